"""The executor seam: the one module of the API that imports ``sandpit.executor`` (with
the app factory, which builds the executor), and only its package face.

The API depends on the :class:`~sandpit.executor.Executor` and
:class:`~sandpit.executor.ExecutorSession` protocols, never on a backend: :class:`Sandboxes`
wraps any ``Executor`` (a pool or the Ray backend in production, a scripted fake in unit
tests). Optional capabilities are asked with ``isinstance`` on their protocols:
:class:`~sandpit.executor.KeyedSessions` (sessions keyed by the env id, which any replica
re-attaches to and :meth:`Sandboxes.discard` ends) and :class:`~sandpit.executor.Cluster`
(several sandbox hosts: per-host info, drains). It owns two things every caller would
otherwise repeat:

* **slots**: every run of untrusted code (opening a session, a tool call, restoring a
  snapshot, deriving tools, checks, scripts) holds one slot of the :class:`FairScheduler`
  for its tenant (``max_running_calls`` of the tenant, ``call_slots`` in all); a call that
  waits ``call_queue_timeout_s`` without one is :class:`~.errors.QuotaExceeded` (429).
* **translation**: executor errors become API errors here, at the edge::

      executor error                      API error (HTTP status)
      CapacityError                       SandboxCapacity (NoCapacity, 503 + Retry-After)
      ProfileError                        SandboxRefused (InvalidRequest, 422, field profile)
      SessionLost                         SessionLostError (a SessionClosedError)
      SessionClosed                       SessionClosedError (ServiceUnavailable, 503)
      DockerUnavailable, SandboxLost,     SandboxUnavailable (ServiceUnavailable, 503)
      SessionError, other ExecutorError
      SessionOpenError                    CodeFailed (not an ApiError: each caller words it)

  All but ``CodeFailed`` are also :class:`SandboxError`, so a caller can tell a sandbox
  failure (drop the session) from its own errors. ``ArgumentError`` (bad arguments, also a
  ``ValueError``) passes through untranslated for the caller to name the field.

The executor's result types (plain pydantic data) are re-exported for the services.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from sandpit.executor import (
    ArgumentError,
    BackendName,
    CallResult,
    CallRules,
    CapacityError,
    CheckResult,
    Cluster,
    DockerUnavailable,
    ExecResult,
    Executor,
    ExecutorError,
    ExecutorSession,
    HostInfo,
    KeyedSessions,
    OpenedState,
    PreparedState,
    ProfileError,
    ProfileOverrides,
    ResourceProfile,
    SandboxLost,
    SessionClosed,
    SessionError,
    SessionLost,
    SessionOpenError,
    SharedConfig,
    Snapshot,
    StartedCall,
    StateDelta,
    call_many,
    encode_json_state,
    is_truncated,
    prepare_state,
    render_entry,
    start_call,
)
from sandpit.sandbox_images.runner import limits as _runner_limits

from .errors import ApiError, InvalidRequest, NoCapacity, QuotaExceeded, ServiceUnavailable
from .scheduler import FairScheduler, SchedulerBusy

log = logging.getLogger("sandpit.api")

if TYPE_CHECKING:
    from .metrics import Metrics
    from .settings import ApiSettings

CHECKS_PER_JOB = _runner_limits.MAX_CHECKS
"""Most checks one sandbox job runs (``limits.MAX_CHECKS``); longer checklists go in batches."""
CHECK_SOURCE_MAX_BYTES = _runner_limits.MAX_CHECK_SOURCE_BYTES
"""Most UTF-8 bytes of one ``check_func`` source a sandbox job takes."""

FULLNESS_RATIOS = (("memory_projected_mib", "memory_budget_mib"), ("sandboxes", "max_sandboxes"))
"""The executor's stats whose ratio (used, capacity) says how full its sandboxes are
(:meth:`Sandboxes.fullness`)."""

__all__ = [
    "ArgumentError", "BackendName", "CHECKS_PER_JOB", "CHECK_SOURCE_MAX_BYTES", "CallResult", "CallRules", "CheckResult", "CodeFailed",
    "ExecResult", "OpenedState", "ProfileOverrides", "ResourceProfile",
    "SandboxCapacity", "SandboxError", "SandboxRefused", "SandboxSession", "SandboxUnavailable", "Sandboxes",
    "SessionClosedError", "SessionLostError", "SharedConfig", "Snapshot", "StateDelta", "PreparedState", "encode_json_state", "is_truncated", "prepare_state",
    "render_entry", "resolved_changes", "translate",
]


class SandboxError(Exception):
    """Mixin of the API errors a sandbox operation raises (see the module's table)."""


class SandboxCapacity(NoCapacity, SandboxError):
    """No sandbox could be placed (``CapacityError``)."""


class SandboxRefused(InvalidRequest, SandboxError):
    """A resource profile above the operator's (``ProfileError``)."""


class SandboxUnavailable(ServiceUnavailable, SandboxError):
    """The backend or the sandbox failed (Docker Engine down, sandbox lost, broken session)."""


class SessionClosedError(SandboxUnavailable):
    """The session was closed under the call (evicted, or its sandbox retired)."""


class SessionLostError(SessionClosedError):
    """The session was closed because its sandbox was lost (``SessionLost``): nothing ran."""


class CodeFailed(Exception):
    """Environment code failed to load or instantiate in the sandbox (``SessionOpenError``):
    ``status`` (``error``, ``timeout``, ``oom``, ``crashed``, ``rejected``) and
    ``observation`` (``"Error: <Type>: <message>"``) say how."""

    def __init__(self, status: str, observation: str) -> None:
        super().__init__(observation)
        self.status = status
        self.observation = observation


def translate(exc: ExecutorError, retry_after: int) -> ApiError:
    """An executor error as the API error of the module's table."""
    if isinstance(exc, CapacityError):
        return SandboxCapacity(f"no sandbox capacity: {exc}", retry_after=retry_after)
    if isinstance(exc, ProfileError):
        return SandboxRefused(str(exc), field="profile")
    if isinstance(exc, SessionLost):
        return SessionLostError(f"executor failure: {type(exc).__name__}: {exc}", retry_after=retry_after)
    if isinstance(exc, SessionClosed):
        return SessionClosedError(f"executor failure: {type(exc).__name__}: {exc}", retry_after=retry_after)
    if isinstance(exc, DockerUnavailable | SandboxLost):
        return SandboxUnavailable(f"sandbox backend unavailable: {exc}", retry_after=retry_after)
    return SandboxUnavailable(f"executor failure: {type(exc).__name__}: {exc}", retry_after=retry_after)


class CallInFlight:
    """A tool call sent by :meth:`SandboxSession.start_call`: it holds its tenant's
    execution slot and its session until :meth:`finish`, which must be called exactly
    once (from any thread)."""

    __slots__ = ("_started", "_slot", "_owner")

    def __init__(self, started: StartedCall, slot: ExitStack, owner: Sandboxes) -> None:
        self._started = started
        self._slot = slot
        self._owner = owner

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        """Whether :meth:`finish` can return without waiting for the sandbox, after
        waiting up to ``wait_s`` seconds for its reply, the first ``spin_s`` of them
        polling without sleeping (:meth:`~sandpit.executor.StartedCall.answered`)."""
        return self._started.answered(wait_s, spin_s)

    def finish(self) -> CallResult:
        """The call's result, as :meth:`SandboxSession.call` returns it (waiting for the
        reply until the call's deadline); frees the slot and the session. Raises what
        :meth:`SandboxSession.call` raises (a SandboxError)."""
        try:
            with self._owner.translated():
                return self._started.finish()
        finally:
            self._slot.close()


class SandboxSession:
    """One environment instance in a sandbox (an :class:`ExecutorSession` behind the
    slot discipline and the error translation). A handle: it keeps no state (the API's
    copy is ``LiveEnv.cache``). When its sandbox is lost, the call reports the loss's
    status and :attr:`closed` turns true; the caller re-opens from its own copy."""

    def __init__(self, session: ExecutorSession, owner: Sandboxes) -> None:
        self._session = session
        self._owner = owner

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def handle(self) -> ExecutorSession:
        """The executor's handle of the session (:meth:`Sandboxes.call_many` sends calls through it)."""
        return self._session

    @property
    def closed(self) -> bool:
        """True once closed, or once its sandbox was lost (every request then raises
        SessionClosedError)."""
        return self._session.closed

    @property
    def retyped(self) -> list[dict[str, str]]:
        """``init_config`` keys whose value replaced an attribute the constructor set to a
        value of another type, as the sandbox reported them at open
        (``[{"key", "constructed", "config"}]``; ``[]`` from executors that do not report)."""
        return list(self._session.retyped)

    def call(self, name: str, arguments: dict[str, Any], rules: CallRules = "sandpit") -> CallResult:
        """``getattr(instance, name)(**arguments)`` in a slot, under ``rules`` (Sandpit's
        or EnvScaler's step semantics, :data:`CallRules`): a result whatever the tool
        does. Raises QuotaExceeded (no slot), a SandboxError."""
        with self._owner.slot(self._session.tenant), self._owner.translated():
            return self._session.call(name, arguments, rules)

    def start_call(self, name: str, arguments: dict[str, Any],
                   rules: CallRules = "sandpit") -> CallInFlight | CallResult | None:
        """:meth:`call` without waiting for the sandbox, for a caller that must not block
        (the event loop, :func:`~.envs.step_work.run_inline`): the call is sent now, in a
        slot of the tenant taken only if one is free now, and the :class:`CallInFlight`
        holds that slot and the session until it is finished. Returns the ``rejected``
        result of a call that never reaches the sandbox, or None (nothing sent) when the
        call cannot start at once: no slot free now, the session busy, closed or moving
        to another sandbox, or an executor without this split (then :meth:`call`, on a
        thread). Raises a SandboxError."""
        slot = ExitStack()
        try:
            slot.enter_context(self._owner.slot(self._session.tenant, wait=False))
        except QuotaExceeded:
            return None
        try:
            with self._owner.translated():
                started = start_call(self._session, name, arguments, rules)
        except BaseException:
            slot.close()
            raise
        if not isinstance(started, StartedCall):
            slot.close()
            return started
        return CallInFlight(started, slot, self._owner)

    def call_many(self, calls: list[tuple[SandboxSession, str, dict[str, Any], CallRules]]) -> list[CallResult | Exception]:
        """:meth:`call` for each ``(session, name, arguments, rules)`` of ``calls`` (this
        session is only the door: any sessions of the same owner), sent together
        (:func:`sandpit.executor.call_many`: one frame per sandbox each way) in waves of
        at most the tenant's ``max_running_calls``, each call in a slot of its session's
        tenant. The outcomes in order: a result, or the error :meth:`call` would have
        raised for it (QuotaExceeded, a SandboxError, ArgumentError)."""
        return self._owner.call_many(calls)

    def take_opened(self) -> OpenedState:
        """The state the session opened with, handed over once
        (:meth:`ExecutorSession.take_opened`): encoded attributes, or only the runner's
        digest of a state forked from a config template."""
        return self._session.take_opened()

    def read_state(self) -> dict[str, list[Any]]:
        """The session's current encoded state, read from its sandbox (one round trip; no
        environment code runs). Raises a SandboxError (SessionClosedError once lost)."""
        with self._owner.translated():
            return self._session.read_state()

    def state(self) -> dict[str, Any]:
        """The current state's JSON view, read from the sandbox (no untrusted code runs).
        Raises a SandboxError (SessionClosedError once lost)."""
        with self._owner.translated():
            return self._session.state()

    def restore(self, attributes: dict[str, list[Any]]) -> None:
        """Put the instance into the state of ``attributes`` (in a slot: restoring opaque
        values runs the environment's code). Raises QuotaExceeded, a SandboxError."""
        with self._owner.slot(self._session.tenant), self._owner.translated():
            self._session.restore(Snapshot(attributes=attributes))

    def close(self) -> None:
        """End the session (idempotent; a failure to close is the executor's to log)."""
        with self._owner.translated():
            self._session.close()


def resolved_changes(delta: StateDelta, previous: Callable[[str], list[Any] | None]) -> dict[str, list[Any]]:
    """The attributes a call set, keyed changes (``["k", ops]``) applied to ``previous(name)``
    (the API's copy of the attribute before the call), sharing untouched nodes with it
    (:meth:`StateDelta.applied_to`). Raises SandboxUnavailable (503) when a keyed change
    does not apply: the sandbox sent a delta that does not fit the state it was given."""
    try:
        return delta.applied_to(previous)
    except SessionError as exc:
        raise SandboxUnavailable(f"executor failure: {exc}", retry_after=1) from exc


class Sandboxes:
    """The API's view of an :class:`Executor` (see the module docstring).

    Args:
        executor: where untrusted code runs.
        settings: ``call_slots``, ``call_queue_timeout_s``, ``capacity_retry_after_s``.
        metrics: ``queue_seconds`` observes slot waits.
        running_limit: a tenant's ``max_running_calls`` (default: the settings' quota).
        scheduler: the fair scheduler (default: one of ``call_slots`` slots).
    """

    def __init__(self, executor: Executor, settings: ApiSettings, metrics: Metrics | None = None,
                 running_limit: Callable[[str], int] | None = None, scheduler: FairScheduler | None = None) -> None:
        self.executor = executor
        self.keyed = isinstance(executor, KeyedSessions)
        """Sessions are keyed by the env id and outlive this process (:meth:`open_session`)."""
        self.cluster: Cluster | None = executor if isinstance(executor, Cluster) else None
        """The executor as a :class:`~sandpit.executor.Cluster`, when it is one."""
        self.settings = settings
        self.metrics = metrics
        self.scheduler = scheduler or FairScheduler(settings.resolved_call_slots())
        self._running_limit = running_limit or (lambda _tenant: settings.quotas.max_running_calls)

    # -- the two disciplines ---------------------------------------------------------------
    @contextmanager
    def slot(self, tenant: str, wait: bool = True) -> Iterator[None]:
        """Hold one execution slot for ``tenant``. Raises QuotaExceeded
        (``max_running_calls``) when none frees within ``call_queue_timeout_s`` (at once
        when ``wait`` is False and none is free now)."""
        limit = self._running_limit(tenant)
        try:
            with self.scheduler.slot(tenant, limit, self.settings.call_queue_timeout_s if wait else 0.0) as waited:
                if waited > 0.001 and self.metrics is not None:
                    self.metrics.queue_seconds.observe(waited)
                yield
        except SchedulerBusy as exc:
            raise QuotaExceeded(f"{exc}; tenant {tenant!r} may run max_running_calls={limit} at once",
                                limit="max_running_calls", retry_after=5) from None

    def call_many(self, calls: list[tuple[SandboxSession, str, dict[str, Any], CallRules]]) -> list[CallResult | Exception]:
        """:meth:`SandboxSession.call_many`: the calls of ``calls`` in waves, each call
        holding a slot of its tenant: a wave's first call waits for its slot as
        :meth:`call` does (QuotaExceeded after ``call_queue_timeout_s``), the next ones
        join the wave only while a slot is free at once (a thread that waited for more
        slots than the scheduler can give it would wait on itself); the rest go in the
        next wave. Translated outcomes in order."""
        done: dict[int, CallResult | Exception] = {}
        waiting = list(range(len(calls)))
        while waiting:
            with ExitStack() as slots:
                ready: list[int] = []
                for i in waiting:
                    tenant = calls[i][0].handle.tenant
                    try:
                        slots.enter_context(self.slot(tenant, wait=not ready))
                    except QuotaExceeded as exc:
                        if not ready:
                            done[i] = exc
                            continue
                        break
                    ready.append(i)
                sent = call_many([(calls[i][0].handle, calls[i][1], calls[i][2], calls[i][3]) for i in ready])
                for i, outcome in zip(ready, sent, strict=True):
                    done[i] = self._translate_outcome(outcome)
            waiting = [i for i in waiting if i not in done]
        return [done[i] for i in range(len(calls))]

    def _translate_outcome(self, outcome: CallResult | Exception) -> CallResult | Exception:
        """An executor error as :meth:`translated` turns it into an API error."""
        if isinstance(outcome, CallResult):
            return outcome
        try:
            with self.translated():
                raise outcome
        except Exception as exc:  # noqa: BLE001 - the translated outcome
            return exc

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Executor errors raised in the block as API errors (module docstring)."""
        try:
            yield
        except SessionOpenError as exc:
            raise CodeFailed(exc.status, exc.observation) from None
        except ArgumentError:
            raise  # the caller names the field
        except ExecutorError as exc:
            raise translate(exc, self.settings.capacity_retry_after_s) from exc

    # -- profiles ----------------------------------------------------------------------------
    def profile(self, overrides: dict[str, Any] | None = None) -> ResourceProfile:
        """The default profile lowered by ``overrides`` (``memory_mib``, ``cpus``,
        ``call_timeout_s``). Raises SandboxRefused (above the operator's profile)."""
        with self.translated():
            return self.executor.profile(overrides=ProfileOverrides(**overrides) if overrides else None)

    def default_limits(self) -> dict[str, float]:
        """``memory_mib``, ``cpus`` and ``call_timeout_s`` of the default profile."""
        default = self.profile()
        return {"memory_mib": default.memory_mib, "cpus": default.cpus, "call_timeout_s": default.call_timeout_s}

    # -- untrusted code ----------------------------------------------------------------------
    def open_session(self, *, tenant: str, source: str, class_name: str, init_config: dict[str, Any] | None = None,
                     profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None, env_id: str | None = None,
                     seed: int | None = None) -> SandboxSession:
        """Instantiate ``class_name`` (restoring ``snapshot`` when given; ``seed`` seeds the
        session's ``random`` before the constructor, EnvScaler's ``reset(seed=...)``) in a slot.
        ``env_id`` keys the session in executors whose sessions outlive this process
        (:class:`~sandpit.executor.KeyedSessions`: the Ray backend, where any replica
        re-attaches to it); the local pool's session ids stay random. Raises CodeFailed,
        QuotaExceeded, a SandboxError (SandboxCapacity when full)."""
        keyed = env_id if self.keyed else None
        with self.slot(tenant), self.translated():
            session = self.executor.open_session(tenant=tenant, source=source, class_name=class_name,
                                                 init_config=init_config, profile=profile, snapshot=snapshot,
                                                 session_id=keyed, seed=seed)
        return SandboxSession(session, self)

    def discard(self, env_id: str) -> None:
        """End the executor's session of a deleted env, whichever process's handle on it is
        current (:class:`~sandpit.executor.KeyedSessions`: the Ray backend, where another
        API replica may have stepped the env last). Best effort: never raises; a session
        left behind ends with its pool's idle eviction."""
        if not isinstance(self.executor, KeyedSessions):
            return
        try:
            self.executor.discard(env_id)
        except Exception as exc:  # noqa: BLE001 - deleting the env must not fail on it
            log.warning("could not end the session of deleted env %s: %s: %s", env_id, type(exc).__name__, exc)

    def describe(self, *, tenant: str, source: str, class_name: str) -> list[dict[str, Any]]:
        """Tool schemas of ``class_name`` (module loaded, class not instantiated), in a
        slot. Raises CodeFailed, QuotaExceeded, a SandboxError."""
        with self.slot(tenant), self.translated():
            return self.executor.describe(tenant=tenant, source=source, class_name=class_name)

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]],
                   initial_state: dict[str, list[Any]] | PreparedState, final_state: dict[str, list[Any]] | PreparedState,
                   profile: ResourceProfile | None = None, source: str | None = None) -> list[CheckResult]:
        """Check functions on two encoded (or prepared) states, each in a fresh process, in one slot.
        Raises ValueError (a check over the caps), QuotaExceeded, a SandboxError."""
        with self.slot(tenant), self.translated():
            return self.executor.run_checks(tenant=tenant, checks=checks, initial_state=initial_state,
                                            final_state=final_state, profile=profile, source=source)

    def execute(self, *, tenant: str, code: str, stdin: str | None, files: dict[str, str] | None,
                timeout_s: float | None, profile: ResourceProfile) -> ExecResult:
        """``code`` as a script in a fresh process, in a slot. Raises ValueError (bad
        files), QuotaExceeded, a SandboxError."""
        with self.slot(tenant), self.translated():
            return self.executor.execute(tenant=tenant, code=code, stdin=stdin, files=files, timeout_s=timeout_s,
                                         profile=profile)

    # -- operations ----------------------------------------------------------------------------
    def warm(self, tenant: str) -> int:
        """Fill the warm pool of ``tenant``'s default profile; how many are idle."""
        return self.executor.warm(tenant)

    def stats(self) -> dict[str, Any]:
        """The executor's counters (``idle``, ``active``, ``sessions``, ...); for a cluster
        also ``hosts``, its :meth:`hosts` (what ``/metrics`` reports per host)."""
        stats = self.executor.stats()
        if self.cluster is not None:
            stats = {**stats, "hosts": self.hosts()}
        return stats

    def fullness(self) -> float:
        """How full the sandboxes are, from the executor's :meth:`stats`: the larger of
        ``memory_projected_mib / memory_budget_mib`` and ``sandboxes / max_sandboxes``
        (each where the executor reports both, summed over hosts for a cluster); 1.0 when
        it reports neither pair (what idle eviction then assumes:
        ``ApiSettings.env_idle_evict_fullness``)."""
        stats = self.executor.stats()
        ratios = [float(stats[used]) / float(stats[cap]) for used, cap in FULLNESS_RATIOS
                  if isinstance(stats.get(used), int | float) and isinstance(stats.get(cap), int | float)
                  and stats[cap] > 0]
        return max(ratios) if ratios else 1.0

    def ping(self) -> None:
        """Raise when the backend cannot take work (``/readyz`` reports the error's type)."""
        self.executor.ping()

    # -- a cluster's hosts (executors over several hosts) -------------------------------------
    @property
    def multi_host(self) -> bool:
        """Whether the executor runs sandboxes on several hosts (a Cluster: per-host info,
        drains); False for one pool."""
        return self.cluster is not None

    def hosts(self) -> list[HostInfo]:
        """Every live host's info (:meth:`Cluster.hosts`); ``[]`` for an executor that is not
        a cluster. Raises a SandboxError."""
        if self.cluster is None:
            return []
        with self.translated():
            return self.cluster.hosts()

    def live_hosts(self, force: bool = False) -> set[str]:
        """The names of the live hosts (re-read now when ``force``); empty for an executor
        that is not a cluster. Raises a SandboxError."""
        if self.cluster is None:
            return set()
        with self.translated():
            return set(self.cluster.refresh(force=force))

    def drain(self, host: str) -> None:
        """Start (or resume) the drain of ``host``, recorded by the caller first. Raises a
        SandboxError (SandboxUnavailable for an executor that is not a cluster)."""
        with self.translated():
            self._cluster().drain(host)

    def undrain(self, host: str) -> bool:
        """Let ``host`` take work again; False when its node is gone. Raises a SandboxError."""
        with self.translated():
            return self._cluster().undrain(host)

    def node_alive(self, host: str) -> bool:
        """Whether ``host``'s node can host sandboxes. Raises a SandboxError."""
        with self.translated():
            return self._cluster().node_alive(host)

    def _cluster(self) -> Cluster:
        if self.cluster is None:
            raise SandboxUnavailable("the executor has one sandbox host: it has no drains")
        return self.cluster
