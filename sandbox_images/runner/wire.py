"""The rules and texts that the host, PID 1 and the child processes all apply.

Stdlib only, no state. Imported by the host (``sandpit.sandbox_images.runner.wire``:
``executor/``, ``api/``) and, in the sandbox, by PID 1 and by the processes that run
untrusted code: so its functions use their own copy of the builtins, taken before any such
code runs, and never call back into values they are given except through ``str``/``repr``
where a text is the point (:func:`error_observation`, :func:`bounded_repr`).

One definition each, so that a rule checked on one side of the sandbox boundary and
applied on the other cannot drift apart:

* **state encoding**: :func:`is_encoded_entry` (what an attribute of an encoded state may
  be), :func:`check_delta` (the shape of state changes), :func:`json_native` (which values
  are sent as ``["j", value]``), :func:`is_tag` (the ``$`` tags of a rendering,
  ``child_render.py``);
* **tool schemas**: :data:`TOOL_NAME_PATTERN` / :func:`is_tool_name` (a tool's name),
  :data:`JSON_TYPES` (the ``type`` keywords a schema may use);
* **JSON frames and bodies**: :func:`depth_exceeds` (nesting depth, without recursion),
  :func:`state_text_field` (a state the host sends as base64 of its JSON text);
* **texts**: :func:`error_observation` (EnvScaler's ``Error: <Type>: <message>``),
  :func:`cap_observation`, :data:`ENVSCALER_INVALID_ACTION`, :data:`ENVSCALER_TOOL_ERROR`,
  :func:`call_failure_observation` (PID 1's words for a call that timed out, ran out of
  memory or crashed), and EnvScaler's verdict of a check's returned value
  (:func:`classify`, :func:`bounded_repr`);
* **check results**: :func:`check_result` (one check's result as a check process sends
  it to its zygote and the zygote to PID 1, validated and capped).
"""

from __future__ import annotations

import binascii
import builtins
import re

from .limits import (
    CHECK_RESULT_TEXT_CAPS,
    ERROR_CHARS,
    JSON_NATIVE_MAX_DEPTH,
    MAX_NAME_CHARS,
    RESULT_REPR_CHARS,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping  # annotations only: never evaluated in the sandbox
    from typing import Any, TypedDict

    Delta = TypedDict("Delta", {"set": dict[str, list[Any]], "del": list[str]})
    """State changes: ``set`` attribute name -> encoded entry (or, in a call's delta, a keyed
    change ``["k", changes]``, ``protocol.apply_keyed``); ``del`` names of deleted attributes."""

    class CheckFields(TypedDict):
        """One check's result as :func:`check_result` rebuilds it (``protocol.CheckResult``
        adds the check's output)."""

        status: str
        passed: bool
        result: str | None
        error: str | None
        traceback: str | None
        duration_ms: float

__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


# -- state encoding --------------------------------------------------------------------------
def is_encoded_entry(entry: object) -> bool:
    """One attribute of an encoded state: ``["j", value]``, ``["p", base64]``, ``["p",
    base64, rendering]`` or ``["u", rendering]`` (``child_session.py``); nothing else."""
    if not isinstance(entry, list) or not entry:
        return False
    kind = entry[0]
    if kind == "j" or kind == "u":
        return len(entry) == 2
    return kind == "p" and len(entry) in (2, 3) and isinstance(entry[1], str)


def check_delta(delta: object, keyed: bool = True) -> Delta | None:
    """``delta`` when it is state changes in shape: a dict whose ``set`` (default empty)
    maps names to encoded entries (:func:`is_encoded_entry`) or, with ``keyed``, to keyed
    changes ``["k", changes]`` (their content is checked when they are applied), and whose
    ``del`` (default empty) is a list of names; returned with both keys. None otherwise."""
    if type(delta) is not dict:
        return None
    sets, dels = delta.get("set", {}), delta.get("del", [])
    if type(sets) is not dict or type(dels) is not list or not all(type(name) is str for name in dels):
        return None
    for entry in sets.values():
        if not is_encoded_entry(entry) and not (keyed and type(entry) is list and len(entry) == 2
                                                 and entry[0] == "k"):
            return None
    return {"set": sets, "del": dels}


def json_native(value: object, depth: int = 0) -> bool:
    """True when ``value`` round-trips through JSON with exact types and reads back as
    itself in a rendering, so it is encoded as ``["j", value]``: str, int, bool, None,
    finite floats, lists, dicts with str keys; no dict with a single ``$`` key (it would
    read as a tag, :func:`is_tag`); at most JSON_NATIVE_MAX_DEPTH levels counting from
    ``depth`` (the level ``value`` sits at inside its attribute). Iterative: a deep or
    cyclic value gives False, never RecursionError."""
    stack: list[tuple[Any, int]] = [(value, depth)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is float:
            if item != item or item in (float("inf"), float("-inf")):
                return False
            continue
        if depth >= JSON_NATIVE_MAX_DEPTH:
            return False
        if kind is dict:
            if len(item) == 1:
                key = next(iter(item))
                if type(key) is str and key.startswith("$"):
                    return False
            for key, sub in item.items():
                if type(key) is not str:
                    return False
                stack.append((sub, depth + 1))
            continue
        if kind is list:
            stack.extend((sub, depth + 1) for sub in item)
            continue
        return False
    return True


def is_tag(value: object) -> bool:
    """True when ``value`` (a rendering) is a tag: a one-key dict whose key starts with ``$``."""
    if type(value) is not dict or len(value) != 1:
        return False
    key = next(iter(value))
    return type(key) is str and key.startswith("$")


# -- tool schemas ----------------------------------------------------------------------------
TOOL_NAME_PATTERN = rf"[A-Za-z][A-Za-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}"
"""A tool's name, matched whole: a public method name that is a valid OpenAI function name
(``^[a-zA-Z0-9_-]{1,64}$``)."""
JSON_TYPES = ("string", "integer", "number", "boolean", "null", "array", "object")
"""The ``type`` keywords a derived tool schema uses."""


def is_tool_name(name: object) -> bool:
    """True when ``name`` is a string matching :data:`TOOL_NAME_PATTERN` whole. The
    pattern is compiled on first use (``re``'s cache), not when this module is imported."""
    return isinstance(name, str) and re.fullmatch(TOOL_NAME_PATTERN, name) is not None


# -- nesting depth ---------------------------------------------------------------------------
_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
"""A complete JSON string literal, escapes included (left to right, as the exact scan
opens and closes strings; a backslash outside a string is skipped by both). Written so
that every way to match is the same one: a string that never ends costs one pass, where
``"(?:[^"\\]+|\\.)*"`` backtracks exponentially."""


def depth_exceeds(payload: bytes, limit: int) -> bool:
    """True when the JSON text ``payload`` nests arrays and objects deeper than ``limit``
    levels (brackets inside strings do not count).

    Never recurses. Bytes operations (in C) first: string literals cut out by one regular
    expression (escapes honoured only inside strings), or, when no backslash is followed
    by a quote, by splitting at quotes (an escape then never decides whether a quote ends
    a string: the byte it escapes is not a quote, so the cut is the same), everything but
    brackets removed, then each ``replace(b"()", b"")`` pass
    peels one nesting level; only a payload still holding brackets after ``limit`` passes
    (deeper, or unbalanced, or with a string that never ends) gets the exact byte-by-byte
    scan, which decides. So a malformed text that is not deeper gives False and keeps its
    own parse error. A 3 MB text without escaped quotes takes ~30 ms at 0.5 CPU instead of
    ~200 ms for the scan alone (the regular expression about twice as long)."""
    if payload.count(b"[") + payload.count(b"{") <= limit:
        return False
    if b'\\"' in payload:
        outside = re.sub(_STRING, b"", payload, flags=re.DOTALL)  # an unterminated string stays
    else:
        outside = b"".join(payload.split(b'"')[::2])
    brackets = outside.translate(_PARENS, _NOT_BRACKETS)
    for _ in range(limit):
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
    return bool(brackets) and _scan_exceeds(payload, limit)


def _scan_exceeds(payload: bytes, limit: int) -> bool:
    """The exact linear scan behind :func:`depth_exceeds`: counts brackets outside strings."""
    depth = 0
    in_string = False
    escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte == 0x5B or byte == 0x7B:
            depth += 1
            if depth > limit:
                return True
        elif byte == 0x5D or byte == 0x7D:
            depth -= 1
    return False


def state_text_field(msg: Mapping[str, object], field: str) -> bytes:
    """The bytes of ``msg[field]`` when it is strict base64 text (the standard alphabet,
    padded, nothing else) of what is a JSON object's text on its face (``{`` to ``}``):
    how the host sends a state (a check batch's two, a restore's or an open's snapshot)
    that PID 1 forwards to a process without parsing it (``protocol.encode_raw``: the host
    vouches that it is JSON; the process parses it). Raises ValueError naming ``field``
    when it is missing or anything else."""
    value = msg.get(field)
    if isinstance(value, str):
        try:
            data = binascii.a2b_base64(value, strict_mode=True)
        except (binascii.Error, ValueError):  # ValueError: text that is not ASCII
            data = b""
        if data.startswith(b"{") and data.endswith(b"}"):
            return data
    raise ValueError(f"field '{field}' must be the base64 of an encoded state's JSON text")


# -- texts -----------------------------------------------------------------------------------
ENVSCALER_INVALID_ACTION = "Error: Invalid action"
"""EnvScaler's observation for an action ``hasattr`` does not find (``check_vaild_action``)."""
ENVSCALER_TOOL_ERROR = "Error: <Exception>\n"
"""What EnvScaler's ``step()`` puts before the traceback of a tool that raised."""


def error_observation(exc: BaseException, limit: int | None = None) -> str:
    """EnvScaler's observation of an exception: ``Error: <Type>: <message>`` (``Error:
    <Type>`` for an empty message, ``<unprintable exception>`` when ``str`` raises), cut
    to ``limit`` characters when one is given."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__
        message = "<unprintable exception>"
    text = f"Error: {type(exc).__name__}: {message}" if message else f"Error: {type(exc).__name__}"
    return text if limit is None else text[:limit]


def cap_observation(text: str, limit: int) -> tuple[str, bool]:
    """``(text, False)``, or its first ``limit`` characters with a marker and True."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n...[truncated {len(text) - limit} characters]", True


def call_failure_observation(status: str, timeout_s: float, note: str = "") -> str:
    """PID 1's observation of a call whose session process failed: ``status`` ``timeout``
    (past ``timeout_s`` seconds), ``oom`` or ``crashed`` (``note`` says how, when known)."""
    if status == "timeout":
        return f"Error: tool call exceeded the {timeout_s:g} s time limit"
    if status == "oom":
        return "Error: session ran out of memory"
    return "Error: session process died" + (f" ({note})" if note else "")


def bounded_repr(value: object, limit: int = RESULT_REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters (plus ``...``); a hostile ``__repr__``
    that raises gives ``<unrepresentable T: E>``, one returning a str subclass its plain
    text."""
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    if type(text) is not str:  # a str subclass from a hostile __repr__
        text = str.__str__(text) if isinstance(text, str) else "<unrepresentable>"
    return text if len(text) <= limit else text[:limit] + "..."


def classify(value: object) -> tuple[str, bool, str | None]:
    """EnvScaler ``calculate_reward`` on one check's returned value: ``(status, passed,
    error)``. Only ``True`` itself passes; ``False`` is a clean failure; anything else
    (``1``, ``"yes"``, ``None``, a bool subclass) is an ``error`` naming what came back
    (at most ERROR_CHARS characters)."""
    if value is True:
        return "ok", True, None
    if value is False:
        return "ok", False, None
    if value is None:
        return "error", False, "returned None, not a bool"
    return "error", False, f"returned {type(value).__name__} {bounded_repr(value, 200)}, not a bool"[:ERROR_CHARS]


# -- check results ---------------------------------------------------------------------------
CHECK_STATUSES = ("ok", "error", "rejected", "oom", "crashed")
"""The statuses of one check's result; a check process itself never reports ``crashed``."""


def check_result(message: object, statuses: tuple[str, ...] = CHECK_STATUSES) -> CheckFields | None:
    """One check's result fields from an untrusted frame, rebuilt with exact types and
    capped: ``{"status", "passed", "result", "error", "traceback", "duration_ms"}``, where
    ``status`` is one of ``statuses``, ``passed`` a bool (True only with ``ok``),
    ``duration_ms`` a number from 0 to 1e9, and each text None or a string cut to its
    CHECK_RESULT_TEXT_CAPS. None when the frame is anything else."""
    if type(message) is not dict or message.get("status") not in statuses:
        return None
    passed, duration = message.get("passed"), message.get("duration_ms")
    if type(passed) is not bool or not (type(duration) is int or type(duration) is float) or not 0 <= duration < 1e9:
        return None
    texts: dict[str, str | None] = {}
    for name, cap in CHECK_RESULT_TEXT_CAPS.items():
        value = message.get(name)
        if value is not None and type(value) is not str:
            return None
        texts[name] = value[:cap] if value is not None else None
    status = message["status"]
    return {"status": status, "passed": passed and status == "ok", "result": texts["result"],
            "error": texts["error"], "traceback": texts["traceback"], "duration_ms": float(duration)}
