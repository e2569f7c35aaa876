"""The same scripted episodes through the scenario doors other stacks use: MCP (the ``mcp``
SDK's own client on ``/v1/scenarios/{id}/mcp``) and OpenEnv (``openenv-core``'s own
``GenericEnvClient`` on ``/v1/scenarios/{id}/openenv``). ``sandpit rl demo`` runs a few
scenarios through both and prints their rewards beside the gymnasium adapter's: every door
is a recorded step with the same episode rules, so the rewards must be equal.

Each function opens one fresh env of the scenario through its door (an MCP session, an
OpenEnv WebSocket session), carries out ``actions`` in order until the episode ends, and
returns an :class:`EpisodeRun`; the env is deleted when the session ends. Errors of the
door (a refused handshake, a JSON-RPC error, an OpenEnv error message) are recorded on
the run, not raised.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

MCP_STEP_META = "sandpit/step"
"""The key of a ``tools/call`` result's ``_meta`` that carries the step result (docs/mcp.md)."""


@dataclass
class EpisodeRun:
    """One scripted episode (through an adapter or a door): its reward, steps, whether it
    ended, each step's latency (milliseconds), steps by status, an error that stopped it
    (None when none did)."""

    scenario_id: str
    reward: float = 0.0
    steps: int = 0
    ended: bool = False
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def record(self, started: float, info: dict[str, Any]) -> None:
        self.latencies_ms.append((time.perf_counter() - started) * 1000.0)
        self.steps += 1
        status = str(info.get("status", "?"))
        self.statuses[status] = self.statuses.get(status, 0) + 1


def mcp_episode(url: str, api_key: str, scenario_id: str, actions: list[dict[str, Any]],
                timeout_s: float = 300.0) -> EpisodeRun:
    """``actions`` (``{"name", "arguments"}``) as MCP ``tools/call`` requests in one MCP
    session of ``/v1/scenarios/{scenario_id}/mcp`` (a fresh env; bearer ``api_key``); the
    reward is the ending call's ``_meta["sandpit/step"]["reward"]``. Needs the ``mcp``
    package (``sandpit[server]``). Never raises for the door's errors: they are the run's
    ``error``."""
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    run = EpisodeRun(scenario_id)

    async def episode() -> None:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with httpx.AsyncClient(headers=headers, timeout=timeout_s) as http:
            endpoint = f"{url.rstrip('/')}/v1/scenarios/{scenario_id}/mcp"
            async with (streamable_http_client(endpoint, http_client=http) as (read, write, _),
                        ClientSession(read, write) as session):
                await session.initialize()
                for action in actions:
                    started = time.perf_counter()
                    result = await session.call_tool(action["name"], action.get("arguments") or {})
                    step = (result.meta or {}).get(MCP_STEP_META, {})
                    run.record(started, step)
                    if step.get("terminated") or step.get("truncated"):
                        run.reward, run.ended = float(step["reward"]), True
                        return

    try:
        asyncio.run(episode())
    except Exception as exc:  # noqa: BLE001 - the door's failure is the run's result
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def openenv_episode(url: str, api_key: str, scenario_id: str, actions: list[dict[str, Any]]) -> EpisodeRun:
    """``actions`` as OpenEnv ``step`` messages through ``openenv-core``'s
    ``GenericEnvClient`` on ``/v1/scenarios/{scenario_id}/openenv`` (one WebSocket
    session: a fresh env; ``api_key`` as the URL's Basic credentials, docs/openenv.md);
    the reward is the ending ``StepResult.reward``. Needs ``openenv-core``
    (``sandpit[openenv]``). Never raises for the door's errors: they are the run's
    ``error``."""
    from openenv.core import GenericEnvClient

    run = EpisodeRun(scenario_id)
    parts = urlsplit(url)
    base_url = (f"{parts.scheme}://sandpit:{quote(api_key, safe='')}@{parts.netloc}{parts.path.rstrip('/')}"
                f"/v1/scenarios/{scenario_id}/openenv")
    try:
        with GenericEnvClient(base_url=base_url).sync() as env:
            env.reset()
            for action in actions:
                started = time.perf_counter()
                result = env.step(action)
                run.record(started, result.observation if isinstance(result.observation, dict) else {})
                if result.done:
                    run.reward, run.ended = float(result.reward or 0.0), True
                    break
    except Exception as exc:  # noqa: BLE001 - the door's failure is the run's result
        run.error = f"{type(exc).__name__}: {exc}"
    return run
