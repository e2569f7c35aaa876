"""Result and state models exchanged with callers of the executor.

State encoding (per attribute of the environment instance; EnvScaler ``get_state_info``:
``vars(instance)`` without dunder keys): ``["j", <JSON value>]`` exact JSON-native value;
``["p", <base64>, <rendering>]`` a pickle, decoded only inside a sandbox, plus its JSON
rendering made in the sandbox (``sandbox_images/runner/child_render.py``); ``["u", <rendering>]``
not picklable (not restorable; the attribute keeps what instantiation produced). Stored
states written before renderings existed may hold ``["p", <base64>]`` and ``["u", <repr
string>]``. :func:`render_state` turns an encoded state into the one JSON view every
reader sees (``GET /state``, ``include=state``, diffs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sandpit.sandbox_images.runner import limits, wire
from sandpit.sandbox_images.runner.protocol import ProtocolViolation, apply_keyed

from .errors import SessionError

Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "oom", "crashed", "rejected")
EncodedValue = list[Any]
CallRules = Literal["sandpit", "envscaler"]
"""Whose rules a tool call follows in the sandbox: ``sandpit`` (only public methods are
tools; a raised exception is ``Error: <Type>: <message>``) or ``envscaler`` (EnvScaler's
``step()``: ``hasattr`` decides, a raised exception is ``Error: <Exception>\n`` and the
traceback; ``sandbox_images/runner/child_session.py``)."""
ENVSCALER_INVALID_ACTION = wire.ENVSCALER_INVALID_ACTION
"""The observation of a call under ``envscaler`` rules that names nothing of the instance
(the session's own text, for a name the host refuses before asking it)."""


def check_encoded(mapping: object, what: str) -> dict[str, EncodedValue]:
    """Validate an encoded-state mapping received from a sandbox (nothing it sends is
    trusted). Raises :class:`ProtocolViolation` on any malformed entry."""
    if not isinstance(mapping, dict):
        raise ProtocolViolation(f"{what} is not an object")
    for key, entry in mapping.items():
        if not wire.is_encoded_entry(entry):
            raise ProtocolViolation(f"{what}: malformed entry for attribute {str(key)[:64]!r}")
    return mapping


def check_retyped(value: object) -> list[dict[str, str]]:
    """The ``retyped`` list of an ``init`` reply (``child_instance.retyped_attributes``:
    ``init_config`` keys that replace an attribute the constructor set to a value of
    another type), as ``[{"key", "constructed", "config"}]`` of strings: at most
    ``limits.INIT_RETYPED_MAX`` entries, each string cut to
    ``limits.INIT_RETYPED_NAME_CHARS``; malformed entries are dropped (a session can
    only misreport its own construction). Never raises."""
    if not isinstance(value, list):
        return []
    found: list[dict[str, str]] = []
    for entry in value[:limits.INIT_RETYPED_MAX]:
        if isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("key", "constructed", "config")):
            found.append({k: entry[k][:limits.INIT_RETYPED_NAME_CHARS] for k in ("key", "constructed", "config")})
    return found


def render_entry(entry: EncodedValue) -> Any:
    """The JSON view of one encoded attribute: a ``"j"`` value itself, the sandbox's
    rendering of a ``"p"``/``"u"`` value; legacy entries without a rendering show as
    ``{"$truncated": {"type": "?", "reason": "legacy", ...}}``."""
    kind = entry[0]
    if kind == "j":
        return entry[1]
    if kind == "p":
        if len(entry) == 3:
            return entry[2]
        return {"$truncated": {"type": "?", "reason": "legacy",
                               "repr": f"<pickle of {len(entry[1]) * 3 // 4} bytes, stored before renderings>"}}
    if isinstance(entry[1], str):  # legacy: a repr string
        return {"$repr": {"type": "?", "repr": entry[1]}}
    return entry[1]


def render_state(state: dict[str, EncodedValue]) -> dict[str, Any]:
    """The JSON view of an encoded state (attribute name -> :func:`render_entry`)."""
    return {name: render_entry(entry) for name, entry in state.items()}


def is_truncated(view: Any) -> bool:
    """True when a rendering holds a ``$truncated`` marker (anything was cut). Walks only
    tags' bodies and containers (iterative)."""
    stack = [view]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if len(item) == 1 and "$truncated" in item:
                return True
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
    return False


_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters"}
_PARAMETERS_KEYS = {"type", "properties", "required", "additionalProperties"}
_SCHEMA_KEYS = {"type", "description", "items", "enum", "anyOf", "default"}


def check_tool_schemas(tools: object) -> list[dict[str, Any]]:
    """Validate the tool schemas a sandbox derived (``describe``); nothing it sends is trusted.

    Accepts exactly the shape a sandbox derives (``sandbox_images/runner/child_schemas.py``): a list
    of at most ``MAX_TOOLS`` ``{"type": "function", "function": {"name", "description",
    "parameters"}}``; unique names matching ``wire.TOOL_NAME_PATTERN``; descriptions of at most
    ``MAX_DESCRIPTION_CHARS``; ``parameters`` ``{"type": "object", "properties",
    "required", "additionalProperties": bool}`` with at most ``MAX_PARAMS`` properties,
    ``required`` naming only properties; each property a schema of ``type`` (one of
    ``wire.JSON_TYPES``), ``description``, ``items``, ``enum`` (JSON scalars), ``anyOf`` and
    ``default`` (JSON of at most ``MAX_DEFAULT_CHARS``), nested at most
    ``MAX_SCHEMA_DEPTH`` deep. Returns ``tools`` unchanged.

    Raises:
        ProtocolViolation: anything else, naming the offending tool and field.
    """
    if not isinstance(tools, list):
        raise ProtocolViolation("tools is not a list")
    if len(tools) > limits.MAX_TOOLS:
        raise ProtocolViolation(f"more than {limits.MAX_TOOLS} tools")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        _keys(tool, _TOOL_KEYS, _TOOL_KEYS, where)
        if tool["type"] != "function":
            raise ProtocolViolation(f"{where}.type is not 'function'")
        function = tool["function"]
        _keys(function, _FUNCTION_KEYS, _FUNCTION_KEYS, f"{where}.function")
        name = function["name"]
        if not isinstance(name, str) or not wire.is_tool_name(name) or name in names:
            raise ProtocolViolation(f"{where}.function.name is not a valid, unique tool name")
        names.add(name)
        where = f"tool {name!r}"
        _text(function["description"], f"{where}: description")
        parameters = function["parameters"]
        _keys(parameters, _PARAMETERS_KEYS, _PARAMETERS_KEYS, f"{where}: parameters")
        properties, required = parameters["properties"], parameters["required"]
        if parameters["type"] != "object" or not isinstance(properties, dict) \
                or len(properties) > limits.MAX_PARAMS or type(parameters["additionalProperties"]) is not bool:
            raise ProtocolViolation(f"{where}: malformed parameters object")
        if (not isinstance(required, list) or len(set(map(str, required))) != len(required)
                or not all(isinstance(r, str) and r in properties for r in required)):
            raise ProtocolViolation(f"{where}: 'required' must list distinct properties")
        for param, schema in properties.items():
            if not param.isidentifier() or len(param) > limits.MAX_PARAM_NAME_CHARS:
                raise ProtocolViolation(f"{where}: parameter name {param[:64]!r} is not an identifier")
            if not isinstance(schema, dict) or "description" not in schema:
                raise ProtocolViolation(f"{where}: parameter {param!r} has no description")
            _check_schema(schema, f"{where}: parameter {param!r}", 0)
    return tools


def _keys(value: object, required: set[str], allowed: set[str], where: str) -> None:
    if not isinstance(value, dict) or not required <= value.keys() or not value.keys() <= allowed:
        raise ProtocolViolation(f"{where} must be an object with keys {sorted(required)}")


def _text(value: object, where: str) -> None:
    if not isinstance(value, str) or len(value) > limits.MAX_DESCRIPTION_CHARS:
        raise ProtocolViolation(f"{where} is not a string of at most {limits.MAX_DESCRIPTION_CHARS} characters")


def _check_schema(schema: object, where: str, depth: int) -> None:
    """One parameter schema (recursively through ``items``/``anyOf``)."""
    if depth > limits.MAX_SCHEMA_DEPTH + 1:
        raise ProtocolViolation(f"{where}: schema nested too deeply")
    _keys(schema, set(), _SCHEMA_KEYS, where)
    assert isinstance(schema, dict)
    if "type" in schema and schema["type"] not in wire.JSON_TYPES:
        raise ProtocolViolation(f"{where}: unknown type")
    if "description" in schema:
        _text(schema["description"], f"{where}: description")
    if "items" in schema:
        _check_schema(schema["items"], where, depth + 1)
    if "anyOf" in schema:
        members = schema["anyOf"]
        if not isinstance(members, list) or not 2 <= len(members) <= limits.MAX_ANY_OF:
            raise ProtocolViolation(f"{where}: malformed anyOf")
        for member in members:
            _check_schema(member, where, depth + 1)
    if "enum" in schema:
        values = schema["enum"]
        if (not isinstance(values, list) or not 1 <= len(values) <= limits.MAX_ENUM_VALUES
                or not all(v is None or type(v) in (str, int, float, bool) for v in values)
                or sum(len(v) for v in values if isinstance(v, str)) > limits.MAX_ENUM_CHARS):
            raise ProtocolViolation(f"{where}: malformed enum")
    if "default" in schema:
        try:
            size = len(json.dumps(schema["default"], allow_nan=False))
        except (TypeError, ValueError, RecursionError):
            size = limits.MAX_DEFAULT_CHARS + 1
        if size > limits.MAX_DEFAULT_CHARS:
            raise ProtocolViolation(f"{where}: default is not JSON of at most {limits.MAX_DEFAULT_CHARS} characters")


class StateDelta(BaseModel):
    """Attributes a call changed (``set``) and removed (``deleted``), as the sandbox sent
    them. An entry of ``set`` is a whole encoded value (``["j", value]``, ``["p", ...]``,
    ``["u", ...]``) or a keyed change of a large JSON value, ``["k", ops]``: path
    operations on the attribute's previous ``["j", value]`` (``protocol.apply_keyed``),
    which only the holder of that previous value can apply (:meth:`applied_to`)."""

    model_config = ConfigDict(extra="forbid")

    set: dict[str, EncodedValue] = Field(default_factory=dict)
    deleted: list[str] = Field(default_factory=list)

    def applied_to(self, previous: Callable[[str], EncodedValue | None]) -> dict[str, EncodedValue]:
        """``set`` with every keyed change resolved against ``previous(name)`` (the
        attribute's encoding before the call; None when it had none): whole entries as
        they are, keyed ones as the new ``["j", value]``. The result shares every untouched
        node with the previous value (copy on write along the changed paths), so an
        encoder that skips unchanged subtrees by identity sees only what changed.

        Raises:
            SessionError: a keyed change does not apply (malformed operations, a path
                that does not exist, a previous value that is not JSON): the sandbox sent
                a delta that does not fit the state it was given.
        """
        changed: dict[str, EncodedValue] = {}
        for name, entry in self.set.items():
            if entry[0] != "k":
                changed[name] = entry
                continue
            merged = apply_keyed(previous(name), entry[1])
            if merged is None:
                raise SessionError(f"sandbox sent a delta whose keyed change of {name[:64]!r} does not apply "
                                   "to the state it holds")
            changed[name] = merged
        return changed


class Snapshot(BaseModel):
    """Everything needed to put a session back into a state: the encoded attributes.

    JSON-serializable; opaque entries are base64 pickles that only a sandbox decodes.
    """

    model_config = ConfigDict(extra="forbid")

    attributes: dict[str, EncodedValue]


ConstructionReason = Literal[
    "restored", "templates_off", "seeded", "no_config", "source_unsuitable", "import_effects", "nondeterministic",
    "module_state", "construction_failed", "no_verdict", "leaves_process", "template_failed", "first_open",
    "building", "no_room", "other"]
"""Why a session's instance was constructed rather than forked from its config's template
(``sandbox_images/runner/pid1_verdicts.py`` documents each; ``other``: a reason this host
does not know). A bounded set: a metric may use it as a label."""
CONSTRUCTION_REASONS: tuple[str, ...] = ConstructionReason.__args__  # type: ignore[attr-defined]


class Construction(BaseModel):
    """How a session's instance was made: ``template`` (forked copy-on-write from a
    process that constructed it from the same config: no parse, no construction) or
    ``constructed`` (the source executed and the constructor called in the session's own
    process) with ``reason`` and the sandbox's ``detail`` text (at most 200 characters;
    it may quote what the environment's own code made a template report)."""

    model_config = ConfigDict(extra="forbid")

    path: Literal["template", "constructed"]
    reason: ConstructionReason | None = None
    """Set when ``path`` is ``constructed``."""
    detail: str | None = None


def check_construction(value: object) -> Construction | None:
    """The ``construction`` of an ``open`` reply as a :class:`Construction` (None when the
    sandbox gave none or it is malformed: nothing the sandbox sends is trusted; an
    unknown reason becomes ``other``, a detail is cut to 200 characters). Never raises."""
    if not isinstance(value, dict) or value.get("path") not in ("template", "constructed"):
        return None
    if value["path"] == "template":
        return Construction(path="template")
    reason = value.get("reason")
    detail = value.get("detail")
    return Construction(path="constructed", reason=reason if reason in CONSTRUCTION_REASONS else "other",
                        detail=detail[:limits.CONSTRUCTION_DETAIL_MAX_CHARS] if isinstance(detail, str) and detail else None)


class OpenedState(BaseModel):
    """The state a session opened with, as its executor reports it once
    (:meth:`~sandpit.executor.interface.ExecutorSession.take_opened`).

    ``attributes`` are the encoded attributes the sandbox reported, or None when the
    session was forked from a config template (the sandbox named the state by ``digest``
    instead of sending it: a caller that knows the state of that digest uses its own copy,
    otherwise it asks the sandbox once with ``read_state``). ``digest`` is the runner's
    SHA-256 (hex) of the state's JSON text, None when the session opened with a snapshot
    restored on top or the backend gives none; equal digests of one tenant are equal
    states (digests come from that tenant's own sandboxes). ``construction``: whether
    the instance came from a config template, and if not, why."""

    model_config = ConfigDict(extra="forbid")

    attributes: dict[str, EncodedValue] | None = None
    digest: str | None = None
    construction: Construction | None = None
    """How the instance was made (None: the backend does not say)."""
class CallResult(BaseModel):
    """Outcome of one tool call (EnvScaler step semantics).

    A tool that raises, times out or exhausts memory is a result, not an exception.
    """

    model_config = ConfigDict(extra="forbid")

    status: Status
    """ok | error (tool raised) | timeout | oom | crashed | rejected (bad name/arguments)."""
    observation: str
    """``str(result)``, or ``"Error: <Type>: <message>"``; capped by the profile."""
    duration_ms: float
    """Host-measured round trip of the call, milliseconds."""
    tool_ms: float | None = None
    """Time spent inside the tool itself (measured in the session process), milliseconds."""
    stdout: str = ""
    """What the tool printed during this call, capped at ``output_cap_bytes``."""
    stderr: str = ""
    traceback: str | None = None
    """Bounded traceback (last frames, at most 4 KiB) when the tool raised."""
    observation_truncated: bool = False
    delta: StateDelta = Field(default_factory=StateDelta)
    """Encoded state changes; empty unless status is ok or error."""
    recovered: bool = False
    """True when the session was re-opened from a state its caller kept before this call
    (its sandbox had been lost). An executor's own session never sets it (its handle
    closes with the sandbox); :class:`~sandpit.executor.recovering.RecoveringSession`
    does."""
    sandbox_lost: bool = False
    """True when the sandbox itself was lost during the call (the container died or was
    killed, the engine restarted, or the host's watchdog gave up on a runner that stopped
    answering: :class:`~sandpit.executor.errors.SandboxLost`), as opposed to the session's
    own process timing out, running out of memory or dying (the runner's verdicts)."""
    cpu_ms: float | None = None
    """On a ``timeout`` the runner gave: CPU time (user + system) the session's process
    used during the call, milliseconds (PID 1 reads ``/proc/<pid>/schedstat`` when it
    sends the call and when it stops it); None otherwise or where the kernel gives none."""
    wait_ms: float | None = None
    """On a ``timeout`` the runner gave: time the session's process was runnable but
    waiting for a CPU during the call (``schedstat``'s run-queue delay, which includes
    time throttled by the sandbox's own CPU quota), milliseconds; None as ``cpu_ms``."""
    starved: bool = False
    """The platform held the call up, not the environment's code (decided by the executor's
    session): a ``timeout`` that :func:`starved` of ``cpu_ms``/``wait_ms``, the call's time
    limit and the profile's ``cpus`` calls starved, or a ``crashed`` call whose new session
    process did not start within ``session_startup_s`` (the runner's ``not_started``)."""


STARVED_WAIT_SHARE = 0.25
"""A timed-out call whose process waited this share of its time limit for a CPU beyond
what its own quota explains, while using less than half the CPU the quota allowed, was
starved (:func:`starved`)."""


def starved(cpu_ms: float | None, wait_ms: float | None, limit_s: float, cpus: float) -> bool:
    """Whether a call stopped at its time limit (``limit_s`` seconds) was starved of CPU
    by the platform rather than held up by its own code. ``cpu_ms`` and ``wait_ms`` are
    the runner's measurements of the call (:attr:`CallResult.cpu_ms`, ``wait_ms``);
    ``cpus`` is the sandbox's CPU quota (the profile's). A single-threaded process under a
    quota of ``q`` CPUs is throttled for up to ``limit * (1 - q)`` of the limit by its own
    quota; run-queue wait beyond that is the host's or the sandbox's neighbours'. Starved:
    it used less than half the CPU its quota allowed (``cpu < limit * min(q, 1) / 2``) and
    waited beyond its own quota for at least :data:`STARVED_WAIT_SHARE` of the limit.
    A process that computed (a loop) or slept/blocked (little wait) is not starved. False
    when either measurement is missing (an unknown cause is the environment's limit)."""
    if cpu_ms is None or wait_ms is None or limit_s <= 0:
        return False
    limit_ms = limit_s * 1000.0
    share = min(max(cpus, 0.0), 1.0)
    own_throttle_ms = limit_ms * (1.0 - share)
    return cpu_ms < limit_ms * share / 2 and wait_ms - own_throttle_ms >= limit_ms * STARVED_WAIT_SHARE


class CheckResult(BaseModel):
    """Outcome of one check function (EnvScaler rule-based reward): ``check_func(final_state)``
    with ``initial_state`` as a global of its module, in a sandbox process that never ran
    environment code. Only a returned ``True`` (a real bool) passes
    (``calculate_reward``); a check that raises, returns a non-bool, times out or dies is
    a result here, not an exception."""

    model_config = ConfigDict(extra="forbid")

    check_item: str
    """The check's description, as given."""
    passed: bool
    """True only when ``status == "ok"`` and the check returned ``True``."""
    status: Status
    """ok (returned a bool) | error (raised, or returned a non-bool) | timeout (exceeded
    ``per_check_timeout_s``, or not run because the batch's time budget ran out) | oom
    (MemoryError, or killed by the kernel's OOM killer) | crashed (its process died:
    ``os._exit``, a signal, a broken result channel) | rejected (does not compile, or
    defines no callable ``check_func``)."""
    result: str | None = None
    """``repr`` of what ``check_func`` returned, at most 1 KiB (``...`` marks a cut);
    None when it returned nothing (it raised, timed out, died, or never ran)."""
    error: str | None = None
    """Why it did not pass, None for ``ok`` (including a clean ``False``): ``returned int
    1, not a bool``, ``Error: KeyError: 'x'``, ``timed out after 2 s``, ``no check_func
    defined``, ``syntax error: ... (line N)``, ``the check process crashed (...)``;
    at most 4 KiB."""
    traceback: str | None = None
    """Bounded traceback (last frames, at most ~4 KiB) when the check raised."""
    stdout: str = ""
    """What this check printed, at most 4 KiB (and at most the profile's
    ``output_cap_bytes``) per stream; a cut is marked ``...[N bytes dropped]``."""
    stderr: str = ""
    duration_ms: float
    """Time spent on this check in its sandbox process (deep copies of both states
    included), milliseconds; for timeouts and crashes, the time until it was stopped."""


class ExecResult(BaseModel):
    """Outcome of one script run (:meth:`SandboxPool.execute`): like ``python3 -I main.py``
    in a fresh sandbox process and an empty working directory."""

    model_config = ConfigDict(extra="forbid")

    status: Status
    """ok (exit status 0) | error (non-zero exit status; an uncaught exception exits 1) |
    timeout (killed at ``timeout_s``) | oom (an uncaught MemoryError: the allocation went
    over the profile's ``memory_mib``, exit status 1; or killed by the kernel's OOM
    killer) | crashed (killed by a signal, e.g. ``os.kill(os.getpid(), 9)`` or a
    segfault; or the sandbox died). ``rejected`` is never produced: bad arguments raise
    ArgumentError."""
    exit_code: int | None
    """The process's exit status; ``-N`` when killed by signal N; None on timeout or when
    the sandbox was lost."""
    stdout: str = ""
    """Captured stdout (UTF-8, invalid bytes replaced), at most the profile's
    ``output_cap_bytes`` bytes; the rest was dropped (``stdout_truncated``)."""
    stderr: str = ""
    """Captured stderr, same cap (``stderr_truncated``); an uncaught exception's traceback
    is here, as Python prints it."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float
    """Host-measured round trip of the run (request to reply), milliseconds."""
    error: str | None = None
    """Why it is not ``ok``, in words (``exited with status 3``, ``timed out after 2 s``,
    ``killed by signal SIGKILL``, ...); None for ``ok``."""
