"""Tool-call parsing and checking against an environment's tool schemas.

A step names a tool and gives arguments, either directly or as an OpenAI tool call whose
``arguments`` is a JSON string (chat-completions). The arguments must be a JSON object of
at most ``max_arguments_bytes``; the tool must be one of the environment's derived tools;
and when the tool has a parameters schema, the arguments must satisfy it (JSON Schema,
checked with ``jsonschema``). Violations are :class:`InvalidRequest`/:class:`UnknownTool`
(422) or :class:`PayloadTooLarge` (413), raised before anything reaches a sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.validators import Draft202012Validator

from .errors import InvalidRequest, PayloadTooLarge, UnknownTool
from .schemas import StepRequest
from .strict_json import strict_loads


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: ``name`` and keyword ``arguments``."""

    name: str
    arguments: dict[str, Any]


def text_size(text: str) -> int:
    """UTF-8 size of ``text`` in bytes (lone surrogates count as 3 bytes, never fail)."""
    return len(text.encode("utf-8", "surrogatepass"))


def json_size(value: Any) -> int:
    """Compact JSON size of ``value`` in bytes."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def parse_step(request: StepRequest, max_arguments_bytes: int, max_depth: int,
               check_size: Callable[[int], None] | None = None) -> ToolCall:
    """The tool call in a step request (either form). ``check_size(bytes)``, when given,
    sees the arguments' compact JSON size once it is within ``max_arguments_bytes`` (the
    route's per-tenant quota). Raises InvalidRequest / PayloadTooLarge, or what
    ``check_size`` raises."""
    if request.function is not None:
        name, raw = request.function.name, request.function.arguments
        field = "function.arguments"
        if isinstance(raw, str):
            if text_size(raw) > max_arguments_bytes:
                raise PayloadTooLarge(f"arguments over {max_arguments_bytes} bytes", field=field)
            try:
                arguments = strict_loads(raw.encode("utf-8", "surrogatepass") or b"{}", max_depth)
            except InvalidRequest as exc:
                raise InvalidRequest(f"{field}: {exc.message}", field=field) from None
        else:
            arguments = raw
    else:
        assert request.name is not None
        name, arguments, field = request.name, request.arguments, "arguments"
        if arguments is None:
            arguments = {}
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"{field} must be a JSON object, got {type(arguments).__name__}", field=field)
    size = json_size(arguments)
    if size > max_arguments_bytes:
        raise PayloadTooLarge(f"arguments over {max_arguments_bytes} bytes", field=field)
    if check_size is not None:
        check_size(size)
    return ToolCall(name, arguments)


class ToolSet:
    """The tools of one environment, with compiled argument validators."""

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, Draft202012Validator | None] = {}
        for tool in tools:
            function = tool.get("function", {}) if isinstance(tool, dict) else {}
            name = function.get("name")
            if isinstance(name, str):
                self.schemas[name] = function
                self._validators[name] = self._compile(function.get("parameters"))

    @staticmethod
    def _compile(parameters: Any) -> Draft202012Validator | None:
        if not isinstance(parameters, dict):
            return None
        try:
            Draft202012Validator.check_schema(parameters)
        except jsonschema.SchemaError:
            return None  # a schema we cannot use: the sandbox still checks the call
        return Draft202012Validator(parameters)

    def check(self, call: ToolCall) -> None:
        """Raise :class:`UnknownTool` or :class:`InvalidRequest` unless ``call`` fits."""
        if call.name not in self.schemas:
            raise UnknownTool(f"unknown tool {call.name[:128]!r}; tools: {', '.join(sorted(self.schemas)) or 'none'}",
                              field="name")
        validator = self._validators[call.name]
        if validator is None:
            return
        required = set(self.schemas[call.name].get("parameters", {}).get("required", []))
        # an explicit null for an optional parameter (``Optional[X] = None``) is what
        # models send for "not given": checked as absent, passed through as given
        arguments = {k: v for k, v in call.arguments.items() if v is not None or k in required}
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path)
            field = "arguments" + (f".{where}" if where else "")
            raise InvalidRequest(f"{field}: {error.message[:500]}", field=field)
