"""Executor settings: :class:`ExecutorSettings` (environment variables prefixed
``SANDPIT_EXECUTOR_``: where and how sandboxes run), :class:`BackendSettings` (which
backend runs them: ``SANDPIT_EXECUTOR_BACKEND`` and the backend's own variables) and
:class:`ImageSettings` (``SANDPIT_IMAGE_``: how the sandbox image is built).

Read through the cached getters (:func:`get_settings`, :func:`get_backend_settings`,
:func:`get_image_settings`) so tests and the CLI can override them; nothing here creates a
Docker client or reads the environment at import time. Profiles are JSON, e.g.
``SANDPIT_EXECUTOR_PROFILES='{"default": {"memory_mib": 512}}'``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sandpit.sandbox_images.runner import limits

from .profiles import ResourceProfile, check_within


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))) / "sandpit"


def _default_run_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/sandpit")
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sandpit"


SHARED_SESSIONS_DEFAULT = 8
"""``sessions_per_sandbox`` when it is not set and the runtime is ``runc``."""


class ExecutorSettings(BaseSettings):
    """Where sandboxes run and how many; every field documents its unit."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_EXECUTOR_", extra="forbid")

    docker_host: str | None = None
    """Docker Engine URL (``unix:///var/run/docker.sock``); ``None`` = DOCKER_HOST or the default."""
    runtime: Literal["runc", "runsc"] = "runc"
    """OCI runtime for sandboxes: ``runc`` (Docker's default) or ``runsc`` (gVisor)."""
    image: str | None = None
    """Sandbox image reference; ``None`` = the tag built from ``sandbox_images/`` by
    ``sandpit image build`` (content-hash tag)."""
    run_dir: Path = Field(default_factory=_default_run_dir)
    """Host directory holding one protocol-socket directory per sandbox."""
    pool_size: Annotated[int, Field(ge=0, le=1024)] = 2
    """Warm (started, idle) sandboxes kept ready per (tenant, profile, runtime, image)."""
    pool_refill_concurrency: Annotated[int, Field(ge=1, le=64)] = 2
    """Containers started in parallel by the background refill."""
    sessions_per_sandbox: Annotated[int, Field(ge=1, le=256)] = SHARED_SESSIONS_DEFAULT
    """Placement: hard upper cap on sessions of one tenant hosted by one sandbox (1 =
    container per session). Below it, admission is by measured memory: a session joins a
    sandbox only while the sandbox's measured memory plus the expected cost of one more
    session stays under its memory limit, and the pool's total under ``memory_budget_mib``.
    Default: SHARED_SESSIONS_DEFAULT (8) under ``runc`` (sessions of one tenant share a
    sandbox, so an environment's sessions fork from its templates and repeated configs
    skip construction: ``session_templates``); 1 when it is not set and the runtime is
    ``runsc`` (where sessions of one sandbox could read each other's ``/proc``:
    docs/isolation.md)."""
    session_templates: bool = True
    """With ``sessions_per_sandbox > 1``: each sandbox keeps one warm template process per
    environment (source and class) and forks new sessions of it copy-on-write instead of
    executing the source again (``sandbox_images/runner/pid1_templates.py``; sources whose
    import is not provably side-effect free start the normal way)."""
    session_forks_ahead: Annotated[int, Field(ge=0, le=limits.FORK_AHEAD_MAX_PER_SANDBOX)] = limits.FORK_AHEAD_DEFAULT
    """With ``session_templates``: how many templates of a sandbox keep their next session
    process forked ahead of the next open of their environment or config (the most recently
    forked from; ``sandbox_images/runner/pid1_forks.py``): the open takes it instead of
    waiting for a fork. Each is one more idle copy-on-write process of the sandbox (about
    1.4 MiB of its own); 0 forks every session on its open's path."""
    sandbox_memory_mib: Annotated[int, Field(ge=0, le=1048576)] = 0
    """Memory limit of a sandbox container (cgroup, MiB; swap = memory). 0: the profile's
    ``memory_mib`` plus 32 MiB per session slot (``ResourceProfile.sandbox_memory_bytes``).
    It is a ceiling; how many sessions a sandbox takes is decided by what it actually uses."""
    memory_budget_mib: Annotated[int, Field(ge=0, le=16777216)] = 0
    """Host memory all sandboxes of this pool may use together (MiB), measured as the sum of
    their cgroups' memory usage plus the expected cost of sandboxes being started; a
    placement that would exceed it raises CapacityError. 0: 80 % of the host's MemTotal."""
    session_memory_estimate_mib: Annotated[float, Field(gt=0, le=65536)] = 8.0
    """Expected memory of one more session (MiB) until a sandbox has measured its own:
    afterwards the estimate is that sandbox's measured (usage - empty usage) / sessions,
    never below ``session_memory_floor_mib``."""
    session_memory_floor_mib: Annotated[float, Field(gt=0, le=65536)] = 1.0
    """Smallest per-session memory estimate admission uses (MiB)."""
    sandbox_memory_headroom_mib: Annotated[int, Field(ge=0, le=1048576)] = 0
    """Memory kept free in every shared sandbox for its sessions to grow (MiB); 0: the
    profile's ``memory_mib`` (one session at its full limit)."""
    memory_sample_s: Annotated[float, Field(gt=0, le=60)] = 0.5
    """How long a sandbox's measured memory is reused before the cgroup is read again (s)."""
    max_sandboxes: Annotated[int, Field(ge=1, le=100000)] = 64
    """Hard cap on live sandboxes (warm + busy); beyond it placement raises CapacityError."""
    idle_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    """A sandbox with no session for this long (seconds) is removed, beyond the warm quota."""
    startup_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Max seconds from ``docker create`` until the runner says hello."""
    watchdog_grace_s: Annotated[float, Field(ge=0)] = 5.0
    """Seconds the host waits beyond a call's own timeout before declaring the runner
    unresponsive and killing the container."""
    cpu_period_us: Annotated[int, Field(ge=1000, le=1_000_000)] = 10_000
    """CFS period of every sandbox, microseconds; its quota is ``cpus`` of it. Shorter than
    Docker's 100 ms default: same CPU share, but a sandbox that hits its quota stalls for
    at most ``(1 - cpus) x`` the period."""
    cpu_burst_fraction: Annotated[float, Field(ge=0, le=1)] = 1.0
    """CFS burst of each sandbox as a fraction of its CPU quota per period
    (``cpu.cfs_burst_us`` in cgroup v1, ``cpu.max.burst`` in v2; Linux >= 5.14): quota a
    sandbox left unused may be spent later, up to this much beyond the quota in one
    period, so a short step after idle time runs at full speed instead of stalling at the
    quota. The long-run share stays ``cpus``. The kernel caps the burst at the quota (1.0);
    0 turns it off. Written by the host after the container starts; a host whose cgroup
    file is missing or not writable runs without it."""
    session_startup_s: Annotated[float, Field(gt=0, le=120)] = limits.SESSION_STARTUP_S
    """Time a newly started session process in a sandbox has to come up (interpreter,
    limits, seccomp filter) before the request waiting for it fails as ``crashed``. The
    request's own ``call_timeout_s`` starts only once the process runs, so a slow start
    (CI saw one under gVisor, every core busy, use up a 1 s limit) is never charged to the
    environment's code (``sandbox_images/runner/limits.py`` SESSION_STARTUP_S)."""
    spare_child: bool = True
    """Keep one pre-started (code-free) session process per sandbox with a free slot, so
    opening a session does not wait for the Python interpreter to start (~8 MiB each)."""
    runsc_pids_headroom: Annotated[int, Field(ge=0, le=4096)] = 192
    """Under gVisor the container's pids cgroup also counts the sentry's and gofer's host
    threads (about 30 idle, 60+ under load); with only the profile's pids the Go runtime
    of the sentry fails to start a thread and the whole sandbox exits. This many extra pids
    are added to the cgroup limit for runsc only; the processes of untrusted code stay
    bounded by the profile's pids through RLIMIT_NPROC, which gVisor enforces itself."""
    runsc_pids_per_process: Annotated[int, Field(ge=1, le=64)] = 8
    """Under gVisor (ptrace platform) every sandboxed process also costs host pids: a
    stub process and the sentry threads that trace it. Measured: 64 sandboxed processes
    (a spawn loop at RLIMIT_NPROC=64) took 457 host pids; at a cgroup limit of
    ``pids + 192`` the sentry could not start a thread and the whole sandbox died within
    about 1 s. The runsc pids cgroup limit is ``pids * this + runsc_pids_headroom``."""

    runsc_poll_interval_s: Annotated[float, Field(gt=0, le=1)] = 0.05
    """Under gVisor, the runner's event loop wakes at least this often (seconds): Debian's
    runsc (2022-12) can miss epoll wake-ups on the host-backed protocol socket, which
    otherwise stalls a reply until the next wake-up. runc needs no polling (1 s). Faster
    polling spends the sandbox's CPU quota on wake-ups and gets it throttled, which raises
    the tail rather than lowering it."""
    runsc_retire_pids_fraction: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Under gVisor (ptrace platform, Debian's 2022-12 runsc) the host stub processes of
    exited sandboxed processes are kept: measured about 230 host pids per spawn loop of
    64 processes, still held when the sandbox is idle. A runsc sandbox whose pids cgroup
    holds more than this fraction of its limit after a call is retired: no new session
    is placed in it, its sessions move to a fresh sandbox (restored from the state read
    from the retiring one) at their next request, and it is destroyed when the last one has left."""
    reap_on_start: bool = True
    """When a pool starts, remove every ``sandpit=1`` container left by earlier runs: those
    whose owner is proven dead (``executor/docker/owners.py``) and those without a Sandpit owner
    label. Sandboxes of live owners (and of owners this pool cannot judge) stay."""
    reap_interval_s: Annotated[float, Field(ge=0, le=86400)] = 30.0
    """Seconds between two sweeps of the engine by a started pool (0: none): each removes
    the sandboxes whose owner is proven dead (its process gone, in this pool's pid
    namespace, or its lease expired), whatever ``reap_on_start`` says; containers without
    a Sandpit owner label and owners it cannot judge are left alone. A dead owner's
    sandboxes go within ``reap_interval_s + owner_lease_timeout_s`` seconds of its last
    lease renewal (within ``reap_interval_s`` when its process was in this namespace)."""
    owner_lease_timeout_s: Annotated[float, Field(ge=0.5, le=86400)] = 60.0
    """A pool's lease (a file in ``owner_lease_dir`` whose modification time it refreshes
    every quarter of this) counts as expired, and its owner as dead, this many seconds
    after its last renewal: also while its process exists but is stopped or hung."""
    owner_lease_dir: Path | None = None
    """Directory of the owner leases (``executor/docker/owners.py``). Pools that should reap each
    other's leftovers across pid namespaces (API servers in separate containers on one
    engine) must share it: mount the same host directory. ``None``: ``<run_dir>.leases``."""
    default_profile: str = "default"
    profiles: dict[str, ResourceProfile] = Field(
        default_factory=lambda: {"default": ResourceProfile()})
    """Named profiles an operator offers; callers pick one and may lower it."""
    max_profile: ResourceProfile = ResourceProfile(
        name="max", memory_mib=8192, cpus=2.0, pids=1024, tmpfs_mib=2048, call_timeout_s=600.0,
        output_cap_bytes=16 * 1024 * 1024, observation_cap_bytes=16 * 1024 * 1024,
        nofile=4096, fsize_mib=2048)
    """Operator ceiling: no profile may exceed any of these values."""
    uid_base: Annotated[int, Field(ge=1000)] = 20000
    uid_count: Annotated[int, Field(ge=1)] = 40000
    """Each sandbox runs as its own non-root uid from [uid_base, uid_base+uid_count), so
    RLIMIT_NPROC and file ownership never span two sandboxes."""
    sandbox_gid: Annotated[int, Field(ge=1000)] = 10001
    """Group shared by sandbox processes; owns the protocol socket directories."""
    max_frame_bytes: Annotated[int, Field(ge=1024)] = limits.MAX_FRAME_BYTES
    """Largest protocol frame accepted from a runner (bytes); bigger kills the sandbox."""

    def resolved_lease_dir(self) -> Path:
        """``owner_lease_dir``, or ``<run_dir>.leases`` beside the socket directories."""
        return self.owner_lease_dir or self.run_dir.with_name(self.run_dir.name + ".leases")

    @model_validator(mode="after")
    def _default_sessions_per_sandbox(self) -> ExecutorSettings:
        if "sessions_per_sandbox" not in self.model_fields_set:
            self.sessions_per_sandbox = 1 if self.runtime == "runsc" else SHARED_SESSIONS_DEFAULT
        return self

    @model_validator(mode="after")
    def _profiles_within_ceiling(self) -> ExecutorSettings:
        if self.default_profile not in self.profiles:
            raise ValueError(f"default_profile {self.default_profile!r} is not in profiles")
        for name, profile in self.profiles.items():
            if profile.name != name:
                self.profiles[name] = profile.model_copy(update={"name": name})
            check_within(self.profiles[name], self.max_profile)
        return self


BackendName = Literal["local", "ray"]
"""The backends :class:`BackendSettings` can choose (``config.py`` has one config class each)."""


class BackendSettings(BaseSettings):
    """Which executor backend a program builds, and that backend's options (prefix
    ``SANDPIT_``). A field ``<backend>_<option>`` is option ``<option>`` of the backend
    named ``<backend>`` (``ray_address`` is :attr:`RayConfig.address
    <sandpit.executor.config.RayConfig.address>`); :func:`sandpit.executor.config.configured`
    turns these into the backend's typed config."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_", extra="forbid")

    executor_backend: BackendName = "local"
    """Where sandboxes run: ``local`` (a Docker pool in this process, the default; no Ray
    needed) or ``ray`` (host actors on the Ray cluster's nodes that offer the
    ``sandpit_docker`` resource; needs the ``ray`` extra and, for replicas, a shared
    PostgreSQL database). Environment: ``SANDPIT_EXECUTOR_BACKEND``."""
    ray_address: str | None = None
    """Ray cluster address for the ``ray`` backend (``SANDPIT_RAY_ADDRESS``; empty: ``auto``,
    the cluster this machine's ``ray start`` joined)."""
    ray_direct_calls: bool = True
    """Ray backend: send session requests (tool calls, restores, state reads) to the sandbox
    hosts over gRPC host links (``executor/ray/link.py``; ``benchmarks/host_link.py``
    compares their round trip with a Ray actor call's); False sends everything through
    Ray (``SANDPIT_RAY_DIRECT_CALLS``)."""

    def config_data(self) -> dict[str, Any]:
        """``{"type": <backend>, <option>: value, ...}``: the chosen backend's name and the
        fields named ``<backend>_<option>`` (other backends' options are left out)."""
        prefix = f"{self.executor_backend}_"
        options = {name.removeprefix(prefix): value for name, value in self if name.startswith(prefix)}
        return {"type": self.executor_backend, **options}


class ImageSettings(BaseSettings):
    """How the sandbox image is built (``SANDPIT_IMAGE_`` prefix)."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_IMAGE_", extra="forbid")

    repository: str = "sandpit-sandbox"
    """Repository name of the sandbox image; the tag is a content hash."""
    pull_base: str | None = "python:3.11-slim-bookworm"
    """A registry image tried first as the base; ``None`` skips the pull."""
    pull_timeout_s: Annotated[float, Field(gt=0)] = 20.0
    debian_suite: str = "bookworm"
    debian_mirror: str = "http://deb.debian.org/debian"
    """Mirror for ``debootstrap`` when the base image cannot be pulled."""
    cache_dir: Path = Field(default_factory=lambda: _default_cache_dir())
    """Where base and builder root filesystems are cached as tarballs (and the BFCL wheel
    next to them); default ``$XDG_CACHE_HOME/sandpit`` (``~/.cache/sandpit``), read when the
    settings are made, not when this module is imported."""


@lru_cache
def get_settings() -> ExecutorSettings:
    """The process-wide executor settings (cached; tests call ``cache_clear()``)."""
    return ExecutorSettings()


@lru_cache
def get_backend_settings() -> BackendSettings:
    """The process-wide backend choice (cached; tests call ``cache_clear()``)."""
    return BackendSettings()


@lru_cache
def get_image_settings() -> ImageSettings:
    """The process-wide image-build settings (cached)."""
    return ImageSettings()
