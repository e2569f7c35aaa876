"""The composite environment for one combination of BFCL classes: a single Python module
(``source_code``) defining ``BfclEnv``, which holds one instance of each involved class as a
public attribute named after the class (the state) and forwards every public method of
those classes (the tools), with BFCL's modules embedded as text.

Everything here is static: BFCL's sources are parsed with :func:`ast.parse` (which
executes nothing) and the generated module is meant to run only inside a sandbox.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .errors import BfclImportError
from .wheel import BFCL_VERSION

__all__ = [
    "BACKEND_PACKAGE",
    "CLASS_NAME",
    "CONFIG_KEY",
    "ENV_PREFIX",
    "STAND_INS",
    "BfclEnvironment",
    "build_environment",
    "embedded_modules",
    "environment_name",
]

CLASS_NAME = "BfclEnv"
"""Name of the environment class every generated ``source_code`` defines."""
CONFIG_KEY = "_bfcl"
"""The init_config key holding the classes' scenarios (private: EnvScaler setattr-s every key)."""
ENV_PREFIX = "bfcl:"
BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
"""Dotted package of BFCL's tool modules; the composite registers them under these names."""


@dataclass(frozen=True, slots=True)
class BfclEnvironment:
    """A registrable environment for one combination of BFCL classes.

    Attributes:
        name: ``"bfcl:" + "+".join(classes)``, e.g. ``"bfcl:GorillaFileSystem+TwitterAPI"``.
        class_name: always :data:`CLASS_NAME` (``"BfclEnv"``).
        classes: the involved BFCL class names, sorted.
        source_code: the composite module (untrusted code inside; run only in a sandbox).
        tool_names: every public method of every class, class by class in ``classes``
            order, each class's methods in definition order.
        signatures: tool name -> its parameter names in order (``self`` excluded).
        required: tool name -> the parameters without a default.
        tool_classes: tool name -> the BFCL class that implements it.
    """

    name: str
    class_name: str
    classes: tuple[str, ...]
    source_code: str
    tool_names: tuple[str, ...]
    signatures: dict[str, tuple[str, ...]]
    required: dict[str, tuple[str, ...]]
    tool_classes: dict[str, str]


def environment_name(classes: Iterable[str]) -> str:
    """``"bfcl:" + "+".join(sorted(set(classes)))``."""
    return ENV_PREFIX + "+".join(sorted(set(classes)))


# -- composite environment --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Method:
    name: str
    params: tuple[str, ...]
    required: tuple[str, ...]
    header: str  # "name(self, a: int = 1) -> Dict[str, int]"
    doc: str | None


@dataclass(frozen=True, slots=True)
class _BfclClass:
    name: str
    module: str  # dotted
    methods: tuple[_Method, ...]
    has_load_scenario: bool


STAND_INS = frozenset({"mpmath"})
"""Third-party modules BFCL's tools import; the sandbox image provides them (Debian's
``python3-mpmath``, see ``sandbox_images/base.json``)."""


def build_environment(classes: Sequence[str], class_modules: Mapping[str, str], stateless: Iterable[str],
                      read_module: Callable[[str], str]) -> BfclEnvironment:
    """Build the composite environment for ``classes`` (statically, with ``ast``).

    Args:
        classes: BFCL class names (order and duplicates ignored).
        class_modules: BFCL's ``CLASS_FILE_PATH_MAPPING`` (class -> dotted module).
        stateless: BFCL's ``STATELESS_CLASSES`` (no ``_load_scenario`` call).
        read_module: ``read_module(dotted_name) -> source text`` (from the wheel).

    Returns:
        A :class:`BfclEnvironment` whose ``source_code`` defines :data:`CLASS_NAME`.

    Raises:
        BfclImportError: a class is unknown or outside :data:`BACKEND_PACKAGE`; a module
            does not parse, imports a third-party package other than those in
            :data:`STAND_INS`, imports BFCL code outside the backend package, or has an
            import cycle; a class has base classes or decorated/async public methods, a
            public method has ``*args``/keyword-only/positional-only parameters or a
            non-literal default; a stateful class lacks ``_load_scenario``; two classes
            share a tool name, or a tool name equals a class name.
    """
    return build(tuple(sorted(set(classes))), class_modules, frozenset(stateless), ModuleIndex(read_module))


class ModuleIndex:
    """BFCL module sources, syntax trees and imports, each computed once (``load_suite``
    shares one index across all combinations; ``long_context.py`` alone is 190 KB)."""

    def __init__(self, read_module: Callable[[str], str]) -> None:
        self.read_module = read_module
        self.sources: dict[str, str] = {}
        self.trees: dict[str, ast.Module] = {}
        self.imported: dict[str, list[tuple[str, int]]] = {}

    def source(self, dotted: str) -> str:
        if dotted not in self.sources:
            self.sources[dotted] = self.read_module(dotted)
        return self.sources[dotted]

    def tree(self, dotted: str) -> ast.Module:
        if dotted not in self.trees:
            try:
                self.trees[dotted] = ast.parse(self.source(dotted), filename=dotted)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                raise BfclImportError(f"BFCL module {dotted} does not parse: {exc}") from exc
        return self.trees[dotted]

    def imports(self, dotted: str) -> list[tuple[str, int]]:
        if dotted not in self.imported:
            self.imported[dotted] = list(_imports(dotted, self.tree(dotted)))
        return self.imported[dotted]


def build(names: tuple[str, ...], class_modules: Mapping[str, str], stateless: frozenset[str],
           index: ModuleIndex) -> BfclEnvironment:
    parsed: list[_BfclClass] = []
    for class_name in names:
        module = class_modules.get(class_name)
        if module is None:
            raise BfclImportError(f"BFCL has no module for class {class_name!r}")
        if not module.startswith(BACKEND_PACKAGE + "."):
            raise BfclImportError(f"class {class_name} lives in {module}, outside {BACKEND_PACKAGE}")
        parsed.append(_parse_class(class_name, module, index.tree(module), class_name not in stateless))
    order = _module_order([cls.module for cls in parsed], index)
    owners: dict[str, str] = {}
    for cls in parsed:
        for method in cls.methods:
            if method.name in owners:
                raise BfclImportError(f"tool {method.name!r} is defined by both {owners[method.name]} and "
                                      f"{cls.name}; they cannot share one environment")
            if method.name in names:
                raise BfclImportError(f"tool {method.name!r} of {cls.name} has the name of a class")
            owners[method.name] = cls.name
    stand_ins = sorted({name for dotted in order for name in _third_party(dotted, index)})
    source = _render(names, parsed, [(dotted, index.source(dotted)) for dotted in order], stand_ins, stateless)
    return BfclEnvironment(
        name=environment_name(names), class_name=CLASS_NAME, classes=names, source_code=source,
        tool_names=tuple(m.name for cls in parsed for m in cls.methods),
        signatures={m.name: m.params for cls in parsed for m in cls.methods},
        required={m.name: m.required for cls in parsed for m in cls.methods},
        tool_classes=dict(owners))


def _parse_class(class_name: str, module: str, tree: ast.Module, stateful: bool) -> _BfclClass:
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    if len(found) != 1:
        raise BfclImportError(f"{module} does not define class {class_name} exactly once")
    node = found[0]
    if node.bases or node.keywords or node.decorator_list:
        raise BfclImportError(f"class {class_name} has bases or decorators; inherited tools are not supported")
    methods = []
    has_load = False
    for item in node.body:
        if isinstance(item, ast.AsyncFunctionDef) and not item.name.startswith("_"):
            raise BfclImportError(f"{class_name}.{item.name} is async; not supported")
        if not isinstance(item, ast.FunctionDef):
            continue
        if item.name == "_load_scenario":
            has_load = True
        if item.name.startswith("_"):
            continue
        methods.append(_parse_method(class_name, item))
    if stateful and not has_load:
        raise BfclImportError(f"stateful class {class_name} has no _load_scenario method")
    return _BfclClass(name=class_name, module=module, methods=tuple(methods), has_load_scenario=has_load)


def _parse_method(class_name: str, node: ast.FunctionDef) -> _Method:
    where = f"{class_name}.{node.name}"
    args = node.args
    if node.decorator_list:
        raise BfclImportError(f"{where} is decorated; only plain methods are supported")
    if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg:
        raise BfclImportError(f"{where} has positional-only, keyword-only or variadic parameters")
    if not args.args or args.args[0].arg != "self":
        raise BfclImportError(f"{where} does not take self first")
    params = args.args[1:]
    first_default = len(params) - len(args.defaults)
    parts = ["self"]
    for index, param in enumerate(params):
        text = param.arg
        if param.annotation is not None:
            text += ": " + ast.unparse(param.annotation)
        if index >= first_default:
            default = args.defaults[index - first_default]
            try:
                ast.literal_eval(default)
            except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
                raise BfclImportError(f"{where}: default of {param.arg!r} is not a literal") from exc
            text += (" = " if param.annotation is not None else "=") + ast.unparse(default)
        parts.append(text)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    names = tuple(param.arg for param in params)
    return _Method(name=node.name, params=names, required=names[:first_default],
                   header=f"{node.name}({', '.join(parts)}){returns}",
                   doc=ast.get_docstring(node, clean=False))


def _imports(dotted: str, tree: ast.Module) -> Iterable[tuple[str, int]]:
    """``(absolute module name, line)`` for every import anywhere in the module."""
    package = dotted.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    raise BfclImportError(f"{dotted} line {node.lineno}: relative import beyond the top package")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == BACKEND_PACKAGE:  # "from <package> import long_context"
                for alias in node.names:
                    yield f"{target}.{alias.name}", node.lineno
            else:
                yield target, node.lineno


def _internal_deps(dotted: str, index: ModuleIndex) -> list[str]:
    deps = []
    for target, line in index.imports(dotted):
        top = target.partition(".")[0]
        if top != "bfcl_eval":
            continue
        if not target.startswith(BACKEND_PACKAGE + "."):
            raise BfclImportError(f"{dotted} line {line} imports {target}, outside {BACKEND_PACKAGE}; not supported")
        deps.append(target)
    return deps


def _third_party(dotted: str, index: ModuleIndex) -> list[str]:
    found = []
    for target, line in index.imports(dotted):
        top = target.partition(".")[0]
        if top == "bfcl_eval" or top in sys.stdlib_module_names:
            continue
        if top not in STAND_INS:
            raise BfclImportError(f"{dotted} line {line} imports {target}, a third-party package the sandbox lacks")
        found.append(top)
    return found


def _module_order(roots: Sequence[str], index: ModuleIndex) -> list[str]:
    """Dependency order (imported modules first) of ``roots`` and what they import."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(dotted: str, chain: tuple[str, ...]) -> None:
        if state.get(dotted) == "done":
            return
        if state.get(dotted) == "active":
            raise BfclImportError(f"import cycle between BFCL modules: {' -> '.join(chain + (dotted,))}")
        state[dotted] = "active"
        for dep in _internal_deps(dotted, index):
            visit(dep, chain + (dotted,))
        state[dotted] = "done"
        order.append(dotted)

    for root in roots:
        visit(root, ())
    return order


def _render(names: tuple[str, ...], parsed: list[_BfclClass], modules: list[tuple[str, str]],
            stand_ins: list[str], stateless: frozenset[str]) -> str:
    """The composite module's text (see the module docstring it carries)."""
    by_name = {cls.name: cls for cls in parsed}
    lines = [
        f'"""BFCL multi-turn environment {"+".join(names)} (bfcl-eval=={BFCL_VERSION}), generated by',
        # the generator's old module name, kept: this text is part of every composite's
        # code_sha256, by which imports find the environments they registered before
        "sandpit.api.bfcl. Run only inside a Sandpit sandbox: it executes BFCL's tool modules.",
        "",
        "BFCL's modules are embedded as text and created as real modules, registered in sys.modules",
        "under their own names (with their parent packages):",
        f"{BACKEND_PACKAGE}.<module>.",
        "So their imports resolve and pickle finds their classes. BfclEnv holds one instance of each",
        "involved class as a public attribute named after the class (the state) and forwards every",
        'public method of those classes (the tools)."""',
        "",
        "from __future__ import annotations",
        "",
        "import copy as _copy",
        "import importlib.machinery as _machinery",
        "import linecache as _linecache",
        "import sys as _sys",
        "import types as _types",
        "",
        "",
        "def _package(name):",
        "    module = _sys.modules.get(name)",
        "    if module is None:",
        "        module = _types.ModuleType(name)",
        "        module.__path__ = []",
        "        module.__package__ = name",
        "        module.__spec__ = _machinery.ModuleSpec(name, None, is_package=True)",
        "        _sys.modules[name] = module",
        "        parent, _, leaf = name.rpartition('.')",
        "        if parent:",
        "            setattr(_package(parent), leaf, module)",
        "    return module",
        "",
        "",
        "def _install(name, source):",
        "    parent, _, leaf = name.rpartition('.')",
        "    filename = '<bfcl>/' + name.replace('.', '/') + '.py'",
        "    module = _types.ModuleType(name)",
        "    module.__file__ = filename",
        "    module.__package__ = parent",
        "    module.__spec__ = _machinery.ModuleSpec(name, None, origin=filename)",
        "    _sys.modules[name] = module",
        "    if parent:",
        "        setattr(_package(parent), leaf, module)",
        "    _linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)",
        "    try:",
        "        exec(compile(source, filename, 'exec', dont_inherit=True), module.__dict__)",
        "    except BaseException:",
        "        del _sys.modules[name]",
        "        raise",
        "    return module",
        "",
    ]
    lines += ["", "_MODULES = {}"]
    for dotted, source in modules:
        lines.append(f"_MODULES[{dotted!r}] = _install({dotted!r}, {source!r})")
    lines += ["", "_CLASSES = {"]
    for name in names:
        lines.append(f"    {name!r}: _MODULES[{by_name[name].module!r}].{name},")
    lines += ["}", f"_STATEFUL = {tuple(n for n in names if n not in stateless)!r}", "", ""]
    tools = textwrap.wrap("Tools: " + ", ".join(m.name for cls in parsed for m in cls.methods) + ".",
                          width=88, initial_indent="    ", subsequent_indent="        ")
    lines += [
        f"class {CLASS_NAME}:",
        f'    """BFCL tools of {", ".join(names)}.',
        "",
        f"    State: {', '.join(f'self.{n}' for n in names)} (the BFCL instances).",
        *tools,
        '    """',
        "",
        "    def __init__(self, init_config):",
        f"        config = (init_config or {{}}).get({CONFIG_KEY!r}) or {{}}",
    ]
    for name in names:
        lines.append(f"        self.{name} = _new({name!r}, config)")
    for cls in parsed:
        for method in cls.methods:
            lines += ["", f"    def {method.header}:"]
            if method.doc is not None:
                lines.append(f"        {_docstring_literal(method.doc)}")
            forwarded = ", ".join(f"{p}={p}" for p in method.params)
            lines.append(f"        return self.{cls.name}.{method.name}({forwarded})")
    lines += [
        "",
        "",
        "def _new(name, config):",
        "    instance = _CLASSES[name]()",
        "    if name in _STATEFUL:",
        "        instance._load_scenario(_copy.deepcopy(config.get(name) or {}), long_context=False)",
        "    return instance",
        "",
        "",
        "# Real annotations on the forwarders (the text above is kept as strings):",
        "for _name, _cls in _CLASSES.items():",
        "    for _tool, _function in list(vars(_cls).items()):",
        f"        if not _tool.startswith('_') and callable(_function) and _tool in vars({CLASS_NAME}):",
        f"            vars({CLASS_NAME})[_tool].__annotations__ = dict(getattr(_function, '__annotations__', {{}}))",
        "",
    ]
    return "\n".join(lines)


def _docstring_literal(doc: str) -> str:
    """``doc`` as a triple-quoted literal when that reads back identically, else its repr."""
    if '"""' in doc or "\\" in doc or doc.endswith('"') or any(c < " " and c not in "\n\t" for c in doc):
        return repr(doc)
    return f'"""{doc}"""'



def embedded_modules(composite: str) -> dict[str, str]:
    """The BFCL module sources a composite environment embeds (its ``_install(name,
    source)`` string literals), read with ``ast`` only: dotted name -> source. These are
    what the static policy judges; the composite wrapper around them is Sandpit's own
    generated glue (it must ``exec`` them inside the sandbox)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(composite)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_install" \
                and len(node.args) == 2:
            name, source = (a.value if isinstance(a, ast.Constant) else None for a in node.args)
            if isinstance(name, str) and isinstance(source, str):
                found[name] = source
    return found
