"""The cluster view behind ``GET /v1/admin/cluster`` and ``sandpit cluster status``: the
executor's hosts (one ``local`` pool, or the Ray backend's host actors with their per-host
counters), the API replicas heart-beating on the database and the env -> host placements."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from ..db import models
from ..db.affinity import DbAffinity
from ..db.database import Database
from ..sandboxes import Sandboxes
from ..schemas.cluster import ClusterStatus, HostStatus, ReplicaStatus
from ..settings import ApiSettings
from .common import aware
from .live import LiveEnvs


class ClusterService:
    """Reads only; the executor's ``stats()`` is one request per host (Ray backend)."""

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, live: LiveEnvs,
                 replica_id: str) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.live = live
        self.replica_id = replica_id

    def status(self) -> ClusterStatus:
        """The cluster as this replica sees it. Raises ServiceUnavailable (database)."""
        stats = self.sandboxes.stats()
        placed = DbAffinity(self.db).counts()
        raw: list[dict[str, Any]] = stats.get("hosts") or [{"host": "local", "stats": stats}]
        hosts = []
        for info in raw:
            s = info.get("stats", {})
            cap = info.get("max_sandboxes")
            per = info.get("sessions_per_sandbox")
            hosts.append(HostStatus(
                host=info["host"], node_id=info.get("node_id"), hostname=info.get("hostname"), pid=info.get("pid"),
                uptime_s=info.get("uptime_s"), sessions=int(s.get("sessions", 0)),
                sandboxes=int(s.get("sandboxes", 0)), idle=int(s.get("idle", 0)), active=int(s.get("active", 0)),
                starting=int(s.get("starting", 0)), capacity_sandboxes=cap,
                capacity_sessions=cap * per if cap is not None and per is not None else None,
                envs_placed=placed.get(info["host"], 0)))
        with self.db.read() as db:
            replicas = [ReplicaStatus(id=r.id, started_at=aware(r.started_at), heartbeat_at=aware(r.heartbeat_at))
                        for r in db.scalars(select(models.Replica).order_by(models.Replica.started_at))]
        caps = [h.capacity_sessions for h in hosts]
        return ClusterStatus(
            backend=self.settings.executor_backend, replica=self.replica_id,
            nodes=len({h.node_id or h.host for h in hosts}), hosts=hosts, replicas=replicas,
            live_envs=len(self.live), sandboxes=sum(h.sandboxes for h in hosts),
            sessions=sum(h.sessions for h in hosts),
            capacity_sessions=sum(c for c in caps if c is not None) if caps and None not in caps else None)
