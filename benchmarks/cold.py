"""Cold-path benchmark (issue 14, targets 2 and 5): starts its own ``sandpit serve``
(loopback, temporary SQLite file, like ``benchmarks/api.py``) and measures, over real HTTP:

* env create from the warm pool with a small config (target p50 <= 25 ms);
* env create with a ~3 MB tau-bench-shaped ``init_config`` (retail and airline tables under
  one ``data`` attribute, :mod:`taubench_shaped` scaled to ~3 MB): the first create of a
  config, then creates that reuse the same config (target p50 <= 150 ms), and creates
  whose config differs by one value from the previous one;
* ``GET /v1/envs/{id}/state`` of that ~3 MB state: repeated reads of the head (target
  p50 <= 50 ms) and the first read after a writing step;
* ``POST /v1/envs/{id}/evaluate`` with 8 checks (target p50 <= 30 ms).

Each figure is p50/p99/mean over N runs (milliseconds). Prints a table with the target
beside each figure and saves JSON to ``benchmarks/results/cold.json``. The numbers are
wall-clock times on whatever else the machine is doing: run it on a quiet machine.
Usage: ``python benchmarks/cold.py [--runs 30] [--size-mb 3] [--only warm,evaluate,retail,airline]``
(``--only`` runs some parts and prints their rows; it saves to ``--output``, so give a
path other than the default when the run is partial).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from taubench_shaped import AIRLINE_SOURCE, RETAIL_SOURCE, airline_data, json_size, retail_data  # noqa: E402

from api import SOURCE, Server, SocketClient, pcts  # noqa: E402 - benchmarks/ is not a package

TARGETS_MS = {
    "create_warm_small": 25.0,
    "create_3mb_same_config": 150.0,
    "state_3mb_head": 50.0,
    "evaluate_8_checks": 30.0,
}
PARTS = ("warm", "evaluate", "retail", "airline")
CHECKS = [{"check_item": f"check {i}", "check_func": f"def check_func(final_state):\n"
                                                       f"    return final_state['count'] >= {i}\n"}
          for i in range(8)]


def scaled_config(domain: str, size_mb: float) -> dict[str, Any]:
    """``{"data": tables}`` of ``domain`` grown until its compact JSON is ~``size_mb`` MB."""
    target = int(size_mb * 1_000_000)
    if domain == "retail":
        make: Callable[[int], dict[str, Any]] = lambda n: retail_data(orders=n)  # noqa: E731
        n = 1500
    else:
        make = lambda n: airline_data(reservations=n)  # noqa: E731
        n = 2500
    data = make(n)
    for _ in range(6):  # size is about linear in the record count
        size = json_size(data)
        if abs(size - target) < target * 0.02:
            break
        base = json_size(make(0))
        n = max(1, int(n * (target - base) / max(size - base, 1)))
        data = make(n)
    return {"data": data}


def timed(call: Callable[[], httpx.Response], expect: int) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = call()
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != expect:
        raise RuntimeError(f"{response.status_code}: {response.text[:500]}")
    return elapsed, response


def create(client: httpx.Client, environment_id: str, body: bytes) -> tuple[float, str]:
    """POST /v1/envs with a pre-encoded body (the client's own JSON encoding is not timed)."""
    elapsed, response = timed(lambda: client.post("/v1/envs", content=body,
                                                  headers={"Content-Type": "application/json"}), 201)
    return elapsed, response.json()["id"]


def env_body(environment_id: str, init_config: dict[str, Any]) -> bytes:
    return json.dumps({"environment_id": environment_id, "init_config": init_config}).encode()


def register(client: httpx.Client, source: str, class_name: str) -> str:
    response = client.post("/v1/environments", json={"source_code": source, "class_name": class_name})
    if response.status_code != 201:
        raise RuntimeError(response.text)
    return str(response.json()["id"])


def bench_warm(client: httpx.Client, runs: int) -> dict[str, Any]:
    """Warm creates with a small config through ``client`` (p50/p99/mean ms), each env
    deleted after its create (not timed)."""
    return bench_warm_clients(client, None, runs)["httpx"]


def bench_warm_clients(client: httpx.Client, lean: SocketClient | None, runs: int) -> dict[str, dict[str, Any]]:
    """Warm creates with a small config, each env deleted after its create (not timed):
    ``{"httpx": pcts}`` through ``client``, and with ``lean`` also ``{"socket": pcts}``
    through it, the two clients taking turns (same conditions; each client's own CPU is
    in what it measures, httpx's about 1 ms per request here)."""
    environment_id = register(client, SOURCE, "Bench")
    body = env_body(environment_id, {"count": 1})
    clients: list[tuple[str, Callable[[], tuple[float, str]]]] = [
        ("httpx", lambda: create(client, environment_id, body))]
    if lean is not None:
        clients.append(("socket", lambda: create_lean(lean, body)))
    samples: dict[str, list[float]] = {name: [] for name, _ in clients}
    for i in range(runs + 5):
        for name, make in clients:
            elapsed, env_id = make()
            if i >= 5:
                samples[name].append(elapsed)
            client.delete(f"/v1/envs/{env_id}")
    return {name: pcts(values) for name, values in samples.items()}


def create_lean(lean: SocketClient, body: bytes) -> tuple[float, str]:
    """POST /v1/envs through the socket client: (ms, env id). That client takes a dict
    and encodes it inside the timing (microseconds for this body)."""
    payload = json.loads(body)
    started = time.perf_counter()
    status, reply = lean.post("/v1/envs", payload)
    elapsed = (time.perf_counter() - started) * 1000
    if status != 201:
        raise RuntimeError(f"{status}: {str(reply)[:500]}")
    return elapsed, str(reply["id"])


def bench_large(client: httpx.Client, domain: str, size_mb: float, runs: int) -> dict[str, Any]:
    source, class_name = (RETAIL_SOURCE, "RetailTools") if domain == "retail" else (AIRLINE_SOURCE, "AirlineTools")
    environment_id = register(client, source, class_name)
    config = scaled_config(domain, size_mb)
    out: dict[str, Any] = {"config_bytes": json_size(config)}
    body = env_body(environment_id, config)
    first, env_id = create(client, environment_id, body)
    out["create_first_ms"] = round(first, 1)
    second, other = create(client, environment_id, body)  # builds the config template, if any
    out["create_second_ms"] = round(second, 1)
    client.delete(f"/v1/envs/{other}")
    same = []
    for _ in range(runs):
        elapsed, other = create(client, environment_id, body)
        same.append(elapsed)
        client.delete(f"/v1/envs/{other}")
    out["create_same_config_ms"] = pcts(same)
    changed = []
    table = next(iter(config["data"].values()))
    record_key = next(iter(table))
    for i in range(max(3, runs // 4)):
        table[record_key] = dict(table[record_key], bench_marker=i)  # one value differs each time
        elapsed, other = create(client, environment_id, env_body(environment_id, config))
        changed.append(elapsed)
        client.delete(f"/v1/envs/{other}")
    out["create_changed_config_ms"] = pcts(changed)

    head = []
    size = 0
    for _ in range(runs):
        elapsed, response = timed(lambda: client.get(f"/v1/envs/{env_id}/state"), 200)
        head.append(elapsed)
        size = len(response.content)
    out["state_response_bytes"] = size
    out["state_head_ms"] = pcts(head)
    after_step = []
    calls = {"retail": ("modify_user_address", {"user_id": "user_0001", "address": {"city": "Reno"}}),
             "airline": ("update_reservation_baggages", {"reservation_id": "R00001", "total_baggages": 2,
                                                         "nonfree_baggages": 1})}
    name, arguments = calls[domain]
    for _ in range(max(3, runs // 3)):
        timed(lambda: client.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments}), 200)
        elapsed, _ = timed(lambda: client.get(f"/v1/envs/{env_id}/state"), 200)
        after_step.append(elapsed)
    out["state_after_step_ms"] = pcts(after_step)
    older = []
    for _ in range(max(3, runs // 3)):
        elapsed, _ = timed(lambda: client.get(f"/v1/envs/{env_id}/state", params={"step": 0}), 200)
        older.append(elapsed)
    out["state_step_0_ms"] = pcts(older)
    client.delete(f"/v1/envs/{env_id}")
    return out


def bench_evaluate(client: httpx.Client, runs: int) -> dict[str, Any]:
    environment_id = register(client, SOURCE, "Bench")
    _, env_id = create(client, environment_id, env_body(environment_id, {"count": 3}))
    samples = []
    for i in range(runs + 3):
        elapsed, response = timed(lambda: client.post(f"/v1/envs/{env_id}/evaluate", json={"checks": CHECKS}), 200)
        if response.json()["total"] != len(CHECKS):
            raise RuntimeError(response.text)
        if i >= 3:
            samples.append(elapsed)
    client.delete(f"/v1/envs/{env_id}")
    return pcts(samples)


def table(results: dict[str, Any]) -> str:
    rows = []
    if "create_warm_small_ms" in results:
        rows.append(("env create, warm pool, small config", results["create_warm_small_ms"],
                     TARGETS_MS["create_warm_small"]))
    for domain in ("retail", "airline"):
        if domain not in results:
            continue
        r = results[domain]
        label = f"{domain} {r['config_bytes'] / 1e6:.1f} MB"
        rows += [(f"env create {label}, same config", r["create_same_config_ms"],
                  TARGETS_MS["create_3mb_same_config"]),
                 (f"env create {label}, one value changed", r["create_changed_config_ms"], None),
                 (f"GET /state {label}, head", r["state_head_ms"], TARGETS_MS["state_3mb_head"]),
                 (f"GET /state {label}, first read after a step", r["state_after_step_ms"], None),
                 (f"GET /state {label}, ?step=0", r["state_step_0_ms"], None)]
    if "evaluate_8_checks_ms" in results:
        rows.append(("evaluate, 8 checks", results["evaluate_8_checks_ms"], TARGETS_MS["evaluate_8_checks"]))
    lines = [f"{'measure':58s} {'p50 ms':>8s} {'p99 ms':>8s} {'n':>4s} {'target p50':>11s}"]
    for label, stats, target in rows:
        goal = f"<= {target:g}" if target is not None else "-"
        met = "" if target is None else ("  ok" if stats["p50"] <= target else "  MISSED")
        lines.append(f"{label:58s} {stats['p50']:8.1f} {stats['p99']:8.1f} {stats['n']:4d} {goal:>11s}{met}")
    for domain in (d for d in ("retail", "airline") if d in results):
        lines.append(f"first create of a new {domain} config: {results[domain]['create_first_ms']:.0f} ms, "
                     f"second: {results[domain].get('create_second_ms', 0):.0f} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="samples per measure")
    parser.add_argument("--size-mb", type=float, default=3.0, help="init_config size of the large creates (MB)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "cold.json")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    args = parser.parse_args()
    parts = [part for part in args.only.split(",") if part]
    if not parts or any(part not in PARTS for part in parts):
        parser.error(f"--only takes parts of {', '.join(PARTS)}")
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                           "load_avg_at_start": os.getloadavg()},
                               "targets_ms": TARGETS_MS}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="4", SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="8",
                        SANDPIT_EXECUTOR_MAX_SANDBOXES="16")
        try:
            with server.client() as client:
                if "warm" in parts:
                    results["create_warm_small_ms"] = bench_warm(client, args.runs)
                if "evaluate" in parts:
                    results["evaluate_8_checks_ms"] = bench_evaluate(client, args.runs)
                for domain in ("retail", "airline"):
                    if domain in parts:
                        results[domain] = bench_large(client, domain, args.size_mb, args.runs)
            results["server_rss_mib"] = round(server.rss_mib(), 1)
        finally:
            server.stop()
    results["machine"]["load_avg_at_end"] = os.getloadavg()
    print(table(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
