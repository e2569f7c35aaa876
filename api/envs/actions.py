"""Actions: what a step asks for, parsed as EnvScaler parses an agent's output.

A step request carries one action in one of three forms:

* ``{"name", "arguments"}``;
* an OpenAI tool call ``{"type": "function", "function": {"name", "arguments": "<json>"}}``
  (``arguments`` as chat-completions emits it: a JSON string; an object is accepted too);
* ``{"text": "<raw model output>"}`` in the prompt (non-function-calling) format EnvScaler's
  RL training parses: an optional ``<think>...</think>`` block, then either one
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the first one counts) or
  plain text, which is a reply to the user: the action ``chat_with_user(content=text)``.

Parsing never refuses an action: a malformed one becomes an :class:`Action` with
``problem`` set, which the step records as ``rejected`` with EnvScaler's observation
(:data:`PARSE_FAILED` when the output or its arguments could not be parsed into a call,
:data:`INVALID_ACTION` when the call names no tool of the environment or has arguments
that are not an object) and the reason in the step's ``info.error``. Only what is not a
step at all is an HTTP error: arguments over ``max_arguments_bytes`` (413) or the
tenant's quota (429); the body's shape is the route's (422).

:class:`ToolSet` compares a call with the tool's derived JSON schema. By default nothing
is enforced (EnvScaler calls ``getattr(env, name)(**arguments)`` and Python decides);
``argument_checking`` ``warn`` reports the findings with the step and ``strict`` rejects
the call (:mod:`sandpit.api.envs.steps`). :class:`ToolSets` keeps them compiled per
environment.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import jsonschema
from cachetools import LRUCache
from jsonschema.validators import Draft202012Validator

from ..errors import InvalidRequest, PayloadTooLarge
from ..json_rules import json_size, strict_loads, text_size
from ..schemas.envs import StepRequest

PARSE_FAILED = "Error: Failed to parse response to action"
"""EnvScaler's observation when the agent's output is not a usable call."""
INVALID_ACTION = "Error: Invalid action"
"""EnvScaler's observation when the call names no tool or its arguments are not an object."""
RESPOND_ACTION = "chat_with_user"
"""The action a plain-text reply stands for (EnvScaler's respond action)."""
MAX_NAME_CHARS = 64
"""Longest tool name (OpenAI's limit); a longer name is no tool."""
MAX_STORED_NAME_CHARS = 256
"""A rejected call's name is recorded cut to this many characters."""
MAX_FINDINGS = 16
"""Most argument-schema findings reported for one call."""
THINK = re.compile(r"(?:<|@)think(?:>|@)\s*(.*?)(?:<|@)/think(?:>|@)", re.DOTALL | re.IGNORECASE)
"""A complete ``<think>...</think>`` block (EnvScaler's pattern; ``@think@`` too)."""
THINK_OPEN = re.compile(r"(?:<|@)think(?:>|@)", re.IGNORECASE)
"""An opening ``<think>`` tag (with no closing one, the output does not parse)."""
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
"""A ``<tool_call>`` block holding a JSON object (EnvScaler's pattern; the first one counts)."""


@dataclass(frozen=True)
class ToolCall:
    """A well-formed tool call: ``name`` and keyword ``arguments``."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Action:
    """A parsed action. Well-formed when ``problem`` is None (then ``arguments`` is an
    object); otherwise ``problem`` is the observation to record (:data:`PARSE_FAILED` or
    :data:`INVALID_ACTION`) and ``error`` says why. ``name``/``arguments`` are what to
    record (text made valid UTF-8, the name cut to :data:`MAX_STORED_NAME_CHARS`)."""

    name: str
    arguments: Any
    problem: str | None = None
    error: str | None = None
    reasoning: str | None = None
    """The ``<think>`` block of a text action, if any."""
    extra: dict[str, Any] = field(default_factory=dict)
    request: StepRequest | None = field(default=None, compare=False, repr=False)
    """The request it was parsed from: an ``envscaler`` episode parses it again by
    EnvScaler's rules (:mod:`.envscaler`)."""

    @property
    def call(self) -> ToolCall:
        """The tool call (only for a well-formed action)."""
        assert self.problem is None and isinstance(self.arguments, dict)
        return ToolCall(self.name, self.arguments)

    def record(self) -> dict[str, Any]:
        """``{"name", "arguments"}`` as stored in the trajectory."""
        return {"name": self.name, "arguments": self.arguments}

    def rejected(self, problem: str, error: str) -> Action:
        """This action marked malformed."""
        return Action(self.name, self.arguments, problem, error, self.reasoning, request=self.request)


def valid_text(value: Any) -> tuple[Any, bool]:
    """``value`` with every string (keys too) made encodable as UTF-8 (a lone surrogate
    becomes U+FFFD), and whether it already was."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value, True
    except UnicodeEncodeError:
        pass

    def clean(item: Any) -> Any:
        if isinstance(item, str):
            return item.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        if isinstance(item, list):
            return [clean(x) for x in item]
        if isinstance(item, dict):
            return {clean(k): clean(v) for k, v in item.items()}
        return item

    return clean(value), False


def _name_problem(name: str) -> str | None:
    if not name:
        return "the call has no tool name"
    if len(name) > MAX_NAME_CHARS or not name.isidentifier():
        return f"{name[:80]!r} is not a tool name"
    if name.startswith("_"):
        return f"{name[:80]!r} is private: only public methods are tools"
    return None


def parse_text(text: str) -> tuple[str | None, Any, str | None, str | None]:
    """EnvScaler's parse of raw model output (prompt mode): ``(name, arguments, error,
    reasoning)``. A plain reply is ``("chat_with_user", {"content": text}, None, ...)``;
    an unclosed ``<think>``/``<tool_call>``, tool-call JSON that does not parse or lacks
    ``name``/``arguments``, or an empty reply give ``error``."""
    text = text.strip()
    reasoning = None
    think = THINK.search(text)
    if think:
        reasoning = think.group(1).strip()
    elif THINK_OPEN.search(text):
        return None, None, "unclosed <think> block", None
    calls = list(TOOL_CALL.finditer(text))
    if not calls:
        if "<tool_call>" in text:  # a call block that is unclosed or holds no JSON object is no reply
            closed = "</tool_call>" in text
            return None, None, "the <tool_call> holds no JSON object" if closed else "unclosed <tool_call> tag", reasoning
        content = text[think.end():].strip() if think else text
        if not content:
            return None, None, "the reply is empty", reasoning
        return RESPOND_ACTION, {"content": content}, None, reasoning
    try:
        body = json.loads(calls[0].group(1))
    except (ValueError, RecursionError) as exc:
        return None, None, f"the <tool_call> is not valid JSON: {str(exc)[:200]}", reasoning
    if not isinstance(body, dict) or "name" not in body or "arguments" not in body:
        return None, None, "the <tool_call> needs fields 'name' and 'arguments'", reasoning
    return body["name"], body["arguments"], None, reasoning


def parse_step(request: StepRequest, max_arguments_bytes: int, max_depth: int,
               check_size: Callable[[int], None] | None = None) -> Action:
    """:func:`_parse_step`, with the request kept on the action (:attr:`Action.request`)."""
    action = _parse_step(request, max_arguments_bytes, max_depth, check_size)
    object.__setattr__(action, "request", request)  # a frozen dataclass made just now: nothing shares it
    return action


def _parse_step(request: StepRequest, max_arguments_bytes: int, max_depth: int,
                check_size: Callable[[int], None] | None = None) -> Action:
    """The action of a step request (module docstring). ``check_size(bytes)``, when given,
    sees the arguments' compact JSON size once it is within ``max_arguments_bytes`` (the
    route's per-tenant quota). Malformed actions come back with ``problem`` set.

    Raises:
        PayloadTooLarge: the arguments (or the text) are over ``max_arguments_bytes``.
        whatever ``check_size`` raises (QuotaExceeded).
    """
    reasoning = None
    if request.text is not None:
        if text_size(request.text) > max_arguments_bytes:
            raise PayloadTooLarge(f"text over {max_arguments_bytes} bytes", field="text")
        name, arguments, error, reasoning = parse_text(request.text)
        if error is not None:
            text, _ = valid_text(request.text[:2000])
            return Action("", {"text": text}, PARSE_FAILED, error, reasoning)
        raw_field = "text"
    elif request.function is not None:
        name, arguments, raw_field = request.function.name, request.function.arguments, "function.arguments"
        if isinstance(arguments, str):
            if text_size(arguments) > max_arguments_bytes:
                raise PayloadTooLarge(f"arguments over {max_arguments_bytes} bytes", field=raw_field)
            try:
                arguments = strict_loads(arguments.encode("utf-8", "surrogatepass") or b"{}", max_depth)
            except InvalidRequest as exc:
                stored, _ = valid_text(request.function.arguments[:2000])
                return Action(_stored_name(name), stored, PARSE_FAILED,
                              f"function.arguments is not valid JSON: {exc.message}")
    else:
        name, arguments, raw_field = request.name, request.arguments, "arguments"
        if arguments is None:
            arguments = {}
    if not isinstance(name, str):
        stored, _ = valid_text(arguments)
        return Action(_stored_name(str(name)), stored, PARSE_FAILED, "the tool name is not a string", reasoning)
    size = json_size(arguments)
    if size > max_arguments_bytes:
        raise PayloadTooLarge(f"arguments over {max_arguments_bytes} bytes", field=raw_field)
    if check_size is not None:
        check_size(size)
    stored_name, name_ok = valid_text(_stored_name(name))
    stored_args, args_ok = valid_text(arguments)
    action = Action(stored_name, stored_args, reasoning=reasoning)
    if not isinstance(arguments, dict):
        return action.rejected(PARSE_FAILED, f"arguments must be a JSON object, got {type(arguments).__name__}")
    if not name_ok or not args_ok:
        return action.rejected(INVALID_ACTION, "the call contains text that is not valid Unicode (a lone surrogate)")
    problem = _name_problem(name)
    if problem is not None:
        return action.rejected(INVALID_ACTION, problem)
    return action


def _stored_name(name: str) -> str:
    return name[:MAX_STORED_NAME_CHARS]


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
            return None  # a schema we cannot use: Python decides
        return Draft202012Validator(parameters)

    def __contains__(self, name: object) -> bool:
        return name in self.schemas

    def unknown(self, name: str) -> str:
        """Why ``name`` is not a tool (for a rejected step's ``info.error``)."""
        return f"unknown tool {name[:128]!r}; tools: {', '.join(sorted(self.schemas)) or 'none'}"

    def findings(self, call: ToolCall) -> list[str]:
        """How ``call.arguments`` do not fit the tool's derived schema (empty when they
        do, or when the tool has no usable schema): at most :data:`MAX_FINDINGS` messages
        like ``arguments.amount: '5' is not of type 'integer'``. An explicit null for an
        optional parameter counts as absent (``Optional[X] = None``)."""
        validator = self._validators.get(call.name)
        if validator is None:
            return []
        required = set(self.schemas[call.name].get("parameters", {}).get("required", []))
        arguments = {k: v for k, v in call.arguments.items() if v is not None or k in required}
        out = []
        for error in sorted(validator.iter_errors(arguments), key=jsonschema.exceptions.relevance)[:MAX_FINDINGS]:
            where = ".".join(str(p) for p in error.absolute_path)
            out.append(f"arguments{'.' + where if where else ''}: {error.message[:300]}")
        return out


ArgumentChecking = Literal["off", "warn", "strict"]


class _Tooled(Protocol):
    id: str
    tools: list[dict[str, Any]]


TOOLSETS = 4096
"""Environments whose compiled tools :class:`ToolSets` keeps."""


class ToolSets:
    """Environment id -> its :class:`ToolSet`, compiled once and kept for the last
    :data:`TOOLSETS` environments used (a ``cachetools.LRUCache`` behind a lock; an
    environment is immutable once registered, so an entry never goes stale). Thread-safe."""

    def __init__(self, max_entries: int = TOOLSETS) -> None:
        self._toolsets: LRUCache[str, ToolSet] = LRUCache(max_entries)
        self._lock = threading.Lock()

    def of(self, environment: _Tooled) -> ToolSet:
        """The environment's derived tools with compiled argument validators: what the
        class accepts, whatever the agent is shown."""
        with self._lock:
            toolset = self._toolsets.get(environment.id)
        if toolset is None:
            toolset = ToolSet(environment.tools)
            with self._lock:
                self._toolsets[environment.id] = toolset
        return toolset
