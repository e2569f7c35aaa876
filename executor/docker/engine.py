"""The Docker edge of Sandpit: the only module (with ``images``) that imports ``docker``.

It creates the Docker client, translates ``docker.errors.*`` into
:mod:`sandpit.executor.errors` (:func:`map_docker_errors`), builds the hardened container
specification every sandbox gets (:func:`container_spec`), and finds/removes sandboxes
by label (:func:`list_sandboxes`, :func:`reap`). Labels: ``sandpit=1`` on everything,
``sandpit.tenant=<tenant id>``, ``sandpit.sandbox=<sandbox id>``, ``sandpit.pool=<pool id>``,
and the owner's ``sandpit.owner`` / ``sandpit.owner-ns`` (:mod:`.owners`: who may reap it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Ulimit
from sandpit.sandbox_images.runner import protocol

from ..errors import DockerUnavailable, ImageError
from ..profiles import MiB, ResourceProfile
from ..settings import ExecutorSettings
from . import owners
from .seccomp import security_opt

log = logging.getLogger(__name__)

LABEL = "sandpit"
LABEL_TENANT = "sandpit.tenant"
LABEL_SANDBOX = "sandpit.sandbox"
LABEL_POOL = "sandpit.pool"
LABEL_OWNER = "sandpit.owner"
LABEL_OWNER_NS = "sandpit.owner-ns"
SOCKET_MOUNT = protocol.SOCKET_DIR
RUNNER_CMD = ["/usr/bin/python3", "-s", "-S", "-B", "-c",
              "import sys; sys.path[0] = '/opt/sandpit'; from sandpit_runner import pid1_runner; pid1_runner.main()"]


@contextlib.contextmanager
def map_docker_errors(action: str) -> Iterator[None]:
    """Translate Docker SDK/transport errors raised inside the block.

    Raises:
        ImageError: the image does not exist (``docker.errors.ImageNotFound``).
        DockerUnavailable: any other API or connection error, message prefixed by ``action``.
    """
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise ImageError(f"{action}: {exc.explanation or exc}. Build it with `sandpit image build`.") from exc
    except docker.errors.DockerException as exc:
        raise DockerUnavailable(f"{action}: {exc}") from exc
    except requests.exceptions.RequestException as exc:
        raise DockerUnavailable(f"{action}: Docker Engine unreachable: {exc}") from exc


def make_client(settings: ExecutorSettings, timeout_s: float = 60.0) -> docker.DockerClient:
    """A Docker client for ``settings.docker_host`` (or the environment's default).

    Raises:
        DockerUnavailable: the engine does not answer a ping. Run ``scripts/ensure-docker``.
    """
    with map_docker_errors("connecting to the Docker Engine"):
        if settings.docker_host:
            client = docker.DockerClient(base_url=settings.docker_host, timeout=int(timeout_s))
        else:
            client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    return client


def ping(client: docker.DockerClient) -> None:
    """Ask the engine whether it answers (``GET /_ping``).

    Raises:
        DockerUnavailable: it does not (connection refused, timeout, API error).
    """
    with map_docker_errors("pinging the Docker Engine"):
        client.ping()


RUNSC_REQUIRED_ARGS = ("oci-seccomp",)
"""runsc flags the engine's ``runsc`` registration must pass (``runtimeArgs``; leading
dashes and ``=true`` aside): without ``--oci-seccomp`` gVisor loads no seccomp profile of
the container, so neither ``seccomp.runsc_profile`` nor any other (what refuses
``unshare`` and the like under runc) applies inside the sandbox.
``scripts/ensure-docker`` registers it."""


def check_runtime(client: docker.DockerClient, runtime: str) -> None:
    """Refuse to place sandboxes under ``runtime`` when the engine's registration of it
    is not one Sandpit's isolation holds under: ``runsc`` must be registered and carry
    :data:`RUNSC_REQUIRED_ARGS`. ``runc`` (Docker's built-in default) needs nothing.
    Reads ``GET /info`` once (``Runtimes``).

    Raises:
        DockerUnavailable: the engine does not answer, has no such runtime, or registers
            it without a required flag (the message names it and the fix:
            ``scripts/ensure-docker`` as root, which reloads dockerd without a restart).
    """
    if runtime == "runc":
        return
    with map_docker_errors("reading the engine's runtimes"):
        runtimes = client.info().get("Runtimes") or {}
    registered = runtimes.get(runtime)
    if not isinstance(registered, dict):
        raise DockerUnavailable(f"the Docker Engine has no runtime {runtime!r} (it has {sorted(runtimes)}); "
                                "run scripts/ensure-docker as root to register gVisor")
    given = {str(arg).lstrip("-").removesuffix("=true") for arg in registered.get("runtimeArgs") or []}
    missing = [f"--{flag}" for flag in RUNSC_REQUIRED_ARGS if flag not in given]
    if missing:
        raise DockerUnavailable(
            f"the Docker Engine registers {runtime!r} without {' '.join(missing)} (runtimeArgs "
            f"{registered.get('runtimeArgs') or []}): no seccomp profile would apply inside its "
            "sandboxes; run scripts/ensure-docker as root (it rewrites /etc/docker/daemon.json "
            "and reloads dockerd with SIGHUP, running containers untouched)")


def container_spec(*, settings: ExecutorSettings, profile: ResourceProfile, image: str,
                   tenant: str, sandbox_id: str, pool_id: str, uid: int, socket_dir: str,
                   limits_json: str) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create`` giving a hardened sandbox.

    No network (``network_mode=none``), read-only root, size-capped noexec tmpfs for /tmp
    and /work, non-root ``uid`` (group ``sandbox_gid``), every capability dropped,
    ``no-new-privileges``, a seccomp profile (under runc Docker's default, never
    overridden; under runsc gVisor's kernel answers and applies ``seccomp.runsc_profile``,
    Docker's refusals in gVisor's names, loaded because runsc is registered with
    ``--oci-seccomp``, :func:`check_runtime`; see docs/isolation.md), memory with swap
    equal to memory, CPU quota, pids limit, nofile/nproc/fsize ulimits (``nofile`` the
    runner's, :meth:`ResourceProfile.runner_nofile`: its session processes lower theirs to
    the profile's before any untrusted code runs), and the protocol
    socket directory as the only host path (read-only). Neither the runner's token nor
    where it is is in the environment (only ``SANDPIT_LIMITS``, the profile's limits): the
    host writes it to ``protocol.TOKEN_NAME`` in the socket directory (``sandbox.py``),
    mounted at the fixed ``protocol.SOCKET_DIR``.

    Under runsc the pids cgroup also counts gVisor's host threads and stub processes:
    measured (ptrace platform) about 7 host pids per sandboxed process, so its limit is
    ``pids * runsc_pids_per_process + runsc_pids_headroom``; the sandboxed processes
    stay bounded by ``pids`` through RLIMIT_NPROC, which gVisor enforces.
    """
    memory = sandbox_memory_limit(settings, profile)
    nofile = profile.runner_nofile(settings.sessions_per_sandbox)
    tmpfs_opts = f"rw,nosuid,nodev,noexec,size={profile.tmpfs_mib}m"
    spec: dict[str, Any] = {
        "image": image,
        "command": RUNNER_CMD,
        "name": f"sandpit-{sandbox_id}",
        "hostname": "sandbox",
        "detach": True,
        "user": f"{uid}:{settings.sandbox_gid}",
        "environment": {"SANDPIT_LIMITS": limits_json},
        "labels": {LABEL: "1", LABEL_TENANT: tenant, LABEL_SANDBOX: sandbox_id, LABEL_POOL: pool_id,
                   LABEL_OWNER: owner_id(), LABEL_OWNER_NS: owners.owner_ns()},
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"{tmpfs_opts},mode=1777", "/work": f"{tmpfs_opts},mode=1733"},
        "cap_drop": ["ALL"],
        "security_opt": security_opt(settings.runtime),
        "mem_limit": memory,
        "memswap_limit": memory,
        # a CFS period shorter than Docker's 100 ms (cpu_period_us): same CPU share, but a
        # sandbox that hits its quota stalls for at most ~(1 - cpus) x the period
        "cpu_period": settings.cpu_period_us,
        "cpu_quota": cpu_quota_us(settings, profile),
        "pids_limit": (profile.pids * settings.runsc_pids_per_process + settings.runsc_pids_headroom
                       if settings.runtime == "runsc" else profile.pids),
        "ulimits": [
            Ulimit(name="nofile", soft=nofile, hard=nofile),
            Ulimit(name="nproc", soft=profile.pids, hard=profile.pids),
            Ulimit(name="fsize", soft=profile.fsize_mib * MiB, hard=profile.fsize_mib * MiB),
            Ulimit(name="core", soft=0, hard=0),
        ],
        "ipc_mode": "private",
        "volumes": {socket_dir: {"bind": SOCKET_MOUNT, "mode": "ro"}},
        "log_config": {"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
        "stop_signal": "SIGKILL",
    }
    if settings.runtime != "runc":
        spec["runtime"] = settings.runtime
    return spec


def list_sandboxes(client: docker.DockerClient, **labels: str) -> list[Any]:
    """Every container (running or not) carrying ``sandpit=1`` and the given labels
    (keyword ``tenant=...``, ``pool=...``, ``sandbox=...``)."""
    filters = [f"{LABEL}=1"] + [f"{LABEL}.{k}={v}" for k, v in labels.items()]
    with map_docker_errors("listing sandboxes"):
        # ignore_removed: a container removed between the list and its inspect is not an error
        return client.containers.list(all=True, filters={"label": filters}, ignore_removed=True)


def remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Force-remove a container (and its anonymous volumes); missing is not an error, nor
    is a removal already in progress (409 from another thread destroying it)."""
    # suppress innermost: map_docker_errors would turn NotFound into DockerUnavailable
    with map_docker_errors(f"removing {container_id[:12]}"), contextlib.suppress(docker.errors.NotFound):
        try:
            client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.APIError as exc:
            if exc.status_code != 409 or "in progress" not in str(exc):
                raise


def sandbox_summaries(client: docker.DockerClient) -> list[dict[str, Any]]:
    """Every container carrying ``sandpit=1``, as the engine's list gives it (``Id``,
    ``Labels``, ``State``...): one API call, where :func:`list_sandboxes` inspects each."""
    with map_docker_errors("listing sandboxes"):
        return list(client.api.containers(all=True, filters={"label": [f"{LABEL}=1"]}))


owner_id = owners.owner_id


def owner_alive(owner: str) -> bool:
    """False when ``owner`` (a ``sandpit.owner`` label) is empty, malformed or names a
    process on this host that no longer exists (pid gone or reused: start time differs).
    Judged by the label alone (:func:`owners.judge` without namespace or lease): other
    hosts' sandboxes count as alive."""
    return owners.judge(owner, "", "", running=True, leases=None).state in ("alive", "unknown")


def reap(client: docker.DockerClient, *, exclude_pool: str | None = None, everything: bool = False,
         unowned: bool = True, leases: owners.LeaseView | None = None) -> int:
    """Remove leftover sandboxes: those whose owner is proven dead (:func:`owners.judge`:
    its process gone, its lease in ``leases`` expired, an exited container of an earlier
    boot), with ``unowned`` also those whose owner labels are missing or not Sandpit's,
    or every sandbox when ``everything``; never those of ``exclude_pool``, never those
    whose owner is alive or cannot be judged here (another pid namespace without a
    readable lease). Several Sandpit processes can share one engine without reaping each
    other. Each removal is logged (owner and reason). Returns the count.

    Raises:
        DockerUnavailable: the engine did not answer the listing or a removal.
    """
    removed = 0
    here = owners.Here.now()
    for summary in sandbox_summaries(client):
        labels: dict[str, str] = summary.get("Labels") or {}
        if exclude_pool and labels.get(LABEL_POOL) == exclude_pool:
            continue
        owner = labels.get(LABEL_OWNER, "")
        if everything:
            reason = "every sandbox asked for"
        else:
            verdict = owners.judge(owner, labels.get(LABEL_OWNER_NS, ""), labels.get(LABEL_POOL, ""),
                                   running=summary.get("State") == "running", leases=leases, here=here)
            if verdict.state in ("alive", "unknown") or (verdict.state == "unowned" and not unowned):
                continue
            reason = verdict.reason
        remove_container(client, str(summary["Id"]))
        removed += 1
        log.info("reaped sandbox container %s (owner %r: %s)", str(summary["Id"])[:12], owner[:300], reason)
    return removed


PIDS_CURRENT = ("/sys/fs/cgroup/pids/docker/{id}/pids.current",  # cgroup v1, cgroupfs driver
                "/sys/fs/cgroup/system.slice/docker-{id}.scope/pids.current",  # v2, systemd
                "/sys/fs/cgroup/docker/{id}/pids.current")  # v2, cgroupfs


MEMORY_CURRENT = ("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes",  # cgroup v1, cgroupfs driver
                  "/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current",  # v2, systemd
                  "/sys/fs/cgroup/docker/{id}/memory.current")  # v2, cgroupfs


CPU_BURST = ("/sys/fs/cgroup/cpu/docker/{id}/cpu.cfs_burst_us",  # cgroup v1, cgroupfs driver
             "/sys/fs/cgroup/cpu,cpuacct/docker/{id}/cpu.cfs_burst_us",  # v1, joint mount
             "/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.max.burst",  # v2, systemd
             "/sys/fs/cgroup/docker/{id}/cpu.max.burst")  # v2, cgroupfs


def cpu_quota_us(settings: ExecutorSettings, profile: ResourceProfile) -> int:
    """A sandbox's CFS quota in microseconds per ``cpu_period_us``: ``cpus`` of the period
    (at least 1 ms, the kernel's floor)."""
    return max(1000, int(profile.cpus * settings.cpu_period_us))


def cpu_burst_us(settings: ExecutorSettings, profile: ResourceProfile) -> int:
    """The CFS burst a sandbox gets, in microseconds per period: ``cpu_burst_fraction`` of
    its quota (:func:`cpu_quota_us`)."""
    return int(settings.cpu_burst_fraction * cpu_quota_us(settings, profile))


def set_cpu_burst(container_id: str, burst_us: int) -> bool:
    """Write the container's CFS burst (microseconds) to the host's cgroup filesystem. True
    when written; False when no layout matches or the kernel refuses (older than 5.14, a
    remote engine, no permission): the sandbox then runs at its plain quota."""
    for pattern in CPU_BURST:
        try:
            with open(pattern.format(id=container_id), "w") as handle:
                handle.write(str(burst_us))
            return True
        except OSError:
            continue
    return False


def sandbox_memory_limit(settings: ExecutorSettings, profile: ResourceProfile) -> int:
    """A sandbox container's memory limit in bytes: ``sandbox_memory_mib`` when set, else
    the profile's ``memory_mib`` plus 32 MiB per session slot."""
    if settings.sandbox_memory_mib:
        return settings.sandbox_memory_mib * MiB
    return profile.sandbox_memory_bytes(settings.sessions_per_sandbox)


def host_memory(container_id: str) -> int | None:
    """Bytes the container's memory cgroup is charged now (what its limit and the kernel's
    OOM killer compare: process memory, tmpfs files, kernel memory), read from the host's
    cgroup filesystem; None when it cannot be read (a remote engine, another layout)."""
    for pattern in MEMORY_CURRENT:
        try:
            with open(pattern.format(id=container_id)) as handle:
                return int(handle.read())
        except (OSError, ValueError):
            continue
    return None


_memory_total: int = 0
"""MemTotal once read (0: not read yet, or unreadable)."""


def host_memory_total() -> int:
    """The host's MemTotal in bytes (``/proc/meminfo``); 0 when unreadable. Read once and
    kept: the kernel fixes it at boot, and the memory admission asks it on every session
    it places (each read is a file opened and read, and the GIL given up meanwhile, on
    the create's path). A failed read is tried again next time."""
    global _memory_total
    if _memory_total:
        return _memory_total
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    _memory_total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    return _memory_total


def host_pids(container_id: str) -> int | None:
    """Host processes and threads in the container's pids cgroup (under runsc: gVisor's
    sentry, gofer and stub processes too), read from the host's cgroup filesystem; None
    when it cannot be read (a remote engine, another layout)."""
    for pattern in PIDS_CURRENT:
        try:
            with open(pattern.format(id=container_id)) as handle:
                return int(handle.read())
        except (OSError, ValueError):
            continue
    return None


def container_outcome(client: docker.DockerClient, container_id: str) -> tuple[str, bool]:
    """(Docker state status, OOM-killed flag) of a container; ``("missing", False)`` if gone."""
    try:
        with map_docker_errors("inspecting container"):
            attrs = client.api.inspect_container(container_id)
    except DockerUnavailable:
        return "missing", False
    except docker.errors.NotFound:
        return "missing", False
    state = attrs.get("State") or {}
    return str(state.get("Status", "unknown")), bool(state.get("OOMKilled"))
