"""The policy's own rules over the syntax tree (imports, dunder chains, eval, open,
getattr with computed names, rebinding builtins): :class:`AstChecker`."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Mapping
from typing import Any

from .findings import Sink
from .rules import DANGEROUS_ATTRIBUTES, MODULE_NAME, Policy

_EVAL_NAMES = frozenset({"eval", "exec", "compile", "breakpoint"})
_GETATTR_NAMES = frozenset({"getattr", "setattr", "delattr", "hasattr"})
_OPEN_MODULES = frozenset({"io", "os", "codecs", "builtins"})
_BUILTIN_NAMES = frozenset(dir(builtins))


class AstChecker:
    """The policy's own rules. Iterative (``ast.walk``), so deep trees cannot exhaust the
    stack here."""

    def __init__(self, policy: Policy, sink: Sink) -> None:
        self.policy = policy
        self.sink = sink
        self.builtins_aliases = {"builtins", "__builtins__"}
        self.called: set[int] = set()
        self.import_calls: set[int] = set()
        """id() of the callee of an ``import-call`` (not ``dynamic-import`` then)."""
        self.globals_keys: set[int] = set()
        """id() of ``"__builtins__"`` keys of dict displays (``eval-globals``, not ``dunder-access``)."""

    def check(self, tree: ast.Module) -> None:
        handlers = self._HANDLERS
        todo = [(handlers[type(node)], node) for node in ast.walk(tree) if type(node) in handlers]
        for _handler, node in todo:  # aliases first: `import builtins as b` may follow its use
            if isinstance(node, ast.Import):
                self.builtins_aliases.update(a.asname for a in node.names if a.name == "builtins" and a.asname)
        for handler, node in todo:
            handler(self, node)

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self.policy.allows_import(alias.name):
                self.sink.add_node("import-not-allowed", node, f"import of {alias.name!r} (not in the allow-list)")

    def _import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.sink.add_node("import-not-allowed", node, f"relative import from {'.' * node.level}{module}")
        elif not self.policy.allows_import(module):
            self.sink.add_node("import-not-allowed", node, f"import from {module!r} (not in the allow-list)")
        for alias in node.names:
            if module == "builtins" and alias.name in _EVAL_NAMES:
                self.sink.add_node("dynamic-eval", node, f"import of {alias.name} from builtins")
            elif alias.name in ("import_module", "__import__"):
                self.sink.add_node("dynamic-import", node, f"import of {alias.name} from {module}")

    def _call(self, node: ast.Call) -> None:
        func = node.func
        self.called.add(id(func))
        module = self._imported_module(node)
        if module is not None:
            self.import_calls.add(id(func))
            callee = "__import__" if isinstance(func, ast.Name) else "import_module"
            self.sink.add_node("import-call", node, f"call to {callee}({module!r}), a module the allow-list allows")
        if isinstance(func, ast.Name) and func.id in _GETATTR_NAMES:
            self._getattr_call(node, func.id, node.args[1] if len(node.args) > 1 else None)
        elif isinstance(func, ast.Attribute) and func.attr == "__getattribute__":
            self._getattr_call(node, "__getattribute__", node.args[-1] if node.args else None)
        if (isinstance(func, ast.Name) and func.id == "open") or (
                isinstance(func, ast.Attribute) and func.attr == "open" and isinstance(func.value, ast.Name)
                and (func.value.id in _OPEN_MODULES or func.value.id in self.builtins_aliases)):
            where = f"{func.value.id}." if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            self.sink.add_node("open-call", node, f"call to {where}open()")

    def _imported_module(self, node: ast.Call) -> str | None:
        """The module ``node`` imports when it is ``__import__("m", ...)`` or
        ``x.import_module("m")`` with ``m`` a string constant the allow-list allows and no
        relative level (``level`` absent or the constant 0, no ``*``/``**`` arguments that
        could hide one); else None (the call stays ``dynamic-import``)."""
        func, args = node.func, node.args
        if isinstance(func, ast.Name) and func.id == "__import__":
            extra = [k for k in node.keywords if k.arg not in ("globals", "locals", "fromlist")]
            if not 1 <= len(args) <= 5 or any(isinstance(a, ast.Starred) for a in args):
                return None
            levels = [args[4]] if len(args) == 5 else [k.value for k in extra if k.arg == "level"]
            if any(k.arg != "level" for k in extra) or not all(
                    isinstance(v, ast.Constant) and type(v.value) is int and v.value == 0 for v in levels):
                return None
        elif isinstance(func, ast.Attribute) and func.attr == "import_module":
            if len(args) != 1 or node.keywords or isinstance(args[0], ast.Starred):
                return None
        else:
            return None
        name = args[0]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and MODULE_NAME.match(name.value)):
            return None
        return name.value if self.policy.allows_import(name.value) and name.value != "__future__" else None

    def _getattr_call(self, node: ast.Call, name: str, attr: ast.expr | None) -> None:
        if name in ("setattr", "delattr") and node.args and self._is_builtins(node.args[0]):
            self.sink.add_node("builtins-write", node, f"{name}() on the builtins module")
        if attr is None or isinstance(attr, ast.Starred) or not (
                isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            self.sink.add_node("dynamic-getattr", node, f"{name}() with a computed attribute name")

    def _name(self, node: ast.Name) -> None:
        verb = "call to" if id(node) in self.called else "reference to"
        if isinstance(node.ctx, ast.Store) and node.id == "__builtins__":
            self.sink.add_node("builtins-write", node, "assignment to __builtins__")
        elif not isinstance(node.ctx, ast.Load):
            return
        elif node.id in _EVAL_NAMES:
            self.sink.add_node("dynamic-eval", node, f"{verb} {node.id}")
        elif node.id == "__import__":
            if id(node) not in self.import_calls:
                self.sink.add_node("dynamic-import", node, f"{verb} __import__")
        elif node.id.startswith("__") and node.id in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"reference to {node.id}")

    def _attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr == "__import__":
            self.sink.add_node("dynamic-import", node, "access to __import__")
        elif attr in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"access to attribute {attr}")
        elif attr == "__dict__":
            self.sink.add_node("dunder-dict", node, "access to attribute __dict__")
        elif attr == "import_module":
            if id(node) not in self.import_calls:
                self.sink.add_node("dynamic-import", node, "access to import_module")
        elif attr in _EVAL_NAMES and self._is_builtins(node.value):
            self.sink.add_node("dynamic-eval", node, f"access to builtins.{attr}")

    def _dict(self, node: ast.Dict) -> None:
        for key in node.keys:
            if isinstance(key, ast.Constant) and key.value == "__builtins__":
                self.globals_keys.add(id(key))
                self.sink.add_node("eval-globals", key, "a '__builtins__' key in a dict display (restricted "
                                                        "globals for eval/exec)")

    def _constant(self, node: ast.Constant) -> None:
        if id(node) in self.globals_keys:
            return
        if isinstance(node.value, str) and node.value in DANGEROUS_ATTRIBUTES:
            self.sink.add_node("dunder-access", node, f"string literal {node.value!r} (usable with getattr or subscripts)")

    def _global(self, node: ast.Global) -> None:
        for name in node.names:
            if name in _BUILTIN_NAMES:
                self.sink.add_node("builtins-write", node, f"global statement naming the builtin {name!r}")

    def _targets(self, node: ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete | ast.For | ast.withitem) -> None:
        if isinstance(node, ast.Assign | ast.Delete):
            stack = list(node.targets)
        elif isinstance(node, ast.withitem):
            stack = [node.optional_vars] if node.optional_vars is not None else []
        else:
            stack = [node.target]
        while stack:
            target = stack.pop()
            if isinstance(target, ast.Tuple | ast.List):
                stack.extend(target.elts)
            elif isinstance(target, ast.Starred):
                stack.append(target.value)
            elif isinstance(target, ast.Attribute | ast.Subscript) and self._is_builtins(target.value, chain=True):
                self.sink.add_node("builtins-write", target, "write to the builtins module or __builtins__")

    def _is_builtins(self, node: ast.expr, *, chain: bool = False) -> bool:
        """``node`` is the builtins module (by name or alias) or ``__builtins__``; with
        ``chain``, also anything reached from it (``builtins.__dict__[...]``, ``vars(builtins)``)."""
        while True:
            if isinstance(node, ast.Name):
                return node.id in self.builtins_aliases
            if not chain:
                return False
            if isinstance(node, ast.Attribute | ast.Subscript):
                node = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "vars" and node.args:
                node = node.args[0]
            else:
                return False

    _HANDLERS: Mapping[type, Any] = {
        ast.Import: _import, ast.ImportFrom: _import_from, ast.Call: _call, ast.Name: _name,
        ast.Attribute: _attribute, ast.Dict: _dict, ast.Constant: _constant, ast.Global: _global,
        ast.Assign: _targets, ast.AugAssign: _targets, ast.AnnAssign: _targets, ast.Delete: _targets,
        ast.For: _targets, ast.AsyncFor: _targets, ast.withitem: _targets,
    }
