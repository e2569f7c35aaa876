"""RL adapter throughput: `SandpitVectorEnv` (N envs stepped concurrently over one
`AsyncClient`) against a real ``sandpit serve`` (loopback, temporary SQLite file), for
several N, compared with one `RLEnv` stepped in a plain loop.

Each env runs scenario episodes of the ``Bench`` environment: ``--episode-steps`` tool
calls, then the episode is truncated and scored (two checks, each in a fresh sandbox
process) and autoreset (SAME_STEP). Reported per N: env-steps/s over the whole run
(episode ends and resets included) and the initial reset time (env creation).

Usage: ``python benchmarks/rl_vector.py [--envs 1,4,8,16] [--rounds 40] [--running-calls 4]``.
Saves JSON to ``benchmarks/results/rl_vector.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from gymnasium.vector import AutoresetMode
from sandpit.client import Client
from sandpit.client.rl import RLEnv, SandpitVectorEnv

from api import SOURCE, Server

CHECKS = [{"check_item": "bumped", "check_func": "def check_func(final_state):\n    return final_state['count'] > 0\n"},
          {"check_item": "touched",
           "check_func": "def check_func(final_state):\n    return final_state['records']['k']['value'] == 'v'\n"}]
ACTIONS = [{"name": "bump", "arguments": {"by": 1}}, {"name": "touch", "arguments": {"key": "k", "value": "v"}}]


def scenario_ids(server: Server, key: str) -> list[str]:
    with Client(server.url, api_key=key) as client:
        environment = client.environments.create(SOURCE, "Bench")
        return [client.scenarios.create({"environment_id": environment.id, "task": f"bench {n}",
                                         "init_config": {"records": {"k": {"value": "a"}}},
                                         "checklist_with_func": CHECKS}).id for n in range(4)]


def run_vector(server: Server, key: str, ids: list[str], n: int, rounds: int, episode_steps: int) -> dict:
    envs = SandpitVectorEnv(n, ids, base_url=server.url, api_key=key, autoreset_mode=AutoresetMode.SAME_STEP,
                            episode={"max_steps": episode_steps})
    try:
        started = time.perf_counter()
        envs.reset(seed=0)
        reset_s = time.perf_counter() - started
        episodes = 0
        started = time.perf_counter()
        for number in range(rounds):
            _, _, terminated, truncated, _ = envs.step([ACTIONS[number % 2]] * n)
            episodes += int(terminated.sum() + truncated.sum())
        elapsed = time.perf_counter() - started
    finally:
        envs.close()
    return {"envs": n, "env_steps": n * rounds, "seconds": round(elapsed, 3),
            "env_steps_per_s": round(n * rounds / elapsed, 1), "episodes_ended": episodes,
            "first_reset_s": round(reset_s, 3)}


def run_plain(server: Server, key: str, ids: list[str], steps: int, episode_steps: int) -> dict:
    with Client(server.url, api_key=key) as client, RLEnv(client, ids, episode={"max_steps": episode_steps}) as env:
        env.reset(seed=0)
        started = time.perf_counter()
        for number in range(steps):
            _, _, terminated, truncated, _ = env.step(ACTIONS[number % 2])
            if terminated or truncated:
                env.reset()
        elapsed = time.perf_counter() - started
    return {"envs": 1, "env_steps": steps, "seconds": round(elapsed, 3), "env_steps_per_s": round(steps / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="1,4,8,16", help="comma-separated N")
    parser.add_argument("--rounds", type=int, default=40, help="vector steps per N")
    parser.add_argument("--episode-steps", type=int, default=10)
    parser.add_argument("--running-calls", type=int, default=None,
                        help="the tenant's max_running_calls (default: the server's, half the cores)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "rl_vector.json")
    args = parser.parse_args()
    sizes = [int(n) for n in args.envs.split(",")]
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                     "episode_steps": args.episode_steps, "running_calls": args.running_calls or "default"}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="4", SANDPIT_EXECUTOR_MAX_SANDBOXES=str(max(sizes) + 8))
        try:
            quotas = {"max_live_envs": 10_000, "max_concurrent_calls": 1024}
            if args.running_calls:
                quotas["max_running_calls"] = args.running_calls
            key = server.new_tenant("rl", quotas)
            ids = scenario_ids(server, key)
            results["plain_loop"] = run_plain(server, key, ids, args.rounds * 2, args.episode_steps)
            results["vector"] = [run_vector(server, key, ids, n, args.rounds, args.episode_steps) for n in sizes]
        finally:
            server.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    plain = results["plain_loop"]
    print(f"RLEnv plain loop: {plain['env_steps_per_s']} env-steps/s")
    for row in results["vector"]:
        print(f"SandpitVectorEnv N={row['envs']:>3}: {row['env_steps_per_s']:>7} env-steps/s "
              f"({row['episodes_ended']} episodes ended and reset; first reset {row['first_reset_s']} s)")


if __name__ == "__main__":
    main()
