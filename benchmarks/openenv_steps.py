"""OpenEnv benchmark: what a step through ``/v1/scenarios/{id}/openenv/ws`` adds to a plain step.

Starts its own ``sandpit serve`` (loopback, temporary SQLite file; ``benchmarks/api.py``'s
``Server``), registers ``Bench`` and a scenario of it, and steps ``bump`` in alternating
blocks of the same run, one request at a time, each block starting a fresh episode (the
reset is not timed; a block is shorter than the episode's ``max_steps``):

* ``plain``: ``POST /v1/envs/{id}/step`` over one keep-alive ``http.client`` connection, on
  an env of the scenario;
* ``openenv``: a ``step`` message on one WebSocket session (``websockets``' sync client:
  a lean load generator, so the difference is the server's);
* ``openenv_client`` (``--client-steps``, after the blocks): ``openenv-core``'s own
  ``GenericEnvClient(...).sync().step``, client overhead included.

Reports client-measured latency p50/p99 (ms) of each, the p50 added by the OpenEnv door
(target: at most 0.5 ms), and the server-measured sandbox round trip of the steps. Prints
JSON and saves it to ``benchmarks/results/openenv.json``.
Usage: ``python benchmarks/openenv_steps.py [--steps 1000] [--block 25] [--client-steps 300]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from openenv.core import GenericEnvClient
from websockets.sync.client import ClientConnection, connect

from api import SOURCE, Server, machine, pcts, save

ACTION = {"name": "bump", "arguments": {"by": 1}}


class Plain:
    """One keep-alive ``http.client`` connection stepping one env."""

    def __init__(self, server: Server, env_id: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        self.env_id = env_id
        self.headers = {**server.headers, "Content-Type": "application/json"}

    def _post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=self.headers)
        response = self.conn.getresponse()
        reply = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {reply}")
        return reply

    def reset(self) -> None:
        self._post(f"/v1/envs/{self.env_id}/reset", {})

    def step(self) -> tuple[float, float]:
        """One step: (latency ms, the server's sandbox round trip ms)."""
        started = time.perf_counter()
        reply = self._post(f"/v1/envs/{self.env_id}/step", ACTION)
        elapsed = (time.perf_counter() - started) * 1000
        if reply["status"] != "ok":
            raise RuntimeError(reply)
        return elapsed, reply["duration_ms"]


class Session:
    """One OpenEnv WebSocket session (its own env of the scenario) on an open connection."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket

    def _send(self, message: dict) -> dict:
        self.socket.send(json.dumps(message))
        reply = json.loads(self.socket.recv(timeout=120))
        if reply["type"] == "error":
            raise RuntimeError(reply)
        return reply

    def reset(self) -> None:
        self._send({"type": "reset"})

    def step(self) -> tuple[float, float]:
        """One step message: (latency ms, the server's sandbox round trip ms)."""
        started = time.perf_counter()
        reply = self._send({"type": "step", "data": ACTION})
        elapsed = (time.perf_counter() - started) * 1000
        if reply["data"]["observation"]["status"] != "ok":
            raise RuntimeError(reply)
        return elapsed, reply["data"]["observation"]["duration_ms"]


def client_steps(base_url: str, count: int, block: int) -> list[float]:
    """``count`` steps through OpenEnv's own sync client: latency of each, ms."""
    samples: list[float] = []
    with GenericEnvClient(base_url=base_url, message_timeout_s=120).sync() as env:
        while len(samples) < count:
            env.reset()
            for _ in range(min(block, count - len(samples))):
                started = time.perf_counter()
                result = env.step(ACTION)
                samples.append((time.perf_counter() - started) * 1000)
                if result.observation["status"] != "ok":
                    raise RuntimeError(result)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of each kind (plain, openenv)")
    parser.add_argument("--block", type=int, default=25, help="steps per alternating block (< max_steps, 30)")
    parser.add_argument("--client-steps", type=int, default=300, help="steps through OpenEnv's client (0: skip)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "openenv.json")
    args = parser.parse_args()
    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="2")
        try:
            with server.client() as client:
                environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                       "class_name": "Bench"}).json()["id"]
                scenario_id = client.post("/v1/scenarios", json={
                    "environment_id": environment_id, "task": "Count.", "checklist_with_func": [
                        {"check_item": "any", "check_func": "def check_func(final_state):\n    return True\n"}],
                }).json()["id"]
                env_id = client.post("/v1/envs", json={"scenario_id": scenario_id}).json()["id"]
            base_url = (f"http://bench:{quote(server.api_key, safe='')}@127.0.0.1:{server.port}"
                        f"/v1/scenarios/{scenario_id}/openenv")
            latency: dict[str, list[float]] = {"plain": [], "openenv": []}
            rtt: dict[str, list[float]] = {"plain": [], "openenv": []}
            with connect(base_url.replace("http://", "ws://") + "/ws", open_timeout=60, max_size=None) as socket:
                callers: dict[str, Plain | Session] = {"plain": Plain(server, env_id), "openenv": Session(socket)}
                for caller in callers.values():  # warm-up: connection, caches, the env's sandbox
                    caller.reset()
                    for _ in range(20):
                        caller.step()
                for _ in range(max(1, args.steps // args.block)):
                    for kind, caller in callers.items():
                        caller.reset()
                        for _ in range(args.block):
                            elapsed, duration = caller.step()
                            latency[kind].append(elapsed)
                            rtt[kind].append(duration)
            results["latency_ms"] = {kind: pcts(samples) for kind, samples in latency.items()}
            results["sandbox_rtt_ms"] = {kind: pcts(samples) for kind, samples in rtt.items()}
            if args.client_steps:
                results["latency_ms"]["openenv_client"] = pcts(client_steps(base_url, args.client_steps, args.block))
            plain_ms, door_ms = results["latency_ms"]["plain"], results["latency_ms"]["openenv"]
            results["openenv_added_ms"] = {"p50": round(door_ms["p50"] - plain_ms["p50"], 3),
                                           "p99": round(door_ms["p99"] - plain_ms["p99"], 3), "target_p50": 0.5}
        finally:
            server.stop()
    save(results, args.output)


if __name__ == "__main__":
    main()
