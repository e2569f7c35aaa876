"""Deep structural state deltas: Sandpit over HTTP vs EnvScaler's in-process recording, on
the same tau-bench-shaped episodes, side by side in one run.

For each domain of :mod:`taubench_shaped` (retail ~1.4 MB, airline ~3 MB, all state under
one ``data`` attribute holding dict tables) and each episode (a fresh env per episode):

* **anchor, EnvScaler-style in-process recording** (EnvScaler ``interact_with_env``): in
  this process, ``copy.deepcopy`` of the whole state before the call, the call, a deepcopy
  after it, and the recursive ``get_state_diff`` of the two. The environment class is the
  benchmark's own source text (``taubench_shaped.RETAIL_SOURCE``/``AIRLINE_SOURCE``:
  trusted code we wrote, not generated code), executed here only for this anchor;
* **Sandpit**: the same calls as ``POST /v1/envs/{id}/step`` on a ``sandpit serve`` started
  here (loopback, temporary SQLite file, like ``benchmarks/api.py``), timed by the client;
  after each step the blob bytes SQLite gained (compressed, as stored) are read from the
  database file.

A *writing step* is one whose anchor diff is not empty; both sides are reported over the
same writing steps: p50/p99 per step, the ratio of the p50s (target: Sandpit >= 10x
faster, step p50 <= 15 ms) and stored bytes per step (target <= 20 KB). Each episode's
first writing step is also reported on its own (``sandpit_first_writing_step_ms``): it is
the one that pays for an encoder that cannot skip the opened state's records by identity. Prints a table and
saves JSON to ``benchmarks/results/deltas.json``. The numbers depend on the machine's
load; re-run on a quiet machine for the published table.

Usage: ``python benchmarks/deltas.py [--episodes 4] [--steps 30] [--domains retail airline]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from taubench_shaped import DOMAINS, json_size  # noqa: E402

from api import Server  # noqa: E402 - the sibling benchmark's server launcher

TARGET_RATIO = 10.0
TARGET_STEP_P50_MS = 15.0
TARGET_STORED_BYTES = 20_000


def pcts(samples: list[float]) -> dict[str, float]:
    """n, p50, p99, mean of ``samples`` (same units as given)."""
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "mean": 0.0}
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "mean": round(statistics.fmean(ordered), 3)}


def get_state_diff(old: Any, new: Any) -> dict[str, Any]:
    """EnvScaler's ``get_state_diff``: ``{key: {"added": v} | {"removed": v} | {"changed":
    {"old", "new"}} | <nested diff of two dicts>}``."""
    diff: dict[str, Any] = {}
    for key in old:
        if key not in new:
            diff[key] = {"removed": old[key]}
    for key, value in new.items():
        if key not in old:
            diff[key] = {"added": value}
        elif isinstance(value, dict) and isinstance(old[key], dict):
            nested = get_state_diff(old[key], value)
            if nested:
                diff[key] = nested
        elif old[key] != value:
            diff[key] = {"changed": {"old": old[key], "new": value}}
    return diff


def state_info(instance: object) -> dict[str, Any]:
    """EnvScaler's ``get_state_info``: ``vars(instance)`` without dunder keys."""
    return {k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))}


def anchor_step(instance: object, call: dict[str, Any]) -> tuple[float, bool]:
    """One EnvScaler-style recorded step: ``(milliseconds, wrote)``."""
    started = time.perf_counter()
    before = copy.deepcopy(state_info(instance))
    try:
        observation = str(getattr(instance, call["name"])(**call["arguments"]))
    except Exception as exc:  # noqa: BLE001 - EnvScaler: an error is an observation
        observation = f"Error: {type(exc).__name__}: {exc}"
    del observation  # recorded by EnvScaler with the diff; not compared here
    after = copy.deepcopy(state_info(instance))
    diff = get_state_diff(before, after)
    return (time.perf_counter() - started) * 1000.0, bool(diff)


def blob_bytes(db: Path) -> int:
    """Compressed bytes of every stored blob (read-only connection)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0])


def run_domain(server: Server, client: httpx.Client, domain: str, episodes: int, steps: int) -> dict[str, Any]:
    source, class_name, make_data, make_episode = DOMAINS[domain]
    data = make_data()
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{domain} benchmark source>", "exec"), namespace)  # noqa: S102 - our own benchmark code
    environment = client.post("/v1/environments", json={"source_code": source, "class_name": class_name})
    if environment.status_code != 201:
        raise SystemExit(f"registering {domain}: {environment.text}")
    environment_id = environment.json()["id"]
    anchor_ms: list[float] = []
    sandpit_ms: list[float] = []
    first_ms: list[float] = []
    stored: list[int] = []
    create_ms: list[float] = []
    all_steps = 0
    db = server.data_dir / "sandpit.db"
    for episode in range(episodes):
        calls = make_episode(data, seed=episode + 1, steps=steps)
        instance = namespace[class_name]({"data": copy.deepcopy(data)})
        started = time.perf_counter()
        response = client.post("/v1/envs", json={"environment_id": environment_id, "init_config": {"data": data}})
        create_ms.append((time.perf_counter() - started) * 1000.0)
        if response.status_code != 201:
            raise SystemExit(f"creating a {domain} env: {response.text}")
        env_id = response.json()["id"]
        written_before = len(sandpit_ms)
        for call in calls:
            all_steps += 1
            anchor, wrote = anchor_step(instance, call)
            before = blob_bytes(db)
            started = time.perf_counter()
            response = client.post(f"/v1/envs/{env_id}/step", json={"name": call["name"], "arguments": call["arguments"]})
            elapsed = (time.perf_counter() - started) * 1000.0
            if response.status_code != 200 or response.json()["status"] not in ("ok", "error"):
                raise SystemExit(f"{domain} step {call}: {response.text}")
            added = blob_bytes(db) - before
            if wrote:
                if len(sandpit_ms) == written_before:
                    first_ms.append(elapsed)
                anchor_ms.append(anchor)
                sandpit_ms.append(elapsed)
                stored.append(added)
        client.delete(f"/v1/envs/{env_id}")
    anchor = pcts(anchor_ms)
    sandpit = pcts(sandpit_ms)
    stored_stats = pcts([float(b) for b in stored])
    ratio = round(anchor["p50"] / sandpit["p50"], 2) if sandpit["p50"] else 0.0
    return {
        "state_bytes": json_size(data), "episodes": episodes, "steps": all_steps, "writing_steps": len(sandpit_ms),
        "env_create_ms": pcts(create_ms),
        "anchor_envscaler_in_process_ms": anchor, "sandpit_http_step_ms": sandpit,
        "sandpit_first_writing_step_ms": pcts(first_ms) if first_ms else None,
        "ratio_p50_anchor_over_sandpit": ratio,
        "stored_bytes_per_writing_step": {**stored_stats, "max": max(stored, default=0)},
        "targets": {"ratio>=10": ratio >= TARGET_RATIO, "step_p50<=15ms": sandpit["p50"] <= TARGET_STEP_P50_MS,
                    "stored_p50<=20KB": stored_stats["p50"] <= TARGET_STORED_BYTES},
    }


def table(results: dict[str, Any]) -> str:
    """The side-by-side table printed at the end."""
    lines = [f"{'domain':8} {'state':>8} {'writes':>6} | {'EnvScaler in-process p50/p99 ms':>32} | "
             f"{'Sandpit HTTP p50/p99 ms':>24} | {'ratio':>6} | {'stored B/step p50/max':>22}"]
    for domain, row in results["domains"].items():
        anchor, sandpit, stored = (row["anchor_envscaler_in_process_ms"], row["sandpit_http_step_ms"],
                                   row["stored_bytes_per_writing_step"])
        lines.append(f"{domain:8} {row['state_bytes'] / 1e6:>6.2f}MB {row['writing_steps']:>6} | "
                     f"{anchor['p50']:>15.1f} / {anchor['p99']:<14.1f} | {sandpit['p50']:>11.1f} / {sandpit['p99']:<10.1f} | "
                     f"{row['ratio_p50_anchor_over_sandpit']:>5.1f}x | {stored['p50']:>10.0f} / {stored['max']:<9.0f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per domain (a fresh env each)")
    parser.add_argument("--steps", type=int, default=30, help="calls per episode")
    parser.add_argument("--domains", nargs="+", default=list(DOMAINS), choices=list(DOMAINS))
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "deltas.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                           "load_avg_at_start": os.getloadavg()},
                               "targets": {"ratio": TARGET_RATIO, "step_p50_ms": TARGET_STEP_P50_MS,
                                           "stored_bytes_per_step": TARGET_STORED_BYTES},
                               "domains": {}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-deltas-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="2")
        try:
            with server.client() as client:
                for domain in args.domains:
                    results["domains"][domain] = run_domain(server, client, domain, args.episodes, args.steps)
        finally:
            server.stop()
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    print(json.dumps(results, indent=2))
    print(table(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
