"""``GET /v1/admin/cluster`` (operator key): where sandboxes run and how full they are."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel


class HostStatus(BaseModel):
    """One sandbox host: the local pool, or one Ray host actor (one per node)."""

    host: str
    """``local``, or ``sandpit-host-<node id prefix>`` (Ray backend)."""
    node_id: str | None = None
    """The Ray node it is pinned to (None for the local backend)."""
    hostname: str | None = None
    pid: int | None = None
    uptime_s: float | None = None
    """Seconds since the host's pool started."""
    sessions: int
    """Env sessions placed in this host's sandboxes now."""
    sandboxes: int
    """Sandbox containers of the host (idle + active + starting)."""
    idle: int
    active: int
    starting: int
    capacity_sandboxes: int | None = None
    """``max_sandboxes`` of the host's pool (None: not reported)."""
    capacity_sessions: int | None = None
    """``max_sandboxes x sessions_per_sandbox``: live sessions the host can hold."""
    envs_placed: int = 0
    """Envs whose recorded affinity is this host (``env_hosts``; Ray backend)."""
    calls_in_flight: int | None = None
    """Tool calls running on the host now (None: not reported, e.g. the local backend)."""
    drain: Literal["draining", "drained"] | None = None
    """None: the host takes new envs. ``draining``: it takes nothing new and its sessions
    are being moved; ``drained``: empty, its pool shut down (listed with zero counters)."""


class ReplicaStatus(BaseModel):
    """An API process serving the database (heart-beating within the last minute or so)."""

    id: str
    started_at: datetime
    heartbeat_at: datetime


class ClusterStatus(BaseModel):
    """Nodes, hosts, sandboxes, sessions and capacity, as seen by the answering replica."""

    backend: Literal["local", "ray"]
    replica: str
    """The id of the replica that answered."""
    nodes: int
    """Nodes with a sandbox host (1 for the local backend)."""
    hosts: list[HostStatus]
    replicas: list[ReplicaStatus]
    live_envs: int
    """Envs the answering replica holds a session handle for."""
    sandboxes: int
    sessions: int
    capacity_sessions: int | None = None
    """Sum over hosts (None when a host does not report it)."""


class HostDrainPublic(BaseModel):
    """``POST /v1/admin/cluster/hosts/{host}/drain``: the drain of one sandbox host."""

    host: str
    status: Literal["draining", "drained"]
    """``draining`` until the host holds no session and runs no work, then ``drained``
    (its pool shut down, its containers removed, its actor gone)."""
    started_at: datetime
    finished_at: datetime | None = None
    sessions: int
    """Sessions still on the host now (0 once drained, or when the host does not answer)."""
    envs_placed: int
    """Envs whose recorded affinity is still this host (moved to others as the drain goes)."""
    envs_moved: int
    """Envs whose affinity the drain moved (counted when it finishes)."""
    owner: str | None = None
    """The API replica running the drain (``rep_...``, as ``GET /v1/admin/cluster`` lists
    replicas); another replica takes it over when this one stops heart-beating."""



class HostUndrainPublic(BaseModel):
    """``POST /v1/admin/cluster/hosts/{host}/undrain``: a host taking work again."""

    host: str
    previous: Literal["draining", "drained"] | None
    """What the host was: ``draining`` (its drain stopped where it was: sessions already
    moved stay where they re-opened), ``drained`` (its actor re-created on its node, with a
    new empty pool), or None (it was not drained: nothing changed, the undrain is a no-op)."""
    status: Literal["active"] = "active"
    """The host takes new envs again (every replica places on it within a few seconds)."""
