"""The host end of the Ray backend: :class:`SandboxHost`, the body of the detached actor
``sandpit-host-<node>`` that owns one node's sandbox pool and the sessions placed on it
(the package docstring tells the whole design). Every method answers plain data,
``{"ok": value}`` or ``{"error": data}`` (:mod:`.wire`), whether it is reached through Ray
or over a host link (:mod:`.link`)."""

from __future__ import annotations

import importlib
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import LocalConfig
from ..errors import ArgumentError, DockerUnavailable, HostDraining, SandboxLost, SessionClosed
from ..interface import Executor
from ..profiles import ProfileOverrides, ResourceProfile
from ..results import CallRules, Snapshot
from ..settings import ExecutorSettings, ImageSettings
from .link import LinkServer
from .wire import guard

NAMESPACE = "sandpit"
"""Ray namespace of the host actors (every replica finds them by name there)."""
RESOURCE = "sandpit_docker"
"""Custom Ray resource marking a node with a Docker Engine (1 per node)."""
HOST_PREFIX = "sandpit-host-"
"""A host actor's name: this prefix and the first 16 hex digits of its Ray node id."""
HOST_CONCURRENCY = 256
"""Requests one host actor serves at once (threads; the pool bounds sandboxes itself)."""


def ray_module() -> Any:
    """The ``ray`` module (imported on first use: the local backend never needs it).
    Raises DockerUnavailable naming the extra when Ray is not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise DockerUnavailable("the Ray backend needs the 'ray' extra: pip install -e '.[ray]'") from exc


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
        self.name = name
        self.settings = ExecutorSettings.model_validate(settings)
        self.image_settings = ImageSettings.model_validate(image_settings)
        self.pool: Executor = LocalConfig().build(self.settings, image_settings=self.image_settings)
        self._sessions: dict[str, _Hosted] = {}
        self._lock = threading.Lock()
        self.started = time.time()
        self.draining = False
        """Set by :meth:`drain`: new sessions and pool work are refused (HostDraining)."""
        self._busy = 0  # opens and pool calls in progress (a drain waits for them)
        self._calls = 0  # tool calls in progress
        self._link_token = secrets.token_bytes(32)
        self.link = self._link_server()
        """The direct data path's server (:mod:`.link`), on this node's address."""

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
        return LinkServer(self._link_dispatch, ray_module().util.get_node_ip_address(), self._link_token,
                          self.settings.max_frame_bytes, HOST_CONCURRENCY)

    def noop(self) -> dict[str, Any]:
        """Nothing: one round trip (``benchmarks/scale.py`` measures the hop with it)."""
        return {"ok": None}

    def endpoint(self) -> dict[str, Any]:
        """Where the host link listens and how to trust it: ``{"ok": {"address", "port",
        "token", "certificate"}}`` (token: 64 hex digits; certificate: PEM, the link's only
        trusted root). Reached only through Ray, like every other method."""
        return {"ok": self.link.endpoint()}

    def _link_dispatch(self, op: str, args: list[Any]) -> dict[str, Any]:
        """A host link request: the :data:`~.link.DIRECT` method ``op`` with ``args``,
        answered exactly as through Ray; wrong arguments are an ArgumentError (as data)."""
        method = getattr(self, op)
        try:
            answer: dict[str, Any] = method(*args)
        except TypeError as exc:  # arity: the methods take plain JSON values
            return {"error": {"type": "ArgumentError", "message": f"bad arguments for {op!r}: {exc}"}}
        return answer

    def info(self) -> dict[str, Any]:
        """Host name, node, process, sessions, tool calls in progress, whether it drains,
        host link calls being dispatched (``link_calls``) and refused so far (``links_refused``), and
        the pool's counters."""
        ray = ray_module()
        with self._lock:
            sessions = sum(1 for h in self._sessions.values() if not h.session.closed)
            calls = self._calls
        return {"ok": {"host": self.name, "node_id": ray.get_runtime_context().get_node_id(),
                       "hostname": socket.gethostname(), "pid": os.getpid(), "sessions": sessions,
                       "draining": self.draining, "calls": calls, "link_calls": self.link.calls(),
                       "links_refused": self.link.refused,
                       "uptime_s": time.time() - self.started, "stats": self.pool.stats(),
                       "max_sandboxes": self.settings.max_sandboxes,
                       "sessions_per_sandbox": self.settings.sessions_per_sandbox}}

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
        return guard(run)

    def _open(self, session_id: str, tenant: str, source: str, class_name: str,
              init_config: dict[str, Any] | None, profile: dict[str, Any] | None,
              snapshot: dict[str, list[Any]] | None, seed: int | None = None) -> dict[str, Any]:
        with self._lock:
            existing = self._sessions.get(session_id)
        if (snapshot is not None and existing is not None and not existing.session.closed
                and existing.tenant == tenant):  # a resume: attach (a fresh open replaces it)
            with existing.lock:
                try:
                    if existing.session.read_state() != snapshot:  # the sandbox's state, not a copy here
                        existing.session.restore(Snapshot(attributes=snapshot))
                except (SessionClosed, SandboxLost):
                    pass  # lost meanwhile: a fresh open below replaces it
                else:
                    existing.version += 1
                    return {"version": existing.version, "attached": True}
        session = self.pool.open_session(
            tenant=tenant, source=source, class_name=class_name, init_config=init_config,
            profile=ResourceProfile.model_validate(profile) if profile is not None else None,
            snapshot=snapshot, seed=seed)  # the pool's own (random) session id; hosted under session_id
        opened = session.take_opened()  # handed to the replica: this host keeps no state
        with self._lock:
            old = self._sessions.get(session_id)
            self._sessions[session_id] = _Hosted(session, tenant, version=(old.version + 1) if old else 1)
            version = self._sessions[session_id].version
        if old is not None:
            old.session.close()
        return {"version": version, "attached": False, "retyped": session.retyped,
                "opened": opened.model_dump(mode="json")}

    def call(self, session_id: str, version: int, name: str, arguments: dict[str, Any],
             rules: CallRules = "sandpit") -> dict[str, Any]:
        """A tool call (under ``rules``) on a session at ``version``: ``{"ok": [new_version,
        result, closed]}``, ``closed`` true when the sandbox was lost during the call (the
        session is no longer hosted: the replica re-opens it from the state it keeps)."""
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
                closed = hosted.session.closed
                if closed:
                    with self._lock:
                        if self._sessions.get(session_id) is hosted:
                            del self._sessions[session_id]
                return [hosted.version, result.model_dump(mode="json"), closed]
        return guard(run)

    def restore(self, session_id: str, version: int, attributes: dict[str, list[Any]]) -> dict[str, Any]:
        """Restore a session at ``version``: ``{"ok": new_version}``."""
        def run() -> int:
            hosted = self._hosted(session_id, version)
            with hosted.lock:
                self._hosted(session_id, version)
                hosted.session.restore(Snapshot(attributes=attributes))
                hosted.version += 1
                return hosted.version
        return guard(run)

    def read(self, session_id: str, what: str) -> dict[str, Any]:
        """``state`` (JSON view), ``snapshot`` (encoded attributes) or ``describe`` of a
        session, each read from its sandbox (the host keeps no state)."""
        def run() -> Any:
            session = self._hosted(session_id, None).session
            if what == "state":
                return session.state()
            if what == "snapshot":
                return session.read_state()
            if what == "describe":
                return session.describe()
            raise ArgumentError(f"unknown read {what!r}")
        return guard(run)

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
            raise ArgumentError(f"unknown pool method {method!r}")
        return guard(run)

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
        record is gone, :meth:`~.executor.RayExecutor.undrain`): the ``draining`` flag is reset and, if
        :meth:`shutdown` already closed the pool (a drain that finished as the undrain came),
        a new pool (and a new host link server) is started with the same settings. Sessions
        the drain evicted re-open where their affinity points. Idempotent.
        ``{"ok": {"restarted": bool}}``; raises nothing but the pool's start errors
        (DockerUnavailable, ImageError, as data)."""
        def run() -> dict[str, bool]:
            with self._lock:
                restart, self.pool_closed = self.pool_closed, False  # one caller restarts it
                if restart:
                    self.pool_restarting = True
                elif not self.pool_restarting:
                    self.draining = False
            if restart:  # outside the lock: starting a pool talks to Docker
                try:
                    pool = LocalConfig().build(self.settings, image_settings=self.image_settings)
                except BaseException:
                    with self._lock:
                        self.pool_closed, self.pool_restarting = True, False
                    raise
                link = self._link_server() if self.link.closed else self.link  # shutdown closed it too
                with self._lock:
                    self.pool, self.link, self.pool_restarting, self.draining = pool, link, False, False
            return {"restarted": restart}
        return guard(run)

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

