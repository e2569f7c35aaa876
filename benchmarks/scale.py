"""Scale-out benchmark (issue 15): the Ray executor backend against the local pool.

Measures, on the real Docker Engine and a real local Ray cluster (all on 127.0.0.1):
  local_call_ms        trivial tool call through the local SandboxPool (baseline)
  ray_call_ms          the same call through RayExecutor -> host actor -> its pool,
                       measured in pairs with the local call (alternating, so machine
                       noise hits both alike)
  ray_hop_ms           per pair, ray call - local call: what the Ray hop adds per step
                       (target p50 <= 1 ms); and ``actor_rtt_ms``, a no-op request to
                       the host actor (the hop alone)
  steps_per_s          SESSIONS sessions stepped by THREADS threads for DURATION s:
                       local pool, Ray with 1 node, Ray with 2 nodes. On one machine the
                       nodes share the same cores and Docker Engine, so 1 vs 2 nodes shows
                       the overhead of spreading, not a speed-up.
  model                throughput vs node count (see ``model()``): each node adds
                       its measured single-node rate; the API replicas' hop cost bounds it.

Usage: python benchmarks/scale.py [--calls 400] [--duration 10] [--out benchmarks/results/scale.json]
Takes ~2 minutes. Numbers on a loaded machine are noisy: re-run on a quiet one.
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
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1 only

from sandpit.executor.pool import SandboxPool  # noqa: E402
from sandpit.executor.settings import ExecutorSettings  # noqa: E402

TRIVIAL = '''
class Echo:
    def __init__(self, init_config):
        self.calls = 0
    def ping(self, value: int = 0):
        """Count and echo."""
        self.calls += 1
        return value
'''


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "mean": round(statistics.fmean(values), 3)}


def paired(local: Any, remote: Any, calls: int) -> tuple[list[float], list[float]]:
    """Milliseconds per trivial call on a local and a Ray session, alternating."""
    a = local.open_session(tenant="bench", source=TRIVIAL, class_name="Echo")
    b = remote.open_session(tenant="bench", source=TRIVIAL, class_name="Echo", session_id="bench_pair")
    try:
        for _ in range(20):
            a.call("ping", {"value": 1})
            b.call("ping", {"value": 1})
        la, lb = [], []
        for i in range(calls):
            for session, out in ((a, la), (b, lb)) if i % 2 else ((b, lb), (a, la)):
                started = time.perf_counter()
                session.call("ping", {"value": i})
                out.append((time.perf_counter() - started) * 1000)
        return la, lb
    finally:
        a.close()
        b.close()


def actor_rtt(executor: Any, calls: int) -> list[float]:
    """Milliseconds per no-op request to a host actor (the Ray hop alone)."""
    host = sorted(executor.refresh())[0]
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        executor.ask(host, "noop")
        out.append((time.perf_counter() - started) * 1000)
    return out


def throughput(executor: Any, sessions: int, threads: int, duration_s: float, tag: str) -> dict[str, Any]:
    """Steps/s of ``threads`` threads each stepping its share of ``sessions`` sessions."""
    opened = [executor.open_session(tenant="bench", source=TRIVIAL, class_name="Echo",
                                    session_id=f"bench_{tag}_{i}") for i in range(sessions)]
    counts = [0] * threads
    stop = threading.Event()

    def work(k: int) -> None:
        mine = opened[k::threads]
        while not stop.is_set():
            for session in mine:
                session.call("ping", {"value": 1})
                counts[k] += 1

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(duration_s)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    hosts = sorted({getattr(s, "host", "local") for s in opened})
    for session in opened:
        session.close()
    return {"steps": sum(counts), "seconds": round(elapsed, 2), "steps_per_s": round(sum(counts) / elapsed, 1),
            "sessions": sessions, "threads": threads, "hosts_used": len(hosts)}


def model(single_node_steps_s: float, local_p50_ms: float, hop_ms: float, api_steps_s_per_replica: float,
          nodes: list[int]) -> list[dict[str, Any]]:
    """Throughput vs node count on separate machines: nodes scale linearly
    (``n x single_node``: sandboxes of different envs share nothing, and the database
    write per step is the replicas' cost) until the API replicas saturate at
    ``replicas x api_steps_s_per_replica``, one replica per two nodes. The hop does not
    lower throughput (requests overlap) but adds ``hop_ms`` to every step's latency:
    ``step_p50_ms = local_p50_ms + hop_ms``."""
    hop_ms = max(0.0, hop_ms)
    out = []
    for n in nodes:
        replicas = max(1, n // 2)
        api_ceiling = replicas * api_steps_s_per_replica
        out.append({"nodes": n, "replicas": replicas, "steps_per_s": round(min(n * single_node_steps_s, api_ceiling), 1),
                    "bound": "nodes" if n * single_node_steps_s <= api_ceiling else "api",
                    "step_p50_ms": round(local_p50_ms + hop_ms, 3)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--api-steps-per-s", type=float, default=800.0,
                        help="one API replica's steps/s (benchmarks/api.py) for the model")
    parser.add_argument("--out", default="benchmarks/results/scale.json")
    args = parser.parse_args()
    import ray
    from ray.cluster_utils import Cluster
    from sandpit.executor.ray_backend import RayExecutor

    settings = ExecutorSettings(pool_size=1)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "note": "one machine: nodes share cores and the Docker Engine; noisy if loaded"}
    pool = SandboxPool(settings).start()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        results["steps_per_s_local"] = throughput(pool, args.sessions, args.threads, args.duration, "local")
        print("local steps/s", results["steps_per_s_local"]["steps_per_s"])
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
        cluster.wait_for_nodes()
        executor = RayExecutor(cluster.address, settings).start()
        try:
            local, remote = paired(pool, executor, args.calls)
            results["local_call_ms"] = summary(local)
            results["ray_call_ms"] = summary(remote)
            diffs = [r - loc for loc, r in zip(local, remote, strict=True)]
            results["ray_hop_ms"] = {**summary(diffs), "target_p50": 1.0}
            results["actor_rtt_ms"] = summary(actor_rtt(executor, args.calls))
            print("local call ms", results["local_call_ms"], "\nray call ms", results["ray_call_ms"],
                  "\nhop ms (paired)", results["ray_hop_ms"], "\nactor rtt ms", results["actor_rtt_ms"])
            results["steps_per_s_ray_1_node"] = throughput(executor, args.sessions, args.threads, args.duration,
                                                           "one")
            print("ray 1 node steps/s", results["steps_per_s_ray_1_node"])
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
            cluster.wait_for_nodes()
            executor.refresh(force=True)
            executor.warm("bench", count=1)
            results["steps_per_s_ray_2_nodes"] = throughput(executor, args.sessions, args.threads, args.duration,
                                                            "two")
            print("ray 2 nodes steps/s", results["steps_per_s_ray_2_nodes"])
        finally:
            executor.shutdown_hosts()
            executor.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        pool.close()
    single = results["steps_per_s_ray_1_node"]["steps_per_s"]
    results["model"] = {"assumptions": "separate machines; per node = measured 1-node Ray rate; one API replica "
                                       f"per two nodes at {args.api_steps_per_s} steps/s; the hop adds latency, not CPU-bound cost",
                        "curve": model(single, results["local_call_ms"]["p50"], results["ray_hop_ms"]["p50"],
                                       args.api_steps_per_s, [1, 2, 4, 8, 16, 32])}
    for row in results["model"]["curve"]:
        print(f"model: {row['nodes']:>3} nodes, {row['replicas']:>2} replicas -> {row['steps_per_s']:>9} steps/s "
              f"({row['bound']}-bound)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
