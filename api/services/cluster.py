"""The cluster view behind ``GET /v1/admin/cluster`` and ``sandpit cluster status``: the
executor's hosts (one ``local`` pool, or the Ray backend's host actors with their per-host
counters), the API replicas heart-beating on the database and the env -> host placements;
and the drain of a host (``POST /v1/admin/cluster/hosts/{host}/drain``, ``sandpit cluster
drain``): recorded in ``host_drains`` so every replica stops placing on it, carried out by
the executor (``RayExecutor.drain``: sessions evicted once their calls return, envs moved,
pool shut down). The drain is owned by the replica that started it (``host_drains.owner``):
when that replica stops heart-beating, a live replica's janitor takes the drain over
(:meth:`ClusterService.take_over_drains`). ``POST .../undrain`` (``sandpit cluster
undrain``) lets a draining or drained host take work again (:meth:`ClusterService.undrain`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from ..db import models
from ..db.affinity import DbAffinity
from ..db.database import Database
from ..errors import Conflict, NotFound
from ..sandboxes import BackendName, Sandboxes
from ..schemas.cluster import ClusterStatus, HostDrainPublic, HostStatus, HostUndrainPublic, ReplicaStatus
from ..settings import LEASE_S, ApiSettings
from .common import aware

log = logging.getLogger("sandpit.api")

DRAINED_SHOWN = 20
"""Drained hosts (gone) that ``status`` still lists, most recent first."""
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""What a host name can be (``local``, ``sandpit-host-<node id prefix>``): anything else is
unknown without asking the database (a NUL byte is not even storable in PostgreSQL)."""


class ClusterService:
    """Reads, plus :meth:`drain`, :meth:`undrain` and the janitor's
    :meth:`take_over_drains`; the hosts' info is one request per host (Ray backend). Every
    executor call goes through the adapter (:class:`~..sandboxes.Sandboxes`), so its
    errors are translated like any other (503 for a failing backend).

    Args:
        backend: the executor's backend, as the status reports it.
    """

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, live_envs: Callable[[], int],
                 replica_id: str, backend: BackendName = "local") -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.live_envs = live_envs
        """How many envs this replica holds in sandboxes now."""
        self.replica_id = replica_id
        self.backend = backend

    def status(self) -> ClusterStatus:
        """The cluster as this replica sees it (drained hosts listed last, with zero
        counters). Raises ServiceUnavailable (database)."""
        affinity = DbAffinity(self.db)
        placed = affinity.counts()
        multi_host = self.sandboxes.multi_host
        drains = affinity.drains() if multi_host else {}
        raw: list[dict[str, Any]] = ([dict(info) for info in self.sandboxes.hosts()] if multi_host
                                     else [{"host": "local", "stats": self.sandboxes.stats()}])
        hosts = []
        for info in raw:
            s = info.get("stats", {})
            cap = info.get("max_sandboxes")
            per = info.get("sessions_per_sandbox")
            drain = drains.get(info["host"]) or ("draining" if info.get("draining") else None)
            hosts.append(HostStatus(
                host=info["host"], node_id=info.get("node_id"), hostname=info.get("hostname"), pid=info.get("pid"),
                uptime_s=info.get("uptime_s"), sessions=int(s.get("sessions", 0)),
                sandboxes=int(s.get("sandboxes", 0)), idle=int(s.get("idle", 0)), active=int(s.get("active", 0)),
                starting=int(s.get("starting", 0)), capacity_sandboxes=cap,
                capacity_sessions=cap * per if cap is not None and per is not None else None,
                envs_placed=placed.get(info["host"], 0), calls_in_flight=info.get("calls"), drain=drain))  # type: ignore[arg-type]
        live_hosts = list(hosts)
        shown = {h.host for h in hosts}
        with self.db.read() as db:
            replicas = [ReplicaStatus(id=r.id, started_at=aware(r.started_at), heartbeat_at=aware(r.heartbeat_at))
                        for r in db.scalars(select(models.Replica).order_by(models.Replica.started_at))]
            gone = db.scalars(select(models.HostDrain).where(models.HostDrain.status == "drained")
                              .order_by(models.HostDrain.finished_at.desc()).limit(DRAINED_SHOWN)).all()
        hosts += [HostStatus(host=d.host, sessions=0, sandboxes=0, idle=0, active=0, starting=0, capacity_sandboxes=0,
                             capacity_sessions=0, envs_placed=placed.get(d.host, 0), drain="drained")
                  for d in gone if d.host not in shown]
        caps = [h.capacity_sessions for h in hosts]
        return ClusterStatus(
            backend=self.backend, replica=self.replica_id,
            nodes=len({h.node_id or h.host for h in live_hosts}), hosts=hosts, replicas=replicas,
            live_envs=self.live_envs(), sandboxes=sum(h.sandboxes for h in hosts),
            sessions=sum(h.sessions for h in hosts),
            capacity_sessions=sum(c for c in caps if c is not None) if caps and None not in caps else None)

    def drain(self, host: str, force: bool = False) -> HostDrainPublic:
        """Drain sandbox host ``host``: record it ``draining`` (every replica stops placing
        envs on it within ``RayExecutor.refresh_s``, and the host itself refuses new work at
        once), then let this replica's executor move its sessions and shut it down in the
        background; this replica is recorded as the drain's owner. Idempotent: draining a
        draining host (re)starts the work in this replica (taking the drain over when its
        owner is dead: :meth:`take_over_drains` does the same by itself); a drained host is
        answered as is.

        Raises:
            NotFound: ``host`` is neither a live host nor a drained one.
            Conflict: it is the last host taking envs and ``force`` is False (its envs would
                have nowhere to go), or the local backend (its one pool cannot be drained).
            ServiceUnavailable: database or Ray failure.
        """
        if not self.sandboxes.multi_host:
            if host == "local":
                raise Conflict("the local backend has one sandbox host: there is nowhere to drain it to")
            raise NotFound(f"sandbox host {host!r} not found")
        affinity = DbAffinity(self.db)
        live = self.sandboxes.live_hosts(force=True)
        if host not in live and (not HOST_NAME.fullmatch(host) or affinity.drain_record(host) is None):
            raise NotFound(f"sandbox host {host!r} not found")
        row, created = affinity.start_drain(host, live, allow_last=force, owner=self.replica_id)
        if row is None:
            raise Conflict(f"host {host!r} is the last sandbox host taking envs: draining it would leave its envs "
                           "nowhere to go (drain with force=true to do it anyway)")
        if row.status != "drained":
            if not created:
                for orphan, owner in affinity.orphaned_drains(LEASE_S):
                    if orphan == host:
                        affinity.claim_drain(host, owner, self.replica_id)
            self.sandboxes.drain(host)
        return self.drain_view(host)

    def take_over_drains(self) -> list[str]:
        """Claim and resume every ``draining`` drain whose owner replica is dead (no
        heartbeat for ``settings.LEASE_S`` seconds, the rule that resets a dead replica's
        evaluation episodes, or its row gone): one compare-and-set per drain
        (``DbAffinity.claim_drain``), so exactly one live replica resumes each. Run by the
        janitor every ``janitor_interval_s``; a no-op on the local backend. Returns the
        hosts this replica took over. A drain this replica claimed but could not start is
        released (owner None) before the error is raised, so it is claimed again on a later
        pass. Raises ServiceUnavailable (database), the adapter's SandboxError."""
        if not self.sandboxes.multi_host:
            return []
        affinity = DbAffinity(self.db)
        taken = []
        for host, owner in affinity.orphaned_drains(LEASE_S):
            if not affinity.claim_drain(host, owner, self.replica_id):
                continue  # another replica claimed it first
            log.warning("taking over the drain of %s from replica %s (no heartbeat for %.0f s)", host, owner, LEASE_S)
            try:
                self.sandboxes.drain(host)
            except Exception:
                affinity.claim_drain(host, self.replica_id, None)  # let the next pass (any replica) retry it
                raise
            taken.append(host)
        return taken

    def undrain(self, host: str) -> HostUndrainPublic:
        """Let sandbox host ``host`` take new envs again. A ``draining`` host: its drain
        record is deleted, the drain (in whichever replica runs it) stops at its next pass
        without shutting the pool down, and the host's own refusal is lifted; envs it
        already moved stay where they re-opened. A ``drained`` host whose Ray node is
        still alive: its record is deleted and its actor re-created there (a new, empty
        pool). A host that was never drained: a no-op (``previous`` None), so the call is
        idempotent; on the local backend ``local`` is such a host.

        Raises:
            NotFound: ``host`` is neither a live host nor a drained one.
            Conflict: ``host`` is draining or drained and its Ray node is gone (nothing to
                bring back; a draining one ends ``drained``).
            ServiceUnavailable: database or Ray failure (also: the re-created host's pool
                cannot start).
        """
        if not self.sandboxes.multi_host:
            if host == "local":
                return HostUndrainPublic(host=host, previous=None)
            raise NotFound(f"sandbox host {host!r} not found")
        if not HOST_NAME.fullmatch(host):
            raise NotFound(f"sandbox host {host!r} not found")
        affinity = DbAffinity(self.db)
        for _ in range(3):  # a drain finishing meanwhile turns draining into drained: look again
            row = affinity.drain_record(host)
            if row is None:
                if host not in self.sandboxes.live_hosts(force=True):
                    raise NotFound(f"sandbox host {host!r} not found")
                self.sandboxes.undrain(host)  # lifts a refusal left behind, if any
                return HostUndrainPublic(host=host, previous=None)
            if not self.sandboxes.node_alive(host):
                raise Conflict(f"host {host!r} is {row.status} and its Ray node is gone: it cannot take work again "
                               "(a new node gets a new host)")
            if affinity.undrain(host, row.status):
                self.sandboxes.undrain(host)
                log.info("undrained %s (was %s)", host, row.status)
                return HostUndrainPublic(host=host, previous=row.status)  # type: ignore[arg-type]
        raise Conflict(f"the drain of host {host!r} keeps changing; try again")

    def drain_view(self, host: str) -> HostDrainPublic:
        """The drain of ``host`` now. Raises NotFound (never drained)."""
        affinity = DbAffinity(self.db)
        row = affinity.drain_record(host) if HOST_NAME.fullmatch(host) else None
        if row is None:
            raise NotFound(f"sandbox host {host!r} is not being drained")
        sessions = 0
        if row.status != "drained":
            for info in self.sandboxes.hosts():
                if info.get("host") == host:
                    sessions = int(info.get("sessions", 0))
        return HostDrainPublic(host=row.host, status=row.status,  # type: ignore[arg-type]
                               started_at=aware(row.started_at),
                               finished_at=aware(row.finished_at) if row.finished_at is not None else None,
                               sessions=sessions, envs_placed=affinity.counts().get(host, 0),
                               envs_moved=row.envs_moved, owner=row.owner)
