"""The replica end of the Ray backend: :class:`RayExecutor`, placement of sessions on host
actors, refresh of hosts and drains, host links. Its sessions are
:class:`~sandpit.executor.ray.session.RaySession` handles. The package docstring tells the
design."""

from __future__ import annotations

import logging
import secrets
import signal
import threading
import time
from typing import Any

from sandpit.sandbox_images.runner.limits import LINK_RETRY_AFTER_S

from ..errors import DockerUnavailable, ExecutorError, HostDraining, LinkRefused, SandboxLost
from ..interface import Affinity, HostInfo
from ..pool.jobs import PreparedState, unprepared
from ..profiles import ProfileOverrides, ResourceProfile, resolve_profile
from ..results import CheckResult, ExecResult, OpenedState, check_retyped
from ..settings import ExecutorSettings, ImageSettings, get_image_settings, get_settings
from .affinity import MemoryAffinity
from .drain import HostDrains
from .host import HOST_CONCURRENCY, HOST_PREFIX, NAMESPACE, RESOURCE, SandboxHost, ray_module
from .link import DIRECT, HostLink
from .session import RaySession
from .wire import raise_error

log = logging.getLogger("sandpit.executor")


class RayExecutor:
    """The :class:`~sandpit.executor.interface.Executor` over Ray host actors (the package
    docstring); also a :class:`~sandpit.executor.interface.Cluster` (hosts, drains) and
    :class:`~sandpit.executor.interface.KeyedSessions` (sessions keyed by the env id live in
    the hosts, so any replica re-attaches to one, and :meth:`discard` ends one).

    Args:
        address: Ray cluster address (``ray.init(address=...)``; ``None``/``""``: ``auto``).
            Not used when Ray is already initialized in this process.
        settings, image_settings: handed to every host's ``SandboxPool`` (default: this
            process's ``SANDPIT_EXECUTOR_*`` / ``SANDPIT_IMAGE_*``).
        affinity: where env -> host placements are recorded (default: in memory).
        direct: send session requests over host links (:mod:`.link`, the default)
            instead of Ray actor calls; False: everything through Ray.

    Raises (``start``): DockerUnavailable when Ray cannot be reached or no node offers
    ``sandpit_docker``.
    """

    refresh_s: float = 2.0
    """How often the node list is re-read (new nodes get a host; dead ones are skipped)."""
    hop_margin_s: float = 60.0
    """Seconds a request to a host may take beyond the longest call timeout before the
    host counts as lost."""

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
        self._learnt: dict[str, float] = {}  # host -> monotonic time it answered HostDraining
        self.hop_timeout_s = self.settings.max_profile.call_timeout_s + self.hop_margin_s
        self.drains = HostDrains(self)
        """The drains this replica runs (:mod:`.drain`)."""

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> RayExecutor:
        """Connect to Ray and create-or-get the host of every ``sandpit_docker`` node."""
        ray = ray_module()
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
            ray_module().shutdown()

    def shutdown_hosts(self) -> None:
        """Close every host's pool and kill the host actors (operator action; tests)."""
        ray = ray_module()
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
        ray = ray_module()
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
        ray = ray_module()
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

    def learnt_draining(self, host: str) -> None:
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
        ray = ray_module()
        try:
            answer = ray.get(handle.endpoint.remote(), timeout=30)
            where = answer["ok"]
            link = HostLink(host, where["address"], int(where["port"]), where["token"], self.settings.max_frame_bytes,
                            where["certificate"])
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
        ray = ray_module()
        try:
            ray.get(handle.noop.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            self._lost(host)
            return SandboxLost(f"sandbox host {host} was lost: {exc}", sandbox_id=host)
        return SandboxLost(f"the link to sandbox host {host} broke: {exc}", sandbox_id=host)

    def ask(self, host: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Call ``method`` on host ``host`` and unwrap its answer: over the host link for
        the :data:`~.link.DIRECT` methods (when ``direct`` and the link opens), else
        as a Ray actor call. Raises the executor error the host raised, SandboxLost when
        the host (or its node) is gone, its link broke mid-request, or it does not answer
        within ``timeout_s`` seconds (default: the call timeout plus a minute)."""
        ray = ray_module()
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
            raise_error(answer["error"])
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
                self.learnt_draining(host)
                tried.add(host)

    def loads(self, names: list[str]) -> dict[str, int]:
        """Sessions per host of ``names`` (a host that does not answer is left out, as lost)."""
        ray = ray_module()
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
        loads = self.loads(candidates)
        if not loads:
            raise DockerUnavailable("no sandbox host answers")
        self._placed += 1
        return min(sorted(loads), key=lambda n: loads[n])


    # -- drain (the work is in .drain) --------------------------------------------------------
    def drain(self, host: str, wait_s: float | None = None) -> bool:
        """Drain ``host`` in a background thread of this process (:meth:`HostDrains.drain`):
        True when that thread has finished within ``wait_s`` seconds (None: return at once).
        Raises ArgumentError for a host this executor does not know."""
        return self.drains.drain(host, wait_s)

    def undrain(self, host: str) -> bool:
        """Let ``host`` take work again once its drain record is gone
        (:meth:`HostDrains.undrain`): True when the host is live now. Raises the host's
        executor errors (DockerUnavailable, ImageError)."""
        return self.drains.undrain(host)

    def node_alive(self, host: str) -> bool:
        """Whether the Ray node of ``host`` is alive and offers ``sandpit_docker``."""
        return self.drains.node_alive(host)

    def knows(self, host: str) -> bool:
        """Whether ``host`` is live or recorded draining/drained, as this process last read."""
        with self._lock:
            return host in self._hosts or host in self._drains

    def retire(self, host: str) -> None:
        """Record ``host`` drained here, forget its actor and kill it (a drain's last step)."""
        with self._lock:
            self._drains[host] = "drained"
            handle = self._hosts.pop(host, None)
        if handle is not None:
            try:
                ray_module().kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001, S110 - already gone
                pass

    def forget_drain(self, host: str) -> None:
        """Forget what this process learnt of ``host``'s drain and that its actor died (an
        undrain: the next refresh re-creates a drained host's actor on its node)."""
        with self._lock:
            self._learnt.pop(host, None)
            self._drains.pop(host, None)
            self._dead.discard(host)

    # -- Executor ----------------------------------------------------------------------------
    def profile(self, name: str | None = None, overrides: ProfileOverrides | None = None) -> ResourceProfile:
        """A named profile lowered by ``overrides`` (resolved locally: every host has the
        same settings). Raises ProfileError."""
        return resolve_profile(self.settings.profiles, self.settings.max_profile,
                               name or self.settings.default_profile, overrides)

    def open_session(self, *, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None, session_id: str | None = None,
                     seed: int | None = None) -> RaySession:
        """Open ``class_name`` on the env's host (or attach to its live session there);
        ``seed`` as the pool's. Raises SessionOpenError, CapacityError, SandboxLost,
        DockerUnavailable, ArgumentError."""
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
                self.learnt_draining(host)
                tried.add(host)
        if host != recorded:  # a re-attach where it was recorded writes nothing
            self.affinity.put(session_id, host)
        session = RaySession(self, host, session_id, tenant, int(opened["version"]))
        session.retyped = check_retyped(opened.get("retyped"))
        if isinstance(opened.get("opened"), dict):
            session.opened = OpenedState.model_validate(opened["opened"])
        return session

    def describe(self, *, tenant: str, source: str, class_name: str,
                 profile: ResourceProfile | None = None) -> list[dict[str, Any]]:
        """Tool schemas of a class, derived on any host."""
        schemas: list[dict[str, Any]] = self._on_any_host("pool_call", "describe", {
            "tenant": tenant, "source": source, "class_name": class_name,
            "profile": profile.model_dump(mode="json") if profile else None})
        return schemas

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any] | PreparedState,
                   final_state: dict[str, Any] | PreparedState, profile: ResourceProfile | None = None,
                   per_check_timeout_s: float | None = None, source: str | None = None) -> list[CheckResult]:
        """Check functions on two encoded states (a :class:`..pool.jobs.PreparedState`
        goes over the link as its encoded state again), on any host."""
        results = self._on_any_host("pool_call", "run_checks", {
            "tenant": tenant, "checks": checks, "initial_state": unprepared(initial_state),
            "final_state": unprepared(final_state),
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

    def hosts(self) -> list[HostInfo]:
        """Every live host's :meth:`SandboxHost.info` (a host that does not answer is left
        out): the :class:`~sandpit.executor.interface.Cluster` view."""
        out: list[HostInfo] = []
        for host in sorted(self.refresh()):
            try:
                out.append(self.ask(host, "info", timeout_s=10))
            except ExecutorError:
                continue
        return out

    def stats(self) -> dict[str, Any]:
        """The pools' numeric counters summed over the live hosts (per-host info is
        :meth:`hosts`)."""
        total: dict[str, Any] = {}
        for info in self.hosts():
            for key, value in info.get("stats", {}).items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    total[key] = total.get(key, 0) + value
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

