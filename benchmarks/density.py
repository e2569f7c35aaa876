"""Density benchmark: memory per session, and thousands of resident envs with some stepping.

Up to four parts, one JSON (``benchmarks/results/density.json``):

``memory`` (straight through the executor, no API): one sandbox, one session of a small
environment, then ``--sessions`` more; the added PSS and RSS of the container's processes
(read from the host's ``/proc/<pid>/smaps_rollup``, so run as root) and of its cgroup
(``memory.usage_in_bytes`` / ``memory.current``) divided by the sessions added, once with
sessions forked from the environment's template (``session_templates=True``) and once
the way they started before (a fresh interpreter executing the source:
``session_templates=False``). Also the idle sandbox (runner + spare) and the template.

``api`` (``--envs``, 0 to skip): ``sandpit serve`` on loopback with a temporary SQLite
file, memory-admitted shared sandboxes (``SANDPIT_EXECUTOR_*`` below: ``--per-sandbox``
sessions each at most, a profile with room for that many processes, ``--nofile`` files per
process when given) and idle eviction only while the sandboxes are ``--evict-fullness``
full (``SANDPIT_ENV_IDLE_EVICT_FULLNESS``); creates ``--envs`` live envs of one
environment over HTTP from ``--create-threads`` clients (``create_all_s``,
``creates_per_s``), then ``--stepping`` of them step for
``--seconds``: each stepping env is one client that sends a step, waits for the answer,
then waits a think time (an agent waiting for its model) before the next: ``--think-s``
on average, drawn uniformly within ``--think-jitter`` of it (0.5: from half to one and a
half times ``--think-s``; 0: the same pause every time, which keeps clients that one stall
delayed together as a burst for the rest of the run: ``loadgen.pauses``); ``--think-s 0``
is a closed loop (every client saturating). The clients start spread evenly over one
think time (client i after ``i * think_s / stepping`` s), so the load is steady, not 200
steps at once every second. The clients (``--client``) are coroutines of one thread, each
with its own keep-alive connection (``asyncio``, ``loadgen.py``: the default), or a thread
each over ``http.client`` (``threads``); ``cpu_ms_per_step`` is the CPU per answered step
of the server process, of its sandboxes (cgroups) and of this process (the clients), over
the spread run. Then the same clients step once all at the same instant
(``burst``: what a trainer starting a batch of rollouts together meets), and one client
steps 200 of the envs twice each with nothing else running (``step_1_client_after_ms``).
Reports step p50/p99 (``step_ms``; per 10 s of the run: ``step_ms_by_10_s``, and the server's own
time of the same steps: ``server_step_ms_by_10_s``), steps/s,
resident envs (``resident_before``, ``resident_after``: envs the list ``GET /v1/envs``
says are ``live``), restores during the run (``restores_during_run``: steps answered with
``recovered``), sandboxes and sessions (``/metrics``), the server's RSS, the containers'
total memory (cgroups) and PSS, the host's memory before the creates
(``host_memory_at_start_mib``: available, free, page cache, reclaimable slab; with
``--drop-caches`` the kernel's caches are dropped first: ``host_caches_dropped``) and its
available memory at
the end (``host_mem_available_mib_at_end``) and how long the server took to stop
(``server_stop_s``: it closes every session). Beside them, what the
machine did besides the run (``hoststat.py``): the hypervisor's steal (``host_steal``) and
the CPU of the kernel's memory-management threads (``host_kernel_threads``: DAMON's
``kdamond`` and the like, with the DAMON workers' states), each with the p99 of the steps
outside its busy windows.

``executor`` (``--executor``): the same envs and stepping straight through the pool (no
HTTP, no database): the sandbox side's share of a step.

``runner`` (``--runner-sessions 1,128,256``): the sandbox side's CPU per call against
sessions per sandbox (``density_runner.py``).

Usage: ``python benchmarks/density.py [--sessions 16] [--envs 1000] [--stepping 200]
[--seconds 60] [--think-s 1.0] [--think-jitter 0.5] [--per-sandbox 64] [--create-threads 8] [--executor]
[--skip-api] [--skip-memory] [--client asyncio|threads] [--runner-sessions 1,128,256]`` (the
defaults take about 3 minutes). Ten thousand resident
envs: ``--skip-memory --envs 10000 --stepping 1000 --per-sandbox 256 --think-s 2.0
--create-threads 16 --running-calls 64 --client threads`` (about 16 GiB of sandboxes; about
4 minutes, most of it creating the envs), with ``--drop-caches`` (root) to start from a host
whose memory is not full of the kernel's caches, which it would reclaim during the run.
Numbers on a loaded machine are noisy: re-run on a quiet one.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sandpit.executor.docker import docker_pool, engine
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.settings import ExecutorSettings

sys.path.insert(0, str(Path(__file__).parent))
from density_runner import bench_runner  # noqa: E402 - the runner's per-call cost against sessions
from hoststat import KernelThreadSampler, StealSampler  # noqa: E402 - the machine's share of the run
from loadgen import (  # noqa: E402 - the asyncio stepping clients
    Step,
    Stepper,
    pauses,
    run_burst,
    run_spread,
    server_total_ms,
)
from sandbox import container_pids, rss_pss  # noqa: E402 - the sandbox benchmark's memory readers

from api import (  # noqa: E402 - the API benchmark's parts
    SOURCE,
    RawClient,
    Server,
    own_cpu_s,
    pcts,
    phase_counters,
    process_cpu_s,
    sandboxes_cpu_s,
)

MiB = 1024 * 1024
SMALL = '''
from typing import Any, Dict


class Counter:
    """A counter with a few records (templatable: nothing but typing at import)."""

    def __init__(self, init_config: Dict[str, Any]):
        self.count = init_config.get("count", 0)
        self.records = {f"r{i}": {"value": i} for i in range(20)}

    def bump(self, by: int = 1) -> int:
        """Add to the counter."""
        self.count += by
        return self.count
'''


def sandbox_memory(client, container_id: str) -> dict:
    pids = container_pids(client, container_id)
    rss, pss = rss_pss(pids)
    cgroup = engine.host_memory(container_id)
    return {"processes": len(pids), "rss_mib": round(rss, 2), "pss_mib": round(pss, 2),
            "cgroup_mib": round(cgroup / MiB, 2) if cgroup is not None else None}


def bench_memory(templates: bool, extra: int) -> dict:
    """Per-session memory with or without templates (see the module docstring)."""
    settings = ExecutorSettings(sessions_per_sandbox=extra + 1, pool_size=1, session_templates=templates,
                                sandbox_memory_mib=1024)
    with docker_pool(settings) as pool:
        pool.warm("bench", count=1)
        first = pool.open_session(tenant="bench", source=SMALL, class_name="Counter")
        sandbox = first._sandbox
        assert sandbox is not None
        time.sleep(1.0)  # the spare (and the template) finish starting
        before = sandbox_memory(pool.driver.client, sandbox.container_id)
        sessions = [first] + [pool.open_session(tenant="bench", source=SMALL, class_name="Counter")
                              for _ in range(extra)]
        assert all(s._sandbox is sandbox for s in sessions), "sessions were not co-located"
        for session in sessions:
            assert session.call("bump", {"by": 1}).status == "ok"
        time.sleep(1.0)
        after = sandbox_memory(pool.driver.client, sandbox.container_id)
        ping = sandbox.request("ping")
        for session in sessions:
            session.close()

    def per(field: str) -> float | None:
        if before[field] is None or after[field] is None:
            return None
        return round((after[field] - before[field]) / extra, 3)

    return {"templates": templates, "sessions_added": extra, "with_1_session": before,
            f"with_{extra + 1}_sessions": after,
            "per_extra_session_mib": {"pss": per("pss_mib"), "rss": per("rss_mib"), "cgroup": per("cgroup_mib")},
            "runner_templates": ping.get("templates")}


def profile(args: argparse.Namespace) -> dict:
    """The sandboxes' resource profile: ``--cpus``, room for ``--per-sandbox`` session
    processes plus the spare and templates (``pids``), and ``--nofile`` when given."""
    out: dict = {"pids": min(1024, 2 * args.per_sandbox + 32), "cpus": args.cpus}
    if args.nofile:
        out["nofile"] = args.nofile
    return out


def bench_executor(args: argparse.Namespace) -> dict:
    """The sandbox side alone (no HTTP, no database): ``--envs`` sessions opened through the
    pool with the API part's settings (each a ``RecoveringSession``: it keeps its state, as
    the API does, and re-opens after a lost sandbox, counted as ``recoveries``), then ``--stepping`` threads call ``bump`` on their own
    session for ``--seconds`` with ``--think-s`` between calls. Call p50/p99 in ms."""
    settings = ExecutorSettings(
        pool_size=2, sessions_per_sandbox=args.per_sandbox, max_sandboxes=args.max_sandboxes,
        sandbox_memory_mib=args.sandbox_memory_mib, session_templates=args.templates,
        profiles={"default": profile(args)})
    out: dict = {"envs": args.envs, "stepping": args.stepping, "think_s": args.think_s,
                 "think_jitter": args.think_jitter}
    with docker_pool(settings) as pool:
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as starter:
            sessions = list(starter.map(lambda i: RecoveringSession(pool, tenant="bench", source=SOURCE, class_name="Bench",
                                                                     init_config={"count": i}), range(args.envs)))
        out["open_all_s"] = round(time.perf_counter() - started, 1)
        latencies: list[float] = []
        failures = 0
        lock = threading.Lock()
        stop_at = time.perf_counter() + args.seconds

        def drive(index: int, session) -> None:
            nonlocal failures
            local, failed = [], 0
            think = pauses(args.think_s, args.think_jitter, index)
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                result = session.call("bump", {"by": 1})
                if result.status == "ok":
                    local.append((time.perf_counter() - t0) * 1000)
                else:
                    failed += 1
                if args.think_s:
                    time.sleep(next(think))
            with lock:
                latencies.extend(local)
                failures += failed

        stepping = sessions[:: max(1, len(sessions) // args.stepping)][: args.stepping]
        started = time.perf_counter()
        with ThreadPoolExecutor(len(stepping)) as runner:
            list(runner.map(drive, range(len(stepping)), stepping))
        wall = time.perf_counter() - started
        stats = pool.stats()
        out.update({"calls": len(latencies), "failures": failures, "calls_per_s": round(len(latencies) / wall, 1),
                    "call_ms": pcts(latencies) if latencies else None,
                    "recoveries": sum(s.recoveries for s in sessions),
                    "sandboxes": stats["sandboxes"], "sessions": stats["sessions"],
                    "memory_projected_mib": stats["memory_projected_mib"],
                    "session_estimate_mib": stats["session_estimate_mib"],
                    "sandbox_memory": containers_memory(os.getpid())})
        for session in sessions:
            session.close()
    return out


def meminfo() -> dict[str, int]:
    """The host's ``/proc/meminfo``, bytes by field name (``MemAvailable``, ``Cached``, ...)."""
    with open("/proc/meminfo") as handle:
        return {line.split(":", 1)[0]: int(line.split()[1]) * 1024 for line in handle if line.split()[1:2]}


def mem_available() -> int:
    """The host's MemAvailable, bytes (``/proc/meminfo``)."""
    return meminfo().get("MemAvailable", 0)


def host_memory_mib() -> dict[str, int]:
    """The host's memory now, MiB: ``available`` (MemAvailable), ``free`` (MemFree),
    ``page_cache`` (Cached: files' pages the kernel reclaims when sandboxes need the
    memory, at a cost that grows with the processes mapping what it scans) and
    ``reclaimable_slab`` (KReclaimable: the kernel's own caches, such as the directory
    entries and inodes of containers come and gone, reclaimed the same way)."""
    info = meminfo()
    return {"available": round(info.get("MemAvailable", 0) / MiB), "free": round(info.get("MemFree", 0) / MiB),
            "page_cache": round(info.get("Cached", 0) / MiB),
            "reclaimable_slab": round(info.get("KReclaimable", 0) / MiB)}


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches(control: Path = DROP_CACHES) -> None:
    """Write the dirty pages out, then have the kernel drop its clean page cache and
    reclaimable slab (``3`` written to ``control``, the kernel's
    ``/proc/sys/vm/drop_caches``: root only). Nothing is lost: what is dropped is read
    again when needed. Raises SystemExit when ``control`` cannot be written."""
    os.sync()
    try:
        control.write_text("3\n")
    except OSError as exc:
        raise SystemExit(f"--drop-caches could not write {control} (it needs root): {exc}") from None


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def step_histogram(text: str) -> dict[float, float]:
    """``sandpit_step_seconds`` cumulative bucket counts (all statuses), by upper bound."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "sandpit_step_seconds":
            for sample in family.samples:
                if sample.name == "sandpit_step_seconds_bucket":
                    bound = float(sample.labels["le"])  # "+Inf" parses as inf
                    out[bound] = out.get(bound, 0.0) + sample.value
    return out


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding quantile ``q`` of the steps between
    two scrapes (the server's own step time, HTTP excluded), or None without steps."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for bound, count in zip(bounds, counts, strict=True):
        if count >= q * counts[-1]:
            return bound * 1000
    return None


def owned_containers(owner_pid: int) -> list[str]:
    """The ids of the sandbox containers owned by process ``owner_pid`` (the server's
    pool): one call to the engine (its list's labels), cheap enough to sample during a
    run, where the SDK's ``containers.list`` inspects each container: one more engine
    request per sandbox every sample, on the machine the run measures."""
    client = engine.make_client(ExecutorSettings())
    owner = engine.owner_id(owner_pid)
    try:
        return [summary["Id"] for summary in engine.sandbox_summaries(client)
                if (summary.get("Labels") or {}).get(engine.LABEL_OWNER) == owner]
    finally:
        client.close()


def cgroup_mib(container_ids: list[str]) -> float:
    """Summed cgroup memory of the containers ``container_ids``, MiB: one file read each,
    cheap enough to sample during a run (PSS reads every process's page tables, seconds of
    CPU for 1,000 sessions, and stalled the run it measured)."""
    return sum(engine.host_memory(container_id) or 0 for container_id in container_ids) / MiB


def containers_memory(owner_pid: int) -> dict:
    """Summed cgroup memory and process PSS of the sandbox containers owned by process
    ``owner_pid`` (the server's pool)."""
    client = engine.make_client(ExecutorSettings())
    containers = owned_containers(owner_pid)
    pss = sum(rss_pss(container_pids(client, container_id))[1] for container_id in containers)
    return {"containers": len(containers), "cgroup_mib": round(cgroup_mib(containers), 1), "pss_mib": round(pss, 1)}


def _raw_step(raw: RawClient, env_id: str) -> tuple[float | None, dict, str, float | None]:
    """One ``bump`` step of ``env_id`` over ``raw``: ``(ms, reply, "", server ms)`` when it
    was answered ``ok`` (the server's own ms from its ``Server-Timing``, None without one),
    else ``(None, reply or {}, what went wrong, None)``; after a broken connection the
    thread's next step opens a new one."""
    t0 = time.perf_counter()
    try:
        code, body = raw.post(f"/v1/envs/{env_id}/step", {"name": "bump", "arguments": {}})
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raw.local.conn = None
        return None, {}, repr(exc)[:200], None
    if code != 200 or body.get("status") != "ok":
        return None, body, f"{code}: {str(body)[:200]}", None
    return (time.perf_counter() - t0) * 1000, body, "", server_total_ms(raw.server_timing())


def _timed_step(client: httpx.Client, env_id: str) -> float:
    started = time.perf_counter()
    response = client.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {}})
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(response.text)
    return elapsed


def bench_api(args: argparse.Namespace, data_dir: Path) -> dict:
    env = {
        "SANDPIT_EXECUTOR_POOL_SIZE": "2",
        "SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX": str(args.per_sandbox),
        "SANDPIT_EXECUTOR_MAX_SANDBOXES": str(args.max_sandboxes),
        "SANDPIT_EXECUTOR_SANDBOX_MEMORY_MIB": str(args.sandbox_memory_mib),
        "SANDPIT_EXECUTOR_SESSION_TEMPLATES": "true" if args.templates else "false",
        "SANDPIT_EXECUTOR_PROFILES": json.dumps({"default": profile(args)}),
        "SANDPIT_CALL_SLOTS": str(args.call_slots),
        "SANDPIT_ENV_IDLE_EVICT_FULLNESS": str(args.evict_fullness),
    }
    server = Server(data_dir, **env)
    out: dict = {"server_env": env, "envs": args.envs, "stepping": args.stepping, "think_s": args.think_s,
                 "think_jitter": args.think_jitter}
    try:
        # an RL trainer's tenant: its steps may run in parallel (the default max_running_calls
        # is half the cores, 1 here, which would serialize the 200 stepping clients)
        trainer_key = server.new_tenant("trainer", {"max_live_envs": 1_000_000, "max_concurrent_calls": 1024,
                                                    "max_running_calls": args.running_calls})
        out["tenant_max_running_calls"] = args.running_calls
        out["client"] = args.client
        with server.client(trainer_key, limits=httpx.Limits(max_connections=args.stepping + 16,
                                               max_keepalive_connections=args.stepping + 16)) as client:
            environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                   "class_name": "Bench"}).json()["id"]

            def create(i: int) -> str:
                for _ in range(20):
                    response = client.post("/v1/envs", json={"environment_id": environment_id,
                                                             "init_config": {"count": i}})
                    if response.status_code == 201:
                        return str(response.json()["id"])
                    time.sleep(0.5)
                raise RuntimeError(response.text)

            out["host_caches_dropped"] = args.drop_caches
            if args.drop_caches:  # the host's own caches out of the way, as on a host kept for the sandboxes
                drop_caches()
            out["host_memory_at_start_mib"] = host_memory_mib()
            started = time.perf_counter()
            with ThreadPoolExecutor(args.create_threads) as pool:
                ids = list(pool.map(create, range(args.envs)))
            out["create_all_s"] = round(time.perf_counter() - started, 1)
            out["creates_per_s"] = round(args.envs / max(out["create_all_s"], 0.1), 1)
            out["create_threads"] = args.create_threads
            wanted = set(ids)

            def live_count() -> int:
                """Envs of ``ids`` whose status is ``live``, read from the list (1,000 a page)."""
                live, offset = 0, 0
                while True:
                    page = client.get("/v1/envs", params={"limit": 1000, "offset": offset}).json()["data"]
                    live += sum(env["id"] in wanted and env["status"] == "live" for env in page)
                    if len(page) < 1000:
                        return live
                    offset += 1000

            out["resident_before"] = live_count()
            metrics_before = client.get("/metrics").text
            timed_steps: list[tuple[float, float]] = []  # (start, ms) of every answered step
            error_samples: list[str] = []
            restores = errors = 0
            lock = threading.Lock()
            stop_at = time.perf_counter() + args.seconds
            # each stepping client keeps its own keep-alive connection (an agent's rollout
            # worker), over http.client: 200 threads of one httpx.Client spent more CPU in
            # this process, on the same 2 cores, than the server did
            raw = RawClient(server.url, trainer_key)

            def drive(index: int, env_id: str, offset_s: float) -> list[Step]:
                """One thread's client: its steps, as ``loadgen.run_spread`` gives them."""
                local: list[Step] = []
                cpu = time.thread_time()
                think = pauses(args.think_s, args.think_jitter, index)
                time.sleep(offset_s)  # clients spread over one think time, not 200 at once
                while time.perf_counter() < stop_at:
                    begun = time.perf_counter()
                    ms, body, error, server_ms = _raw_step(raw, env_id)
                    local.append((begun, ms, body, error, server_ms))
                    if args.think_s:
                        time.sleep(next(think))
                with lock:
                    clients_cpu[0] += time.thread_time() - cpu
                return local

            clients_cpu = [0.0]  # CPU seconds of the stepping clients' own threads
            sampler_stop = threading.Event()
            peak = {"cgroup_mib": 0.0}

            def sample() -> None:
                while not sampler_stop.wait(5.0):
                    peak["cgroup_mib"] = max(peak["cgroup_mib"], cgroup_mib(owned_containers(server.process.pid)))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            phases0 = phase_counters(server.url)
            steal = StealSampler().start()
            kernel = KernelThreadSampler().start()
            cpu0 = (process_cpu_s(server.process.pid), sandboxes_cpu_s(server.process.pid), own_cpu_s())
            # The clients share this process's cyclic collector: a full collection stalls
            # every client thread at once (120 and 150 ms in a 10,000-env run here, over
            # the set-up's objects and the clients' own), a stall that lands in their
            # latencies and sends their next steps together. 1,000 agents are 1,000
            # processes in a deployment, so this process runs no cyclic collection while
            # they step (reference counting still frees their garbage); the server's
            # collector is untouched.
            gc.collect()
            gc.freeze()
            gc.disable()
            started = time.perf_counter()
            stepping = ids[:: max(1, len(ids) // args.stepping)][: args.stepping]
            offsets = [index * args.think_s / len(stepping) for index in range(len(stepping))]
            if args.client == "asyncio":  # one thread, one keep-alive connection per client
                cpu = time.thread_time()
                spread = run_spread(Stepper(server.url, trainer_key), stepping, offsets, args.think_s,
                                    max(0.0, stop_at - time.perf_counter()), args.think_jitter)
                clients_cpu[0] = time.thread_time() - cpu
            else:
                with ThreadPoolExecutor(len(stepping)) as pool:
                    spread = [step for steps in pool.map(drive, range(len(stepping)), stepping, offsets)
                              for step in steps]
            server_ms: list[float] = []  # the server's own time of each answered step
            server_timed: list[tuple[float, float]] = []  # (start, the server's ms) of each
            for begun, ms, body, error, served_ms in spread:
                if ms is None:
                    errors += 1
                    if len(error_samples) < 5:
                        error_samples.append(error)
                else:
                    timed_steps.append((begun, ms))
                    restores += bool(body.get("recovered"))
                    if served_ms is not None:
                        server_ms.append(served_ms)
                        server_timed.append((begun, served_ms))
            wall = time.perf_counter() - started
            cpu1 = (process_cpu_s(server.process.pid), sandboxes_cpu_s(server.process.pid), own_cpu_s())
            gc.enable()
            gc.unfreeze()
            steal.stop()
            kernel.stop()
            latencies = [ms for _, ms in timed_steps]
            # CPU per answered step (ms) over the spread run: the server process, its
            # sandboxes (cgroups), this process, and of that the stepping clients' threads
            per_step = 1000 / max(1, len(timed_steps))
            out["cpu_ms_per_step"] = {part: round((after - before) * per_step, 3)
                                      for part, before, after in zip(("server", "sandboxes", "this_process"), cpu0,
                                                                     cpu1, strict=True)}
            out["cpu_ms_per_step"]["client"] = round(clients_cpu[0] * per_step, 3)
            phases1 = phase_counters(server.url)
            # the same steps without those that ran while the VM's host took a quarter or
            # more of the machine (a diagnosis beside the target, never instead of it)
            out["host_steal"] = _beside(steal, timed_steps, "steal")
            # and without those that ran while the kernel's memory-management threads (DAMON's
            # kdamond above all) had a quarter or more of the machine
            out["host_kernel_threads"] = _beside(kernel, timed_steps, "busy")
            # when the slow steps came: p99 per 10 s of the run (a tail of the run's first
            # seconds, such as the database catching up with the creates, shows at the start)
            out["step_ms_by_10_s"] = [{"from_s": start, **pcts(window)}
                                      for start, window in _by_window(timed_steps, started, 10.0)]
            # and the server's own time of the same steps by window: a window slow at the
            # client but not in the server waited outside the step (HTTP, the event loop,
            # this process)
            out["server_step_ms_by_10_s"] = [{"from_s": start, **pcts(window)}
                                             for start, window in _by_window(server_timed, started, 10.0)]
            sampler_stop.set()
            metrics_after = client.get("/metrics").text
            # the server's own step time (request in to reply out, bucket upper bounds)
            hist0, hist1 = step_histogram(metrics_before), step_histogram(metrics_after)
            out["server_step_ms_at_most"] = {"p50": histogram_quantile(hist0, hist1, 0.5),
                                             "p99": histogram_quantile(hist0, hist1, 0.99)}
            # and exactly, step by step: the Server-Timing total of each answered step (its
            # body read to its reply ready); the client's latency beyond it is HTTP, the
            # server's event loop before the body and this process
            out["server_step_ms"] = pcts(server_ms) if server_ms else None
            # where a step's time went inside the server (mean ms per step, wall clock):
            # what the client saw beyond their sum was HTTP, queueing and this process
            served = max(1.0, phases1["steps"] - phases0["steps"])
            out["server_wall_ms_per_step"] = {phase: round((phases1["wall"][phase] - phases0["wall"].get(phase, 0.0))
                                                           * 1000 / served, 3) for phase in phases1["wall"]}
            # the same stepping clients all at once, one step each (a trainer starting a batch
            # of rollouts together): the queue a burst builds, which the spread run avoids
            barrier = threading.Barrier(len(stepping))

            def burst_step(env_id: str) -> float | None:
                barrier.wait()
                return _raw_step(raw, env_id)[0]

            if args.client == "asyncio":
                burst = [ms for _, ms, _, _, _ in run_burst(Stepper(server.url, trainer_key), stepping)]
            else:
                with ThreadPoolExecutor(len(stepping)) as pool:
                    burst = list(pool.map(burst_step, stepping))
            answered = [ms for ms in burst if ms is not None]
            out["burst"] = {"clients": len(stepping), "errors": len(burst) - len(answered),
                            "step_ms": pcts(answered) if answered else None,
                            "max_ms": round(max(answered), 1) if answered else None}
            # the same server at rest (1,000 envs resident, nothing else stepping): one client
            quiet = [_timed_step(client, env_id) for env_id in ids[:200] for _ in range(2)]
            out.update({
                "step_1_client_after_ms": pcts(quiet),
                "error_samples": error_samples,
                "steps": len(latencies), "errors": errors, "steps_per_s": round(len(latencies) / wall, 1),
                "step_ms": pcts(latencies) if latencies else None,
                "restores_during_run": restores,
                "resident_after": live_count(),
                "pool_sessions": metric(metrics_after, "sandpit_pool_sessions"),
                "sandboxes": {state: metric(metrics_after, f'sandpit_pool_sandboxes{{state="{state}"}}')
                              for state in ("idle", "active", "starting")},
                # the server's garbage collections during the run, by generation (a full
                # collection stops every thread of the process)
                "gc_collections_during_run": {
                    generation: metric(metrics_after, f'python_gc_collections_total{{generation="{generation}"}}')
                    - metric(metrics_before, f'python_gc_collections_total{{generation="{generation}"}}')
                    for generation in ("0", "1", "2")},
                "live_envs_metric": [metric(metrics_before, "sandpit_live_envs"),
                                     metric(metrics_after, "sandpit_live_envs")],
                "server_rss_mib": round(server.rss_mib(), 1),
                "host_mem_available_mib_at_end": round(mem_available() / MiB),
                "sandbox_memory": containers_memory(server.process.pid),
                "sandbox_memory_peak_cgroup_mib": round(peak["cgroup_mib"], 1),
            })
            out["evictions_during_run"] = max(0, out["resident_before"] - out["resident_after"]) + restores
    finally:
        out["server_stop_s"] = stop(server)
    return out


def stop(server: Server, timeout_s: float = 900.0) -> float:
    """SIGTERM the server and wait for it (it closes every live session and destroys its
    sandboxes, which takes a while with thousands of envs); killed after ``timeout_s``.
    Returns the seconds it took."""
    started = time.perf_counter()
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    return round(time.perf_counter() - started, 1)


def _beside(sampler: StealSampler | KernelThreadSampler, timed: list[tuple[float, float]], kind: str) -> dict:
    """``sampler``'s summary with the steps of ``timed`` (``(start, ms)``) that touched its
    busy windows counted (``steps_in_<kind>_windows``) and the p50/p99 of the others
    (``step_ms_outside_<kind>_windows``, None when there are none)."""
    clear = [ms for begun, ms in timed if not sampler.overlaps(begun, begun + ms / 1000)]
    return {**sampler.summary(), f"steps_in_{kind}_windows": len(timed) - len(clear),
            f"step_ms_outside_{kind}_windows": pcts(clear) if clear else None}


def _by_window(timed: list[tuple[float, float]], started: float, width_s: float) -> list[tuple[float, list[float]]]:
    """``(window start, latencies)``: the latencies (ms) of ``timed`` steps (``(start, ms)``,
    perf_counter seconds) by the ``width_s``-second window of the run they started in
    (window starts in seconds from ``started``), in order; empty windows left out."""
    windows: dict[int, list[float]] = {}
    for begun, ms in timed:
        windows.setdefault(int((begun - started) // width_s), []).append(ms)
    return [(index * width_s, windows[index]) for index in sorted(windows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16, help="sessions added for the memory part")
    parser.add_argument("--envs", type=int, default=1000, help="live envs for the API part (0: skip)")
    parser.add_argument("--stepping", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause of each stepping client between steps")
    parser.add_argument("--think-jitter", type=float, default=0.5,
                        help="pauses drawn uniformly within this fraction of --think-s (0: all equal; below 1)")
    parser.add_argument("--per-sandbox", type=int, default=64, help="hard cap of sessions per sandbox")
    parser.add_argument("--max-sandboxes", type=int, default=64)
    parser.add_argument("--sandbox-memory-mib", type=int, default=1024)
    parser.add_argument("--cpus", type=float, default=1.0, help="CPU quota of each sandbox")
    parser.add_argument("--nofile", type=int, default=0, help="the profile's nofile (0: the default profile's)")
    parser.add_argument("--call-slots", type=int, default=64, help="SANDPIT_CALL_SLOTS of the server")
    parser.add_argument("--running-calls", type=int, default=16,
                        help="max_running_calls of the stepping tenant (the default quota is half the cores)")
    parser.add_argument("--create-threads", type=int, default=8, help="clients creating the envs at once")
    parser.add_argument("--evict-fullness", type=float, default=0.9,
                        help="SANDPIT_ENV_IDLE_EVICT_FULLNESS of the server (0: idle envs leave whatever the load)")
    parser.add_argument("--client", choices=("asyncio", "threads"), default="asyncio",
                        help="the stepping clients: coroutines of one thread (loadgen.py) or a thread each")
    parser.add_argument("--drop-caches", action="store_true",
                        help="drop the host's page cache and reclaimable slab before the API part's creates "
                             "(root): the run starts with the host's memory free, not full of the kernel's caches")
    parser.add_argument("--no-templates", dest="templates", action="store_false")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--executor", action="store_true",
                        help="also run the envs through the executor alone (no HTTP, no database)")
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--runner-sessions", type=lambda text: [int(n) for n in text.split(",")], default=[],
                        help="comma-separated sessions per sandbox for the runner part (e.g. 1,64,256; empty: skip)")
    parser.add_argument("--runner-calls", type=int, default=2000, help="calls per count of the runner part")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "density.json")
    args = parser.parse_args()
    if not 0 <= args.think_jitter < 1:
        parser.error("--think-jitter must be at least 0 and below 1")
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                 "mem_total_mib": round(engine.host_memory_total() / MiB)}}
    if not args.skip_memory:
        results["memory"] = {"forked_from_template": bench_memory(True, args.sessions),
                             "spawned_as_before": bench_memory(False, args.sessions)}
        print(json.dumps(results["memory"], indent=2), flush=True)
    if args.runner_sessions:
        results["runner"] = bench_runner(args)
    if args.executor and args.envs:
        results["executor"] = bench_executor(args)
        print(json.dumps(results["executor"], indent=2), flush=True)
    if args.envs and not args.skip_api:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="sandpit-density-") as tmp:
            results["api"] = bench_api(args, Path(tmp))
    print(json.dumps(results, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
