"""The demo's BFCL replay through two API replicas on the Ray backend, side by side with the
local backend (issue 15: "the same results as on the local backend").

Two setups, started by this script on this machine (loopback only):
  local  one ``sandpit serve`` on the local executor and a SQLite file (what the demo runs)
  ray    a local Ray cluster (a head without Docker plus two nodes offering
         ``sandpit_docker``), a fresh PostgreSQL database (``scripts/ensure-postgres``) and two
         ``sandpit serve`` replicas on the Ray backend; the client sends its requests to the
         replicas in turn, per request (``sandpit.client.replicas``), so consecutive steps of
         one env go through different replicas.

Each setup registers the BFCL v4 multi-turn environments from the cached bfcl-eval wheel and
replays the ground truth of the first ``--limit`` episodes (all by default) in fresh envs,
keeping every step's status and observation and each episode's final state. Then every
episode is compared between the setups: API errors, per-step statuses and observations, and
the final state must be equal. It prints the comparison and both runs' step latency (p50/p99,
milliseconds) and throughput (steps/s), how many requests each replica answered and how many
sessions each Ray host held at most, and saves it all as JSON. Exit 1 when an episode differs
or failed.

Usage: python benchmarks/scale_bfcl.py [--limit N] [--concurrency 4] [--out benchmarks/results/scale_bfcl.json]
Needs root (PostgreSQL and Docker), the ``ray`` and ``postgres`` extras and the BFCL wheel
(``SANDPIT_EXTRAS=dev,ray scripts/setup``). All 200 episodes take about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray takes 127.0.0.1 as every node's address

import httpx  # noqa: E402
from sandpit.api.settings import new_operator_key  # noqa: E402
from sandpit.client import Client  # noqa: E402
from sandpit.importers.bfcl import BfclSuite, fetch_wheel, load_suite  # noqa: E402
from sandpit.importers.bfcl.replay import EpisodeReplay, register_environments, replay_suite  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TENANT = "bfcl-scale"
QUOTAS = {"max_running_calls": 8}
"""The only tenant of its servers: may use more than the default execution slots."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Serve:
    """One ``sandpit serve`` subprocess on 127.0.0.1 with its own data directory and log."""

    def __init__(self, name: str, data_dir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log = data_dir / "server.log"
        self.env = {**os.environ, "SANDPIT_DATA_DIR": str(data_dir), **env}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180.0) -> Serve:
        """Start and wait for ``/healthz``. Raises RuntimeError with the log's tail."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([sys.executable, "-c", "from sandpit.cli import app; app()", "serve", "--port", str(self.port)],
                                            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready in {timeout_s} s: {self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """SIGTERM (the lifespan closes every sandbox), SIGKILL after 60 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, migrated database on the test PostgreSQL server; dropped afterwards."""
    from sandpit.api.db.engine import upgrade
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    started = subprocess.run([str(REPO / "scripts" / "ensure-postgres")], capture_output=True, text=True,
                             check=True, timeout=120)
    admin_url = started.stdout.strip().splitlines()[-1]
    name = f"sandpit_bfcl_{secrets.token_hex(4)}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def ray_cluster() -> Iterator[str]:
    """A head (no Docker resource) and two nodes with ``sandpit_docker: 1``, all on
    127.0.0.1; yields the address. On exit the host actors close their pools, then the
    cluster stops."""
    import ray
    from ray.cluster_utils import Cluster
    from sandpit.executor.ray import RayExecutor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                            "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        try:
            executor = RayExecutor(cluster.address).start()
            executor.shutdown_hosts()
            executor.close()
        except Exception as exc:  # noqa: BLE001 - teardown: report and go on stopping
            print(f"stopping the host actors: {exc}", file=sys.stderr)
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


class HostWatch:
    """Polls ``GET /v1/admin/cluster`` every 0.5 s during a run and keeps, per host, the most
    sessions it held at once (the envs are deleted after their episode, so a final look
    would show none)."""

    def __init__(self, url: str, operator_key: str) -> None:
        self.peak: dict[str, int] = {}
        self.missed = 0
        """Polls that failed (each only risks lowering a peak)."""
        self._stop = threading.Event()
        self._client = Client(url, operator_key=operator_key, timeout=30, max_retry_wait_s=0)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                status = self._client.admin.cluster.status()
            except Exception:  # noqa: BLE001 - a missed poll only lowers a peak; counted
                self.missed += 1
                status = None
            for host in status.hosts if status is not None else []:
                self.peak[host.host] = max(self.peak.get(host.host, 0), host.sessions)

    def __enter__(self) -> HostWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._client.close()


def replay(name: str, urls: list[str], operator_key: str, suite: BfclSuite, limit: int | None,
           concurrency: int) -> tuple[dict[str, Any], dict[str, EpisodeReplay]]:
    """Register BFCL's environments and replay through ``urls`` (several: round robin)."""
    with Client(urls[0], operator_key=operator_key, timeout=60) as admin:
        api_key = admin.admin.tenants.create(TENANT, quotas=QUOTAS).api_key
    assert api_key is not None and api_key.key
    with Client(",".join(urls), api_key=api_key.key, timeout=180) as client, \
            HostWatch(urls[0], operator_key) as watch:
        ids = register_environments(client, suite)
        summary, results = replay_suite(client, suite, ids, concurrency=concurrency, limit=limit, want_state=True)
        answers = client.replica_answers
    report = {"setup": name, "episodes": summary.episodes, "steps": summary.steps, "statuses": summary.statuses,
              "failed_episodes": summary.failed_episodes, "step_p50_ms": round(summary.step_p50_ms, 2),
              "step_p99_ms": round(summary.step_p99_ms, 2), "steps_per_s": round(summary.steps_per_s, 1),
              "wall_s": round(summary.wall_s, 1), "requests_per_replica": answers,
              "peak_sessions_per_host": watch.peak}
    print(f"{name}: {summary.episodes} episodes, {summary.steps} steps, {len(summary.failed_episodes)} failed, "
          f"step p50 {summary.step_p50_ms:.1f} ms / p99 {summary.step_p99_ms:.1f} ms, "
          f"{summary.steps_per_s:.0f} steps/s; requests per replica {answers}; peak sessions per host {watch.peak}",
          flush=True)
    return report, {r.episode_id: r for r in results}


def mask_clock(value: Any, window: tuple[datetime, datetime], masked: list[int]) -> Any:
    """``value`` with every rendered datetime (``{"$datetime": iso}``) that falls inside
    ``window`` (the run's wall-clock span, naive, as ``datetime.now()`` in the sandbox gives
    it) replaced by ``"<clock during the run>"``: BFCL's file system stamps files with the time
    of the call, which no two runs share. ``masked[0]`` counts the replacements."""
    if isinstance(value, dict):
        if set(value) == {"$datetime"} and isinstance(value["$datetime"], str):
            try:
                moment = datetime.fromisoformat(value["$datetime"])
            except ValueError:
                return value
            if moment.tzinfo is None and window[0] <= moment <= window[1]:
                masked[0] += 1
                return "<clock during the run>"
            return value
        return {key: mask_clock(item, window, masked) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_clock(item, window, masked) for item in value]
    return value


def first_difference(a: Any, b: Any, path: str = "state") -> tuple[str, Any, Any]:
    """The first place where two JSON values differ: ``(path, a's value, b's value)``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key, ...) != b.get(key, ...):
                return first_difference(a.get(key), b.get(key), f"{path}[{key!r}]")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{path}[{index}]")
    return path, a, b


def compare(local: dict[str, EpisodeReplay], ray: dict[str, EpisodeReplay],
            windows: dict[str, tuple[datetime, datetime]]) -> dict[str, Any]:
    """Per episode: equal errors, statuses and observations step by step, final states
    (timestamps the env took from the clock during each run masked: :func:`mask_clock`)."""
    differences: list[dict[str, Any]] = []
    masked = [0]
    for episode_id in sorted(set(local) | set(ray)):
        a, b = local.get(episode_id), ray.get(episode_id)
        if a is None or b is None:
            differences.append({"episode": episode_id, "what": "missing in " + ("local" if a is None else "ray")})
            continue
        if a.error or b.error:
            differences.append({"episode": episode_id, "what": "failed", "local": a.error, "ray": b.error})
            continue
        if a.observations != b.observations:
            step = next((i for i, (x, y) in enumerate(zip(a.observations, b.observations, strict=False)) if x != y),
                        min(len(a.observations), len(b.observations)))
            differences.append({"episode": episode_id, "what": f"observation of step {step + 1}",
                                "local": a.observations[step:step + 1], "ray": b.observations[step:step + 1]})
        elif dict(a.statuses) != dict(b.statuses):
            differences.append({"episode": episode_id, "what": "statuses", "local": dict(a.statuses),
                                "ray": dict(b.statuses)})
        elif (mask_clock(a.final_state, windows["local"], masked)
              != mask_clock(b.final_state, windows["ray"], masked)):
            path, x, y = first_difference(mask_clock(a.final_state, windows["local"], [0]),
                                          mask_clock(b.final_state, windows["ray"], [0]))
            differences.append({"episode": episode_id, "what": f"final state at {path}",
                                "local": repr(x)[:200], "ray": repr(y)[:200]})
    return {"episodes": len(set(local) | set(ray)), "equal": len(set(local) | set(ray)) - len(differences),
            "differences": differences, "clock_values_masked": masked[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N episodes (default all)")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes replayed at once")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scale_bfcl.json"))
    args = parser.parse_args()
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    suite = load_suite(fetch_wheel())
    operator_key = new_operator_key()
    common = {"SANDPIT_OPERATOR_KEY": operator_key, "SANDPIT_AUTH_CACHE_TTL_S": "0"}
    results: dict[str, Any] = {"bfcl_version": suite.version, "machine": {"cpus": os.cpu_count()},
                               "note": "one machine: both Ray nodes share its cores and Docker Engine"}
    with tempfile.TemporaryDirectory(prefix="sandpit-scale-bfcl-") as scratch:
        local_server = Serve("local", Path(scratch) / "local", {**common, "SANDPIT_EXECUTOR_POOL_SIZE": "1"})
        try:
            subprocess.run([sys.executable, "-c", "from sandpit.cli import app; app()", "db", "upgrade"], env=local_server.env, check=True,
                           capture_output=True, timeout=120)
            local_server.start()
            began = datetime.now() - timedelta(seconds=1)
            results["local"], local = replay("local", [local_server.url], operator_key, suite, args.limit,
                                             args.concurrency)
            windows = {"local": (began, datetime.now() + timedelta(seconds=1))}
        finally:
            local_server.stop()
        with postgres_database() as database_url, ray_cluster() as address:
            env = {**common, "SANDPIT_DATABASE_URL": database_url, "SANDPIT_EXECUTOR_BACKEND": "ray",
                   "SANDPIT_RAY_ADDRESS": address, "SANDPIT_EXECUTOR_POOL_SIZE": "0", "SANDPIT_WARM_ON_START": "0",
                   "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
            replicas = [Serve(f"replica{i}", Path(scratch) / f"replica{i}", env) for i in range(2)]
            try:
                for server in replicas:
                    server.start()
                began = datetime.now() - timedelta(seconds=1)
                results["ray"], ray = replay("ray, 2 replicas", [s.url for s in replicas], operator_key, suite,
                                             args.limit, args.concurrency)
                windows["ray"] = (began, datetime.now() + timedelta(seconds=1))
            finally:
                for server in replicas:
                    server.stop()
    results["comparison"] = compare(local, ray, windows)
    comparison = results["comparison"]
    print(f"comparison: {comparison['equal']} of {comparison['episodes']} episodes equal "
          "(errors, every step's status and observation, final state; "
          f"{comparison['clock_values_masked']} file timestamps taken during the runs masked)")
    for difference in comparison["differences"][:10]:
        print(f"  differs: {difference}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {out}")
    return 0 if not comparison["differences"] else 1


if __name__ == "__main__":
    sys.exit(main())
