"""What :mod:`sandpit.executor.fake` derives from a registered environment on the host:
tool schemas from a tool's signature and docstring, and the state encoding of a value.

A sandbox derives both from live objects inside the sandbox (``sandbox_images/runner``:
``child_schemas``, ``child_render``, ``child_session.encode_value``), and the host never
imports that code. The fake only ever sees *test code* (tools written as Python
functions over a state dict, their values), never the source it is given, and needs the
same shapes for the common cases, so it has its own small versions of the sandbox's rules:

* :func:`describe_tools`: one OpenAI function schema per tool, in registration order:
  ``description`` is the docstring's summary (the text before its first Google section,
  whitespace collapsed, at most MAX_DESCRIPTION_CHARS), ``parameters`` the tool's keyword
  parameters after its first (the state): ``type`` from the annotation (str, int, float,
  bool, None, list/tuple/set, dict and ``X | None``; anything else gets no ``type``), the
  ``Args:`` text (continuation lines joined) as ``description``, a JSON-native default as
  ``default``, parameters without a default ``required``, ``additionalProperties`` true
  with ``**kwargs``.
  At most MAX_TOOLS tools (:class:`TooManyTools`).
* :func:`encode_value`: ``["j", value]`` for a JSON-native value (``wire.json_native``),
  else ``["p", base64 pickle, rendering]`` when it pickles (``pickle.dumps`` only: the host
  never unpickles) or ``["u", rendering]``; the rendering uses the sandbox's tags for sets,
  tuples, bytes, dates and times, decimals, non-finite floats, dicts with non-str keys and
  objects with attributes, and ``$repr`` for the rest (no truncation markers).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import inspect
import json
import math
import pickle
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from sandpit.sandbox_images.runner import limits, wire

_SECTION = re.compile(r"^\s*(args|arguments|parameters|params|returns?|yields?|raises?|examples?|notes?)\s*:\s*$", re.I)
_ARG = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_TYPES: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
                             list: "array", tuple: "array", set: "array", frozenset: "array", dict: "object"}
_REPR_CHARS = limits.RENDER_MAX_REPR_CHARS


class TooManyTools(ValueError):
    """More tools than ``limits.MAX_TOOLS`` (the sandbox's ``SchemaLimitError``)."""


def describe_tools(tools: dict[str, Callable[..., object]]) -> list[dict[str, Any]]:
    """The OpenAI function schemas of ``tools`` (name -> function whose first parameter is
    the state), as the module docstring says. Raises :class:`TooManyTools`."""
    if len(tools) > limits.MAX_TOOLS:
        raise TooManyTools(f"the class has more than {limits.MAX_TOOLS} public methods; "
                           f"at most {limits.MAX_TOOLS} tools can be described")
    return [_schema(name, tool) for name, tool in tools.items() if wire.is_tool_name(name)]


def _schema(name: str, tool: Callable[..., object]) -> dict[str, Any]:
    summary, documented = _docstring(inspect.getdoc(tool) or "")
    hints = typing.get_type_hints(tool)
    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    extra = False
    for parameter in list(inspect.signature(tool).parameters.values())[1:]:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue
        schema: dict[str, Any] = {}
        kind = _type(hints.get(parameter.name))
        if kind is not None:
            schema["type"] = kind
        schema["description"] = documented.get(parameter.name, "")
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
        elif wire.json_native(parameter.default):
            schema["default"] = parameter.default
        properties[parameter.name] = schema
    return {"type": "function", "function": {
        "name": name, "description": summary,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": extra}}}


def _type(annotation: object) -> str | None:
    """The JSON type of an annotation, ``X | None`` as X; None when there is no one type."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _type(members[0]) if len(members) == 1 else None
    return _TYPES.get(typing.get_origin(annotation) or annotation)


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(summary, {parameter: description})`` of a Google-style docstring."""
    summary: list[str] = []
    documented: dict[str, str] = {}
    section = last = None
    item_indent = 0
    for line in doc.splitlines():
        heading = _SECTION.match(line)
        if heading:
            section, last = heading.group(1).lower(), None
            continue
        indent = len(line) - len(line.lstrip())
        item = _ARG.match(line)
        if section is None:
            summary.append(line)
        elif section not in ("args", "arguments", "parameters", "params"):
            continue
        elif item and (last is None or indent <= item_indent):
            last, item_indent = item.group(1), indent
            documented[last] = item.group(2).strip()
        elif last is not None and line.strip():  # an indented continuation line
            documented[last] = f"{documented[last]} {line.strip()}".strip()
    return " ".join(" ".join(summary).split())[:limits.MAX_DESCRIPTION_CHARS], documented


def encode_value(value: object) -> list[Any]:
    """The encoded entry of ``value`` (module docstring); JSON-native values are copied
    through JSON, so the entry shares nothing with ``value``."""
    if wire.json_native(value):
        return ["j", json.loads(json.dumps(value))]
    try:
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - locks, generators, modules...: not restorable
        return ["u", render(value)]
    return ["p", base64.b64encode(blob).decode("ascii"), render(value)]


def render(value: object, depth: int = 0) -> Any:
    """The JSON rendering of ``value`` with the sandbox's tags (module docstring)."""
    if wire.json_native(value) or depth > limits.RENDER_MAX_DEPTH:
        return value if wire.json_native(value) else _repr(value)
    if isinstance(value, (set, frozenset)):
        items = sorted((render(item, depth + 1) for item in value), key=lambda r: json.dumps(r, sort_keys=True))
        return {"$frozenset" if isinstance(value, frozenset) else "$set": items}
    if isinstance(value, (list, tuple)):
        items = [render(item, depth + 1) for item in value]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes" if isinstance(value, bytes) else "$bytearray": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        tag = "$datetime" if isinstance(value, datetime.datetime) else "$date" if isinstance(value, datetime.date) \
            else "$time"
        return {tag: value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": str(value)}
    if isinstance(value, dict):
        if all(type(key) is str for key in value) and not wire.is_tag(value):
            return {key: render(item, depth + 1) for key, item in value.items()}
        return {"$dict": [[render(key, depth + 1), render(item, depth + 1)] for key, item in value.items()]}
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(value, type):
        return {"$object": {"type": _type_name(value), "attrs": {
            key: render(item, depth + 1) for key, item in attrs.items() if not key.startswith("__")}}}
    return _repr(value)


def _repr(value: object) -> dict[str, Any]:
    return {"$repr": {"type": _type_name(value), "repr": wire.bounded_repr(value, _REPR_CHARS)}}


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
