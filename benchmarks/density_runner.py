"""The sandbox side of a call against sessions per sandbox (``density.py --runner-sessions``).

For each count of sessions: one sandbox holding that many sessions of the API benchmark's
environment (forked from its template), then ``--runner-calls`` calls from one thread, one
at a time, round-robin over the sessions. What PID 1 does per call that grows with the
sessions it holds shows as call latency and CPU per call growing with the count: the
container's CPU per call (its cgroup) and PID 1's own (``/proc/<pid>/stat`` on the host),
with the runner's sweep counters (``ping``: sweeps that ended on the pids cgroup's count vs
sweeps that listed ``/proc``). Results go under ``runner`` in ``density.json``:
``{"calls", "by_sessions": {count: {"call_ms", "sandbox_cpu_ms_per_call",
"pid1_cpu_ms_per_call", "sweeps"}}}``.
"""

from __future__ import annotations

import argparse
import json
import time

from sandpit.executor.docker import docker_pool
from sandpit.executor.settings import ExecutorSettings

from api import SOURCE, container_cpu_s, pcts, process_cpu_s


def bench_runner(args: argparse.Namespace) -> dict:
    """Per-call cost on the sandbox side against sessions per sandbox: for each count of
    ``--runner-sessions``, one sandbox holding that many sessions (forked from the
    environment's template), then ``--runner-calls`` ``bump`` calls from one thread, one
    at a time, round-robin over the sessions. Reports each count's call p50/p99 (ms),
    the container's CPU per call (cgroup) and PID 1's own CPU per call (ms)."""
    out: dict = {"calls": args.runner_calls, "by_sessions": {}}
    for count in args.runner_sessions:
        settings = ExecutorSettings(pool_size=1, sessions_per_sandbox=count, max_sandboxes=1,
                                    sandbox_memory_mib=args.sandbox_memory_mib, session_templates=True,
                                    profiles={"default": {"pids": min(1024, 2 * count + 32), "cpus": args.cpus}})
        with docker_pool(settings) as pool:
            sessions = [pool.open_session(tenant="bench", source=SOURCE, class_name="Bench", init_config={"count": i})
                        for i in range(count)]
            sandbox = sessions[0]._sandbox
            assert sandbox is not None and all(s._sandbox is sandbox for s in sessions), "sessions were not co-located"
            pid1 = pool.driver.client.api.inspect_container(sandbox.container_id)["State"]["Pid"]
            for session in sessions:  # each process has run a call once
                session.call("bump", {"by": 1})
            time.sleep(1.0)  # the spare (and the templates) settle
            latencies = []
            box0, pid0 = container_cpu_s(sandbox.container_id), process_cpu_s(pid1)
            for i in range(args.runner_calls):
                started = time.perf_counter()
                assert sessions[i % count].call("bump", {"by": 1}).status == "ok"
                latencies.append((time.perf_counter() - started) * 1000)
            box1, pid1_after = container_cpu_s(sandbox.container_id), process_cpu_s(pid1)
            out["by_sessions"][str(count)] = {
                "call_ms": pcts(latencies),
                "sandbox_cpu_ms_per_call": round((box1 - box0) * 1000 / args.runner_calls, 3),
                "pid1_cpu_ms_per_call": round((pid1_after - pid0) * 1000 / args.runner_calls, 3),
                "sweeps": sandbox.request("ping").get("sweeps")}  # counted vs listed /proc (newer runners)
            print(count, json.dumps(out["by_sessions"][str(count)]), flush=True)
            for session in sessions:
                session.close()
    return out

