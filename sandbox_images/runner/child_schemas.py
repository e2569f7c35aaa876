"""OpenAI function-calling tool schemas of an environment class, derived by introspection.

Stdlib only (Python 3.11). Inside a sandbox, the session child (``child_session.py``) runs
:func:`describe_class` on the untrusted environment class: nothing here ever runs on the
host with untrusted code. The host imports this module only for its caps (to validate what
a sandbox returns) and in unit tests, on trusted test classes.

Tools are the class's *public methods*: plain functions, staticmethods and classmethods
found in the ``__dict__`` of every class of the MRO except ``object``, whose name does not
start with ``_``. Order: definition order of each class ``__dict__``, most-derived class
first (an override keeps the subclass's position; inherited methods follow). Properties,
nested classes, other descriptors and data attributes are not tools. Class internals are
read through ``type``'s own descriptors, so a metaclass's ``__getattr__``,
``__getattribute__`` or ``__dir__`` is never called, and no getter runs.

One entry per tool::

    {"type": "function", "function": {
        "name": <method name>,
        "description": <docstring summary (text before the first section), whitespace-
                        normalized, at most MAX_DESCRIPTION_CHARS characters, "" if none>,
        "parameters": {"type": "object",
                       "properties": {<param>: {<type keys>, "description": str, "default"?}},
                       "required": [<params without a default>],
                       "additionalProperties": <True iff the method takes **kwargs>}}}

Parameters come from ``inspect.signature`` (``self``/``cls``, ``*args``, ``**kwargs`` and
positional-only parameters are skipped: a call passes arguments by name). Types come from
``typing.get_type_hints``, falling back to the raw annotations, to a parse (never an
evaluation) of annotations that are strings, and, without an annotation, to the type
written in the docstring (``name (type): ...``, ``:type name:``). Mapping (see
:func:`annotation_schema`): str/bytes ``string``, int ``integer``, float ``number``, bool
``boolean``, None ``null``; list/tuple/set/Sequence/Iterable ``array`` with ``items`` when
the element type is known; dict/Mapping ``object``; ``Optional[X]``/``X | None`` is X's
schema; other unions ``anyOf``; ``Literal`` and ``Enum`` subclasses ``enum`` (+ ``type``
when the values share one); ``Annotated[X, ...]`` and ``NewType`` map to X; ``Any`` and
anything unknown get no ``type`` key. ``default`` is given when the default value is
JSON-native (an Enum member gives its value).

Descriptions come from the docstrings (Google, reST and NumPy styles:
``child_docstrings.py``).

Caps (``limits.py``): at most MAX_TOOLS tools (more public methods raise :class:`SchemaLimitError`),
descriptions cut at MAX_DESCRIPTION_CHARS, at most MAX_DOC_SCAN_CHARS of a docstring are
read, the encoded result is at most MAX_SCHEMAS_BYTES (else :class:`SchemaLimitError`).
A method that cannot be introspected (its signature raises, more than MAX_PARAMS
parameters, ...) is still listed, with no known parameters and ``additionalProperties``
true, and a note says why.
"""

from __future__ import annotations

import ast
import builtins
import collections
import collections.abc
import dataclasses
import enum
import inspect
import re
import types
import typing
from typing import Any

from .child_codec import dumps as _json_text
from .child_docstrings import parse_docstring
from .limits import (
    MAX_ANNOTATION_CHARS,
    MAX_ANY_OF,
    MAX_DEFAULT_CHARS,
    MAX_ENUM_CHARS,
    MAX_ENUM_VALUES,
    MAX_NAME_CHARS,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_PARAMS,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMAS_BYTES,
    MAX_TOOLS,
)
from .wire import is_tool_name

_class_dict = type.__dict__["__dict__"].__get__
_class_mro = type.__dict__["__mro__"].__get__
_EMPTY = inspect.Parameter.empty
_SKIPPED_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD,
                  inspect.Parameter.POSITIONAL_ONLY)


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


class SchemaLimitError(ValueError):
    """The class exceeds a cap (too many tools, result too large); the message says which."""


# -- annotations -> JSON schema ----------------------------------------------------------
_SIMPLE: dict[object, str] = {str: "string", bytes: "string", int: "integer", float: "number",
                              bool: "boolean", type(None): "null"}
_ARRAY_TYPES = (list, tuple, set, frozenset, collections.deque)
_ARRAY_ABCS = {collections.abc.Sequence, collections.abc.MutableSequence, collections.abc.Set,
               collections.abc.MutableSet, collections.abc.Iterable, collections.abc.Collection,
               collections.abc.Iterator}
_OBJECT_ABCS = {collections.abc.Mapping, collections.abc.MutableMapping}
_ARRAY_NAMES = {"list", "List", "tuple", "Tuple", "set", "Set", "frozenset", "FrozenSet", "Sequence",
                "MutableSequence", "Iterable", "Collection", "AbstractSet", "MutableSet", "deque",
                "Deque", "Iterator"}
_OBJECT_NAMES = {"dict", "Dict", "Mapping", "MutableMapping", "DefaultDict", "defaultdict", "OrderedDict",
                 "Counter", "ChainMap", "TypedDict"}
_NAME_SCHEMAS: dict[str, dict[str, Any]] = {
    "str": {"type": "string"}, "bytes": {"type": "string"}, "int": {"type": "integer"},
    "float": {"type": "number"}, "bool": {"type": "boolean"}, "None": {"type": "null"},
    "NoneType": {"type": "null"}, "Any": {}, "object": {}, "string": {"type": "string"},
    "integer": {"type": "integer"}, "number": {"type": "number"}, "boolean": {"type": "boolean"},
}


def annotation_schema(annotation: object, depth: int = 0) -> dict[str, Any]:
    """JSON schema (without ``description``) for a type annotation: a type, a typing
    construct, or a string (parsed with ``ast``, never evaluated). Unknown -> ``{}``."""
    if depth > MAX_SCHEMA_DEPTH or annotation is _EMPTY or annotation is typing.Any or annotation is object:
        return {}
    if annotation is None:
        return {"type": "null"}
    if isinstance(annotation, str):
        return string_annotation_schema(annotation, depth)
    if isinstance(annotation, typing.ForwardRef):
        return string_annotation_schema(annotation.__forward_arg__, depth)
    try:
        simple = _SIMPLE.get(annotation)
    except TypeError:  # unhashable annotation
        simple = None
    if simple is not None:
        return {"type": simple}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return annotation_schema(args[0], depth) if args else {}
    if origin is typing.Literal:
        return _enum_schema(list(args))
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in args if a is not type(None) and a is not None]
        return _union_schema([annotation_schema(a, depth + 1) for a in members])
    if isinstance(annotation, typing.NewType):
        return annotation_schema(annotation.__supertype__, depth + 1)
    if isinstance(annotation, typing.TypeVar):
        if annotation.__bound__ is not None:
            return annotation_schema(annotation.__bound__, depth + 1)
        if annotation.__constraints__:
            return _union_schema([annotation_schema(a, depth + 1) for a in annotation.__constraints__])
        return {}
    base = origin if origin is not None else annotation
    if not isinstance(base, type):
        return {}
    if issubclass(base, enum.Enum):
        return _enum_schema([member.value for member in list(base)[:MAX_ENUM_VALUES + 1]])
    if issubclass(base, bool):
        return {"type": "boolean"}
    if issubclass(base, (str, bytes, bytearray)):
        return {"type": "string"}
    if issubclass(base, int):
        return {"type": "integer"}
    if issubclass(base, float):
        return {"type": "number"}
    if issubclass(base, dict) or base in _OBJECT_ABCS or dataclasses.is_dataclass(base):
        return {"type": "object"}
    if issubclass(base, _ARRAY_TYPES) or base in _ARRAY_ABCS:
        return _array_schema([annotation_schema(a, depth + 1) if a is not Ellipsis else None for a in args],
                             tuple_like=issubclass(base, tuple))
    return {}


def _union_schema(members: list[dict[str, Any]]) -> dict[str, Any]:
    """Schemas of a union's non-None members -> one schema: ``Optional[X]`` is X's schema,
    several members ``anyOf``, no member (``None`` alone) ``null``, Any among them ``{}``."""
    if not members:
        return {"type": "null"}
    unique: list[dict[str, Any]] = []
    for member in members:
        if member == {}:
            return {}  # Any in a union: anything goes
        if member not in unique:
            unique.append(member)
    if len(unique) == 1:
        return unique[0]
    if len(unique) > MAX_ANY_OF:
        return {}
    return {"anyOf": unique}


def _array_schema(items: list[dict[str, Any] | None], tuple_like: bool) -> dict[str, Any]:
    """``list[X]``/``set[X]``/``tuple[X, ...]`` -> items X; ``tuple[A, B]`` -> items A
    when A == B, else ``anyOf``; no argument -> no ``items``."""
    known = [item for item in items if item is not None]
    if not known:
        return {"type": "array"}
    if not tuple_like or len(known) == 1:
        element = known[0]
    else:
        element = _union_schema(known)
    return {"type": "array", "items": element} if element else {"type": "array"}


def _json_scalar(value: object) -> bool:
    kind = type(value)
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    return kind is str or kind is int or kind is bool or value is None


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    """``enum`` of JSON scalar values (Enum members give their value) with the common
    ``type`` when there is one. Non-JSON or too many values: only the common type."""
    values = [v.value if isinstance(v, enum.Enum) else v for v in values]
    kinds = set()
    for value in values:
        if not _json_scalar(value):
            return {}
        kinds.add({str: "string", bool: "boolean", int: "integer", float: "number"}.get(type(value), "null"))
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    schema: dict[str, Any] = {"type": kinds.pop()} if len(kinds) == 1 else {}
    if values and len(values) <= MAX_ENUM_VALUES and sum(
            len(v) for v in values if isinstance(v, str)) <= MAX_ENUM_CHARS:
        unique: list[Any] = []
        for value in values:
            if not any(type(value) is type(seen) and value == seen for seen in unique):
                unique.append(value)
        schema["enum"] = unique
    return schema


def string_annotation_schema(text: str, depth: int = 0) -> dict[str, Any]:
    """Schema for an annotation written as text (``"Optional[List[str]]"``, ``"int | None"``,
    a docstring's ``"str, optional"`` or ``"int or None"``). Parsed with ``ast``; names are
    matched by spelling, never looked up or evaluated."""
    text = text.strip()
    if not text or len(text) > MAX_ANNOTATION_CHARS or depth > MAX_SCHEMA_DEPTH:
        return {}
    text = re.sub(r"(,\s*)?\boptional\b\.?$", "", text, flags=re.I).strip()
    text = re.sub(r"\s+or\s+", " | ", text)
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return {}
    return _node_schema(node, depth)


def _node_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    return [node]


def _is_none(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or _node_name(node) == "NoneType"


def _node_schema(node: ast.expr, depth: int) -> dict[str, Any]:
    if depth > MAX_SCHEMA_DEPTH:
        return {}
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"type": "null"}
        if isinstance(node.value, str):
            return string_annotation_schema(node.value, depth + 1)
        return {}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = _union_members(node)
        return _union_schema([_node_schema(m, depth + 1) for m in members if not _is_none(m)])
    name = _node_name(node)
    if name is not None:
        if name in _NAME_SCHEMAS:
            return dict(_NAME_SCHEMAS[name])
        if name in _ARRAY_NAMES:
            return {"type": "array"}
        if name in _OBJECT_NAMES:
            return {"type": "object"}
        return {}
    if not isinstance(node, ast.Subscript):
        return {}
    base = _node_name(node.value)
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base == "Optional":
        return _node_schema(args[0], depth + 1)
    if base == "Union":
        return _union_schema([_node_schema(a, depth + 1) for a in args if not _is_none(a)])
    if base == "Annotated":
        return _node_schema(args[0], depth + 1)
    if base == "Literal":
        values = []
        for arg in args:
            try:
                values.append(ast.literal_eval(arg))  # literals only: never evaluates code
            except (ValueError, TypeError, SyntaxError, RecursionError):
                return {}
        return _enum_schema(values)
    if base in _ARRAY_NAMES:
        items: list[dict[str, Any] | None] = [None if isinstance(a, ast.Constant) and a.value is Ellipsis
                                    else _node_schema(a, depth + 1) for a in args]
        return _array_schema(items, tuple_like=base in ("tuple", "Tuple"))
    if base in _OBJECT_NAMES:
        return {"type": "object"}
    return {}


# -- classes -> tools --------------------------------------------------------------------------
def public_methods(cls: type) -> list[tuple[str, str, object]]:
    """``[(name, kind, function)]`` of the public methods of ``cls`` in tool order; kind
    is ``method``, ``static`` or ``class``; ``function`` is the underlying function.

    Raises:
        SchemaLimitError: more than MAX_TOOLS public methods.
        TypeError: ``cls`` is not a class.
    """
    if not issubclass(type(cls), type):  # its real type: a forged __class__ does not count
        raise TypeError(f"expected a class, got {type(cls).__name__}")
    seen: set[str] = set()
    found: list[tuple[str, str, object]] = []
    for klass in _class_mro(cls):
        if klass is object:
            continue
        for name, value in list(_class_dict(klass).items()):
            if type(name) is not str or name in seen:
                continue
            seen.add(name)
            if name.startswith("_"):
                continue
            kind = _method_kind(value)
            if kind is None:
                continue
            found.append((name, kind[0], kind[1]))
            if len(found) > MAX_TOOLS:
                raise SchemaLimitError(
                    f"the class has more than {MAX_TOOLS} public methods; at most {MAX_TOOLS} tools can be described")
    return found


def _method_kind(value: object) -> tuple[str, object] | None:
    """Classify a class-``__dict__`` value without running any code of it."""
    kind = type(value)
    if kind is types.FunctionType:
        return "method", value
    if issubclass(kind, staticmethod):
        return "static", value.__func__  # type: ignore[attr-defined]
    if issubclass(kind, classmethod):
        return "class", value.__func__  # type: ignore[attr-defined]
    if issubclass(kind, (type, property)) or not callable(value):
        return None
    # Other callables, e.g. functools.lru_cache wrappers: methods if they bind like one;
    # data descriptors (cached_property, slots) are attributes, not tools. Looked up in
    # the type's own dicts (as Python does for descriptors), never via its metaclass.
    if _type_defines(kind, "__set__") or _type_defines(kind, "__delete__"):
        return None
    return ("method", value) if _type_defines(kind, "__get__") else ("static", value)


def _type_defines(kind: type, name: str) -> bool:
    return any(name in _class_dict(klass) for klass in _class_mro(kind))


def _inherited_doc(cls: type, name: str) -> str | None:
    for klass in _class_mro(cls)[1:]:
        if klass is object:
            continue
        value = _class_dict(klass).get(name)
        if value is None:
            continue
        kind = _method_kind(value)
        if kind is not None:
            doc = getattr(kind[1], "__doc__", None)
            if isinstance(doc, str) and doc.strip():
                return doc
    return None


def _default(value: object) -> tuple[bool, object]:
    if isinstance(value, enum.Enum):
        value = value.value
    if not _json_native(value):
        return False, None
    try:
        text = _json_text(value, ascii=True, spaced=True)
    except (TypeError, ValueError, RecursionError):
        return False, None
    return len(text) <= MAX_DEFAULT_CHARS, value


def _json_native(value: object, depth: int = 0) -> bool:
    if depth > 16:
        return False
    if _json_scalar(value):
        return True
    if type(value) is list:
        return len(value) <= MAX_ENUM_VALUES and all(_json_native(v, depth + 1) for v in value)
    if type(value) is dict:
        return len(value) <= MAX_ENUM_VALUES and all(
            type(k) is str and _json_native(v, depth + 1) for k, v in value.items())
    return False


def _fallback(name: str, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": True}}}


def tool_schema(cls: type, name: str, kind: str, function: object, notes: list[str]) -> dict[str, Any]:
    """The tool entry for one public method (see the module docstring); problems that
    only affect parameters are appended to ``notes`` and give the fallback schema."""
    doc = getattr(function, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        doc = _inherited_doc(cls, name)
    summary, documented = parse_docstring(doc)
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        _note(notes, f"{name}: signature unavailable ({type(exc).__name__}); parameters not described")
        return _fallback(name, summary)
    parameters = list(signature.parameters.values())
    if kind in ("method", "class") and parameters and parameters[0].kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        parameters = parameters[1:]  # self / cls
    if len(parameters) > MAX_PARAMS:
        _note(notes, f"{name}: more than {MAX_PARAMS} parameters; parameters not described")
        return _fallback(name, summary)
    try:
        hints: dict[str, Any] = typing.get_type_hints(inspect.unwrap(function))  # type: ignore[arg-type]
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - unresolvable names: fall back to the raw annotations
        hints = {}
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    extra = False
    for param in parameters:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if param.kind in _SKIPPED_KINDS:
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                _note(notes, f"{name}: positional-only parameter {param.name!r} cannot be passed by name")
            continue
        doc_param = documented.get(param.name)
        annotation = hints.get(param.name, param.annotation)
        try:
            if annotation is _EMPTY and doc_param is not None and doc_param.type:
                schema = string_annotation_schema(doc_param.type)
            else:
                schema = annotation_schema(annotation)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - a hostile annotation: type unknown
            _note(notes, f"{name}: type of {param.name!r} unavailable ({type(exc).__name__})")
            schema = {}
        schema["description"] = doc_param.description if doc_param is not None else ""
        if param.default is _EMPTY:
            required.append(param.name)
        else:
            ok, value = _default(param.default)
            if ok:
                schema["default"] = value
        properties[param.name] = schema
    return {"type": "function", "function": {
        "name": name, "description": summary,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": extra}}}


def _note(notes: list[str], text: str) -> None:
    if len(notes) < MAX_NOTES:
        notes.append(text[:MAX_NOTE_CHARS])


def describe_class(cls: type) -> tuple[list[dict[str, Any]], list[str]]:
    """Tool schemas of every public method of ``cls`` plus notes on what could not be
    described. Returns ``(tools, notes)``; ``tools`` is in tool order (module docstring).

    Raises:
        SchemaLimitError: more than MAX_TOOLS public methods, or the encoded tools would
            exceed MAX_SCHEMAS_BYTES.
        TypeError: ``cls`` is not a class.
    """
    notes: list[str] = []
    tools: list[dict[str, Any]] = []
    size = 2
    for name, kind, function in public_methods(cls):
        if not is_tool_name(name):
            _note(notes, f"{name[:MAX_NAME_CHARS]!r}: not a valid function name (ASCII letters, digits, "
                         f"underscores, at most {MAX_NAME_CHARS}); not described")
            continue
        try:
            tool = tool_schema(cls, name, kind, function, notes)
        except (SchemaLimitError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a hostile method must not hide the others
            _note(notes, f"{name}: introspection failed ({type(exc).__name__}); parameters not described")
            tool = _fallback(name, "")
        size += len(_json_text(tool, spaced=True).encode("utf-8")) + 1
        if size > MAX_SCHEMAS_BYTES:
            raise SchemaLimitError(f"the tool schemas exceed {MAX_SCHEMAS_BYTES} bytes")
        tools.append(tool)
    return tools, notes
