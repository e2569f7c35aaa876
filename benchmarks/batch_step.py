"""Batched step benchmark: ``POST /v1/envs:step`` with one action for each of N envs
against N concurrent single-step requests (``POST /v1/envs/{id}/step``), same server, same
envs, alternating rounds of the same run.

Starts its own ``sandpit serve`` (loopback, temporary SQLite file; ``benchmarks/api.py``'s
``Server``, with the pool that benchmark's 32-client run uses), a tenant whose
``max_running_calls`` is N, and N envs of ``Bench``. Each round steps every env
``--rounds-steps`` times: ``batched``, one client thread sending a batch of N ``bump``s
and waiting for it; ``single``, N client threads each stepping its env (the lean
keep-alive ``http.client`` load generator of ``benchmarks/api.py`` for both, so the
difference is the server's). Reports env-steps/s of each (``env_steps_per_s``:
``batched``, ``single``), the ratio (``batched_vs_single``), the batch's latency p50/p99
(ms) and a single step's (``latency_ms``), and the CPU each kind spends per env-step
(``cpu_ms_per_env_step``: ``server``, the API process; ``sandboxes``, this server's
sandbox containers; ms), and what that CPU allows: ``cpu_bound_env_steps_per_s``, the
batched env-steps/s of every core busy with nothing else (cores x 1000 / the batched
kind's server + sandboxes ms per env-step), and ``of_cpu_bound``, the share of it the
batches reached (how much the server's and the sandboxes' work overlap; the rest of the
way to the bound is time one of them waits for the other). The target: >= 3,000
env-steps/s batched with N = 32, and >= 3x the single requests. ``call_slots`` records
the server's ``SANDPIT_CALL_SLOTS`` (``--call-slots``): the tool calls running at once
across the server, for both kinds, so a batch of N runs its calls in waves of at most
that many. By default it is N, as a server
that serves vector envs of width N is configured (docs/settings.md); ``--call-slots 0``
measures the server's own default (2 x CPU cores, at least 4). Prints JSON and saves it to
``benchmarks/results/batch_step.json``.
Usage: ``python benchmarks/batch_step.py [--envs 32] [--rounds 6] [--rounds-steps 20] [--call-slots N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from api import SOURCE, RawClient, Server, create, machine, pcts, process_cpu_s, sandboxes_cpu_s, save


def batched(raw: RawClient, env_ids: list[str], steps: int) -> tuple[float, list[float]]:
    """``steps`` batches of one ``bump`` per env: (wall seconds, each batch's latency ms)."""
    body = {"steps": [{"env_id": e, "action": {"name": "bump", "arguments": {"by": 1}}} for e in env_ids]}
    latencies = []
    started = time.perf_counter()
    for _ in range(steps):
        began = time.perf_counter()
        code, reply = raw.post("/v1/envs:step", body)
        latencies.append((time.perf_counter() - began) * 1000)
        if code != 200 or any(r["status"] != 200 or r["result"]["status"] != "ok" for r in reply["results"]):
            raise RuntimeError(f"{code}: {str(reply)[:500]}")
    return time.perf_counter() - started, latencies


def single(raw: RawClient, env_ids: list[str], steps: int) -> tuple[float, list[float]]:
    """``steps`` single steps of each env, one thread per env: (wall seconds, latencies ms)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def drive(env_id: str) -> None:
        mine = []
        for _ in range(steps):
            began = time.perf_counter()
            code, reply = raw.post(f"/v1/envs/{env_id}/step", {"name": "bump", "arguments": {"by": 1}})
            mine.append((time.perf_counter() - began) * 1000)
            if code != 200 or reply["status"] != "ok":
                raise RuntimeError(f"{code}: {str(reply)[:500]}")
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(env_ids)) as pool:
        list(pool.map(drive, env_ids))
    return time.perf_counter() - started, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=32, help="envs per batch (N)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds of each kind")
    parser.add_argument("--rounds-steps", type=int, default=20, help="steps of every env per round")
    parser.add_argument("--call-slots", type=int, default=None,
                        help="SANDPIT_CALL_SLOTS (default: --envs; 0: the server's default)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "batch_step.json")
    args = parser.parse_args()
    if args.call_slots is None:
        args.call_slots = args.envs
    results: dict = {"machine": machine(), "envs": args.envs, "call_slots": args.call_slots}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="4", SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="8",
                        SANDPIT_EXECUTOR_MAX_SANDBOXES="48", SANDPIT_CALL_SLOTS=str(args.call_slots))
        try:
            key = server.new_tenant("wide", {"max_live_envs": 1_000_000, "max_concurrent_calls": 1024,
                                             "max_running_calls": args.envs})
            with server.client(key) as client:
                environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                       "class_name": "Bench"}).json()["id"]
                env_ids = [create(client, environment_id)[0] for _ in range(args.envs)]
            raw = RawClient(server.url, key)
            batched(raw, env_ids, 5)  # warm-up: connections, sessions, caches
            single(raw, env_ids, 5)
            walls = {"batched": 0.0, "single": 0.0}
            cpu = {kind: {"server": 0.0, "sandboxes": 0.0} for kind in walls}
            samples: dict[str, list[float]] = {"batched": [], "single": []}
            for _ in range(args.rounds):
                for kind, run in (("batched", batched), ("single", single)):
                    server_cpu, sandbox_cpu = process_cpu_s(server.process.pid), sandboxes_cpu_s(server.process.pid)
                    wall, latencies = run(raw, env_ids, args.rounds_steps)
                    cpu[kind]["server"] += process_cpu_s(server.process.pid) - server_cpu
                    cpu[kind]["sandboxes"] += sandboxes_cpu_s(server.process.pid) - sandbox_cpu
                    walls[kind] += wall
                    samples[kind] += latencies
            env_steps = args.rounds * args.rounds_steps * args.envs
            rates = {kind: round(env_steps / wall, 1) for kind, wall in walls.items()}
            results["env_steps_per_s"] = rates
            results["batched_vs_single"] = round(rates["batched"] / rates["single"], 2)
            results["cpu_ms_per_env_step"] = {kind: {part: round(seconds * 1000 / env_steps, 3)
                                                     for part, seconds in parts.items()} for kind, parts in cpu.items()}
            per_env_step = sum(results["cpu_ms_per_env_step"]["batched"].values())
            if per_env_step > 0:
                bound = (os.cpu_count() or 1) * 1000 / per_env_step
                results["cpu_bound_env_steps_per_s"] = round(bound, 1)
                results["of_cpu_bound"] = round(rates["batched"] / bound, 3)
            results["latency_ms"] = {"batch_of_n": pcts(samples["batched"]), "single_step": pcts(samples["single"])}
            results["targets"] = {"batched_env_steps_per_s": 3000, "batched_vs_single": 3.0}
        finally:
            server.stop()
    save(results, args.output)


if __name__ == "__main__":
    main()
