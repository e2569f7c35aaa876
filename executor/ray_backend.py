"""The Ray executor backend: sandbox hosts are Ray actors, one per node with a Docker Engine.

Selected by the API's settings (``SANDPIT_EXECUTOR_BACKEND=ray``, ``SANDPIT_RAY_ADDRESS``);
needs the ``ray`` extra (``pip install -e '.[ray]'``). The local backend
(:class:`~sandpit.executor.pool.SandboxPool` in the API process) stays the default and
never imports Ray. Placement follows ROCK (the ROLL ecosystem's sandbox manager): Ray's own
scheduler, no home-made cluster protocol::

    API replica (RayExecutor) ──ray──►  SandboxHost actor "sandpit-host-<node>" (detached,
    API replica (RayExecutor) ──ray──►  one per node with resource sandpit_docker=1, pinned
                                        to it)  └─ SandboxPool ─► that node's Docker Engine

* **Hosts.** A node offers the custom resource ``sandpit_docker`` (``ray start
  --resources='{"sandpit_docker": 1}'``) when it has a Docker Engine and the sandbox image.
  Every :class:`RayExecutor` creates-or-gets the host actor of each such node by name
  (namespace ``sandpit``, ``lifetime="detached"``, pinned with a hard node affinity), so
  every API replica reaches the same hosts. A host owns that node's ``SandboxPool`` exactly
  as the local backend does (same hardening, runner, limits: the executor settings are
  passed to it whole).
* **Sessions live in the host**, keyed by the env id (``session_id``), so any replica can
  reach an env's session. Each hosted session has a *version*, bumped by every mutating
  request (call, restore) and by every attach; a replica's handle carries the version it
  last saw and a request with another one raises :class:`SessionClosed` (the handle is
  stale: another replica stepped the env). The API then drops its cached view and, on the
  client's retry, re-opens the env from its committed head state: the host *attaches* the
  existing session (restoring the head state when the sandbox differs from it) instead of
  starting a new one. Closing with a stale version is a no-op. So the database stays the
  truth and a sandbox never gets ahead of it silently.
* **Affinity.** ``env -> host`` is recorded through an :class:`Affinity` (the API keeps it
  in its database, table ``env_hosts``): a re-open goes to the recorded host while it is
  alive, else to the least-loaded live host.
* **Loss.** A host whose node died (or whose actor died) fails its requests with
  :class:`SandboxLost` (503 at the API, which drops the session); the env's next use opens
  it on another live host from its last committed snapshot: the same recovery path as a
  lost sandbox on one machine.
* **Drain** (an operator's orderly removal of a host, :meth:`RayExecutor.drain`): the host
  is recorded as draining where every replica reads it (the API's ``host_drains`` table,
  through the :class:`Affinity`), so no replica places anything new on it, and the host
  itself refuses new sessions and pool work (:class:`HostDraining`: the replica retries on
  another host, the client sees nothing). Each hosted session is then evicted once its
  in-flight call has finished (that call is answered and acknowledged normally) and its env's
  affinity moves to another host; the replica's next request finds the session closed (a
  retryable 503 the client library retries) and re-opens the env there from its last
  committed step: the lost-host recovery, with nothing cut. When the host holds no session
  and runs no work its pool is closed (containers removed), the actor is killed and the
  drain is recorded ``drained``; a drained host is not re-created (until undrained).
  The drain runs in a thread of one replica, recorded as the drain's *owner*; when that
  replica stops heart-beating (the API's ``replicas`` table, the evaluation runner's lease)
  a live replica claims the drain (compare-and-set on the owner) and resumes it here
  (:meth:`RayExecutor.drain` again: every step of a drain is idempotent).
* **Undrain** (:meth:`RayExecutor.undrain`, after the caller removed the drain record):
  a draining host takes work again: the drain thread (in whichever replica) re-reads the
  record at each pass and stops without closing the pool, every replica forgets the drain
  at its next refresh (also what it learnt from HostDraining answers), and the host's own
  ``draining`` flag is reset (:meth:`SandboxHost.undrain`); sessions already evicted
  re-open where their affinity now points. A drained host whose node is still alive is
  re-created on that node by the next refresh (the API refuses the undrain of a host
  whose node is gone).

* **Direct data path.** A Ray actor call costs about 1 ms of round trip by itself, so the
  session requests (opens and attaches, tool calls, restores, reads, closes) go over a
  *host link* instead: one authenticated TCP connection from each replica to each host's
  :class:`~sandpit.executor.host_link.LinkServer`, framed like the runner protocol
  (:mod:`sandpit.executor.host_link`). They reach the same host methods with the same
  versions and answers; Ray keeps placement, host creation, pool work, drains and the
  verdict on whether a host whose link broke is lost. ``RayExecutor(direct=False)`` (setting
  ``SANDPIT_RAY_DIRECT_CALLS=false``) sends everything through Ray.

Everything crossing Ray or a link is plain data (JSON-shaped dicts): results are
re-validated into the executor's pydantic models on the caller's side; executor errors are
re-raised as the same classes (:func:`_error_data` / :func:`_raise`).
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandpit.sandbox_images.runner.limits import LINK_RETRY_AFTER_S

from .errors import (
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    ImageError,
    ProfileError,
    SandboxLost,
    SandboxStartError,
    SessionClosed,
    SessionError,
    SessionOpenError,
    ToolSchemaError,
)
from .host_link import DIRECT, HostLink, LinkRefused, LinkServer
from .profiles import ProfileOverrides, ResourceProfile
from .results import CallResult, CallRules, CheckResult, EncodedValue, ExecResult, Snapshot, check_retyped
from .settings import ExecutorSettings, ImageSettings, get_image_settings, get_settings

log = logging.getLogger("sandpit.executor")

NAMESPACE = "sandpit"
RESOURCE = "sandpit_docker"
"""Custom Ray resource marking a node with a Docker Engine (1 per node)."""
HOST_PREFIX = "sandpit-host-"
HOST_CONCURRENCY = 256
"""Requests one host actor serves at once (threads; the pool bounds sandboxes itself)."""
UNDRAIN_ATTEMPTS = 10
"""Tries (0.5 s apart) of :meth:`RayExecutor.undrain` to reach a drained host's new actor."""


class HostDraining(SessionClosed):
    """The host is being drained: it takes no new session nor pool work (the
    :class:`RayExecutor` then places the request on another host). A ``SessionClosed``, so
    anything that reaches the API is a retryable 503."""


def _ray() -> Any:
    """The ``ray`` module (imported on first use: the local backend never needs it).
    Raises DockerUnavailable naming the extra when Ray is not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise DockerUnavailable("the Ray backend needs the 'ray' extra: pip install -e '.[ray]'") from exc


# -- errors across the hop ----------------------------------------------------------------------
def _error_data(exc: BaseException) -> dict[str, Any]:
    """An executor error (or ValueError) as plain data for :func:`_raise`."""
    data: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    for attr in ("retry_after_s", "sandbox_id", "status", "observation", "traceback", "logs"):
        if hasattr(exc, attr):
            data[attr] = getattr(exc, attr)
    return data


def _raise(data: dict[str, Any]) -> None:
    """Re-raise what :func:`_error_data` described, as the same class."""
    kind, message = data["type"], data["message"]
    if kind in ("SessionOpenError", "ToolSchemaError"):
        cls = ToolSchemaError if kind == "ToolSchemaError" else SessionOpenError
        raise cls(data["status"], data["observation"], data.get("traceback"))
    if kind == "CapacityError":
        raise CapacityError(message, retry_after_s=float(data.get("retry_after_s", 1.0)))
    if kind == "SandboxLost":
        raise SandboxLost(message, data.get("sandbox_id", ""), data.get("status", "crashed"))
    if kind == "HostDraining":
        raise HostDraining(message)
    if kind == "SandboxStartError":
        raise SandboxStartError(message, data.get("sandbox_id", ""), data.get("logs", ""))
    simple: dict[str, type[Exception]] = {
        "ProfileError": ProfileError, "SessionClosed": SessionClosed, "SessionError": SessionError,
        "DockerUnavailable": DockerUnavailable, "ImageError": ImageError, "ValueError": ValueError}
    raise simple.get(kind, ExecutorError)(message if kind in simple else f"{kind}: {message}")


def _guard(fn: Callable[[], Any]) -> dict[str, Any]:
    """``{"ok": fn()}``, or ``{"error": ...}`` for an executor error or ValueError."""
    try:
        return {"ok": fn()}
    except (ExecutorError, ValueError) as exc:
        return {"error": _error_data(exc)}


# -- the host actor ---------------------------------------------------------------------------
@dataclass
class _Hosted:
    session: Any  # sandpit.executor.pool.session.Session
    tenant: str
    version: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)


class SandboxHost:
    """Body of the host actor (``ray.remote(SandboxHost)``): one node's ``SandboxPool`` and
    the sessions placed on it (module docstring). Every method returns ``{"ok": value}`` or
    ``{"error": data}``; values are JSON-shaped."""

    def __init__(self, name: str, settings: dict[str, Any], image_settings: dict[str, Any]) -> None:
        from .pool.pool import SandboxPool

        self.name = name
        self.pool = SandboxPool(ExecutorSettings.model_validate(settings), ImageSettings.model_validate(image_settings))
        self.pool.start()
        self._sessions: dict[str, _Hosted] = {}
        self._lock = threading.Lock()
        self.started = time.time()
        self.draining = False
        """Set by :meth:`drain`: new sessions and pool work are refused (HostDraining)."""
        self._busy = 0  # opens and pool calls in progress (a drain waits for them)
        self._calls = 0  # tool calls in progress
        self._link_token = secrets.token_bytes(32)
        self.link = self._link_server()
        """The direct data path's server (:mod:`.host_link`), on this node's address."""

    def _enter(self, what: str) -> None:
        """Count one open / pool call in progress; HostDraining once the host drains."""
        with self._lock:
            if self.draining:
                raise HostDraining(f"sandbox host {self.name} is draining: {what} goes to another host")
            self._busy += 1

    def _leave(self) -> None:
        with self._lock:
            self._busy -= 1

    def _hosted(self, session_id: str, version: int | None) -> _Hosted:
        with self._lock:
            hosted = self._sessions.get(session_id)
        if hosted is None or hosted.session.closed:
            raise SessionClosed(f"session {session_id!r} is not open on host {self.name}")
        if version is not None and hosted.version != version:
            raise SessionClosed(f"session {session_id!r} was used by another replica (version {hosted.version}, "
                                f"this handle saw {version}); re-open it")
        return hosted

    def _link_server(self) -> LinkServer:
        return LinkServer(self._link_dispatch, _ray().util.get_node_ip_address(), self._link_token,
                          self.pool.settings.max_frame_bytes, HOST_CONCURRENCY)

    def noop(self) -> dict[str, Any]:
        """Nothing: one round trip (``benchmarks/scale.py`` measures the hop with it)."""
        return {"ok": None}

    def endpoint(self) -> dict[str, Any]:
        """Where the host link listens: ``{"ok": {"address", "port", "token"}}`` (token:
        64 hex digits). Reached only through Ray, like every other method."""
        return {"ok": {"address": self.link.address, "port": self.link.port, "token": self._link_token.hex()}}

    def _link_dispatch(self, op: str, args: list[Any]) -> dict[str, Any]:
        """A host link request: the :data:`~.host_link.DIRECT` method ``op`` with ``args``,
        answered exactly as through Ray; wrong arguments are a ValueError (as data)."""
        method = getattr(self, op)
        try:
            answer: dict[str, Any] = method(*args)
        except TypeError as exc:  # arity: the methods take plain JSON values
            return {"error": {"type": "ValueError", "message": f"bad arguments for {op!r}: {exc}"}}
        return answer

    def info(self) -> dict[str, Any]:
        """Host name, node, process, sessions, tool calls in progress, whether it drains,
        host link connections open (``links``) and refused so far (``links_refused``), and
        the pool's counters."""
        ray = _ray()
        with self._lock:
            sessions = sum(1 for h in self._sessions.values() if not h.session.closed)
            calls = self._calls
        return {"ok": {"host": self.name, "node_id": ray.get_runtime_context().get_node_id(),
                       "hostname": socket.gethostname(), "pid": os.getpid(), "sessions": sessions,
                       "draining": self.draining, "calls": calls, "links": self.link.connections(),
                       "links_refused": self.link.refused,
                       "uptime_s": time.time() - self.started, "stats": self.pool.stats(),
                       "max_sandboxes": self.pool.settings.max_sandboxes,
                       "sessions_per_sandbox": self.pool.settings.sessions_per_sandbox}}

    def open_session(self, session_id: str, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None, profile: dict[str, Any] | None,
                     snapshot: dict[str, list[Any]] | None, seed: int | None = None) -> dict[str, Any]:
        """Open session ``session_id`` (``snapshot`` None: a fresh instance, replacing a
        hosted one; ``seed`` seeds its ``random`` first), or attach to the hosted one when
        resuming (``snapshot`` given: restored when the sandbox's state differs).
        ``{"ok": {"version", "attached"}}``; HostDraining (as data) when the host drains."""
        def run() -> dict[str, Any]:
            self._enter(f"session {session_id!r}")
            try:
                return self._open(session_id, tenant, source, class_name, init_config, profile, snapshot, seed)
            finally:
                self._leave()
        return _guard(run)

    def _open(self, session_id: str, tenant: str, source: str, class_name: str,
              init_config: dict[str, Any] | None, profile: dict[str, Any] | None,
              snapshot: dict[str, list[Any]] | None, seed: int | None = None) -> dict[str, Any]:
        with self._lock:
            existing = self._sessions.get(session_id)
        if (snapshot is not None and existing is not None and not existing.session.closed
                and existing.tenant == tenant):  # a resume: attach (a fresh open replaces it)
            with existing.lock:
                if snapshot is not None and existing.session.snapshot().attributes != snapshot:
                    existing.session.restore(Snapshot(attributes=snapshot))
                existing.version += 1
                return {"version": existing.version, "attached": True}
        session = self.pool.open_session(
            tenant=tenant, source=source, class_name=class_name, init_config=init_config,
            profile=ResourceProfile.model_validate(profile) if profile is not None else None,
            snapshot=snapshot, seed=seed)  # the pool's own (random) session id; hosted under session_id
        with self._lock:
            old = self._sessions.get(session_id)
            self._sessions[session_id] = _Hosted(session, tenant, version=(old.version + 1) if old else 1)
            version = self._sessions[session_id].version
        if old is not None:
            old.session.close()
        return {"version": version, "attached": False, "retyped": session.retyped}

    def call(self, session_id: str, version: int, name: str, arguments: dict[str, Any],
             rules: CallRules = "sandpit") -> dict[str, Any]:
        """A tool call (under ``rules``) on a session at ``version``: ``{"ok": [new_version, result]}``."""
        def run() -> list[Any]:
            hosted = self._hosted(session_id, version)
            with hosted.lock:
                self._hosted(session_id, version)  # still ours once we hold the lock
                with self._lock:
                    self._calls += 1
                try:
                    result = hosted.session.call(name, arguments, rules)
                finally:
                    with self._lock:
                        self._calls -= 1
                hosted.version += 1
                return [hosted.version, result.model_dump(mode="json")]
        return _guard(run)

    def restore(self, session_id: str, version: int, attributes: dict[str, list[Any]]) -> dict[str, Any]:
        """Restore a session at ``version``: ``{"ok": new_version}``."""
        def run() -> int:
            hosted = self._hosted(session_id, version)
            with hosted.lock:
                self._hosted(session_id, version)
                hosted.session.restore(Snapshot(attributes=attributes))
                hosted.version += 1
                return hosted.version
        return _guard(run)

    def read(self, session_id: str, what: str) -> dict[str, Any]:
        """``state`` (JSON view), ``snapshot`` (encoded attributes) or ``describe`` of a session."""
        def run() -> Any:
            session = self._hosted(session_id, None).session
            if what == "state":
                return session.state()
            if what == "snapshot":
                return session.snapshot().attributes
            if what == "describe":
                return session.describe()
            raise ValueError(f"unknown read {what!r}")
        return _guard(run)

    def close_session(self, session_id: str, version: int | None) -> dict[str, Any]:
        """Close a session if ``version`` is its current one (None: whatever its version)."""
        with self._lock:
            hosted = self._sessions.get(session_id)
            if hosted is None or (version is not None and hosted.version != version):
                return {"ok": False}
            del self._sessions[session_id]
        hosted.session.close()
        return {"ok": True}

    def pool_call(self, method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``describe``, ``run_checks``, ``execute``, ``warm``, ``ping`` or ``profile`` of the
        pool (profiles as dicts; results as JSON-shaped data). HostDraining (as data) for
        any but ``ping`` once the host drains."""
        def run() -> Any:
            if method == "ping":
                self.pool.ping()
                return None
            self._enter(f"pool call {method!r}")
            try:
                return pool_run()
            finally:
                self._leave()

        def pool_run() -> Any:
            if "profile" in kwargs and kwargs["profile"] is not None:
                kwargs["profile"] = ResourceProfile.model_validate(kwargs["profile"])
            if method == "profile":
                overrides = kwargs.get("overrides")
                return self.pool.profile(kwargs.get("name"), ProfileOverrides.model_validate(overrides)
                                         if overrides is not None else None).model_dump(mode="json")
            if method == "describe":
                return self.pool.describe(**kwargs)
            if method == "run_checks":
                return [r.model_dump(mode="json") for r in self.pool.run_checks(**kwargs)]
            if method == "execute":
                return self.pool.execute(**kwargs).model_dump(mode="json")
            if method == "warm":
                return self.pool.warm(**kwargs)
            raise ValueError(f"unknown pool method {method!r}")
        return _guard(run)

    def drain(self) -> dict[str, Any]:
        """Refuse new sessions and pool work from now on (HostDraining; idempotent) and say
        what is left: ``{"ok": {"sessions": [session ids], "busy": opens and pool calls in
        progress}}``."""
        with self._lock:
            self.draining = True
            return {"ok": {"sessions": sorted(self._sessions), "busy": self._busy}}

    pool_closed = False
    """Set by :meth:`shutdown`: the pool's containers are gone (:meth:`undrain` starts a new one)."""
    pool_restarting = False
    """An :meth:`undrain` is starting the new pool (the host stays ``draining`` until it runs)."""

    def undrain(self) -> dict[str, Any]:
        """Take sessions and pool work again (an operator undrained the host: the drain
        record is gone, :meth:`RayExecutor.undrain`): the ``draining`` flag is reset and, if
        :meth:`shutdown` already closed the pool (a drain that finished as the undrain came),
        a new pool (and a new host link server) is started with the same settings. Sessions
        the drain evicted re-open where their affinity points. Idempotent.
        ``{"ok": {"restarted": bool}}``; raises nothing but the pool's start errors
        (DockerUnavailable, ImageError, as data)."""
        def run() -> dict[str, bool]:
            from .pool.pool import SandboxPool

            with self._lock:
                restart, self.pool_closed = self.pool_closed, False  # one caller restarts it
                if restart:
                    self.pool_restarting = True
                elif not self.pool_restarting:
                    self.draining = False
            if restart:  # outside the lock: starting a pool talks to Docker
                try:
                    pool = SandboxPool(self.pool.settings, self.pool.image_settings).start()
                except BaseException:
                    with self._lock:
                        self.pool_closed, self.pool_restarting = True, False
                    raise
                link = self._link_server() if self.link.closed else self.link  # shutdown closed it too
                with self._lock:
                    self.pool, self.link, self.pool_restarting, self.draining = pool, link, False, False
            return {"restarted": restart}
        return _guard(run)

    def evict(self, session_id: str) -> dict[str, Any]:
        """Close session ``session_id`` once its call in progress (if any) has returned, so
        that call is answered and acknowledged normally; the replica's next request finds it
        closed (SessionClosed) and re-opens the env elsewhere from its committed head.
        ``{"ok": True}`` if it was hosted here (idempotent)."""
        with self._lock:
            hosted = self._sessions.get(session_id)
        if hosted is None:
            return {"ok": False}
        with hosted.lock:  # waits for a call in progress (bounded by its call timeout)
            with self._lock:
                if self._sessions.get(session_id) is hosted:
                    del self._sessions[session_id]
            hosted.session.close()
        return {"ok": True}

    def shutdown(self) -> dict[str, Any]:
        """Close every session and the pool (its containers are removed)."""
        with self._lock:
            hosted = list(self._sessions.values())
            self._sessions.clear()
        for h in hosted:
            h.session.close()
        self.link.close()
        self.pool.close()
        self.pool_closed = True
        return {"ok": True}


# -- the API side -------------------------------------------------------------------------------
class Affinity(Protocol):
    """Where an env's session is placed (the API implements it over its database)."""

    def get(self, session_id: str) -> str | None:
        """The host name recorded for ``session_id``, if any."""
        ...

    def put(self, session_id: str, host: str) -> None:
        """Record that ``session_id`` is placed on ``host``."""
        ...

    def drains(self) -> dict[str, str]:
        """Host -> ``draining`` / ``drained`` of every host an operator drains (or drained)."""
        ...

    def envs_on(self, host: str) -> list[str]:
        """The session ids recorded on ``host``."""
        ...

    def move(self, session_id: str, from_host: str, to_host: str | None) -> bool:
        """Re-record ``session_id`` on ``to_host`` (None: forget it) if it is still on
        ``from_host``; True if moved."""
        ...

    def finish_drain(self, host: str, moved: int) -> bool:
        """Record ``host``'s drain as done (``drained``), ``moved`` envs moved. False when
        the drain is no longer recorded (the host was undrained meanwhile)."""
        ...


class MemoryAffinity:
    """An in-process :class:`Affinity` (a single API process, tests); a drain is recorded
    with :meth:`start_drain` (before :meth:`RayExecutor.drain`) and forgotten with
    :meth:`undrain` (before :meth:`RayExecutor.undrain`)."""

    def __init__(self) -> None:
        self._hosts: dict[str, str] = {}
        self._drains: dict[str, str] = {}

    def get(self, session_id: str) -> str | None:
        return self._hosts.get(session_id)

    def put(self, session_id: str, host: str) -> None:
        self._hosts[session_id] = host

    def start_drain(self, host: str) -> None:
        """Record ``host`` as draining (idempotent)."""
        self._drains.setdefault(host, "draining")

    def drains(self) -> dict[str, str]:
        return dict(self._drains)

    def envs_on(self, host: str) -> list[str]:
        return [sid for sid, h in self._hosts.items() if h == host]

    def move(self, session_id: str, from_host: str, to_host: str | None) -> bool:
        if self._hosts.get(session_id) != from_host:
            return False
        if to_host is None:
            del self._hosts[session_id]
        else:
            self._hosts[session_id] = to_host
        return True

    def finish_drain(self, host: str, moved: int) -> bool:
        if host not in self._drains:
            return False
        self._drains[host] = "drained"
        return True

    def undrain(self, host: str) -> None:
        """Forget ``host``'s drain (it takes work again)."""
        self._drains.pop(host, None)


class RaySession:
    """A replica's handle on a session hosted by a :class:`SandboxHost` (module docstring)."""

    def __init__(self, owner: RayExecutor, host: str, session_id: str, tenant: str, version: int) -> None:
        self._owner = owner
        self.host = host
        self._id = session_id
        self._tenant = tenant
        self._version = version
        self._closed = False
        self.retyped: list[dict[str, str]] = []
        """What the host's session reported at open (``Session.retyped``)."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise SessionClosed(f"session {self._id!r} is closed")

    def _ask(self, method: str, *args: Any) -> Any:
        try:
            return self._owner.ask(self.host, method, *args)
        except (SandboxLost, SessionClosed):
            self._closed = True
            raise

    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """A tool call in the host (EnvScaler semantics; ``rules`` as the executor's
        session). Raises SessionClosed (closed, or stale: another replica used the env),
        SandboxLost (host lost), ValueError."""
        self._check()
        version, result = self._ask("call", self._id, self._version, name, arguments or {}, rules)
        self._version = version
        return CallResult.model_validate(result)

    def state(self) -> dict[str, Any]:
        """The state's JSON view."""
        self._check()
        state: dict[str, Any] = self._ask("read", self._id, "state")
        return state

    def snapshot(self) -> Snapshot:
        """The last good snapshot."""
        self._check()
        return Snapshot(attributes=self._ask("read", self._id, "snapshot"))

    def share_opened_state(self, attributes: dict[str, EncodedValue], digest: str) -> bool:
        """Never shares: the session's snapshot lives in its host's process, where no
        object of this one can be."""
        return False

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state. Raises SessionError, SandboxLost."""
        self._check()
        self._version = self._ask("restore", self._id, self._version, snapshot.attributes)

    def describe(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas of the instance's class."""
        self._check()
        schemas: list[dict[str, Any]] = self._ask("read", self._id, "describe")
        return schemas

    def close(self) -> None:
        """End the session in its host unless another replica took it over (idempotent;
        a lost host has nothing left to close)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._owner.ask(self.host, "close_session", self._id, self._version)
        except ExecutorError:
            pass


class RayExecutor:
    """The :class:`~sandpit.executor.interface.Executor` over Ray host actors (module docstring).

    Args:
        address: Ray cluster address (``ray.init(address=...)``; ``None``/``""``: ``auto``).
            Not used when Ray is already initialized in this process.
        settings, image_settings: handed to every host's ``SandboxPool`` (default: this
            process's ``SANDPIT_EXECUTOR_*`` / ``SANDPIT_IMAGE_*``).
        affinity: where env -> host placements are recorded (default: in memory).
        direct: send session requests over host links (:mod:`.host_link`, the default)
            instead of Ray actor calls; False: everything through Ray.

    Raises (``start``): DockerUnavailable when Ray cannot be reached or no node offers
    ``sandpit_docker``.
    """

    refresh_s: float = 2.0
    """How often the node list is re-read (new nodes get a host; dead ones are skipped)."""
    hop_margin_s: float = 60.0
    """Seconds a request to a host may take beyond the longest call timeout before the
    host counts as lost."""
    drain_poll_s: float = 0.2
    """Seconds between two passes of a drain over its host's sessions and work in flight."""
    drain_timeout_s: float = 900.0
    """Seconds a drain waits for its host to empty before it gives up (the host stays
    ``draining``, placing nothing; issuing the drain again resumes it)."""

    def __init__(self, address: str | None = None, settings: ExecutorSettings | None = None,
                 image_settings: ImageSettings | None = None, affinity: Affinity | None = None,
                 direct: bool = True) -> None:
        self.address = address or "auto"
        self.direct = direct
        self._links: dict[str, HostLink] = {}  # host name -> open link
        self._link_retry: dict[str, float] = {}  # host name -> monotonic time a failed open may be retried
        self.settings = settings or get_settings()
        self.image_settings = image_settings or get_image_settings()
        self.affinity: Affinity = affinity or MemoryAffinity()
        self._hosts: dict[str, Any] = {}  # host name -> actor handle (live nodes only)
        self._dead: set[str] = set()
        self._refreshed = 0.0
        self._lock = threading.Lock()
        self._connected_here = False
        self._placed = 0
        self._drains: dict[str, str] = {}  # host -> draining / drained, as last read from the affinity
        self._drain_threads: dict[str, threading.Thread] = {}
        self._learnt: dict[str, float] = {}  # host -> monotonic time it answered HostDraining
        self.keyed_sessions = True
        """Sessions are keyed by the caller's ``session_id`` (the env id) and outlive this
        process: the API passes the env id so any replica re-attaches (``Sandboxes``)."""
        self.hop_timeout_s = self.settings.max_profile.call_timeout_s + self.hop_margin_s

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> RayExecutor:
        """Connect to Ray and create-or-get the host of every ``sandpit_docker`` node."""
        ray = _ray()
        if not ray.is_initialized():
            main = threading.current_thread() is threading.main_thread()
            saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
            try:
                ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False,
                         logging_level="warning")
            except Exception as exc:  # noqa: BLE001 - Ray's connection errors have no common base
                raise DockerUnavailable(f"cannot reach the Ray cluster at {self.address!r}: {exc}") from exc
            finally:  # ray.init's SIGTERM handler exits at once: the server's own graceful stop stays
                for sig, handler in saved.items():
                    signal.signal(sig, handler)
            self._connected_here = True
        self.refresh(force=True)
        if not self._hosts:
            raise DockerUnavailable(f"no Ray node offers the {RESOURCE!r} resource (a node with a Docker Engine "
                                    f"starts with --resources='{{\"{RESOURCE}\": 1}}')")
        return self

    def close(self) -> None:
        """Forget the hosts (they are shared by every replica and stay up) and disconnect
        from Ray if this executor connected."""
        with self._lock:
            self._hosts.clear()
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()
        if self._connected_here:
            _ray().shutdown()

    def shutdown_hosts(self) -> None:
        """Close every host's pool and kill the host actors (operator action; tests)."""
        ray = _ray()
        with self._lock:
            hosts = dict(self._hosts)
        for handle in hosts.values():
            try:
                ray.get(handle.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001, S110 - a host already gone has nothing to close
                pass
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001, S110
                pass

    # -- hosts ----------------------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        """Alive Ray nodes offering ``sandpit_docker``: ``{"node_id", "address", "resources"}``."""
        ray = _ray()
        return [{"node_id": n["NodeID"], "address": n.get("NodeManagerAddress", ""), "resources": n.get("Resources", {})}
                for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(RESOURCE, 0) >= 1]

    def refresh(self, force: bool = False) -> dict[str, Any]:
        """Re-read the node list and the drains (every ``refresh_s`` at most unless
        ``force``): a host for every live ``sandpit_docker`` node, none for dead ones nor
        drained ones; a draining host is reached only if its actor still exists (never
        re-created). Returns name -> handle (draining hosts included: see :meth:`placeable`)."""
        if not force and time.monotonic() - self._refreshed < self.refresh_s:
            with self._lock:
                return dict(self._hosts)
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        drains = self._read_drains()
        remote = ray.remote(SandboxHost)
        hosts: dict[str, Any] = {}
        for node in self.nodes():
            name = HOST_PREFIX + node["node_id"][:16]
            if name in self._dead or drains.get(name) == "drained":
                continue
            if name in drains:
                try:
                    hosts[name] = ray.get_actor(name, namespace=NAMESPACE)
                except ValueError:  # its drain already shut it down
                    pass
                continue
            hosts[name] = remote.options(
                name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached", num_cpus=0,
                resources={RESOURCE: 1}, max_concurrency=HOST_CONCURRENCY, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False),
            ).remote(name, self.settings.model_dump(mode="json"), self.image_settings.model_dump(mode="json"))
        with self._lock:
            self._hosts = hosts
            self._drains = drains
            self._refreshed = time.monotonic()
        return dict(hosts)

    def _read_drains(self) -> dict[str, str]:
        """The affinity's drains, merged with what this process learnt itself (a host that
        answered HostDraining since this read began); the last known ones when the affinity
        cannot be read. A host learnt earlier that the affinity does not record was undrained
        (a drain is recorded before its host refuses work, an undrain removes the record
        before the host takes work again): forgotten. So is a host that the previous read
        recorded and this one does not (undrained): it also leaves the lost hosts, so a
        drained host whose actor this process saw die is re-created on its node."""
        started = time.monotonic()
        with self._lock:
            known = dict(self._drains)
        try:
            recorded = self.affinity.drains()
        except Exception as exc:  # noqa: BLE001 - a database hiccup must not stop placement
            log.warning("cannot read host drains (%s: %s); using the last known ones", type(exc).__name__, exc)
            return known
        with self._lock:
            for host in [h for h, at in self._learnt.items() if h not in recorded and at < started]:
                del self._learnt[host]
            for host in known:
                if host not in recorded and host not in self._learnt:
                    self._dead.discard(host)
            merged = {host: "draining" for host in self._learnt}
        merged.update(recorded)
        return merged

    def placeable(self, hosts: dict[str, Any] | None = None) -> list[str]:
        """Names of the live hosts that take new work (not draining nor drained), sorted."""
        hosts = self.refresh() if hosts is None else hosts
        with self._lock:
            drains = set(self._drains)
        return sorted(name for name in hosts if name not in drains)

    def drain_states(self) -> dict[str, str]:
        """Host -> ``draining`` / ``drained`` as this process last read them."""
        self.refresh()
        with self._lock:
            return dict(self._drains)

    def _learnt_draining(self, host: str) -> None:
        with self._lock:
            self._drains.setdefault(host, "draining")
            self._learnt[host] = time.monotonic()

    def _lost(self, host: str) -> None:
        with self._lock:
            self._hosts.pop(host, None)
            self._dead.add(host)  # its node is gone (a node id is never reused)
            link = self._links.pop(host, None)
        if link is not None:
            link.close()

    def _link(self, host: str, handle: Any) -> HostLink | None:
        """The open link to ``host``, opened on first use (its endpoint asked through
        Ray); None when links are off or the last open failed less than
        :data:`~sandpit.sandbox_images.runner.limits.LINK_RETRY_AFTER_S` ago (the request
        then goes through Ray)."""
        if not self.direct:
            return None
        with self._lock:
            link = self._links.get(host)
            if link is not None and link.alive:
                return link
            if time.monotonic() < self._link_retry.get(host, 0.0):
                return None
        ray = _ray()
        try:
            answer = ray.get(handle.endpoint.remote(), timeout=30)
            where = answer["ok"]
            link = HostLink(host, where["address"], int(where["port"]), where["token"], self.settings.max_frame_bytes)
        except (LinkRefused, ray.exceptions.RayError, KeyError, TypeError, ValueError) as exc:
            log.warning("no direct link to %s (%s: %s); its requests go through Ray for %.0f s", host,
                        type(exc).__name__, exc, LINK_RETRY_AFTER_S)
            with self._lock:
                self._link_retry[host] = time.monotonic() + LINK_RETRY_AFTER_S
            return None
        with self._lock:
            current = self._links.get(host)
            if current is not None and current.alive:  # another thread opened one meanwhile
                spare, link = link, current
            else:
                self._links[host], spare = link, None
        if spare is not None:
            spare.close()
        return link

    def _link_broken(self, host: str, link: HostLink, handle: Any, exc: SandboxLost) -> SandboxLost:
        """After a link failed a request: drop the link and ask Ray whether the host
        lives (lost if not). The error to raise: the request's outcome is unknown, so it
        is a SandboxLost whether or not the host lives (the env re-opens from its head)."""
        with self._lock:
            if self._links.get(host) is link:
                del self._links[host]
        link.close()
        ray = _ray()
        try:
            ray.get(handle.noop.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            self._lost(host)
            return SandboxLost(f"sandbox host {host} was lost: {exc}", sandbox_id=host)
        return SandboxLost(f"the link to sandbox host {host} broke: {exc}", sandbox_id=host)

    def ask(self, host: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call ``method`` on host ``host`` and unwrap its answer: over the host link for
        the :data:`~.host_link.DIRECT` methods (when ``direct`` and the link opens), else
        as a Ray actor call. Raises the executor error the host raised, SandboxLost when
        the host (or its node) is gone, its link broke mid-request, or it does not answer
        within ``timeout_s`` seconds (default: the call timeout plus a minute)."""
        ray = _ray()
        with self._lock:
            handle = self._hosts.get(host)
        if handle is None:
            raise SandboxLost(f"sandbox host {host} is gone", sandbox_id=host)
        answer: dict[str, Any] | None = None
        link = self._link(host, handle) if method in DIRECT else None
        if link is not None:
            try:
                answer = link.request(method, list(args), timeout_s or self.hop_timeout_s)
            except SandboxLost as exc:
                raise self._link_broken(host, link, handle, exc) from exc
            except (ValueError, TypeError):  # not JSON (nothing was sent): Ray carries any value
                pass
        if answer is None:
            try:
                answer = ray.get(getattr(handle, method).remote(*args), timeout=timeout_s or self.hop_timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                self._lost(host)
                raise SandboxLost(f"sandbox host {host} was lost: {type(exc).__name__}", sandbox_id=host) from exc
        if "error" in answer:
            _raise(answer["error"])
        return answer["ok"]

    def _any_host(self, exclude: set[str]) -> str:
        hosts = [name for name in self.placeable() if name not in exclude]
        if not hosts:
            raise DockerUnavailable(f"no live sandbox host that takes work (no Ray node offers {RESOURCE!r}, "
                                    "or every host is draining)")
        self._placed += 1
        return hosts[self._placed % len(hosts)]

    def _on_any_host(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """:meth:`ask` on any host that takes work, moving on to another when the chosen
        one turns out to be draining (its HostDraining never reaches the caller while some
        host is left)."""
        tried: set[str] = set()
        while True:
            host = self._any_host(tried)
            try:
                return self.ask(host, method, *args, timeout_s=timeout_s)
            except HostDraining:
                self._learnt_draining(host)
                tried.add(host)

    def _loads(self, names: list[str]) -> dict[str, int]:
        """Sessions per host of ``names`` (a host that does not answer is left out, as lost)."""
        ray = _ray()
        with self._lock:
            handles = {name: self._hosts[name] for name in names if name in self._hosts}
        loads: dict[str, int] = {}
        refs = {name: handle.info.remote() for name, handle in handles.items()}
        for name, ref in refs.items():
            try:
                loads[name] = ray.get(ref, timeout=10)["ok"]["sessions"]
            except Exception:  # noqa: BLE001 - an unanswering host is not a candidate
                self._lost(name)
        return loads

    def _choose(self, recorded: str | None, exclude: set[str]) -> str:
        """``recorded`` (the host an env's session is recorded on) while it lives and takes
        work, else the least-loaded such host."""
        candidates = [name for name in self.placeable() if name not in exclude]
        if recorded is not None and recorded in candidates:
            return recorded
        if not candidates:
            raise DockerUnavailable(f"no live sandbox host that takes work (no Ray node offers {RESOURCE!r}, "
                                    "or every host is draining)")
        loads = self._loads(candidates)
        if not loads:
            raise DockerUnavailable("no sandbox host answers")
        self._placed += 1
        return min(sorted(loads), key=lambda n: loads[n])

    # -- drain --------------------------------------------------------------------------------
    def drain(self, host: str, wait_s: float | None = None) -> bool:
        """Drain ``host`` (module docstring) in a background thread of this process (one per
        host: a second call joins the running one). The caller records the drain in the
        affinity first, so every replica stops placing on ``host``. ``wait_s``: seconds to
        wait for the drain to finish (None: return at once). Returns True when this
        process's drain thread has finished. Raises ValueError for a host this executor
        does not know (neither live nor recorded)."""
        with self._lock:
            known = host in self._hosts or host in self._drains
        if not known and host not in self.refresh(force=True) and host not in self.drain_states():
            raise ValueError(f"unknown sandbox host {host!r}")
        self._learnt_draining(host)
        with self._lock:
            thread = self._drain_threads.get(host)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(target=self._drain, args=(host,), daemon=True, name=f"sandpit-drain-{host}")
                self._drain_threads[host] = thread
                thread.start()
        if wait_s is not None:
            thread.join(wait_s)
        return not thread.is_alive()

    def _drain(self, host: str) -> None:
        """The drain of ``host`` (module docstring): evict its sessions once their calls
        return, move their envs' affinity, wait for its opens and pool work, close its pool,
        kill its actor, record it ``drained``. Each pass re-reads the drain record: once an
        operator undrained the host (record gone) or another replica finished the drain
        the thread stops, leaving the pool up; an undrain that comes after the pool was
        closed gets a new pool (:meth:`SandboxHost.undrain`) instead of the kill. Failures
        are logged; the host then stays ``draining`` (nothing placed on it) until the drain
        is issued again (or its replica dies and another takes it over)."""
        moved = 0
        deadline = time.monotonic() + self.drain_timeout_s
        try:
            while True:
                if not self._still_draining(host):
                    return
                try:
                    left = self.ask(host, "drain", timeout_s=30)
                except SandboxLost:  # the node went away meanwhile: nothing left to wait for
                    break
                if not left["sessions"] and not left["busy"]:
                    break
                try:
                    for session_id in left["sessions"]:
                        if not self._still_draining(host):  # undrained while a call held an eviction
                            return
                        self.ask(host, "evict", session_id)
                        moved += self._move_envs(host, [session_id])
                except SandboxLost:  # the node went away meanwhile: its sessions went with it
                    break
                if time.monotonic() > deadline:
                    log.warning("drain of %s gave up after %.0f s: %d sessions, %d requests left", host,
                                self.drain_timeout_s, len(left["sessions"]), left["busy"])
                    return
                if not left["sessions"]:
                    time.sleep(self.drain_poll_s)
            if not self._still_draining(host):
                return
            moved += self._move_envs(host, self.affinity.envs_on(host))
            try:
                self.ask(host, "shutdown", timeout_s=120)
            except SandboxLost:
                pass
            if not self.affinity.finish_drain(host, moved):  # undrained as the pool closed
                log.info("drain of %s was undrained as it shut the pool down: starting a new pool", host)
                try:
                    self.ask(host, "undrain", timeout_s=120)
                except SandboxLost:
                    pass
                return
            with self._lock:
                self._drains[host] = "drained"
                handle = self._hosts.pop(host, None)
            if handle is not None:
                try:
                    _ray().kill(handle, no_restart=True)
                except Exception:  # noqa: BLE001, S110 - already gone
                    pass
            late = self._move_envs(host, self.affinity.envs_on(host))  # a placement recorded after the sweep
            if late:
                self.affinity.finish_drain(host, late)
            log.info("drained %s: %d envs moved", host, moved + late)
        except Exception:  # noqa: BLE001 - a background thread: logged, the host stays draining
            log.exception("drain of %s failed; it stays draining (issue the drain again to resume)", host)

    def _still_draining(self, host: str) -> bool:
        """Whether ``host``'s drain is still recorded ``draining`` (a database hiccup counts
        as yes: the next pass looks again)."""
        try:
            status = self.affinity.drains().get(host)
        except Exception as exc:  # noqa: BLE001 - the drain goes on; the next pass re-reads
            log.warning("drain of %s cannot read its record (%s: %s)", host, type(exc).__name__, exc)
            return True
        if status != "draining":
            log.info("drain of %s stops: %s", host, "finished by another replica" if status else "undrained")
        return status == "draining"

    def node_alive(self, host: str) -> bool:
        """Whether the Ray node of ``host`` (``sandpit-host-<node id prefix>``) is alive and
        offers ``sandpit_docker``: a drained host can take work again only then."""
        return any(HOST_PREFIX + node["node_id"][:16] == host for node in self.nodes())

    def undrain(self, host: str) -> bool:
        """Let ``host`` take work again once the caller removed its drain from the affinity
        (``DbAffinity.undrain``): forget what this process learnt of the drain (and that the
        drained host's actor died), re-read hosts (a drained host's actor is re-created on
        its node), then reset the host's own ``draining`` flag (:meth:`SandboxHost.undrain`,
        which starts a new pool if the drain closed it). A drain thread of this or another
        replica stops at its next pass (:meth:`_drain`). Other replicas place on the host
        again at their next refresh (``refresh_s``). Returns True when the host is live
        now, False when its node is gone (nothing to reset). Raises the executor errors of
        the host's answer (DockerUnavailable, ImageError when a new pool cannot start)."""
        with self._lock:
            self._learnt.pop(host, None)
            self._drains.pop(host, None)
            self._dead.discard(host)
        for attempt in range(UNDRAIN_ATTEMPTS):  # a drained actor just killed may still hold its name
            if attempt:
                time.sleep(0.5)
                with self._lock:
                    self._dead.discard(host)
            if host not in self.refresh(force=True):
                return False
            try:
                self.ask(host, "undrain", timeout_s=120)
                return True
            except SandboxLost:
                continue
        return False

    def _move_envs(self, host: str, session_ids: list[str]) -> int:
        """Re-record ``session_ids`` (still recorded on ``host``) on the least-loaded hosts
        that take work (forgotten when there is none). How many moved."""
        if not session_ids:
            return 0
        loads = self._loads([name for name in self.placeable() if name != host])
        moved = 0
        for session_id in session_ids:
            target = min(sorted(loads), key=lambda n: loads[n]) if loads else None
            if self.affinity.move(session_id, host, target):
                moved += 1
                if target is not None:
                    loads[target] += 1
        return moved

    # -- Executor ----------------------------------------------------------------------------
    def profile(self, name: str | None = None, overrides: ProfileOverrides | None = None) -> ResourceProfile:
        """A named profile lowered by ``overrides`` (resolved locally: every host has the
        same settings). Raises ProfileError."""
        from .profiles import resolve_profile

        return resolve_profile(self.settings.profiles, self.settings.max_profile,
                               name or self.settings.default_profile, overrides)

    def open_session(self, *, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None, session_id: str | None = None,
                     seed: int | None = None) -> RaySession:
        """Open ``class_name`` on the env's host (or attach to its live session there);
        ``seed`` as the pool's. Raises SessionOpenError, CapacityError, SandboxLost,
        DockerUnavailable, ValueError."""
        session_id = session_id or f"ses_{secrets.token_hex(8)}"
        recorded = self.affinity.get(session_id)
        tried: set[str] = set()
        while True:
            host = self._choose(recorded, tried)
            try:
                opened = self.ask(host, "open_session", session_id, tenant, source, class_name, init_config,
                                  profile.model_dump(mode="json") if profile is not None else None, snapshot, seed)
                break
            except HostDraining:  # this process had not seen the drain yet: another host
                self._learnt_draining(host)
                tried.add(host)
        if host != recorded:  # a re-attach where it was recorded writes nothing
            self.affinity.put(session_id, host)
        session = RaySession(self, host, session_id, tenant, int(opened["version"]))
        session.retyped = check_retyped(opened.get("retyped"))
        return session

    def describe(self, *, tenant: str, source: str, class_name: str,
                 profile: ResourceProfile | None = None) -> list[dict[str, Any]]:
        """Tool schemas of a class, derived on any host."""
        schemas: list[dict[str, Any]] = self._on_any_host("pool_call", "describe", {
            "tenant": tenant, "source": source, "class_name": class_name,
            "profile": profile.model_dump(mode="json") if profile else None})
        return schemas

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any],
                   final_state: dict[str, Any], profile: ResourceProfile | None = None,
                   per_check_timeout_s: float | None = None, source: str | None = None) -> list[CheckResult]:
        """Check functions on two encoded states, on any host."""
        results = self._on_any_host("pool_call", "run_checks", {
            "tenant": tenant, "checks": checks, "initial_state": initial_state, "final_state": final_state,
            "profile": profile.model_dump(mode="json") if profile else None,
            "per_check_timeout_s": per_check_timeout_s, "source": source})
        return [CheckResult.model_validate(r) for r in results]

    def execute(self, *, tenant: str, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
                timeout_s: float | None = None, profile: ResourceProfile | None = None) -> ExecResult:
        """``code`` as a script in a fresh process, on any host."""
        return ExecResult.model_validate(self._on_any_host("pool_call", "execute", {
            "tenant": tenant, "code": code, "stdin": stdin, "files": files, "timeout_s": timeout_s,
            "profile": profile.model_dump(mode="json") if profile else None}))

    def warm(self, tenant: str, profile: ResourceProfile | None = None, count: int | None = None,
             timeout_s: float = 120.0) -> int:
        """Warm every live host that takes work; the total of idle sandboxes."""
        total = 0
        for host in self.placeable():
            try:
                total += int(self.ask(host, "pool_call", "warm", {
                    "tenant": tenant, "profile": profile.model_dump(mode="json") if profile else None,
                    "count": count, "timeout_s": timeout_s}, timeout_s=timeout_s + 30))
            except ExecutorError:
                continue
        return total

    def discard(self, session_id: str) -> bool:
        """End the hosted session ``session_id`` whatever its version, for an env that is
        deleted: the deleting replica's handle may be stale (another replica stepped the
        env last), and a version-guarded close would then leave the session on its host
        until the pool's idle eviction. Best effort: a lost host or an unknown session is
        nothing to end. Returns True when a session was ended."""
        host = self.affinity.get(session_id)
        if host is None or host not in self.refresh():
            return False
        try:
            return bool(self.ask(host, "close_session", session_id, None))
        except ExecutorError:
            return False

    def hosts_info(self) -> list[dict[str, Any]]:
        """Every live host's :meth:`SandboxHost.info` (a host that does not answer is left out)."""
        out = []
        for host in sorted(self.refresh()):
            try:
                out.append(self.ask(host, "info", timeout_s=10))
            except ExecutorError:
                continue
        return out

    def stats(self) -> dict[str, Any]:
        """The pools' counters summed over hosts, plus ``hosts`` (per-host info)."""
        hosts = self.hosts_info()
        total: dict[str, Any] = {}
        for info in hosts:
            for key, value in info["stats"].items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    total[key] = total.get(key, 0) + value
        total["hosts"] = hosts
        return total

    def ping(self) -> None:
        """Return when at least one host answers; raise DockerUnavailable otherwise."""
        for host in sorted(self.refresh()):
            try:
                self.ask(host, "pool_call", "ping", {}, timeout_s=10)
                return
            except ExecutorError:
                continue
        raise DockerUnavailable("no sandbox host answers")
