"""Forks ahead, on and off, over HTTP (``SANDPIT_EXECUTOR_SESSION_FORKS_AHEAD``,
``sandbox_images/runner/pid1_forks.py``): two ``sandpit serve`` processes (loopback, a
temporary SQLite file each, ``benchmarks/api.py``'s :class:`Server`), one with the default
(2) and one with 0, both with ``cold.py``'s shared sandboxes (2 warm, 8 sessions each),
measured in alternating rounds of one run, each round on each server:

* ``create_ms``: ``POST /v1/envs`` of ``api.SOURCE`` with a small config while another env
  of the same environment and config stays live in the sandbox (so the sandbox is not
  recycled between creates and the config's template serves them: the case of a trainer
  that keeps several envs and replaces one each episode), each env deleted after its
  create (``delete_ms``) and, before that, stepped once (``first_step_ms``: the first call
  after an open, which may wait for the fork ahead under way; ``delete_ms`` through httpx,
  whose own CPU is in it);
* ``reset_ms``: ``POST /v1/envs/{id}/reset`` of one env, the config kept (a trainer's
  episode loop), then one step (``step_after_reset_ms``).

Everything through the lean socket client of ``api.py``; milliseconds of wall clock,
p50/p99/mean over every round's samples, and each round's p50 (``rounds``) so the two
servers can be compared round by round. ``construction_paths`` counts the ``construction``
of each create and reset (``template`` when forked from the config's template).

Usage: ``python benchmarks/forks_ahead.py [--rounds 6] [--per-round 100]``; saves
``benchmarks/results/forks_ahead.json``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from cold import register  # noqa: E402 - benchmarks/ is not a package

from api import SOURCE, Server, SocketClient, machine, pcts, save  # noqa: E402

SETTINGS = {"SANDPIT_EXECUTOR_POOL_SIZE": "2", "SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX": "8",
            "SANDPIT_EXECUTOR_MAX_SANDBOXES": "8"}
ARMS = {"ahead_2": "2", "ahead_0": "0"}
MEASURES = ("create_ms", "first_step_ms", "delete_ms", "reset_ms", "step_after_reset_ms")


def timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    status, reply = call()
    elapsed = (time.perf_counter() - started) * 1000
    if status not in (200, 201):
        raise RuntimeError(f"{status}: {str(reply)[:500]}")
    return elapsed, reply


def deleted(client: httpx.Client, env_id: str) -> tuple[int, None]:
    """DELETE /v1/envs/{id}: (200 for the 204 it answers, else its status, None)."""
    status = client.delete(f"/v1/envs/{env_id}").status_code
    return (200 if status == 204 else status), None


class Arm:
    """One server, its environment, the env kept live and the env reset each episode."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.server = Server(tmp / name, SANDPIT_EXECUTOR_SESSION_FORKS_AHEAD=ARMS[name], **SETTINGS)
        self.lean = SocketClient(self.server.url, self.server.api_key)
        self.client = self.server.client()  # deletes (204, no body for the socket client to read)
        with self.server.client() as client:
            environment_id = register(client, SOURCE, "Bench")
        self.payload = {"environment_id": environment_id, "init_config": {"count": 1}}
        self.keeper = self.lean.post("/v1/envs", self.payload)[1]["id"]
        self.resetting = self.lean.post("/v1/envs", self.payload)[1]["id"]
        self.samples: dict[str, list[float]] = {m: [] for m in MEASURES}
        self.rounds: dict[str, list[float]] = {m: [] for m in MEASURES}
        self.paths: collections.Counter[str] = collections.Counter()

    def round(self, per_round: int, record: bool) -> None:
        got: dict[str, list[float]] = {m: [] for m in MEASURES}
        step = {"name": "bump", "arguments": {"by": 1}}
        for _ in range(per_round):
            ms, reply = timed(lambda: self.lean.post("/v1/envs", self.payload))
            got["create_ms"].append(ms)
            self.paths[f"create:{(reply.get('construction') or {}).get('path')}"] += record
            env_id = reply["id"]
            got["first_step_ms"].append(timed(partial(self.lean.post, f"/v1/envs/{env_id}/step", step))[0])
            got["delete_ms"].append(timed(partial(deleted, self.client, env_id))[0])
            ms, reply = timed(lambda: self.lean.post(f"/v1/envs/{self.resetting}/reset", {}))
            got["reset_ms"].append(ms)
            self.paths[f"reset:{(reply.get('construction') or {}).get('path')}"] += record
            got["step_after_reset_ms"].append(timed(partial(self.lean.post, f"/v1/envs/{self.resetting}/step", step))[0])
        if record:
            for measure, values in got.items():
                self.samples[measure] += values
                self.rounds[measure].append(round(statistics.median(values), 3))

    def results(self) -> dict[str, Any]:
        out: dict[str, Any] = {m: pcts(v) for m, v in self.samples.items()}
        out["rounds_p50_ms"] = self.rounds
        out["construction_paths"] = dict(self.paths)
        out["server_rss_mib"] = round(self.server.rss_mib(), 1)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="recorded rounds per server")
    parser.add_argument("--per-round", type=int, default=100, help="creates (and resets) per round")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "forks_ahead.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine(), "settings": SETTINGS, "rounds": args.rounds,
                               "per_round": args.per_round}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-ahead-") as tmp:
        arms: list[Arm] = []
        try:
            for name in ARMS:
                (Path(tmp) / name).mkdir()
                arms.append(Arm(name, Path(tmp)))
            for arm in arms:  # warm-up: templates built, nothing recorded
                arm.round(20, record=False)
            for _ in range(args.rounds):
                for arm in arms:
                    arm.round(args.per_round, record=True)
            for arm in arms:
                results[arm.name] = arm.results()
        finally:
            for arm in arms:
                arm.client.close()
                arm.server.stop()
    on, off = results["ahead_2"], results["ahead_0"]
    results["rounds_lower_with_forks_ahead"] = {
        m: sum(a < b for a, b in zip(on["rounds_p50_ms"][m], off["rounds_p50_ms"][m], strict=True)) for m in MEASURES}
    save(results, args.output)
    print(f"{'measure':22s} {'ahead 2 p50':>12s} {'ahead 0 p50':>12s} {'p99 (2 / 0)':>16s} rounds lower")
    for m in MEASURES:
        print(f"{m:22s} {on[m]['p50']:12.3f} {off[m]['p50']:12.3f} {on[m]['p99']:7.2f} / {off[m]['p99']:<7.2f}"
              f" {results['rounds_lower_with_forks_ahead'][m]}/{args.rounds}")


if __name__ == "__main__":
    main()
