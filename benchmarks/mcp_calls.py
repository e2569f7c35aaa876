"""MCP benchmark (named so as not to shadow the ``mcp`` package it imports): what ``tools/call`` on ``/v1/envs/{id}/mcp`` adds to a plain step.

Starts its own ``sandpit serve`` (loopback, temporary SQLite file; ``benchmarks/api.py``'s
``Server``), registers ``Bench``, opens one env and steps it ``bump`` in alternating
blocks of the same run, one request at a time over one keep-alive connection each:

* ``plain``: ``POST /v1/envs/{id}/step`` (``{"name", "arguments"}``);
* ``mcp``: ``POST /v1/envs/{id}/mcp`` with a JSON-RPC ``tools/call`` (the same action;
  the same lean ``http.client`` load generator, so the difference is the server's);
* ``mcp_sdk`` (``--sdk-steps``, after the blocks): the ``mcp`` SDK's own client
  (``streamable_http_client`` + ``ClientSession.call_tool``), client overhead included.

Reports client-measured latency p50/p99 (ms) of each, the p50 added by MCP (target: at
most 0.5 ms), and the server-measured sandbox round trip of the steps. Prints JSON and
saves it to ``benchmarks/results/mcp.json``.
Usage: ``python benchmarks/mcp_calls.py [--steps 1000] [--block 50] [--sdk-steps 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import tempfile
import time
from pathlib import Path

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from api import SOURCE, Server, machine, pcts, save

ACCEPT = "application/json, text/event-stream"


class Caller:
    """One keep-alive ``http.client`` connection: a step or a ``tools/call`` per request."""

    def __init__(self, server: Server, env_id: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        self.env_id = env_id
        self.headers = {**server.headers, "Content-Type": "application/json", "Accept": ACCEPT}
        self.ident = 0

    def _post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers=self.headers)
        response = self.conn.getresponse()
        reply = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {reply}")
        return reply

    def plain(self) -> tuple[float, float]:
        """One step: (latency ms, the server's sandbox round trip ms)."""
        started = time.perf_counter()
        reply = self._post(f"/v1/envs/{self.env_id}/step", {"name": "bump", "arguments": {"by": 1}})
        elapsed = (time.perf_counter() - started) * 1000
        if reply["status"] != "ok":
            raise RuntimeError(reply)
        return elapsed, reply["duration_ms"]

    def mcp(self) -> tuple[float, float]:
        """One ``tools/call``: (latency ms, the server's sandbox round trip ms)."""
        self.ident += 1
        started = time.perf_counter()
        reply = self._post(f"/v1/envs/{self.env_id}/mcp", {
            "jsonrpc": "2.0", "id": self.ident, "method": "tools/call",
            "params": {"name": "bump", "arguments": {"by": 1}}})
        elapsed = (time.perf_counter() - started) * 1000
        result = reply.get("result")
        if result is None or result["isError"]:
            raise RuntimeError(reply)
        return elapsed, result["_meta"]["sandpit/step"]["duration_ms"]


async def sdk_calls(server: Server, env_id: str, count: int) -> list[float]:
    """``count`` ``call_tool``s through the SDK's client: latency of each, ms."""
    samples: list[float] = []
    async with httpx.AsyncClient(headers=server.headers, timeout=120) as http:
        async with streamable_http_client(f"{server.url}/v1/envs/{env_id}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(count):
                    started = time.perf_counter()
                    result = await session.call_tool("bump", {"by": 1})
                    samples.append((time.perf_counter() - started) * 1000)
                    if result.isError:
                        raise RuntimeError(result)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of each kind (plain, mcp)")
    parser.add_argument("--block", type=int, default=50, help="steps per alternating block")
    parser.add_argument("--sdk-steps", type=int, default=300, help="SDK client tools/calls (0: skip)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "mcp.json")
    args = parser.parse_args()
    results: dict = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="sandpit-bench-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_POOL_SIZE="1")
        try:
            with server.client() as client:
                environment_id = client.post("/v1/environments", json={"source_code": SOURCE,
                                                                       "class_name": "Bench"}).json()["id"]
                env_id = client.post("/v1/envs", json={"environment_id": environment_id,
                                                        "episode": {"max_steps": None}}).json()["id"]
            caller = Caller(server, env_id)
            for _ in range(20):  # warm-up: connection, caches, the env's sandbox
                caller.plain()
                caller.mcp()
            latency: dict[str, list[float]] = {"plain": [], "mcp": []}
            rtt: dict[str, list[float]] = {"plain": [], "mcp": []}
            for _ in range(max(1, args.steps // args.block)):
                for kind in ("plain", "mcp"):
                    run = caller.plain if kind == "plain" else caller.mcp
                    for _ in range(args.block):
                        elapsed, duration = run()
                        latency[kind].append(elapsed)
                        rtt[kind].append(duration)
            results["latency_ms"] = {kind: pcts(samples) for kind, samples in latency.items()}
            results["sandbox_rtt_ms"] = {kind: pcts(samples) for kind, samples in rtt.items()}
            if args.sdk_steps:
                results["latency_ms"]["mcp_sdk"] = pcts(asyncio.run(sdk_calls(server, env_id, args.sdk_steps)))
            plain, mcp = results["latency_ms"]["plain"], results["latency_ms"]["mcp"]
            results["mcp_added_ms"] = {"p50": round(mcp["p50"] - plain["p50"], 3),
                                       "p99": round(mcp["p99"] - plain["p99"], 3), "target_p50": 0.5}
        finally:
            server.stop()
    save(results, args.output)


if __name__ == "__main__":
    main()
