"""Host-side handle of one session (one environment instance in a sandbox).

The handle holds no state of its own: the state lives in the sandbox (PID 1 keeps a
snapshot there and restarts a crashed session process from it), and whoever needs a copy
on the host keeps it (the API keeps the one copy, ``LiveEnv.cache``). A call's reply
carries the delta as the sandbox sent it, keyed changes of large JSON values
(``["k", ops]``) included: the holder of the previous state applies them
(:meth:`~sandpit.executor.results.StateDelta.applied_to`).

If the sandbox is lost (timeout kill by the watchdog, OOM kill, crash, ``docker kill``,
engine restart) the failed call reports its status (``timeout``, ``oom``, ``crashed``) and
the handle closes; every later request raises :class:`SessionClosed`. Nothing is
re-placed silently: recovering is the caller's (the API re-opens the env from its own
copy; :class:`~sandpit.executor.recovering.RecoveringSession` does it for code that uses
the executor on its own). A sandbox that is still alive but retiring (gVisor pid churn)
is left at the next request: the session's state is read from that sandbox and the
session placed again with it.

Requests on one session are serialized; different sessions run concurrently.

:meth:`Session.describe` returns the environment's OpenAI tool schemas, derived inside
the sandbox (``sandbox_images/runner/child_schemas.py``) and validated here
(:func:`~sandpit.executor.results.check_tool_schemas`). :meth:`SandboxPool.describe`
uses a *describe-only* session: the module is loaded and the class found, but never
instantiated; such a session only answers ``describe``.

A session knows nothing of the pool: it is placed, released and forgotten through a
:class:`~sandpit.executor.pool.placement.Placement` (the pool implements it), and talks to
its sandbox through :class:`~sandpit.executor.pool.placement.SandboxSlot`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from sandpit.sandbox_images.runner import limits, wire
from sandpit.sandbox_images.runner.protocol import ProtocolViolation

from ..errors import ArgumentError, SandboxLost, SessionClosed, SessionError, SessionLost, ToolSchemaError
from ..results import (
    ENVSCALER_INVALID_ACTION,
    CallResult,
    CallRules,
    EncodedValue,
    OpenedState,
    Snapshot,
    StateDelta,
    Status,
    check_encoded,
    check_tool_schemas,
    render_state,
    starved,
)
from .placement import Placement, Reply, SandboxSlot, SessionSpec
from .state_text import state_b64

if TYPE_CHECKING:
    from sandpit.sandbox_images.runner.protocol import CallReply, DescribeReply, SnapshotReply

log = logging.getLogger(__name__)


def check_open_arguments(tenant: object, source: object, class_name: object, init_config: object) -> None:
    """Raise ArgumentError naming the first bad argument of ``open_session``/``describe``
    (any :class:`~sandpit.executor.interface.Executor` applies these checks)."""
    if not isinstance(tenant, str) or not tenant or len(tenant) > limits.TENANT_MAX_CHARS:
        raise ArgumentError(f"tenant must be a non-empty string of at most {limits.TENANT_MAX_CHARS} characters")
    if not isinstance(source, str) or len(source.encode("utf-8", "surrogatepass")) > limits.MAX_SOURCE_BYTES:
        raise ArgumentError(f"source must be a string of at most {limits.MAX_SOURCE_BYTES} bytes")
    if not isinstance(class_name, str) or not class_name.isidentifier():
        raise ArgumentError("class_name must be a Python identifier")
    if init_config is not None and not isinstance(init_config, dict):
        raise ArgumentError("init_config must be an object")


class Session:
    """A live environment instance. Obtain from :meth:`SandboxPool.open_session`."""

    def __init__(self, *, placement: Placement, spec: SessionSpec) -> None:
        self.spec = spec
        self.id = spec.session_id
        self.tenant = spec.tenant
        self.profile = spec.profile
        self.source = spec.source
        self.class_name = spec.class_name
        self.init_config = spec.init_config
        self.describe_only = spec.describe_only
        """Loaded without instantiation: only :meth:`describe` is served (calls are rejected)."""
        self._placement = placement
        self._sandbox: SandboxSlot | None = None
        self._opened: OpenedState | None = None
        """What :meth:`take_opened` hands over once (then None)."""
        self._lock = threading.Lock()
        self.closed = False
        self.lost: str | None = None
        """The status (``timeout``, ``oom``, ``crashed``) of the loss that closed the
        session, None while it is open or when it was closed by :meth:`close`."""
        self.retyped: list[dict[str, str]] = []
        """``init_config`` keys whose value replaced an attribute the constructor set to a
        value of another type, as the sandbox reported them when the session was opened
        (``[{"key", "constructed", "config"}]``, :func:`~.results.check_retyped`)."""

    def open(self, snapshot: dict[str, EncodedValue]) -> None:
        """Place the session for the first time, ``snapshot`` (encoded attributes, ``{}``
        for none) restored on top of its ``init_config``. Raises what
        :meth:`Placement.place` raises."""
        with self._lock:
            if self._sandbox is not None or self.closed:
                raise SessionError(f"session {self.id} was opened already")
            self._sandbox, self._opened, self.retyped = self._placement.place(self.spec, snapshot)

    def take_opened(self) -> OpenedState:
        """The state the session opened with (:class:`OpenedState`: the encoded
        attributes the sandbox reported, or only the runner's digest of a state forked
        from a config template), handed over once: the handle keeps no copy, and later
        calls return an empty ``OpenedState()``. Empty too for a session opened with a
        snapshot (its caller gave the state)."""
        with self._lock:
            opened, self._opened = self._opened, None
        return opened or OpenedState()

    # -- the sandbox (called with self._lock held) -------------------------------------
    def _slot(self) -> SandboxSlot:
        """The live sandbox holding the session: a retiring one is left for another, the
        state read from it first. Raises SessionClosed (closed; SessionLost: its sandbox lost),
        SandboxLost (lost while moving: the session closes), what :meth:`Placement.place`
        raises."""
        if self.closed or self._sandbox is None:
            if self.lost is not None:
                raise SessionLost(f"session {self.id} is closed: its sandbox was lost ({self.lost})")
            raise SessionClosed(f"session {self.id} is closed")
        sandbox = self._sandbox
        if not sandbox.alive:
            self._lose("crashed")
            raise SessionLost(f"session {self.id} is closed: its sandbox was lost")
        if not sandbox.retiring:
            return sandbox
        try:
            state = self._read(sandbox)
        except SandboxLost as exc:
            self._lose(exc.status)
            raise
        self._placement.release(sandbox, self.id)
        self._sandbox = None
        try:
            self._sandbox, _, _ = self._placement.place(self.spec, state)
        except BaseException:
            self.closed = True
            raise
        return self._sandbox

    def _request(self, op: str, **fields: Any) -> dict[str, Any]:
        reply = self._slot().request(op, session=self.id, **fields)
        if reply.get("status") == "fault":
            raise SessionError(f"sandbox refused {op!r}: {reply.get('message')}")
        return reply

    def _read(self, sandbox: SandboxSlot) -> dict[str, EncodedValue]:
        reply = sandbox.request("snapshot", session=self.id)
        if reply.get("status") != "ok":
            raise SessionError(f"sandbox refused the state: {reply.get('message') or reply.get('observation')}")
        try:
            return check_encoded(cast("SnapshotReply", reply).get("snapshot") or {}, "snapshot")
        except ProtocolViolation as exc:
            raise SessionError(f"sandbox sent a malformed state: {exc}") from exc

    def _lose(self, status: str) -> None:
        """The sandbox died under the session: forget it there and close the handle."""
        if self._sandbox is not None:
            self._placement.forget(self._sandbox, self.id)
        self._sandbox = None
        self.closed = True
        self.lost = status

    # -- public API --------------------------------------------------------------------
    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """Execute the tool call ``getattr(instance, name)(**arguments)`` (EnvScaler).

        Returns a :class:`CallResult`; ``rejected`` without touching the sandbox when
        ``name`` is not a public identifier (dunders, ``_private``), ``arguments`` is not
        a dict, or it is not JSON-encodable (NaN, objects). With ``rules="envscaler"``
        (EnvScaler's ``step()``) any attribute name of at most
        ``TOOL_CALL_NAME_MAX_CHARS`` characters is asked of the instance with ``hasattr``
        (``rejected`` with ``Error: Invalid action`` when it has none), and a tool that
        raises gives ``Error: <Exception>\n`` plus the traceback as the observation.

        The result's ``delta`` is the sandbox's, checked for shape: keyed entries
        (``["k", ops]``) are passed on as they are, for the holder of the previous state
        to apply. When the sandbox is lost during the call, the result has the loss's
        status (``timeout``, ``oom``, ``crashed``) and :func:`lost_message`, and the
        handle is closed (:attr:`closed`, :attr:`lost`).

        Raises:
            SessionClosed: after :meth:`close` or a loss.
            SessionError: the sandbox refused the call or sent a malformed delta.
            CapacityError: the session had to leave a retiring sandbox and none is free.
        """
        started = time.perf_counter()
        fields = self.call_fields(name, arguments, rules, started)
        if isinstance(fields, CallResult):
            return fields
        with self._lock:
            return self.finish_call(lambda: self._request("call", **fields), started)

    def start_call(self, name: str, arguments: dict[str, Any] | None = None,
                   rules: CallRules = "sandpit") -> StartedCall | CallResult | None:
        """:meth:`call` in two halves, for a caller that must not block (an event loop):
        the request is sent now and the returned :class:`StartedCall` holds the session's
        lock until :meth:`StartedCall.finish` (which must be called, from any thread).
        Returns the ``rejected`` result of a call that never reaches the sandbox (as
        :meth:`call`), or None, with nothing sent, when the call cannot be sent without
        waiting: another request of the session holds its lock, the session is closed,
        or its sandbox is lost or retiring (moving the session is blocking work). Then
        :meth:`call` is the way (on a thread)."""
        started = time.perf_counter()
        fields = self.call_fields(name, arguments, rules, started)
        if isinstance(fields, CallResult):
            return fields
        if not self._lock.acquire(blocking=False):
            return None
        try:
            sandbox = self._sandbox
            if self.closed or sandbox is None or not sandbox.alive or sandbox.retiring:
                self._lock.release()
                return None
            try:
                return StartedCall(self, sandbox.submit("call", session=self.id, **fields), started)
            except (ValueError, TypeError, SandboxLost) as exc:  # what the reply raises when finished
                return StartedCall(self, exc, started)
        except BaseException:
            self._lock.release()
            raise

    def call_fields(self, name: str, arguments: dict[str, Any] | None, rules: CallRules,
                    started: float) -> CallResult | dict[str, Any]:
        """The fields of the runner's ``call`` request for :meth:`call` (``name``,
        ``arguments``, ``rules``), or the ``rejected`` result of a call that never reaches
        the sandbox (the checks :meth:`call` lists), timed from ``started``
        (``time.perf_counter()``)."""
        arguments = {} if arguments is None else arguments
        longest = limits.TOOL_CALL_NAME_MAX_CHARS
        if rules == "envscaler":
            if not isinstance(name, str) or not name or len(name) > longest:
                return _rejected(ENVSCALER_INVALID_ACTION, started)
        elif not isinstance(name, str) or not name.isidentifier() or name.startswith("_") or len(name) > longest:
            return _rejected(f"Error: {str(name)[:longest]!r} is not a public tool name", started)
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return _rejected("Error: arguments must be an object with string keys", started)
        if self.describe_only:
            return _rejected("Error: this session only describes the environment; it has no instance", started)
        return {"name": name, "arguments": arguments, **({"rules": "envscaler"} if rules == "envscaler" else {})}

    def finish_call(self, reply: Callable[[], dict[str, Any]], started: float) -> CallResult:
        """The :class:`CallResult` of the call whose runner reply ``reply()`` returns (or
        raises), as :meth:`call` returns it: a lost sandbox closes the handle and is a
        result with the loss's status. Call it holding the session's lock (:meth:`locked`).
        Raises SessionError (a ``fault`` reply or a malformed delta) and what ``reply`` raises
        but SandboxLost."""
        try:
            raw = reply()
            if raw.get("status") == "fault":
                raise SessionError(f"sandbox refused 'call': {raw.get('message')}")
        except (ValueError, TypeError) as exc:
            return _rejected(f"Error: arguments are not JSON-encodable: {exc}", started)
        except SandboxLost as exc:
            self._lose(exc.status)
            return CallResult(status=exc.status, observation=lost_message(exc.status),  # type: ignore[arg-type]
                              duration_ms=_ms(started), sandbox_lost=True)
        reply_ = cast("CallReply", raw)
        status = reply_.get("status")
        delta = StateDelta()
        if status in ("ok", "error"):
            checked = wire.check_delta(reply_.get("delta") or {})
            if checked is None:
                raise SessionError("sandbox sent a malformed delta: not {set: {name: entry}, del: [name]}")
            delta = StateDelta(set=checked["set"], deleted=checked["del"])
        if self._sandbox is not None:
            self._sandbox.check_churn()  # runsc: gVisor keeps host pids of exited processes
        cpu_ms, wait_ms = _measure(reply_.get("cpu_ms")), _measure(reply_.get("wait_ms"))
        return CallResult(cpu_ms=cpu_ms, wait_ms=wait_ms,
            starved=(status == "timeout" and starved(cpu_ms, wait_ms, self.profile.call_timeout_s,
                                                     self.profile.cpus))
            or (status == "crashed" and reply_.get("not_started") is True),
            status=cast(Status, status), observation=str(reply_.get("observation", "")), duration_ms=_ms(started),
            tool_ms=reply_.get("duration_ms"), stdout=str(reply_.get("stdout", "")),
            stderr=str(reply_.get("stderr", "")), traceback=reply_.get("traceback"),
            observation_truncated=bool(reply_.get("observation_truncated")), delta=delta)

    @property
    def locked(self) -> threading.Lock:
        """The lock that serializes the session's requests (held around :meth:`slot` and
        :meth:`finish_call` by a caller that sends the call itself, :mod:`.grouped`)."""
        return self._lock

    def slot(self) -> SandboxSlot:
        """The live sandbox holding the session, moved off a retiring one first; call it
        holding :attr:`locked`. Raises SessionClosed (SessionLost once its sandbox was
        lost), SandboxLost (lost while moving: the handle closes), CapacityError."""
        return self._slot()

    def read_state(self) -> dict[str, EncodedValue]:
        """The session's current encoded state, read from the sandbox (PID 1 answers from
        its own snapshot: one round trip, no environment code runs). Raises
        SessionClosed (closed, or lost: the handle closes), SessionError (refused or
        malformed)."""
        with self._lock:
            sandbox = self._slot()
            try:
                return self._read(sandbox)
            except SandboxLost as exc:
                self._lose(exc.status)
                raise SessionLost(f"session {self.id} is closed: its sandbox was lost ({exc.status})") from exc

    def state(self) -> dict[str, Any]:
        """The current state's JSON view (:func:`~sandpit.executor.results.render_state`
        of :meth:`read_state`): every non-dunder attribute, JSON-native ones as they are,
        others as the rendering the sandbox made of them. Raises as :meth:`read_state`."""
        return render_state(self.read_state())

    def describe(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the environment's tools, derived inside the
        sandbox from the instance's class (``type(instance)``; the class itself for a
        describe-only session). One round trip, bounded by the profile's
        ``call_timeout_s``; the state is not touched.

        Returns:
            ``[{"type": "function", "function": {"name": str, "description": str,
            "parameters": {"type": "object", "properties": {name: schema}, "required":
            [name, ...], "additionalProperties": bool}}}, ...]``, public methods in
            definition order (most-derived class first); rules and caps in
            :mod:`sandpit.sandbox_images.runner.child_schemas` and ``limits``. Notes on methods that could only
            be partly described are logged at INFO level.

        Raises:
            ToolSchemaError: too many tools or too large (``rejected``), introspection
                raised (``error``), timed out, ran out of memory or crashed.
            SessionError: the sandbox's reply is not a valid tool list (sizes, types,
                shape; see :func:`check_tool_schemas`). SessionClosed: after :meth:`close`.
            SandboxLost: the sandbox was lost (the handle closes).
        """
        with self._lock:
            try:
                raw = self._request("describe")
            except SandboxLost as exc:
                self._lose(exc.status)
                raise
            reply = cast("DescribeReply", raw)
            status = reply.get("status")
            if status != "ok":
                traceback = reply.get("traceback")
                raise ToolSchemaError(str(status)[:32], str(reply.get("observation", ""))[:limits.DESCRIBE_ERROR_CHARS],
                                      traceback[:limits.DESCRIBE_TRACEBACK_CHARS] if isinstance(traceback, str) else None)
            try:
                tools = check_tool_schemas(reply.get("tools"))
                notes: object = reply.get("notes") or []
                if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
                    raise ProtocolViolation("notes is not a list of strings")
            except ProtocolViolation as exc:
                raise SessionError(f"sandbox sent malformed tool schemas: {exc}") from exc
            for note in notes[:limits.MAX_NOTES]:
                log.info("session %s (%s): %s", self.id, self.class_name, note[:limits.MAX_NOTE_CHARS])
            return tools

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state (attributes not in it are deleted).

        Raises:
            SessionError: the snapshot could not be applied (e.g. an opaque entry fails to
                unpickle inside the sandbox); the session keeps its previous state.
            SandboxLost: the sandbox was lost during the restore (the handle closes).
            SessionClosed: after :meth:`close` or a loss.
            ProtocolViolation: ``snapshot`` is not encoded attributes; ValueError,
                TypeError: they are not JSON (NaN, text UTF-8 cannot carry).
        """
        attributes = check_encoded(snapshot.attributes, "snapshot")
        snapshot_b64 = state_b64(attributes)
        with self._lock:
            try:  # the runner forwards the text to the session's process unparsed (protocol.RestoreRequest)
                raw = self._request("restore", snapshot_b64=snapshot_b64)
            except SandboxLost as exc:
                self._lose(exc.status)
                raise
            if raw.get("status") != "ok":
                raise SessionError(f"restore failed: {raw.get('observation') or raw.get('message')}")

    def close(self) -> None:
        """End the session: its process, work directory and slot are freed. Idempotent."""
        with self._lock:
            if self.closed and self._sandbox is None:
                return
            self.closed = True
            sandbox, self._sandbox = self._sandbox, None
            self._opened = None
        if sandbox is not None:
            self._placement.release(sandbox, self.id)


class StartedCall:
    """A tool call sent by :meth:`Session.start_call`, its reply not yet taken: it holds
    the session's lock until :meth:`finish`."""

    __slots__ = ("_session", "_reply", "_started")

    def __init__(self, session: Session, reply: Reply | Exception, started: float) -> None:
        self._session = session
        self._reply = reply
        self._started = started

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        """Wait up to ``wait_s`` seconds for the sandbox's reply, polling without
        sleeping for the first ``spin_s`` of them (:meth:`Reply.answered
        <sandpit.executor.pool.placement.Reply.answered>`); True when :meth:`finish` will
        not wait for the sandbox (the reply came, or the request could not be encoded);
        False when it has not come yet or the sandbox was lost (finishing then waits, or
        destroys the sandbox: work for a thread)."""
        reply = self._reply
        if isinstance(reply, Exception):
            return not isinstance(reply, SandboxLost)
        return reply.answered(wait_s, spin_s)

    def finish(self) -> CallResult:
        """The call's result, as :meth:`Session.call` returns it (waiting for the reply
        until the request's deadline); releases the session's lock. Raises what
        :meth:`Session.call` raises. Call it exactly once."""
        reply = self._reply
        try:
            if isinstance(reply, Exception):
                failed = reply

                def raised() -> dict[str, Any]:
                    raise failed

                return self._session.finish_call(raised, self._started)
            return self._session.finish_call(reply, self._started)
        finally:
            self._session.locked.release()


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _measure(value: object) -> float | None:
    """A runner's measurement in milliseconds (``cpu_ms``, ``wait_ms``): a finite,
    non-negative number below a day, else None (nothing the sandbox sends is trusted)."""
    if type(value) not in (int, float) or not 0 <= value < 86_400_000:  # type: ignore[operator]
        return None
    return float(value)  # type: ignore[arg-type]


def _rejected(message: str, started: float) -> CallResult:
    return CallResult(status="rejected", observation=message, duration_ms=_ms(started))


def lost_message(status: str) -> str:
    """The observation of a call whose sandbox was lost (``status`` of :class:`SandboxLost`):
    the handle closed; its owner re-opens the session from the last state it kept."""
    return {
        "timeout": "Error: the sandbox stopped responding and was killed; the session will be restored from its last snapshot",
        "oom": "Error: the sandbox ran out of memory and was killed; the session will be restored from its last snapshot",
    }.get(status, "Error: the sandbox died; the session will be restored from its last snapshot")
