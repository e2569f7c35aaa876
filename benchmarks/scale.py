"""Scale-out benchmark (issue 15): the Ray executor backend against the local pool.

Measures, on the real Docker Engine and a real local Ray cluster (all on 127.0.0.1):
  local_call_ms        trivial tool call through the local SandboxPool (baseline)
  ray_call_ms          the same call through RayExecutor -> host -> its pool over the
                       host link (the default data path, executor/ray/link.py), and
                       ray_actor_call_ms through Ray actor calls (``direct=False``), all
                       measured in rounds with the local call (alternating, so machine
                       noise hits them alike)
  ray_hop_ms           per round, ray call - local call: what the hop adds per step
                       (target p50 <= 1 ms); ray_actor_hop_ms the same through Ray actor
                       calls; ``link_rtt_ms`` / ``actor_rtt_ms``, a no-op request over the
                       link / as a Ray actor call (the hop alone)
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

from sandpit.executor.docker import docker_pool  # noqa: E402
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


def rounds(executors: list[Any], calls: int) -> list[list[float]]:
    """Milliseconds per trivial call on one session of each executor, in rounds (one call
    on each per round, the order rotating so no executor always goes first)."""
    sessions = [executor.open_session(tenant="bench", source=TRIVIAL, class_name="Echo", session_id=f"bench_round_{k}")
                for k, executor in enumerate(executors)]
    try:
        for _ in range(20):
            for session in sessions:
                session.call("ping", {"value": 1})
        out: list[list[float]] = [[] for _ in sessions]
        for i in range(calls):
            for k in range(len(sessions)):
                j = (i + k) % len(sessions)
                started = time.perf_counter()
                sessions[j].call("ping", {"value": i})
                out[j].append((time.perf_counter() - started) * 1000)
        return out
    finally:
        for session in sessions:
            session.close()


def noop_rtt(executor: Any, calls: int, through_ray: bool) -> list[float]:
    """Milliseconds per no-op request to a host: over the executor's host link, or as a
    Ray actor call (the hop alone)."""
    import ray

    hosts = executor.refresh()
    host = sorted(hosts)[0]
    handle = hosts[host]
    out = []
    for _ in range(calls + 20):
        started = time.perf_counter()
        if through_ray:
            ray.get(handle.noop.remote())
        else:
            executor.ask(host, "noop")
        out.append((time.perf_counter() - started) * 1000)
    return out[20:]


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
    from sandpit.executor.ray import RayExecutor

    settings = ExecutorSettings(pool_size=1)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "note": "one machine: nodes share cores and the Docker Engine; noisy if loaded"}
    pool = docker_pool(settings).start()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        results["steps_per_s_local"] = throughput(pool, args.sessions, args.threads, args.duration, "local")
        print("local steps/s", results["steps_per_s_local"]["steps_per_s"])
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
        cluster.wait_for_nodes()
        executor = RayExecutor(cluster.address, settings).start()
        through_ray = RayExecutor(cluster.address, settings, direct=False).start()
        try:
            local, remote, actor = rounds([pool, executor, through_ray], args.calls)
            results["local_call_ms"] = summary(local)
            results["ray_call_ms"] = summary(remote)
            results["ray_actor_call_ms"] = summary(actor)
            results["ray_hop_ms"] = {**summary([r - loc for loc, r in zip(local, remote, strict=True)]),
                                     "target_p50": 1.0, "path": "host link"}
            results["ray_actor_hop_ms"] = {**summary([r - loc for loc, r in zip(local, actor, strict=True)]),
                                           "path": "Ray actor calls"}
            results["link_rtt_ms"] = summary(noop_rtt(executor, args.calls, through_ray=False))
            results["actor_rtt_ms"] = summary(noop_rtt(executor, args.calls, through_ray=True))
            for key in ("local_call_ms", "ray_call_ms", "ray_actor_call_ms", "ray_hop_ms", "ray_actor_hop_ms",
                        "link_rtt_ms", "actor_rtt_ms"):
                print(key, results[key])
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
            through_ray.close()
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
