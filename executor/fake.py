"""A scripted, in-memory :class:`~sandpit.executor.interface.Executor` for unit tests of
the code above the executor (the API's services, the snapshot store): no Docker, no
sandbox, runs in microseconds.

It never executes the code it is given: ``source``, ``check_func`` and script sources are
only validated (with the real pool's argument checks) and used as keys. What runs instead
is test code: an environment is *registered by class name* with tools that are Python
callables over a plain state dict, and checks and scripts get scripted answers. What it
returns is what :class:`~sandpit.executor.pool.SandboxPool` returns for the same
behaviour: :class:`CallResult` with deltas in the executor's state encoding (``["j",
value]``; a value JSON cannot carry becomes ``["p", base64 pickle, rendering]`` or ``["u",
rendering]`` by the sandbox's rules, and :class:`Encoded` puts a given entry in the state),
:class:`Snapshot`, ``state()`` through :func:`render_state`, OpenAI tool schemas derived
from the tools' signatures and docstrings (or given), the same observations, rejections
and error texts (``wire``), and the same exceptions. Encodings and schemas come from
:mod:`~sandpit.executor.fake_tools`, the fake's own versions of the sandbox's rules for
plain tools and values: the host imports no code that runs beside untrusted code.

Example::

    from sandpit.executor.errors import CapacityError, DockerUnavailable
    from sandpit.executor.fake import FakeExecutor

    def bump(state: dict, by: int = 1) -> int:
        \"\"\"Add to the counter.

        Args:
            by: how much to add.
        \"\"\"
        state["count"] += by
        return state["count"]

    fake = FakeExecutor()
    fake.register("Counter", {"bump": bump}, init=lambda config: {"count": 0, "log": []})
    session = fake.open_session(tenant="t1", source="<never run>", class_name="Counter",
                                init_config={"count": 1})        # EnvScaler: setattr per key
    result = session.call("bump", {"by": 2})   # CallResult(status="ok", observation="3",
    assert result.delta.set == {"count": ["j", 3]}              #   delta=StateDelta(...))
    assert session.state() == {"count": 3, "log": []}
    fake.describe(tenant="t1", source="", class_name="Counter")  # [{"type": "function", ...}]

    fake.script_check("def check_func(s): return s['count'] == 3",
                      lambda initial, final: final["count"] == 3)   # or True/False/"timeout"/CheckResult
    fake.script_exec("print(1)", "1\\n")                        # or an ExecResult, or a callable
    fake.fail_call("timeout", tool="bump")                     # the next bump: status timeout
    fake.fail("open_session", CapacityError("full", retry_after_s=2.0))   # the next open raises
    fake.fail("ping", DockerUnavailable("engine down"), times=None)       # until clear_failures()

Semantics kept from the real executor: ``init(config)`` plays ``cls(init_config)`` and then
every key of ``init_config`` is set on the state (EnvScaler); an ``init`` that raises, or
an unregistered class, is a :class:`SessionOpenError` (``error``); a tool that raises is an
``error`` result (``Error: <Type>: <message>``, traceback) whose state changes count; an
unknown or private tool name, non-object or non-JSON arguments are ``rejected``; an
injected ``timeout``/``oom``/``crashed`` call does not run the tool and leaves the state
at the last good snapshot (``lost=True``: a lost sandbox, the handle closes and later
requests raise ``SessionClosed``); ``take_opened`` hands the opened attributes over once
(never a digest); ``restore`` drops attributes the snapshot does not name and keeps
the current value of ``"u"`` entries. Nothing is pickled back: a ``"p"`` entry the fake
did not produce itself is kept as an :class:`Encoded` value. Not modelled: tool output
(``stdout``/``stderr`` are empty), time limits (a tool runs to its end), memory.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandpit.sandbox_images.runner import limits, protocol, wire

from . import fake_tools
from .errors import (
    ArgumentError,
    ExecutorError,
    SessionClosed,
    SessionError,
    SessionOpenError,
    ToolSchemaError,
)
from .pool import jobs
from .pool.session import check_open_arguments, lost_message
from .profiles import ProfileOverrides, ResourceProfile, resolve_profile
from .results import (
    ENVSCALER_INVALID_ACTION,
    CallResult,
    CallRules,
    CheckResult,
    EncodedValue,
    ExecResult,
    OpenedState,
    Snapshot,
    StateDelta,
    Status,
    check_encoded,
    check_tool_schemas,
    render_state,
)
from .settings import ExecutorSettings

Tool = Callable[..., object]
"""A tool: ``tool(state, **arguments)``; its return value's ``str`` is the observation."""
Verdict = bool | str | CheckResult | Callable[[dict[str, Any], dict[str, Any]], object]
"""How a check is answered: its returned value, a status (``"timeout"``, ``"oom"``,
``"crashed"``, ``"error"``, ``"rejected"``), a whole result, or a callable over the
rendered initial and final states returning the value (an exception is ``error``)."""
ExecScript = str | ExecResult | Callable[[jobs.ExecRequest], str | ExecResult]
"""How a script is answered: its stdout (exit 0), a whole result, or a callable."""
FAILABLE = frozenset({"open_session", "describe", "run_checks", "execute", "warm", "ping", "call"})
_CALL_FAILURES = ("timeout", "oom", "crashed")
"""Statuses :meth:`FakeExecutor.fail_call` injects (PID 1's words: ``wire.call_failure_observation``)."""
_CHECK_ERRORS = {
    "timeout": "timed out after {timeout:g} s", "oom": "the check ran out of memory",
    "crashed": "the check process crashed (killed by signal SIGKILL)", "error": "Error: scripted failure",
    "rejected": "no check_func defined",
}


@dataclass(frozen=True)
class Encoded:
    """A state value the fake holds only in encoded form: it encodes as ``entry``
    (``["p", base64, rendering]`` or ``["u", rendering]``), e.g. to script an opaque value."""

    entry: list[Any]


@dataclass
class ScriptedEnv:
    """A registered environment: what :meth:`FakeExecutor.register` was given."""

    class_name: str
    tools: dict[str, Tool]
    init: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    schemas: list[dict[str, Any]] | None = None

    def describe(self) -> list[dict[str, Any]]:
        """The given schemas, else those derived from the tools' signatures and docstrings
        as a sandbox derives them for plain methods (``fake_tools.describe_tools``: their
        first parameter plays ``self``)."""
        if self.schemas is not None:
            return copy.deepcopy(self.schemas)
        try:
            tools = fake_tools.describe_tools(self.tools)
        except fake_tools.TooManyTools as exc:
            raise ToolSchemaError("rejected", f"Error: SchemaLimitError: {exc}") from None
        return check_tool_schemas(tools)


@dataclass
class _CallFailure:
    status: Status
    tool: str | None
    session_id: str | None
    times: int | None
    lost: bool


class FakeSession:
    """One scripted environment instance; an :class:`ExecutorSession`."""

    def __init__(self, executor: FakeExecutor, env: ScriptedEnv, session_id: str, tenant: str,
                 profile: ResourceProfile, state: dict[str, Any]) -> None:
        self._executor = executor
        self._env = env
        self._id = session_id
        self._tenant = tenant
        self.profile = profile
        self._state = state
        self._encoded: dict[str, EncodedValue] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.calls: list[tuple[str, dict[str, Any]]] = []
        """Every call this session was asked to make (name, arguments), in order."""
        self._encoded = self._executor._encode_state(self._state)
        self._opened: OpenedState | None = OpenedState(attributes=copy.deepcopy(self._encoded))

    @property
    def id(self) -> str:
        return self._id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def retyped(self) -> list[dict[str, str]]:
        return []  # the fake does not model construction over a config

    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """EnvScaler's ``getattr(instance, name)(**arguments)`` on the scripted tool. Under
        ``envscaler`` rules a name that is no scripted tool is ``Error: Invalid action`` and
        a tool's exception is ``Error: <Exception>\n`` plus its traceback."""
        started = time.perf_counter()
        arguments = {} if arguments is None else arguments
        longest = limits.TOOL_CALL_NAME_MAX_CHARS
        if rules == "envscaler":
            if not isinstance(name, str) or not name or len(name) > longest or name not in self._env.tools:
                return _result("rejected", ENVSCALER_INVALID_ACTION, started)
        elif not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or len(name) > longest:
            return _result("rejected", f"Error: {str(name)[:longest]!r} is not a public tool name", started)
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return _result("rejected", "Error: arguments must be an object with string keys", started)
        self._executor._raise_injected("call")  # e.g. SessionClosed: another replica's handle took it
        with self._lock:
            if self._closed:
                raise SessionClosed(f"session {self.id} is closed")
            try:
                arguments = json.loads(protocol.encode({"a": arguments})[4:])["a"]  # a copy, as sent
            except (ValueError, TypeError) as exc:
                return _result("rejected", f"Error: arguments are not JSON-encodable: {exc}", started)
            self.calls.append((name, arguments))
            failure = self._executor._take_call_failure(self.id, name)
            if failure is not None:
                self._executor.failures[failure.status] += 1
                if failure.lost:
                    self._closed = True  # the sandbox is gone: the handle closes with it
                    text = lost_message(failure.status)
                else:
                    text = wire.call_failure_observation(failure.status, self.profile.call_timeout_s)
                return _result(failure.status, text, started)
            tool = self._env.tools.get(name)
            if tool is None:
                return _result("rejected", f"Error: {name!r} is not a tool of this environment", started)
            status: Status = "ok"
            trace = None
            tool_started = time.perf_counter()
            try:
                observation = str(tool(self._state, **arguments))
            except Exception as exc:  # noqa: BLE001 - EnvScaler: errors are observations
                status, observation = "error", wire.error_observation(exc)
                trace = _traceback(exc)
                if rules == "envscaler":
                    observation = wire.ENVSCALER_TOOL_ERROR + trace
            tool_ms = (time.perf_counter() - tool_started) * 1000.0
            observation, truncated = wire.cap_observation(observation, self.profile.observation_cap_bytes)
            encoded = self._executor._encode_state(self._state)
            delta = StateDelta(set={k: v for k, v in encoded.items() if self._encoded.get(k) != v},
                               deleted=[k for k in self._encoded if k not in encoded])
            self._encoded = encoded
            return CallResult(status=status, observation=observation, duration_ms=_ms(started), tool_ms=tool_ms,
                              traceback=trace, observation_truncated=truncated, delta=delta)

    def take_opened(self) -> OpenedState:
        """The encoded state the session opened with, once (then an empty one)."""
        opened, self._opened = self._opened, None
        return opened or OpenedState()

    def read_state(self) -> dict[str, EncodedValue]:
        """The instance's current encoded state (a copy). Raises SessionClosed."""
        with self._lock:
            if self._closed:
                raise SessionClosed(f"session {self.id} is closed")
            return copy.deepcopy(self._encoded)

    def state(self) -> dict[str, Any]:
        """The JSON view of the instance's current state. Raises SessionClosed."""
        return render_state(self.read_state())

    def restore(self, snapshot: Snapshot) -> None:
        """Put the state into ``snapshot``'s (the real restore's rules, module docstring)."""
        attributes = check_encoded(snapshot.attributes, "snapshot")
        with self._lock:
            if self._closed:
                raise SessionClosed(f"session {self.id} is closed")
            self._executor._apply(self._state, attributes)
            self._encoded = self._executor._encode_state(self._state)

    def describe(self) -> list[dict[str, Any]]:
        """The environment's tool schemas (:meth:`ScriptedEnv.describe`)."""
        if self._closed:
            raise SessionClosed(f"session {self.id} is closed")
        return self._env.describe()

    def close(self) -> None:
        """End the session (idempotent)."""
        with self._lock:
            self._closed = True


class FakeExecutor:
    """Scripted :class:`Executor` (module docstring). Thread-safe; use as a context manager
    or call :meth:`close`."""

    def __init__(self, settings: ExecutorSettings | None = None) -> None:
        self.settings = settings or ExecutorSettings()
        self.envs: dict[str, ScriptedEnv] = {}
        self.sessions: dict[str, FakeSession] = {}
        """Every session opened, by id (closed ones too)."""
        self.failures: Counter[str] = Counter()
        self.seeds: list[int | None] = []
        """The ``seed`` of every ``open_session``, in order."""
        self.warmed: dict[tuple[str, str], int] = {}
        self.default_verdict: Verdict | None = None
        """Answer for a check with no scripted verdict; None: such a check raises LookupError."""
        self.default_exec: ExecScript | None = None
        """Answer for a script with no scripted result; None: such a script raises LookupError."""
        self._verdicts: dict[str, Verdict] = {}
        self._execs: dict[str, ExecScript] = {}
        self._raises: dict[str, list[tuple[BaseException, int | None]]] = {}
        self._call_failures: list[_CallFailure] = []
        self._pickles: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._next_id = 0
        self._closed = False

    def __enter__(self) -> FakeExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scripting -----------------------------------------------------------------------
    def register(self, class_name: str, tools: dict[str, Tool], *,
                 init: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 schemas: list[dict[str, Any]] | None = None) -> ScriptedEnv:
        """Script the environment class ``class_name``: ``tools`` (name -> callable over the
        state dict), ``init(init_config) -> state`` (default: an empty state; either way
        every key of ``init_config`` is then set), ``schemas`` (default: derived from the
        tools). Raises ValueError for schemas the host would refuse."""
        if schemas is not None:
            try:
                check_tool_schemas(copy.deepcopy(schemas))
            except protocol.ProtocolViolation as exc:
                raise ValueError(f"schemas the host would refuse: {exc}") from None
        env = ScriptedEnv(class_name, dict(tools), init, schemas)
        with self._lock:
            self.envs[class_name] = env
        return env

    def script_check(self, check_func: str, verdict: Verdict) -> None:
        """Answer every check whose source is ``check_func`` with ``verdict``."""
        if isinstance(verdict, str) and verdict not in _CHECK_ERRORS:
            raise ValueError(f"a status verdict is one of {sorted(_CHECK_ERRORS)}")
        with self._lock:
            self._verdicts[check_func] = verdict

    def script_exec(self, code: str, result: ExecScript) -> None:
        """Answer every script whose source is ``code`` with ``result``."""
        with self._lock:
            self._execs[code] = result

    def fail(self, method: str, error: BaseException, times: int | None = 1) -> None:
        """Make the next ``times`` calls of ``method`` (one of :data:`FAILABLE`; None: every
        call until :meth:`clear_failures`) raise ``error`` once its arguments are checked.
        ``call`` is a tool call of any session, refused before the tool runs."""
        if method not in FAILABLE:
            raise ValueError(f"method must be one of {sorted(FAILABLE)}")
        with self._lock:
            self._raises.setdefault(method, []).append((error, times))

    def fail_call(self, status: Status, *, tool: str | None = None, session_id: str | None = None,
                  times: int | None = 1, lost: bool = False) -> None:
        """Make the next ``times`` tool calls (of ``tool``, in ``session_id``, when given)
        end with ``status`` (``timeout``, ``oom`` or ``crashed``) without running the tool;
        ``lost``: as a lost sandbox (the observation says so and the session closes), else
        as a session process PID 1 restarted (the session stays open)."""
        if status not in _CALL_FAILURES:
            raise ValueError(f"status must be one of {sorted(_CALL_FAILURES)}")
        with self._lock:
            self._call_failures.append(_CallFailure(status, tool, session_id, times, lost))

    def clear_failures(self) -> None:
        """Forget every injected failure not used yet."""
        with self._lock:
            self._raises.clear()
            self._call_failures.clear()

    # -- Executor --------------------------------------------------------------------------
    def profile(self, name: str | None = None, overrides: ProfileOverrides | None = None) -> ResourceProfile:
        """As :meth:`SandboxPool.profile` (the settings' profiles). Raises ProfileError."""
        return resolve_profile(self.settings.profiles, self.settings.max_profile,
                               name or self.settings.default_profile, overrides)

    def open_session(self, *, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None, session_id: str | None = None,
                     seed: int | None = None) -> FakeSession:
        """A session of the registered ``class_name`` (``source`` is never run; ``seed`` is
        recorded in :attr:`seeds` and changes nothing else)."""
        self.seeds.append(seed)
        check_open_arguments(tenant, source, class_name, init_config)
        snapshot = check_encoded(copy.deepcopy(snapshot or {}), "snapshot")
        try:
            config = json.loads(json.dumps(init_config or {}, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ArgumentError(f"init_config is not JSON-encodable: {exc}") from exc
        self._raise_injected("open_session")
        env = self._env(class_name)
        try:
            state = dict(env.init(copy.deepcopy(config))) if env.init is not None else {}
        except Exception as exc:  # noqa: BLE001 - the environment's __init__ raised
            self.failures["error"] += 1
            raise SessionOpenError("error", wire.error_observation(exc), _traceback(exc)) from None
        state.update(config)
        if snapshot:  # as the sandbox does: on top of init_config, dropping what it does not name
            self._apply(state, snapshot)
        with self._lock:
            self._next_id += 1
            sid = session_id or f"fake-{self._next_id}"
            if sid in self.sessions:
                raise SessionError(f"sandbox refused to open the session: session {sid!r} already exists")
            session = FakeSession(self, env, sid, tenant, profile or self.profile(), state)
            if snapshot:
                session._opened = None  # the caller gave the state
            self.sessions[sid] = session
        return session

    def describe(self, *, tenant: str, source: str, class_name: str,
                 profile: ResourceProfile | None = None) -> list[dict[str, Any]]:
        """Tool schemas of the registered ``class_name``. Raises SessionOpenError when it is
        not registered, ToolSchemaError when it exceeds the schema caps."""
        check_open_arguments(tenant, source, class_name, None)
        self._raise_injected("describe")
        return self._env(class_name).describe()

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any] | jobs.PreparedState,
                   final_state: dict[str, Any] | jobs.PreparedState, profile: ResourceProfile | None = None,
                   per_check_timeout_s: float | None = None, source: str | None = None) -> list[CheckResult]:
        """One :class:`CheckResult` per check, from its scripted verdict (the check's source
        is never run). Raises ArgumentError as the pool does, LookupError for a check with no
        verdict (and no ``default_verdict``)."""
        jobs.check_tenant(tenant)
        timeout_s, _, _ = jobs.check_checks(checks, initial_state, final_state, profile or self.profile(),
                                            per_check_timeout_s, source)
        if not checks:
            return []
        self._raise_injected("run_checks")
        initial, final = render_state(jobs.unprepared(initial_state)), render_state(jobs.unprepared(final_state))
        return [self._check(check, initial, final, timeout_s) for check in checks]

    def execute(self, *, tenant: str, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
                timeout_s: float | None = None, profile: ResourceProfile | None = None) -> ExecResult:
        """The scripted result of ``code`` (never run), its output capped by the profile.
        Raises ArgumentError as the pool does, LookupError for an unscripted script."""
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        request = jobs.check_exec(code, stdin, files, timeout_s, profile)
        self._raise_injected("execute")
        started = time.perf_counter()
        with self._lock:
            script = self._execs.get(code, self.default_exec)
        if script is None:
            raise LookupError(f"FakeExecutor: no result scripted for the script {code[:80]!r} (script_exec)")
        answer = script(request) if callable(script) else script
        if isinstance(answer, ExecResult):
            return answer.model_copy(deep=True)
        stdout, truncated = _cap_bytes(answer, profile.output_cap_bytes)
        return ExecResult(status="ok", exit_code=0, stdout=stdout, stdout_truncated=truncated, duration_ms=_ms(started))

    def warm(self, tenant: str, profile: ResourceProfile | None = None, count: int | None = None,
             timeout_s: float = 120.0) -> int:
        """Records the wish; returns ``count`` (default ``pool_size``) at once."""
        self._raise_injected("warm")
        want = self.settings.pool_size if count is None else count
        with self._lock:
            self.warmed[(tenant, (profile or self.profile()).name)] = want
        return want

    def stats(self) -> dict[str, Any]:
        """The pool's keys: open sessions count as active sandboxes (of the settings'
        ``max_sandboxes``), warmed ones as idle."""
        with self._lock:
            live, idle = sum(1 for s in self.sessions.values() if not s.closed), sum(self.warmed.values())
            return {"sandboxes": live + idle, "idle": idle, "active": live, "starting": 0, "sessions": live,
                    "failures": dict(self.failures), "check_restarts": 0,
                    "max_sandboxes": self.settings.max_sandboxes}

    def ping(self) -> None:
        """Returns, unless a failure was injected with ``fail("ping", ...)``."""
        self._raise_injected("ping")

    def close(self) -> None:
        """Close every session; later opens raise ExecutorError."""
        with self._lock:
            self._closed = True
            sessions = list(self.sessions.values())
        for session in sessions:
            session.close()

    # -- internals -------------------------------------------------------------------------
    def _env(self, class_name: str) -> ScriptedEnv:
        with self._lock:
            if self._closed:
                raise ExecutorError("the executor is closed")
            env = self.envs.get(class_name)
        if env is None:
            self.failures["error"] += 1
            raise SessionOpenError("error", f"Error: LookupError: class {class_name!r} is not defined by the "
                                   "environment code")
        return env

    def _raise_injected(self, method: str) -> None:
        with self._lock:
            queue = self._raises.get(method)
            if not queue:
                return
            error, times = queue[0]
            if times is not None:
                if times <= 1:
                    queue.pop(0)
                else:
                    queue[0] = (error, times - 1)
        raise error

    def _take_call_failure(self, session_id: str, tool: str) -> _CallFailure | None:
        with self._lock:
            for failure in self._call_failures:
                if failure.tool in (None, tool) and failure.session_id in (None, session_id):
                    if failure.times is not None:
                        failure.times -= 1
                        if failure.times <= 0:
                            self._call_failures.remove(failure)
                    return failure
        return None

    def _encode_state(self, state: dict[str, Any]) -> dict[str, EncodedValue]:
        """The state's encoding by the sandbox's rules (``fake_tools.encode_value``;
        EnvScaler: no dunder keys); a ``"p"`` value is kept to be restored from."""
        out: dict[str, EncodedValue] = {}
        for name, value in state.items():
            if name.startswith("__") and name.endswith("__"):
                continue
            if isinstance(value, Encoded):
                out[name] = copy.deepcopy(value.entry)
                continue
            out[name] = fake_tools.encode_value(value)
            if out[name][0] == "p":
                with self._lock:
                    self._pickles[out[name][1]] = copy.deepcopy(value)
        return check_encoded(out, "state")

    def _apply(self, state: dict[str, Any], snapshot: dict[str, EncodedValue]) -> None:
        """Restore ``snapshot`` into ``state`` (in place): attributes it does not name are
        dropped, ``"j"`` and known ``"p"`` entries set, ``"u"`` entries keep the current value."""
        for name in [n for n in state if n not in snapshot]:
            del state[name]
        for name, entry in snapshot.items():
            if entry[0] == "j":
                state[name] = copy.deepcopy(entry[1])
            elif entry[0] == "p":
                with self._lock:
                    known = entry[1] in self._pickles
                    value = copy.deepcopy(self._pickles[entry[1]]) if known else Encoded(copy.deepcopy(entry))
                state[name] = value
            # "u": not restorable, the attribute keeps its current value

    def _check(self, check: dict[str, Any], initial: dict[str, Any], final: dict[str, Any],
               timeout_s: float) -> CheckResult:
        item = check["check_item"]
        with self._lock:
            verdict = self._verdicts.get(check["check_func"], self.default_verdict)
        if verdict is None:
            raise LookupError(f"FakeExecutor: no verdict scripted for check_func {check['check_func'][:80]!r} "
                              "(script_check)")
        started = time.perf_counter()
        if isinstance(verdict, CheckResult):
            return verdict.model_copy(update={"check_item": item})
        if isinstance(verdict, str):
            self.failures[verdict] += 1
            return CheckResult(check_item=item, passed=False, status=verdict,  # type: ignore[arg-type]
                               error=_CHECK_ERRORS[verdict].format(timeout=timeout_s), duration_ms=_ms(started))
        if callable(verdict):
            try:
                value = verdict(copy.deepcopy(initial), copy.deepcopy(final))
            except Exception as exc:  # noqa: BLE001 - a check that raises is an error result
                return CheckResult(check_item=item, passed=False, status="error",
                                   error=wire.error_observation(exc, limits.ERROR_CHARS), traceback=_traceback(exc),
                                   duration_ms=_ms(started))
        else:
            value = verdict
        status, passed, error = wire.classify(value)
        return CheckResult(check_item=item, passed=passed, status=status,  # type: ignore[arg-type]
                           result=wire.bounded_repr(value), error=error, duration_ms=_ms(started))


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _result(status: Status, observation: str, started: float) -> CallResult:
    return CallResult(status=status, observation=observation, duration_ms=_ms(started))


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))
    return text[-limits.SESSION_TRACEBACK_CHARS:]


def _cap_bytes(text: str, cap: int) -> tuple[str, bool]:
    data = text.encode("utf-8", "replace")
    return (text, False) if len(data) <= cap else (data[:cap].decode("utf-8", "ignore"), True)
