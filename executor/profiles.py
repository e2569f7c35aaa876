"""Resource profiles: the limits one sandbox and each session in it run under.

A profile is named in settings (``ExecutorSettings.profiles``; ``default`` gives
256 MiB, 0.5 CPU, 64 pids, 64 MiB tmpfs, 10 s per call). A caller may
*lower* any field of a named profile (:func:`resolve_profile` with overrides); only an
operator raises limits, by defining profiles in settings, and no profile may exceed
``ExecutorSettings.max_profile``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from sandpit.sandbox_images.runner import limits

from .errors import ProfileError

MiB = limits.MiB


RUNNER_FDS_PER_SESSION = 4
"""Descriptors PID 1 holds per session process: its control socket, its stdout and
stderr streams and its ``/proc/<pid>/schedstat`` (``runner/pid1_children.py`` ``Child``)."""
RUNNER_BASE_FDS = 64
"""Descriptors PID 1 holds besides its sessions': the host channel, the selector, the
wake-up pair, the spare's and the templates' channels (at most
``TEMPLATE_MAX_PER_SANDBOX + CONFIG_TEMPLATE_MAX_PER_SANDBOX`` templates, 4 each), the
cgroup files it keeps open, and room for the files it opens for a moment."""


class ResourceProfile(BaseModel):
    """Limits for a sandbox (container cgroup) and for each session (child process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "default"
    """Profile name; part of the warm-pool key."""
    memory_mib: Annotated[int, Field(ge=32, le=65536)] = limits.DEFAULT_SESSION_MEMORY_BYTES // limits.MiB
    """Per session: RLIMIT_DATA of the session process (MiB); over it a call reports
    ``oom``. Per sandbox: the container's memory limit is ``memory_mib`` plus 32 MiB per
    session slot (runner and idle sessions), with swap equal to memory (no swap)."""
    cpus: Annotated[float, Field(gt=0, le=64)] = 0.5
    """CPU quota of the whole sandbox, in CPUs (CFS quota; 0.5 = half a core)."""
    pids: Annotated[int, Field(ge=8, le=32768)] = 64
    """Max processes+threads in the sandbox (pids cgroup); a fork bomb stops here."""
    tmpfs_mib: Annotated[int, Field(ge=1, le=65536)] = 64
    """Size cap of each tmpfs (/tmp and the session work root /work), MiB."""
    call_timeout_s: Annotated[float, Field(gt=0, le=3600)] = limits.DEFAULT_CALL_TIMEOUT_S
    """Wall-clock limit of one tool call (and of instantiation), seconds; over it the
    session process is killed and the call reports ``timeout``."""
    output_cap_bytes: Annotated[int, Field(ge=0, le=64 * MiB)] = limits.DEFAULT_OUTPUT_CAP_BYTES
    """Captured stdout and stderr per call, each, bytes; the rest is dropped and counted."""
    observation_cap_bytes: Annotated[int, Field(ge=1024, le=64 * MiB)] = limits.DEFAULT_OBSERVATION_CAP_BYTES
    """Max characters of one observation; longer ones are truncated with a marker."""
    nofile: Annotated[int, Field(ge=16, le=65536)] = limits.DEFAULT_SESSION_NOFILE
    """RLIMIT_NOFILE of every process that runs untrusted code (sessions, templates,
    one-shot jobs); the runner itself gets what its sessions need
    (:meth:`runner_nofile`)."""
    fsize_mib: Annotated[int, Field(ge=1, le=65536)] = 64
    """RLIMIT_FSIZE (largest file a process may write), MiB."""

    def runner_nofile(self, sessions_per_sandbox: int) -> int:
        """RLIMIT_NOFILE of a sandbox's runner (PID 1; the container's ``nofile`` ulimit)
        for a sandbox holding up to ``sessions_per_sandbox`` sessions: the profile's
        ``nofile``, raised to what the runner holds for that many sessions
        (:data:`RUNNER_FDS_PER_SESSION` each) plus its own channels, spare and templates
        (:data:`RUNNER_BASE_FDS`). Untrusted code never gets more than ``nofile``: every
        process the runner starts lowers its own soft and hard limit to ``nofile``
        before any such code exists (``sandbox_images/runner/child_spare.py`` ``harden``),
        and cannot raise it again."""
        return max(self.nofile, RUNNER_BASE_FDS + RUNNER_FDS_PER_SESSION * max(1, sessions_per_sandbox))

    def sandbox_memory_bytes(self, sessions_per_sandbox: int) -> int:
        """Container memory limit in bytes for a sandbox holding up to that many sessions."""
        return (self.memory_mib + 32 * max(1, sessions_per_sandbox)) * MiB

    def runner_limits(self, sessions_per_sandbox: int, spare_child: bool, poll_interval_s: float = 1.0,
                      runtime: str = "runc", templates: bool = False,
                      session_startup_s: float = limits.SESSION_STARTUP_S,
                      forks_ahead: int = limits.FORK_AHEAD_DEFAULT) -> dict[str, Any]:
        """The limits the in-sandbox runner enforces (its ``SANDPIT_LIMITS``);
        ``poll_interval_s`` bounds how long its event loop sleeps without an event.
        ``memory_rlimit`` says how a session's memory is capped: RLIMIT_DATA under runc,
        RLIMIT_AS under runsc (measured: gVisor ignores RLIMIT_DATA, so a 1 GiB
        allocation went on to the container limit and killed the whole sandbox; it
        checks RLIMIT_AS at every mmap, and the allocation fails with MemoryError).
        ``templates``: fork sessions from per-environment template processes
        (``pid1_templates.py``; only with more than one session per sandbox).
        ``session_startup_s``: seconds a new session process has to start before the
        request waiting for it fails; that request's ``call_timeout_s`` starts after.
        ``forks_ahead``: how many templates keep a session process forked ahead of the
        next open (``pid1_forks.py``; 0 to FORK_AHEAD_MAX_PER_SANDBOX).
        ``cgroup_task_count``: the container's pids cgroup counts exactly the sandbox's
        tasks (runc), so a sweep that finds no more tasks than the runner follows skips
        listing /proc (``pid1_children.Children.sweep``); off under runsc.
        ``spares_from_template``: with ``templates`` under runc, the runner starts the jobs
        template at boot, forks its spares from it instead of starting Python for each,
        and keeps it through recycles while it is clean (``pid1_templates.py``); off under
        runsc, where a fork costs 5 to 100 ms of PID 1's time (the ptrace platform)."""
        return {
            "call_timeout_s": self.call_timeout_s,
            "session_memory_bytes": self.memory_mib * MiB,
            "memory_rlimit": "as" if runtime == "runsc" else "data",
            "output_cap_bytes": self.output_cap_bytes,
            "observation_cap_bytes": self.observation_cap_bytes,
            "session_nofile": self.nofile,
            "max_sessions": sessions_per_sandbox,
            "spare_child": spare_child,
            "poll_interval_s": poll_interval_s,
            "templates": templates,
            "session_startup_s": session_startup_s,
            "forks_ahead": forks_ahead,
            "cgroup_task_count": runtime == "runc",
            "spares_from_template": templates and runtime == "runc",
        }


class ProfileOverrides(BaseModel):
    """Caller-side lowering of a named profile; every field may only go down."""

    model_config = ConfigDict(extra="forbid")

    memory_mib: Annotated[int, Field(ge=32)] | None = None
    cpus: Annotated[float, Field(gt=0)] | None = None
    pids: Annotated[int, Field(ge=8)] | None = None
    tmpfs_mib: Annotated[int, Field(ge=1)] | None = None
    call_timeout_s: Annotated[float, Field(gt=0)] | None = None
    output_cap_bytes: Annotated[int, Field(ge=0)] | None = None


LIMIT_FIELDS = ("memory_mib", "cpus", "pids", "tmpfs_mib", "call_timeout_s", "output_cap_bytes",
                "observation_cap_bytes", "nofile", "fsize_mib")


def check_within(profile: ResourceProfile, ceiling: ResourceProfile) -> None:
    """Raise :class:`ProfileError` naming the first field of ``profile`` above ``ceiling``."""
    for field in LIMIT_FIELDS:
        if getattr(profile, field) > getattr(ceiling, field):
            raise ProfileError(
                f"profile {profile.name!r}: {field}={getattr(profile, field)} exceeds the "
                f"operator maximum {getattr(ceiling, field)}")


def resolve_profile(profiles: dict[str, ResourceProfile], ceiling: ResourceProfile,
                    name: str, overrides: ProfileOverrides | None = None) -> ResourceProfile:
    """Return the named profile, lowered by ``overrides``.

    Raises:
        ProfileError: unknown name, an override above the named profile's value, or a
            result above the operator's ``ceiling``.
    """
    base = profiles.get(name)
    if base is None:
        raise ProfileError(f"unknown resource profile {name!r}; known: {sorted(profiles)}")
    check_within(base, ceiling)
    if overrides is None:
        return base
    changes = overrides.model_dump(exclude_none=True)
    for field, value in changes.items():
        if value > getattr(base, field):
            raise ProfileError(
                f"{field}={value} is above profile {name!r}'s {getattr(base, field)}; "
                "callers may only lower limits")
    if not changes:
        return base
    suffix = ",".join(f"{k}={v}" for k, v in sorted(changes.items()))
    return base.model_copy(update={**changes, "name": f"{name}[{suffix}]"})
