"""Draining a sandbox host: an operator's orderly removal of one host of the Ray backend
(the package docstring tells the protocol; ``api/services/cluster.py`` records drains and
their owners). :class:`HostDrains` runs a drain in a thread of this replica, one per host,
and undoes one; everything it needs of the replica's executor is :class:`Replica`."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from ..errors import ArgumentError, SandboxLost
from ..interface import Affinity
from .host import HOST_PREFIX

log = logging.getLogger("sandpit.executor")

UNDRAIN_ATTEMPTS = 10
"""Tries (0.5 s apart) of :meth:`HostDrains.undrain` to reach a drained host's new actor."""


class Replica(Protocol):
    """What a drain needs of this replica's Ray executor
    (:class:`~sandpit.executor.ray.executor.RayExecutor` provides it)."""

    @property
    def affinity(self) -> Affinity:
        """Where env placements and drains are recorded (shared by every replica)."""
        ...

    def knows(self, host: str) -> bool:
        """Whether ``host`` is live or recorded as draining/drained, as last read."""
        ...

    def refresh(self, force: bool = False) -> dict[str, Any]:
        """Live host name -> actor handle (re-read at most every ``refresh_s`` unless ``force``)."""
        ...

    def drain_states(self) -> dict[str, str]:
        """Host -> ``draining`` / ``drained`` as last read."""
        ...

    def nodes(self) -> list[dict[str, Any]]:
        """Alive Ray nodes offering the host resource (``{"node_id", ...}``)."""
        ...

    def placeable(self) -> list[str]:
        """Live hosts that take new work."""
        ...

    def loads(self, names: list[str]) -> dict[str, int]:
        """Sessions per host of ``names`` (hosts that do not answer are left out)."""
        ...

    def ask(self, host: str, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        """A host method's answer. Raises the host's executor error, SandboxLost."""
        ...

    def learnt_draining(self, host: str) -> None:
        """Count ``host`` as draining from now on (before any replica's record says so)."""
        ...

    def retire(self, host: str) -> None:
        """``host`` is drained: record it so here, forget its actor and kill it."""
        ...

    def forget_drain(self, host: str) -> None:
        """``host`` was undrained: forget what this replica learnt of its drain and that its
        actor died, so the next refresh re-creates it."""
        ...


class HostDrains:
    """The drains this replica runs (:meth:`drain`), and undrains (:meth:`undrain`).

    Args:
        replica: the replica's executor.
    """

    drain_poll_s: float = 0.2
    """Seconds between two passes of a drain over its host's sessions and work in flight."""
    drain_timeout_s: float = 900.0
    """Seconds a drain waits for its host to empty before it gives up (the host stays
    ``draining``, placing nothing; issuing the drain again resumes it)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def drain(self, host: str, wait_s: float | None = None) -> bool:
        """Drain ``host`` (module docstring) in a background thread of this process (one per
        host: a second call joins the running one). The caller records the drain in the
        affinity first, so every replica stops placing on ``host``. ``wait_s``: seconds to
        wait for the drain to finish (None: return at once). Returns True when this
        process's drain thread has finished. Raises ArgumentError for a host this executor
        does not know (neither live nor recorded)."""
        replica = self.replica
        if not replica.knows(host) and host not in replica.refresh(force=True) and host not in replica.drain_states():
            raise ArgumentError(f"unknown sandbox host {host!r}")
        replica.learnt_draining(host)
        with self._lock:
            thread = self._threads.get(host)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(target=self._drain, args=(host,), daemon=True, name=f"sandpit-drain-{host}")
                self._threads[host] = thread
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
                    left = self.replica.ask(host, "drain", timeout_s=30)
                except SandboxLost:  # the node went away meanwhile: nothing left to wait for
                    break
                if not left["sessions"] and not left["busy"]:
                    break
                try:
                    for session_id in left["sessions"]:
                        if not self._still_draining(host):  # undrained while a call held an eviction
                            return
                        self.replica.ask(host, "evict", session_id)
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
            moved += self._move_envs(host, self.replica.affinity.envs_on(host))
            try:
                self.replica.ask(host, "shutdown", timeout_s=120)
            except SandboxLost:
                pass
            if not self.replica.affinity.finish_drain(host, moved):  # undrained as the pool closed
                log.info("drain of %s was undrained as it shut the pool down: starting a new pool", host)
                try:
                    self.replica.ask(host, "undrain", timeout_s=120)
                except SandboxLost:
                    pass
                return
            self.replica.retire(host)
            late = self._move_envs(host, self.replica.affinity.envs_on(host))  # a placement recorded after the sweep
            if late:
                self.replica.affinity.finish_drain(host, late)
            log.info("drained %s: %d envs moved", host, moved + late)
        except Exception:  # noqa: BLE001 - a background thread: logged, the host stays draining
            log.exception("drain of %s failed; it stays draining (issue the drain again to resume)", host)

    def _still_draining(self, host: str) -> bool:
        """Whether ``host``'s drain is still recorded ``draining`` (a database hiccup counts
        as yes: the next pass looks again)."""
        try:
            status = self.replica.affinity.drains().get(host)
        except Exception as exc:  # noqa: BLE001 - the drain goes on; the next pass re-reads
            log.warning("drain of %s cannot read its record (%s: %s)", host, type(exc).__name__, exc)
            return True
        if status != "draining":
            log.info("drain of %s stops: %s", host, "finished by another replica" if status else "undrained")
        return status == "draining"

    def node_alive(self, host: str) -> bool:
        """Whether the Ray node of ``host`` (``sandpit-host-<node id prefix>``) is alive and
        offers ``sandpit_docker``: a drained host can take work again only then."""
        return any(HOST_PREFIX + node["node_id"][:16] == host for node in self.replica.nodes())

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
        self.replica.forget_drain(host)
        for attempt in range(UNDRAIN_ATTEMPTS):  # a drained actor just killed may still hold its name
            if attempt:
                time.sleep(0.5)
                self.replica.forget_drain(host)
            if host not in self.replica.refresh(force=True):
                return False
            try:
                self.replica.ask(host, "undrain", timeout_s=120)
                return True
            except SandboxLost:
                continue
        return False

    def _move_envs(self, host: str, session_ids: list[str]) -> int:
        """Re-record ``session_ids`` (still recorded on ``host``) on the least-loaded hosts
        that take work (forgotten when there is none). How many moved."""
        if not session_ids:
            return 0
        loads = self.replica.loads([name for name in self.replica.placeable() if name != host])
        moved = 0
        for session_id in session_ids:
            target = min(sorted(loads), key=lambda n: loads[n]) if loads else None
            if self.replica.affinity.move(session_id, host, target):
                moved += 1
                if target is not None:
                    loads[target] += 1
        return moved

