"""API benchmark: starts its own ``sandpit serve`` (loopback, temporary SQLite file) and
measures, over real HTTP:

* step latency p50/p99 with 1 client and with 32 concurrent clients, and steps/s;
* env create latency (warm pool);
* snapshot bytes stored per step on a ~2 MB ``Dict[id, record]`` state where each step
  changes one record, and that step's latency;
* restore latency and fork latency (a 30-step env into 16 copies);
* optionally (``--density N``) N live envs of one environment with 200 stepping at once
  (idle ones evicted to snapshots), errors and the server's resident memory.

Prints a table and saves JSON to ``benchmarks/results/api.json``.
Usage: ``python benchmarks/api.py [--steps 2000] [--density 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sandpit.api.db.engine import upgrade

SOURCE = '''
class Bench:
    """Small state plus a record store."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)
        self.records = init_config.get("records", {})

    def bump(self, by: int = 1) -> int:
        """Add `by` to the counter."""
        self.count += by
        return self.count

    def touch(self, key: str, value: str) -> str:
        """Change one record's value."""
        self.records[key] = dict(self.records[key], value=value)
        return key
'''


def pcts(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 3),
            "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "mean": round(statistics.fmean(ordered), 3)}


class Server:
    """``sandpit serve`` on a free loopback port with a random operator key; tenant
    ``default`` (``api_key``/``headers``) gets generous quotas so that one benchmark
    client is not throttled by the per-tenant defaults."""

    def __init__(self, data_dir: Path, **env: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        upgrade(f"sqlite:///{data_dir / 'sandpit.db'}")
        self.operator_key = secrets.token_urlsafe(32)
        self.env = {**os.environ, "SANDPIT_DATA_DIR": str(data_dir), "SANDPIT_OPERATOR_KEY": self.operator_key, **env}
        with (data_dir / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from sandpit.cli import app; app()", "serve", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    self.api_key = self.new_tenant("default", {"max_live_envs": 1_000_000,
                                                               "max_concurrent_calls": 1024})
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"server not ready; see {data_dir / 'server.log'}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def new_tenant(self, tenant_id: str, quotas: dict | None = None) -> str:
        """Create a tenant; returns its API key."""
        response = httpx.post(f"{self.url}/v1/admin/tenants", json={"id": tenant_id, "quotas": quotas}, timeout=30,
                              headers={"Authorization": f"Bearer {self.operator_key}"})
        if response.status_code != 201:
            raise SystemExit(f"creating tenant {tenant_id}: {response.text}")
        return response.json()["api_key"]["key"]

    def client(self, api_key: str | None = None, **kwargs) -> httpx.Client:
        """An httpx client authenticated as ``api_key`` (default: tenant ``default``)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {api_key or self.api_key}"},
                            **{"timeout": 120, **kwargs})

    def rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)


def step(client: httpx.Client, env_id: str, name: str, **arguments) -> float:
    started = time.perf_counter()
    response = client.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments})
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200 or response.json()["status"] != "ok":
        raise RuntimeError(response.text)
    return elapsed


def create(client: httpx.Client, environment_id: str, **init_config) -> tuple[str, float]:
    started = time.perf_counter()
    response = client.post("/v1/envs", json={"environment_id": environment_id, "init_config": init_config})
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 201:
        raise RuntimeError(response.text)
    return response.json()["id"], elapsed


def blob_bytes(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps for the 1-client latency run")
    parser.add_argument("--concurrent-steps", type=int, default=4000, help="steps for the 32-client run")
    parser.add_argument("--density", type=int, default=0, help="live envs for the density run (0: skip)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "api.json")
    args = parser.parse_args()
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        data_dir = Path(tmp)
        server = Server(data_dir, SANDPIT_EXECUTOR_POOL_SIZE="4", SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="8",
                        SANDPIT_EXECUTOR_MAX_SANDBOXES="48")
        try:
            with server.client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)) as client:
                environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                       "class_name": "Bench"}).json()["id"]
                create_ms = [create(client, environment_id)[1] for _ in range(20)]
                results["env_create_ms"] = pcts(create_ms)

                env_id, _ = create(client, environment_id)
                for _ in range(50):
                    step(client, env_id, "bump")
                one = [step(client, env_id, "bump") for _ in range(args.steps)]
                results["step_1_client_ms"] = pcts(one)

                env_ids = [create(client, environment_id)[0] for _ in range(32)]
                per_client = args.concurrent_steps // 32
                samples: list[float] = []
                lock = threading.Lock()

                def drive(eid: str) -> None:
                    local = [step(client, eid, "bump") for _ in range(per_client)]
                    with lock:
                        samples.extend(local)

                started = time.perf_counter()
                with ThreadPoolExecutor(32) as pool:
                    list(pool.map(drive, env_ids))
                wall = time.perf_counter() - started
                results["step_32_clients_ms"] = pcts(samples)
                results["steps_per_s_32_clients"] = round(len(samples) / wall, 1)

                records = {f"r{i:05d}": {"value": f"v{i}", "owner": f"user{i % 97}", "pad": "p" * 170}
                           for i in range(10000)}
                big_id, big_create = create(client, environment_id, records=records)
                size = len(json.dumps(records))
                before = blob_bytes(data_dir / "sandpit.db")
                big_steps = [step(client, big_id, "touch", key=f"r{(i * 37) % 10000:05d}", value=f"n{i}")
                             for i in range(50)]
                stored = (blob_bytes(data_dir / "sandpit.db") - before) / len(big_steps)
                results["large_state"] = {"state_bytes": size, "create_ms": round(big_create, 1),
                                          "stored_bytes_per_step": round(stored), "step_ms": pcts(big_steps)}

                fork_src, _ = create(client, environment_id)
                for _ in range(30):
                    step(client, fork_src, "bump")
                fork_ms, restore_ms = [], []
                for _ in range(10):
                    started = time.perf_counter()
                    response = client.post(f"/v1/envs/{fork_src}/fork", json={"step": 30, "count": 16})
                    fork_ms.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 201, response.text
                    for fork in response.json()["data"]:
                        client.delete(f"/v1/envs/{fork['id']}")
                for k in range(10):
                    target = 20 + k
                    started = time.perf_counter()
                    response = client.post(f"/v1/envs/{fork_src}/restore", json={"step": target})
                    restore_ms.append((time.perf_counter() - started) * 1000)
                    assert response.status_code == 200, response.text
                    for _ in range(30 - target):
                        step(client, fork_src, "bump")
                results["fork_30_steps_x16_ms"] = pcts(fork_ms)
                results["restore_ms"] = pcts(restore_ms)

                if args.density:
                    dense_ids = []
                    started = time.perf_counter()
                    for i in range(args.density):
                        dense_ids.append(create(client, environment_id, count=i)[0])
                    results_d = {"envs": args.density, "create_all_s": round(time.perf_counter() - started, 1)}
                    errors = 0
                    latencies: list[float] = []

                    def dense(eid: str) -> None:
                        nonlocal errors
                        for _ in range(5):
                            try:
                                value = step(client, eid, "bump")
                            except Exception:  # noqa: BLE001 - counted
                                with lock:
                                    errors += 1
                            else:
                                with lock:
                                    latencies.append(value)

                    with ThreadPoolExecutor(200) as pool:
                        list(pool.map(dense, dense_ids))
                    results_d.update({"stepping_concurrently": 200, "errors": errors, "step_ms": pcts(latencies),
                                      "server_rss_mib": round(server.rss_mib(), 1)})
                    results["density"] = results_d
                results["server_rss_mib"] = round(server.rss_mib(), 1)
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
