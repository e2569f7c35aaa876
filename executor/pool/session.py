"""Host-side handle of one session (one environment instance in a sandbox).

The handle keeps the session's last good snapshot (the encoded state after the last
``ok``/``error`` call), updated from every call's delta. If the sandbox dies (timeout
kill by the watchdog, OOM kill, crash, ``docker kill``, engine restart) the failed call
reports its status, and the next request transparently re-creates the session in a
sandbox of the same tenant and profile from that snapshot (``CallResult.recovered``).
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
from typing import TYPE_CHECKING, Any, cast

from sandpit.sandbox_images.runner import limits, wire
from sandpit.sandbox_images.runner.protocol import ProtocolViolation, apply_keyed

from ..errors import ArgumentError, SandboxLost, SessionClosed, SessionError, ToolSchemaError
from ..results import (
    ENVSCALER_INVALID_ACTION,
    CallResult,
    CallRules,
    EncodedValue,
    Snapshot,
    StateDelta,
    Status,
    check_encoded,
    check_tool_schemas,
    render_state,
)
from .placement import Placement, SandboxSlot, SessionSpec

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
        self._snapshot: dict[str, EncodedValue] = {}
        self._digest: str | None = None
        """The runner's digest of the opened state, until a call or restore changes it."""
        self._lock = threading.Lock()
        self.closed = False
        self.recoveries = 0
        """How many times the session was re-created in a new sandbox."""
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
            self._sandbox, self._snapshot = self._placement.place(self.spec, snapshot)
            self._digest = getattr(self._snapshot, "digest", None) if not snapshot else None
            self.retyped = list(getattr(self._snapshot, "retyped", None) or [])
            self._snapshot = dict(self._snapshot)  # this session's own map; entries are shared, never mutated

    # -- placement (called with self._lock held) -------------------------------------
    def _ensure_placed(self) -> bool:
        if self._sandbox is not None and self._sandbox.alive and not self._sandbox.retiring:
            return False
        if self._sandbox is not None and self._sandbox.alive:  # retiring: leave it cleanly
            self._placement.release(self._sandbox, self.id)
        elif self._sandbox is not None:
            self._placement.forget(self._sandbox, self.id)
        self._sandbox = None
        self._sandbox, placed = self._placement.place(self.spec, self._snapshot)
        self._snapshot = dict(placed)
        self.recoveries += 1
        return True

    def _request(self, op: str, **fields: Any) -> tuple[dict[str, Any], bool]:
        if self.closed:
            raise SessionClosed(f"session {self.id} is closed")
        recovered = self._ensure_placed()
        assert self._sandbox is not None
        reply = self._sandbox.request(op, session=self.id, **fields)
        if reply.get("status") == "fault":
            raise SessionError(f"sandbox refused {op!r}: {reply.get('message')}")
        return reply, recovered

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

        Raises:
            SessionClosed: after :meth:`close`.
            CapacityError: the session had to be re-placed and no sandbox is available.
        """
        started = time.perf_counter()
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
        extra = {"rules": "envscaler"} if rules == "envscaler" else {}
        with self._lock:
            try:
                raw, recovered = self._request("call", name=name, arguments=arguments, **extra)
            except (ValueError, TypeError) as exc:
                return _rejected(f"Error: arguments are not JSON-encodable: {exc}", started)
            except SandboxLost as exc:
                self._lose()
                return CallResult(status=exc.status, observation=lost_message(exc.status),  # type: ignore[arg-type]
                                  duration_ms=_ms(started))
            reply = cast("CallReply", raw)
            try:
                delta = wire.check_delta(reply.get("delta") or {})
                if delta is None:
                    raise ProtocolViolation("delta is not {set: {name: entry}, del: [name]}")
                changed = {k: v for k, v in delta["set"].items() if v[0] != "k"}
                for key, entry in delta["set"].items():  # large JSON values arrive as path operations
                    if entry[0] == "k":
                        merged = apply_keyed(self._snapshot.get(key), entry[1])
                        if merged is None:
                            raise ProtocolViolation(f"delta: keyed change of {key!r} does not apply")
                        changed[key] = merged
                deleted = delta["del"]
            except ProtocolViolation as exc:
                raise SessionError(f"sandbox sent a malformed delta: {exc}") from exc
            status = reply.get("status")
            if self._sandbox is not None:
                self._sandbox.check_churn()  # runsc: gVisor keeps host pids of exited processes
            if status in ("ok", "error"):
                if changed or deleted:
                    self._digest = None
                self._snapshot.update(changed)
                for key in deleted:
                    self._snapshot.pop(key, None)
            return CallResult(
                status=cast(Status, status), observation=str(reply.get("observation", "")), duration_ms=_ms(started),
                tool_ms=reply.get("duration_ms"), stdout=str(reply.get("stdout", "")),
                stderr=str(reply.get("stderr", "")), traceback=reply.get("traceback"),
                observation_truncated=bool(reply.get("observation_truncated")),
                delta=StateDelta(set=changed, deleted=deleted), recovered=recovered)

    def state(self) -> dict[str, Any]:
        """The current state's JSON view (:func:`~sandpit.executor.results.render_state`):
        every non-dunder attribute, JSON-native ones as they are, others as the rendering
        the sandbox made of them. Built from the host's copy of the last good snapshot: no
        sandbox round trip, and the same view a stored state of this step gives."""
        with self._lock:
            if self.closed:
                raise SessionClosed(f"session {self.id} is closed")
            return render_state(self._snapshot)

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
            CapacityError: the session had to be re-placed and no sandbox is available.
            SandboxLost: the sandbox died again after being replaced once.
        """
        with self._lock:
            try:
                raw, _ = self._request("describe")
            except SandboxLost:
                self._lose()
                raw, _ = self._request("describe")
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

    def snapshot(self) -> Snapshot:
        """The last good snapshot (host copy; no sandbox round trip)."""
        with self._lock:
            return Snapshot(attributes=dict(self._snapshot), digest=self._digest)

    def share_opened_state(self, attributes: dict[str, EncodedValue], digest: str) -> bool:
        """Take ``attributes`` as this session's snapshot when the session is still in the
        state it opened with and PID 1 gave that state ``digest`` (SHA-256 of its
        snapshot text, so the two are equal exactly). Returns whether it did.

        Why: the API reuses the stored initial state of an earlier env with the same
        digest, and its encoder skips unchanged records by identity (``value is
        node.value``); a keyed delta applied to a separately decoded copy of the same
        state shares no object with it, so the first writing step of every such env
        re-compared every record (~30 ms on a 2.8 MB state; measured: tau-bench airline,
        first writing step 39 ms against 8 ms for the rest). Values are shared, never
        mutated (keyed deltas copy along their paths)."""
        with self._lock:
            if self._digest is None or self._digest != digest or set(attributes) != set(self._snapshot):
                return False
            self._snapshot = dict(attributes)
            return True

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state (attributes not in it are deleted).

        Raises:
            SessionError: the snapshot could not be applied (e.g. an opaque entry fails to
                unpickle inside the sandbox); the session keeps its previous state.
        """
        attributes = check_encoded(snapshot.attributes, "snapshot")
        with self._lock:
            try:
                raw, _ = self._request("restore", snapshot=attributes)
            except SandboxLost:
                self._lose()
                self._snapshot = dict(attributes)
                self._digest = None
                self._ensure_placed()
                return
            reply = cast("SnapshotReply", raw)
            if reply.get("status") != "ok":
                raise SessionError(f"restore failed: {reply.get('observation') or reply.get('message')}")
            self._snapshot = check_encoded(reply.get("snapshot") or {}, "snapshot")
            self._digest = None

    def close(self) -> None:
        """End the session: its process, work directory and slot are freed. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            self._placement.release(sandbox, self.id)

    def _lose(self) -> None:
        if self._sandbox is not None:
            self._placement.forget(self._sandbox, self.id)
        self._sandbox = None


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _rejected(message: str, started: float) -> CallResult:
    return CallResult(status="rejected", observation=message, duration_ms=_ms(started))


def lost_message(status: str) -> str:
    """The observation of a call whose sandbox was lost (``status`` of :class:`SandboxLost`)."""
    return {
        "timeout": "Error: the sandbox stopped responding and was killed; the session will be restored from its last snapshot",
        "oom": "Error: the sandbox ran out of memory and was killed; the session will be restored from its last snapshot",
    }.get(status, "Error: the sandbox died; the session will be restored from its last snapshot")
