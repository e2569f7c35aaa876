"""Which check functions can only read: the static proof behind running a check in the
zygote itself instead of a process forked for it (``child_checks.run_checks``).

Stdlib only; runs in a check batch's zygote, inside the sandbox. A fork costs
milliseconds of CPU per check (copy-on-write page faults of the interpreter the check
runs in), which is most of an evaluation's time on a fraction of a CPU. A check whose source passes
:func:`why_not_read_only` cannot change anything another check of the batch sees, so it
may share the zygote's interpreter with them. The proof assumes what the zygote
guarantees when it takes this path: both states are plain data (JSON values, or the
objects the renderings' tags stand for: sets, tuples, dates, Decimal, ...; never
unpickled objects, whose classes' code could run on ``==`` or ``len``).

A read-only check (every rule is syntactic, on the whole source, flow-insensitive):

* uses only these statements and expressions: ``def`` (no decorators), ``lambda``,
  assignment, ``if``/``for``/``while``/``try``/``raise``/``assert``/``return``/``del``,
  comprehensions, f-strings, operators, calls. Not: ``import``, ``global``/``nonlocal``,
  ``class``, ``with``, ``yield``, ``async``/``await``, ``match``.
* names only what it binds itself, ``initial_state`` and :data:`SAFE_BUILTINS` (no
  ``open``, ``getattr``, ``type``, ``globals``, ``__import__``, no dunder name at all), so
  it reaches no module, frame or file;
* reads only the attributes of :data:`READ_ATTRIBUTES` (methods and fields that never
  change their object: ``get``, ``items``, ``lower``, ``year``...; no ``format``, no dunder,
  no ``gi_frame``), so it reaches nothing through an object either;
* changes only objects it made: a mutating method (:data:`MUTATING_METHODS`), a
  subscript store or delete, or an augmented assignment (``+=`` extends a list in place)
  is allowed only on a name every assignment of which is *fresh* (a display, a
  comprehension, an operator's result, ``list(...)``/``dict(...)``/``sorted(...)``/
  ``x.copy()`` and the like), never on a parameter, a loop variable or a subscript of
  anything (``fresh[0] += [1]`` changes the list inside).

Everything else takes the forked path, which isolates any code; the price of a rule
that is too strict is only speed. EnvScaler asks its model for checks that "must not
modify any input data"; written that way (lookups, comparisons, loops with counters,
comprehensions, helpers) they pass.
"""

from __future__ import annotations

import ast
import builtins

from .limits import READ_ONLY_CHECK_MAX_NODES

SAFE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "complex", "dict", "divmod",
    "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "id", "int", "isinstance",
    "issubclass", "iter", "len", "list", "map", "max", "min", "next", "oct", "ord", "pow", "print", "range",
    "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip",
    "ArithmeticError", "AssertionError", "AttributeError", "Exception", "IndexError", "KeyError",
    "LookupError", "RuntimeError", "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
})
"""Builtins a read-only check may name: none reaches a module, a frame, a file or code,
and none changes an object it is given (``print`` writes to the check's stdout, which
the runner captures per check)."""

READ_ATTRIBUTES = frozenset({
    # dict, list, tuple, str, bytes, set: methods that return new objects or facts
    "get", "keys", "values", "items", "copy", "count", "index",
    "lower", "upper", "strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit", "splitlines",
    "join", "replace", "find", "rfind", "partition", "rpartition", "removeprefix", "removesuffix",
    "isdigit", "isalpha", "isalnum", "isspace", "isnumeric", "isdecimal", "islower", "isupper", "istitle",
    "title", "capitalize", "casefold", "swapcase", "zfill", "center", "ljust", "rjust",
    "union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset", "isdisjoint",
    # numbers, dates and times, UUIDs, ranges
    "real", "imag", "numerator", "denominator", "is_integer", "bit_length", "hex",
    "year", "month", "day", "hour", "minute", "second", "microsecond", "weekday", "isoweekday",
    "isoformat", "strftime", "timestamp", "toordinal", "date", "time", "days", "seconds", "microseconds",
    "total_seconds", "start", "stop", "step",
})
"""Attributes a read-only check may read (and call): on every type a check can reach
(plain data, what builtins return, its own functions) each of them leaves its object
as it was and returns plain data. ``copy`` returns a new container, like ``list(x)``.
Not ``encode``/``decode``: a codec lookup imports modules (the zygote forgets them
after each check, but there is no need to invite it)."""

MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update", "setdefault",
    "popitem", "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",
})
"""Methods that change their object: allowed only on a fresh name (module docstring)."""

FRESH_CALLS = frozenset({"bool", "dict", "float", "frozenset", "int", "len", "list", "repr", "set", "sorted",
                         "str", "tuple"})
"""Builtins whose result is always a new object (or an immutable one), never an argument."""

_FRESH_VALUES = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.JoinedStr, ast.List, ast.Tuple,
                 ast.Dict, ast.Set, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
"""Expressions whose value is a new object (or an immutable one). Not ``a or b`` or
``x if c else y``: those are one of their operands."""

_ALLOWED = (
    ast.Module, ast.FunctionDef, ast.Return, ast.Delete, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For,
    ast.While, ast.If, ast.Raise, ast.Try, ast.Assert, ast.Expr, ast.Pass, ast.Break, ast.Continue,
    ast.BoolOp, ast.NamedExpr, ast.BinOp, ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict, ast.Set,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call, ast.FormattedValue,
    ast.JoinedStr, ast.Constant, ast.Attribute, ast.Subscript, ast.Starred, ast.Name, ast.List, ast.Tuple,
    ast.Slice, ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop, ast.comprehension,
    ast.ExceptHandler, ast.arguments, ast.arg, ast.keyword,
)


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def why_not_read_only(source: str) -> str | None:
    """``None`` when ``source`` (a check function's module) provably changes nothing but
    objects it made and reaches nothing but its states and :data:`SAFE_BUILTINS` (rules
    in the module docstring); else the first reason it is not, e.g. ``"imports os"``,
    ``"reads attribute '__class__'"``, ``"calls append on 'final_state'"``. A source that
    does not parse gets a reason too (it will be rejected, in a forked process). Never
    raises."""
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return "does not parse"
    nodes = []
    for node in ast.walk(tree):
        nodes.append(node)
        if len(nodes) > READ_ONLY_CHECK_MAX_NODES:
            return f"more than {READ_ONLY_CHECK_MAX_NODES} syntax nodes"
    bound = _bound(nodes)
    shadowed = sorted(bound & _OTHER_BUILTINS)
    if shadowed:  # a name is checked, not the scope it is looked up in: `open` must mean nothing
        return f"binds {shadowed[0]!r}"
    fresh = _fresh(nodes, bound)
    for node in nodes:
        reason = _reason(node, bound, fresh)
        if reason is not None:
            return reason
    return None


_OTHER_BUILTINS = frozenset(dir(builtins)) - SAFE_BUILTINS
"""Builtins a read-only check may not name, nor bind (it could then name them)."""

_NEVER_FRESH = frozenset(dir(builtins)) | {"initial_state"}
"""Names that mean something before the check binds them (``list.append(x, 1)`` changes
``x``; the module's ``initial_state`` is the shared state): never fresh, whatever the
check assigns to them somewhere."""


def _bound(nodes: list[ast.AST]) -> set[str]:
    """Every name the source binds anywhere (any scope)."""
    bound: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ExceptHandler)) and node.name:
            bound.add(node.name)
    return bound


def _fresh(nodes: list[ast.AST], bound: set[str]) -> set[str]:
    """The names every binding of which (in any scope) is a fresh value: at least one
    plain assignment of a fresh value and no other kind of binding."""
    fresh: set[str] = set()
    not_fresh: set[str] = set(_NEVER_FRESH)
    for node in nodes:
        if isinstance(node, ast.arg):
            not_fresh.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ExceptHandler)) and node.name:
            not_fresh.add(node.name)
        elif isinstance(node, ast.Assign):
            value_fresh = _is_fresh(node.value, bound)
            for target in node.targets:
                if isinstance(target, ast.Name) and value_fresh:
                    fresh.add(target.id)
                else:  # unpacking binds parts of a value; a non-fresh value binds itself
                    not_fresh.update(_names_in(target))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            if isinstance(node.target, ast.Name) and _is_fresh(node.value, bound):
                fresh.add(node.target.id)
            else:
                not_fresh.update(_names_in(node.target))
        elif isinstance(node, (ast.For, ast.comprehension, ast.NamedExpr)):
            not_fresh.update(_names_in(node.target))
    # an augmented assignment or a `del` binds no new name. `x = (); x += t` can leave x
    # the state's tuple `t` itself (`() + t is t`), but only ever an immutable one, which
    # no operation allowed on a fresh name can change
    return fresh - not_fresh


def _names_in(target: ast.AST) -> set[str]:
    """The names an assignment target binds (``a, *b``; not the ``x`` of ``x[i] = v``)."""
    return {node.id for node in ast.walk(target) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}


def _is_fresh(value: ast.expr, bound: set[str]) -> bool:
    if isinstance(value, _FRESH_VALUES):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name):
            return func.id in FRESH_CALLS and func.id not in bound  # `list` may be the check's own
        return isinstance(func, ast.Attribute) and func.attr == "copy" and not value.args and not value.keywords
    return False


def _reason(node: ast.AST, bound: set[str], fresh: set[str]) -> str | None:
    if not isinstance(node, _ALLOWED):
        return _describe(node)
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            return f"names {node.id!r}"
        if isinstance(node.ctx, ast.Load) and node.id not in bound and node.id not in SAFE_BUILTINS \
                and node.id != "initial_state":
            return f"names {node.id!r}"
    elif isinstance(node, ast.arg) and node.arg.startswith("__"):
        return f"names {node.arg!r}"
    elif isinstance(node, ast.FunctionDef):
        if node.decorator_list:
            return "decorates a function"
        if node.name.startswith("__"):
            return f"names {node.name!r}"
    elif isinstance(node, ast.Attribute):
        if not isinstance(node.ctx, ast.Load):
            return f"sets attribute {node.attr!r}"
        if node.attr in MUTATING_METHODS:
            if not (isinstance(node.value, ast.Name) and node.value.id in fresh):
                return f"calls {node.attr} on {_what(node.value)}"
        elif node.attr not in READ_ATTRIBUTES:
            return f"reads attribute {node.attr!r}"
    elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
        if not (isinstance(node.value, ast.Name) and node.value.id in fresh):
            return f"changes an item of {_what(node.value)}"
    elif isinstance(node, ast.AugAssign):
        if not (isinstance(node.target, ast.Name) and node.target.id in fresh):
            return f"updates {_what(node.target)} in place"
    return None


def _what(node: ast.AST) -> str:
    return repr(node.id) if isinstance(node, ast.Name) else "an expression"


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Import):
        return "imports " + ", ".join(alias.name for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return f"imports from {node.module or '.'}"
    return f"uses {type(node).__name__}"
