"""Sandbox runtime benchmark (issue 2 targets). Prints p50/p99 and writes JSON.

Measures, on the real Docker Engine:
  cold_start_ms      ``docker create`` -> runner hello, fresh containers (p50/p99)
  pool_acquire_ms    ``open_session`` on a warm sandbox, env instantiated (target p50 <= 30)
  call_rtt_ms        trivial tool round trip host -> runner -> child -> host
                     (target p50 <= 1, p99 <= 5)
  calls_per_s        one session sequentially, and N sessions sharing one sandbox
  idle_sandbox_mib   RSS and PSS of an idle sandbox's processes + its containerd shim
                     (target <= 30 MiB)
  extra_session_mib  added RSS/PSS of one more idle session in a shared sandbox
                     (target <= 12 MiB)

Usage: python benchmarks/sandbox.py [--calls 3000] [--out benchmarks/results/sandbox.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

from sandpit.executor.docker import docker_pool, engine
from sandpit.executor.docker.sandbox import Sandbox
from sandpit.executor.settings import ExecutorSettings

TRIVIAL = '''
class Echo:
    def __init__(self, init_config):
        self.calls = 0
    def ping(self, value: int = 0):
        self.calls += 1
        return value
'''
MiB = 1024 * 1024


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "mean": round(statistics.fmean(values), 3)}


def container_pids(client, container_id: str) -> list[int]:
    top = client.api.top(container_id, ps_args="-o pid")
    return [int(row[0]) for row in top.get("Processes") or []]


def shim_pid(container_id: str) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"containerd-shim" in cmd and container_id.encode() in cmd:
            return int(entry)
    return None


def rss_pss(pids: list[int]) -> tuple[float, float]:
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss / MiB, pss / MiB


def sandbox_memory(client, sandbox: Sandbox, shared_shim: bool) -> dict:
    pids = container_pids(client, sandbox.container_id)
    shim = shim_pid(sandbox.container_id)
    rss, pss = rss_pss(pids)
    shim_rss, shim_pss = rss_pss([shim] if shim else [])
    return {"processes": len(pids), "container_rss_mib": round(rss, 2), "container_pss_mib": round(pss, 2),
            "shim_rss_mib": round(shim_rss, 2), "shim_pss_mib": round(shim_pss, 2),
            "total_rss_mib": round(rss + shim_rss, 2), "total_pss_mib": round(pss + shim_pss, 2)}


def bench_cold_start(settings: ExecutorSettings, n: int) -> dict:
    times = []
    with docker_pool(settings.model_copy(update={"pool_size": 0})) as pool:
        profile = pool.profile()
        for i in range(n):
            sandbox = Sandbox.start(client=pool.driver.client, settings=pool.settings, profile=profile, image=pool.driver.image,
                                    tenant="bench", pool_id=pool.id, uid=pool.settings.uid_base + 30000 + i)
            times.append(sandbox.started_ms)
            sandbox.destroy()
    return summary(times)


def bench_pool(settings: ExecutorSettings, acquires: int, calls: int) -> dict:
    out: dict = {}
    with docker_pool(settings.model_copy(update={"pool_size": 2, "pool_refill_concurrency": 1})) as pool:
        pool.warm("bench", count=2)
        acquire, sessions = [], []
        for _ in range(acquires):
            pool.warm("bench", count=2)  # wait (untimed) until the refill caught up
            t0 = time.perf_counter()
            sessions.append(pool.open_session(tenant="bench", source=TRIVIAL, class_name="Echo"))
            acquire.append((time.perf_counter() - t0) * 1000)
        out["pool_acquire_ms"] = summary(acquire)
        for s in sessions[1:]:
            s.close()
        pool.warm("bench", count=2)
        session = sessions[0]
        for i in range(200):
            session.call("ping", {"value": i})
        rtt = []
        t_start = time.perf_counter()
        for i in range(calls):
            t0 = time.perf_counter()
            result = session.call("ping", {"value": i})
            rtt.append((time.perf_counter() - t0) * 1000)
            assert result.status == "ok", result
        elapsed = time.perf_counter() - t_start
        out["call_rtt_ms"] = summary(rtt)
        out["calls_per_s_one_session"] = round(calls / elapsed, 1)
        out["idle_sandbox"] = sandbox_memory(pool.driver.client, session._sandbox, shared_shim=False)  # type: ignore[arg-type]
        session.close()
    return out


def bench_shared(settings: ExecutorSettings, sessions_n: int, seconds: float) -> dict:
    shared = settings.model_copy(update={"pool_size": 1, "sessions_per_sandbox": sessions_n})
    with docker_pool(shared) as pool:
        pool.warm("bench", count=1)
        first = pool.open_session(tenant="bench", source=TRIVIAL, class_name="Echo")
        sandbox = first._sandbox
        assert sandbox is not None
        time.sleep(0.5)  # let the spare child finish starting
        before = sandbox_memory(pool.driver.client, sandbox, shared_shim=True)
        sessions = [first] + [pool.open_session(tenant="bench", source=TRIVIAL, class_name="Echo")
                              for _ in range(sessions_n - 1)]
        assert all(s._sandbox is sandbox for s in sessions), "sessions were not co-located"
        time.sleep(0.5)
        after = sandbox_memory(pool.driver.client, sandbox, shared_shim=True)
        extra = sessions_n - 1
        per_session = {
            "rss_mib": round((after["total_rss_mib"] - before["total_rss_mib"]) / extra, 2),
            "pss_mib": round((after["total_pss_mib"] - before["total_pss_mib"]) / extra, 2),
        }
        counts = [0] * sessions_n
        stop = time.perf_counter() + seconds

        def drive(i: int) -> None:
            while time.perf_counter() < stop:
                assert sessions[i].call("ping", {"value": 1}).status == "ok"
                counts[i] += 1

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(sessions_n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = sum(counts) / (time.perf_counter() - t0)
        for s in sessions:
            s.close()
    return {"sessions": sessions_n, "memory_with_1_session": before, "memory_with_all": after,
            "extra_session_mib": per_session, "calls_per_s_shared_sandbox": round(rate, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--cold", type=int, default=10)
    parser.add_argument("--acquires", type=int, default=20)
    parser.add_argument("--shared-sessions", type=int, default=4)
    parser.add_argument("--runtime", choices=["runc", "runsc"], default="runc")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sandbox.json")
    args = parser.parse_args()
    settings = ExecutorSettings(runtime=args.runtime)
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "runtime": args.runtime},
        "cold_start_ms": bench_cold_start(settings, args.cold),
        **bench_pool(settings, args.acquires, args.calls),
        "shared": bench_shared(settings, args.shared_sessions, 3.0),
    }
    client = engine.make_client(settings)
    leaked = [c for c in engine.list_sandboxes(client) if c.labels.get(engine.LABEL_OWNER) == engine.owner_id()]
    assert not leaked, f"benchmark leaked sandboxes: {leaked}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
