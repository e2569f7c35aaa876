"""Wire models of the operator's cluster view (`/v1/admin/cluster`): its hosts, API
replicas, and host drains. Response models as in :mod:`.models` (unknown fields ignored)."""

from __future__ import annotations

from datetime import datetime

from .models import _ResponseModel

__all__ = ["ClusterHost", "ClusterReplica", "ClusterStatus", "HostDrain", "HostUndrain"]


class ClusterHost(_ResponseModel):
    """One sandbox host of `ClusterStatus` (the local pool, or one Ray node's host actor)."""

    host: str
    node_id: str | None = None
    hostname: str | None = None
    pid: int | None = None
    uptime_s: float | None = None
    sessions: int
    """Env sessions placed on the host now."""
    sandboxes: int
    idle: int
    active: int
    starting: int
    capacity_sandboxes: int | None = None
    capacity_sessions: int | None = None
    """Live sessions the host can hold (`max_sandboxes x sessions_per_sandbox`)."""
    envs_placed: int = 0
    """Envs whose recorded affinity is this host."""
    calls_in_flight: int | None = None
    """Tool calls running on the host now (None: not reported)."""
    drain: str | None = None
    """None (takes new envs), `draining` (taking nothing new, its envs moving away) or
    `drained` (empty, its pool shut down)."""


class ClusterReplica(_ResponseModel):
    """An API process heart-beating on the shared database."""

    id: str
    started_at: datetime
    heartbeat_at: datetime


class HostDrain(_ResponseModel):
    """`POST /v1/admin/cluster/hosts/{host}/drain`: the drain of one sandbox host."""

    host: str
    status: str
    """`draining`, then `drained` once the host is empty and its pool shut down."""
    started_at: datetime
    finished_at: datetime | None = None
    sessions: int
    """Sessions still on the host."""
    envs_placed: int
    """Envs still recorded on the host."""
    envs_moved: int = 0
    """Envs the drain moved to other hosts (counted when it finishes)."""
    owner: str | None = None
    """The API replica running the drain (taken over by another when it dies)."""


class HostUndrain(_ResponseModel):
    """`POST /v1/admin/cluster/hosts/{host}/undrain`: a sandbox host taking work again."""

    host: str
    previous: str | None = None
    """`draining` (its drain stopped where it was), `drained` (re-created on its node with
    a new pool) or None (it was not drained: a no-op)."""
    status: str = "active"
    """`active`: the host takes new envs again."""


class ClusterStatus(_ResponseModel):
    """`GET /v1/admin/cluster`: nodes, hosts, sandboxes, sessions and capacity, as the
    answering replica (`replica`) sees them."""

    backend: str
    """`local` or `ray`."""
    replica: str
    nodes: int
    hosts: list[ClusterHost]
    replicas: list[ClusterReplica]
    live_envs: int
    sandboxes: int
    sessions: int
    capacity_sessions: int | None = None
