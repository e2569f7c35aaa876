"""The JSON rendering of environment state: one lossless, explicit view of any value.

Stdlib only. Runs inside the sandbox (session and check processes), where the real
objects are; the host never renders anything itself (it stores and serves what sandboxes
rendered, and tells a tag by ``wire.is_tag``).

EnvScaler's state is ``vars(instance)`` without dunder keys, as real Python objects. Values
that JSON carries exactly (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite
``float``, ``bool``, ``None``: *JSON-native*) are their own rendering. Everything else is
rendered as a *tag*: a JSON object with exactly one key, starting with ``$``::

    set / frozenset         {"$set": [items]} / {"$frozenset": [items]}   (sorted by JSON text)
    tuple (namedtuple too)  {"$tuple": [items]}
    bytes / bytearray       {"$bytes": "<base64>"} / {"$bytearray": "<base64>"}
    datetime / date / time  {"$datetime": "2024-05-01T10:00:00+00:00"} / {"$date": ...} / {"$time": ...}
    timedelta               {"$timedelta": <seconds, float>}
    Decimal / Fraction      {"$decimal": "1.10"} / {"$fraction": "1/3"}
    complex                 {"$complex": [real, imag]}
    UUID                    {"$uuid": "..."}
    NaN / +-inf             {"$float": "nan" | "inf" | "-inf"}
    Enum member             {"$enum": {"type": "Color", "name": "RED", "value": <rendering>}}
    dict, non-str keys      {"$dict": [[<key rendering>, <value rendering>], ...]}
    object with attributes  {"$object": {"type": "module.Class", "attrs": {name: rendering}}}
                            (dataclasses, ``__slots__`` and plain instances; dunder names left out)
    anything else           {"$repr": {"type": "module.Class", "repr": "<repr, at most 4096 chars>"}}
    a reference cycle       {"$cycle": "<path of the object it points back to>"}

Subclasses of ``dict`` with ``str`` keys (``defaultdict``, ``OrderedDict``, ``Counter``) and
of ``list`` render as plain objects/arrays, and subclasses of ``str``/``int`` (other than
enums) as the plain value, so EnvScaler's ``get_state_diff`` (which recurses into anything
that ``isinstance(..., dict)``) sees the same structure; the real type is kept in the pickle.

A JSON-native ``dict`` with exactly one key that starts with ``$`` would read as a tag, so
it is not treated as JSON-native (:func:`ambiguous_dict`): the session pickles it and
renders it as ``{"$dict": [["$key", value]]}``, which is unambiguous.

Bounds (a rendering says what it cut; nothing is cut silently)::

    {"$truncated": {"type": "list", "reason": "items", "kept": [first RENDER_MAX_ITEMS], "dropped": n}}
    {"$truncated": {"type": "dict", "reason": "items", "kept": {first RENDER_MAX_ITEMS}, "dropped": n}}
    {"$truncated": {"type": "Node", "reason": "depth", "repr": "<repr>"}}   (deeper than RENDER_MAX_DEPTH)
    {"$truncated": {"type": "str", "reason": "size", "repr": "<start>"}}    (past RENDER_MAX_BYTES)

:func:`render` returns ``(rendering, truncated)``; ``truncated`` is True when any marker was
produced. JSON-native values are never cut (they are stored and served exactly).
"""

from __future__ import annotations

import base64
import builtins
import math
import sys

from .child_codec import dumps as _json_text
from .limits import RENDER_MAX_BYTES, RENDER_MAX_DEPTH, RENDER_MAX_ITEMS, RENDER_MAX_REPR_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox


LOCAL_MODULES = ("builtins", None, "dynamic_env", "sandpit_env", "__main__")
"""Modules whose classes are named without the module: builtins, the environment's own
module (``dynamic_env``, as EnvScaler names it; ``sandpit_env``, the name of stored
pickles' classes) and scripts."""

TAGS = frozenset({
    "$set", "$frozenset", "$tuple", "$bytes", "$bytearray", "$datetime", "$date", "$time",
    "$timedelta", "$decimal", "$fraction", "$complex", "$uuid", "$float", "$enum", "$dict",
    "$object", "$repr", "$cycle", "$truncated",
})
"""Every tag :func:`render` produces."""


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def ambiguous_dict(value: dict[Any, Any]) -> bool:
    """True for a dict that a rendering could not tell from a tag (one ``$`` key)."""
    return len(value) == 1 and type(next(iter(value))) is str and next(iter(value)).startswith("$")


def type_name(value: object) -> str:
    """``module.qualname`` of ``type(value)`` (builtins without the module), at most 200
    characters; read through ``type`` so a hostile ``__class__`` cannot lie."""
    kind = type(value)
    try:
        module = type.__dict__["__module__"].__get__(kind)
        qualname = type.__dict__["__qualname__"].__get__(kind)
    except Exception:  # noqa: BLE001 - a hostile metaclass
        return "?"
    name = str(qualname) if module in LOCAL_MODULES else f"{module}.{qualname}"
    return name[:200]


def bounded_repr(value: object, limit: int = RENDER_MAX_REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters; a ``repr`` that raises gives a placeholder."""
    try:
        text = repr(value)
        if type(text) is not str:
            text = str.__str__(text) if isinstance(text, str) else "<unrepresentable>"
    except Exception as exc:  # noqa: BLE001 - a hostile __repr__
        text = f"<unrepresentable {type_name(value)}: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


class _Renderer:
    """One rendering pass: the byte budget, the path of open containers (for cycles)."""

    def __init__(self) -> None:
        self.budget = RENDER_MAX_BYTES
        self.truncated = False
        self.open: dict[int, str] = {}
        """id() of each container being rendered -> its path."""

    def marker(self, value: object, reason: str, **extra: object) -> dict[str, object]:
        self.truncated = True
        body: dict[str, object] = {"type": type_name(value), "reason": reason}
        body.update(extra)
        return {"$truncated": body}

    def spend(self, n: int) -> bool:
        self.budget -= n
        return self.budget >= 0

    def render(self, value: object, depth: int, path: str) -> object:
        if value is None or type(value) is bool:
            return value
        if type(value) is int:
            return value if self.spend(8) else self.marker(value, "size", repr="")
        if type(value) is str:
            if self.spend(len(value)):
                return value
            return self.marker(value, "size", repr=value[:200])
        if type(value) is float:
            self.spend(8)
            if math.isfinite(value):
                return value
            return {"$float": "nan" if value != value else ("inf" if value > 0 else "-inf")}
        if self.budget < 0:
            return self.marker(value, "size", repr=bounded_repr(value, 200))
        if depth >= RENDER_MAX_DEPTH:
            return self.marker(value, "depth", repr=bounded_repr(value, 200))
        simple = self.simple(value)
        if simple is not None:
            return simple
        ident = id(value)
        if ident in self.open:
            return {"$cycle": self.open[ident]}
        self.open[ident] = path or "$"
        try:
            return self.container(value, depth, path)
        finally:
            del self.open[ident]

    def simple(self, value: object) -> dict[str, object] | None:
        """Tags of leaf types (no recursion), or None. Modules are looked up in
        ``sys.modules``: a type whose module was never imported cannot occur."""
        mods = sys.modules
        enum_mod = mods.get("enum")
        if enum_mod is not None and isinstance(value, enum_mod.Enum):
            return None  # rendered in container(): its value may need recursion
        dt = mods.get("datetime")
        if dt is not None:
            if isinstance(value, dt.datetime):
                return {"$datetime": value.isoformat()}
            if isinstance(value, dt.date):
                return {"$date": value.isoformat()}
            if isinstance(value, dt.time):
                return {"$time": value.isoformat()}
            if isinstance(value, dt.timedelta):
                return {"$timedelta": value.total_seconds()}
        if isinstance(value, (bytes, bytearray)):
            if not self.spend(len(value) * 4 // 3):
                return self.marker(value, "size", repr=bounded_repr(value[:64], 200))
            tag = "$bytes" if isinstance(value, bytes) else "$bytearray"
            return {tag: base64.b64encode(bytes(value)).decode("ascii")}
        decimal = mods.get("decimal")
        if decimal is not None and isinstance(value, decimal.Decimal):
            return {"$decimal": str(value)}
        fractions = mods.get("fractions")
        if fractions is not None and isinstance(value, fractions.Fraction):
            return {"$fraction": f"{value.numerator}/{value.denominator}"}
        if isinstance(value, complex):
            return {"$complex": [self.render(value.real, 0, ""), self.render(value.imag, 0, "")]}
        uuid = mods.get("uuid")
        if uuid is not None and isinstance(value, uuid.UUID):
            return {"$uuid": str(value)}
        return None

    def container(self, value: object, depth: int, path: str) -> object:
        enum_mod = sys.modules.get("enum")
        if enum_mod is not None and isinstance(value, enum_mod.Enum):
            try:
                member_value = value.value
                name = value.name
            except Exception:  # noqa: BLE001 - a hostile enum
                return {"$repr": {"type": type_name(value), "repr": bounded_repr(value)}}
            return {"$enum": {"type": type_name(value), "name": str(name)[:200],
                              "value": self.render(member_value, depth + 1, f"{path}.value")}}
        if isinstance(value, dict):
            return self.mapping(value, depth, path)
        if isinstance(value, list):
            return self.sequence(value, depth, path, None)
        if isinstance(value, tuple):
            return self.sequence(value, depth, path, "$tuple")
        if isinstance(value, (set, frozenset)):
            return self.unordered(value, depth, path)
        if isinstance(value, str):  # str subclass (not an enum)
            return str.__str__(value) if self.spend(len(value)) else self.marker(value, "size", repr="")
        if isinstance(value, int) and not isinstance(value, bool):  # int subclass (not an enum)
            return int.__index__(value)
        if isinstance(value, float):
            return self.render(float.__float__(value), depth, path)
        return self.instance(value, depth, path)

    def mapping(self, value: dict[Any, Any], depth: int, path: str) -> object:
        try:
            items = list(dict.items(value))
        except Exception:  # noqa: BLE001 - mutated while rendering
            return {"$repr": {"type": type_name(value), "repr": bounded_repr(value)}}
        dropped = max(0, len(items) - RENDER_MAX_ITEMS)
        items = items[:RENDER_MAX_ITEMS]
        if all(type(key) is str for key, _ in items) and not ambiguous_dict(value):
            out: dict[str, object] = {}
            for key, item in items:
                self.spend(len(key))
                out[key] = self.render(item, depth + 1, f"{path}.{key}" if path else key)
            if dropped:
                return self.marker(value, "items", kept=out, dropped=dropped)
            return out
        pairs = [[self.render(key, depth + 2, f"{path}[key]"), self.render(item, depth + 2, f"{path}[{i}]")]
                 for i, (key, item) in enumerate(items)]
        if dropped:
            return self.marker(value, "items", kept={"$dict": pairs}, dropped=dropped)
        return {"$dict": pairs}

    def sequence(self, value: list[Any] | tuple[Any, ...], depth: int, path: str, tag: str | None) -> object:
        try:
            items = list(value)
        except Exception:  # noqa: BLE001
            return {"$repr": {"type": type_name(value), "repr": bounded_repr(value)}}
        dropped = max(0, len(items) - RENDER_MAX_ITEMS)
        rendered = [self.render(item, depth + 1, f"{path}[{i}]") for i, item in enumerate(items[:RENDER_MAX_ITEMS])]
        out: object = rendered if tag is None else {tag: rendered}
        if dropped:
            return self.marker(value, "items", kept=out, dropped=dropped)
        return out

    def unordered(self, value: set[Any] | frozenset[Any], depth: int, path: str) -> object:
        try:
            items = list(value)
        except Exception:  # noqa: BLE001
            return {"$repr": {"type": type_name(value), "repr": bounded_repr(value)}}
        dropped = max(0, len(items) - RENDER_MAX_ITEMS)
        rendered = [self.render(item, depth + 2, f"{path}{{}}") for item in items[:RENDER_MAX_ITEMS]]
        rendered.sort(key=_sort_key)
        tag = "$frozenset" if isinstance(value, frozenset) else "$set"
        if dropped:
            return self.marker(value, "items", kept={tag: rendered}, dropped=dropped)
        return {tag: rendered}

    def instance(self, value: object, depth: int, path: str) -> object:
        attrs = instance_attributes(value)
        if attrs is None:
            return {"$repr": {"type": type_name(value), "repr": bounded_repr(value)}}
        out: dict[str, object] = {}
        for key, item in attrs[:RENDER_MAX_ITEMS]:
            self.spend(len(key))
            out[key] = self.render(item, depth + 2, f"{path}.{key}" if path else key)
        body: dict[str, object] = {"type": type_name(value), "attrs": out}
        if len(attrs) > RENDER_MAX_ITEMS:
            self.truncated = True
            body["dropped"] = len(attrs) - RENDER_MAX_ITEMS
        return {"$object": body}


def instance_attributes(value: object) -> list[tuple[str, object]] | None:
    """The non-dunder attributes of an instance: its ``__dict__`` (read through
    ``object``'s descriptor, so a hostile ``__getattribute__`` is not called) plus
    ``__slots__`` values; None when it has neither (a builtin or C type)."""
    found: list[tuple[str, object]] = []
    seen: set[str] = set()
    try:
        attrs = object.__getattribute__(value, "__dict__")
    except Exception:  # noqa: BLE001 - no __dict__, or a hostile descriptor
        attrs = None
    has_state = isinstance(attrs, dict)
    if has_state:
        for key, item in list(dict.items(attrs)):
            if type(key) is str and not (key.startswith("__") and key.endswith("__")):
                found.append((key, item))
                seen.add(key)
    try:
        mro = type.__dict__["__mro__"].__get__(type(value))
    except Exception:  # noqa: BLE001
        mro = ()
    for klass in mro:
        slots = type.__dict__["__dict__"].__get__(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        try:
            names = [s for s in slots if isinstance(s, str)]
        except Exception:  # noqa: BLE001
            names = []
        for name in names:
            if name in seen or (name.startswith("__") and name.endswith("__")):
                continue
            has_state = True
            try:
                item = object.__getattribute__(value, name)
            except Exception:  # noqa: BLE001, S112 - an unset slot
                continue
            found.append((name, item))
            seen.add(name)
    return found if has_state else None


def _sort_key(item: object) -> str:
    try:
        return _json_text(item, sort_keys=True, spaced=True)
    except (TypeError, ValueError, RecursionError):
        return "\uffff"


def render(value: object) -> tuple[object, bool]:
    """The rendering of ``value`` (module docstring) and whether anything was cut.
    Never raises for a hostile value (its ``repr`` or attribute access failing gives a
    ``$repr`` placeholder); ``MemoryError`` propagates."""
    renderer = _Renderer()
    try:
        out = renderer.render(value, 0, "")
    except RecursionError:
        renderer.truncated = True
        out = {"$truncated": {"type": type_name(value), "reason": "depth", "repr": ""}}
    return out, renderer.truncated
