"""Tenancy benchmark: starts its own ``sandpit serve`` (loopback, temporary SQLite file).

* Fairness: a quiet tenant steps one env sequentially, first alone, then while a noisy
  tenant keeps ``--noisy`` infinite-loop steps in flight (one per env, each re-sent as
  soon as it ends). Reports the quiet tenant's step p50/p99 in both phases and their
  ratio (target: loaded p99 <= 2 x unloaded p99), plus what the noisy tenant got.
* Evaluation throughput (``--eval``): BFCL multi-turn base as a replay evaluation (see
  ``eval_bfcl``): episodes per minute.

Prints a table and saves JSON to ``benchmarks/results/tenancy.json``.
Usage: ``python benchmarks/tenancy.py [--steps 300] [--noisy 32] [--eval]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from api import SOURCE, Server, pcts  # noqa: E402 - the sibling benchmark's server launcher

SPIN = '''
class Spinner:
    """A tool that never returns (the noisy tenant's workload)."""

    def spin(self) -> None:
        """Loop forever."""
        while True:
            pass
'''


def quiet_steps(server: Server, key: str, env_id: str, steps: int) -> list[float]:
    """Latencies (ms) of ``steps`` sequential steps; raises on any non-ok step."""
    latencies = []
    with server.client(key) as client:
        for _ in range(steps):
            started = time.perf_counter()
            response = client.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}})
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200 or response.json()["status"] != "ok":
                raise RuntimeError(f"quiet step failed: {response.status_code} {response.text[:300]}")
    return latencies


def fairness(server: Server, steps: int, noisy_count: int, call_timeout_s: float,
             noisy_running: int | None = None) -> dict:
    quiet_key = server.new_tenant("quiet")
    quotas = {"max_live_envs": noisy_count + 10, "max_concurrent_calls": 2 * noisy_count}
    if noisy_running is not None:
        quotas["max_running_calls"] = noisy_running
    noisy_key = server.new_tenant("noisy", quotas)
    with server.client(quiet_key) as quiet:
        environment = quiet.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Bench"}).json()
        quiet_env = quiet.post("/v1/envs", json={"environment_id": environment["id"]}).json()["id"]
    with server.client(noisy_key) as noisy:
        spinner = noisy.post("/v1/environments", json={"source_code": SPIN, "class_name": "Spinner"}).json()
        noisy_envs = [noisy.post("/v1/envs", json={"environment_id": spinner["id"],
                                                   "profile": {"call_timeout_s": call_timeout_s}}).json()["id"]
                      for _ in range(noisy_count)]
    quiet_steps(server, quiet_key, quiet_env, 50)  # warm-up
    alone = quiet_steps(server, quiet_key, quiet_env, steps)
    stop = threading.Event()
    statuses: collections.Counter[str] = collections.Counter()

    def spin(env_id: str) -> None:
        with server.client(noisy_key, timeout=600) as client:
            while not stop.is_set():
                try:
                    response = client.post(f"/v1/envs/{env_id}/step", json={"name": "spin"})
                except httpx.HTTPError as exc:  # counted, not fatal: the noisy tenant's problem
                    statuses[type(exc).__name__] += 1
                    continue
                statuses[str(response.status_code) if response.status_code != 200 else response.json()["status"]] += 1

    threads = [threading.Thread(target=spin, args=(env_id,), daemon=True) for env_id in noisy_envs]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    started = time.monotonic()
    loaded = quiet_steps(server, quiet_key, quiet_env, steps)
    loaded_s = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join(600)
    alone_p, loaded_p = pcts(alone), pcts(loaded)
    return {"quiet_alone_ms": alone_p, "quiet_loaded_ms": loaded_p, "loaded_phase_s": round(loaded_s, 1),
            "p99_ratio": round(loaded_p["p99"] / alone_p["p99"], 2), "p50_ratio": round(loaded_p["p50"] / alone_p["p50"], 2),
            "noisy_calls_in_flight": noisy_count, "noisy_results": dict(statuses),
            "noisy_call_timeout_s": call_timeout_s, "noisy_max_running_calls": noisy_running or "default"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="quiet steps per phase")
    parser.add_argument("--noisy", type=int, default=32, help="noisy infinite-loop steps kept in flight")
    parser.add_argument("--call-timeout", type=float, default=5.0, help="noisy envs' call timeout (s)")
    parser.add_argument("--noisy-running", type=int, default=None,
                        help="the noisy tenant's max_running_calls (default: the server default)")
    parser.add_argument("--eval", action="store_true", help="also measure BFCL replay evaluation throughput")
    parser.add_argument("--eval-limit", type=int, default=None, help="BFCL episodes to evaluate (default all)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "tenancy.json")
    args = parser.parse_args()
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="2", SANDPIT_EXECUTOR_MAX_SANDBOXES=str(args.noisy + 16))
        try:
            results["fairness"] = fairness(server, args.steps, args.noisy, args.call_timeout, args.noisy_running)
            if args.eval:
                from eval_bfcl import replay_throughput

                results["evaluation"] = replay_throughput(server, args.eval_limit)
        finally:
            server.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    fair = results["fairness"]
    print(f"quiet tenant step, alone:  p50 {fair['quiet_alone_ms']['p50']:.1f} ms  p99 {fair['quiet_alone_ms']['p99']:.1f} ms")
    print(f"quiet tenant step, loaded: p50 {fair['quiet_loaded_ms']['p50']:.1f} ms  p99 {fair['quiet_loaded_ms']['p99']:.1f} ms"
          f"  (p99 x{fair['p99_ratio']}, p50 x{fair['p50_ratio']}; target p99 <= 2x)")
    print(f"noisy tenant: {fair['noisy_calls_in_flight']} infinite loops in flight -> {fair['noisy_results']}")
    if "evaluation" in results:
        ev = results["evaluation"]
        print(f"BFCL replay evaluation: {ev['episodes']} episodes in {ev['wall_s']:.1f} s = "
              f"{ev['episodes_per_min']:.0f} episodes/min; mean reward {ev['mean_reward']:.3f}")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
