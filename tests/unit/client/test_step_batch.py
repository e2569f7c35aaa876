"""`StepBatch` (`sandpit.client.step_batch`) over the in-process episode double and over
hostile replies: the steps of one event-loop turn go out as one request and each caller
gets its own step's result or refusal; a request that fails as a whole, or a reply with
the wrong number of outcomes, fails every caller of that request and hangs none; an env
twice in a turn is refused before sending."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from episode_double import EpisodeDouble
from sandpit.client import AsyncClient, InvalidRequest, NotFound, SandpitError
from sandpit.client.step_batch import StepBatch

BUMP = {"name": "bump", "arguments": {"by": 1}}


def test_one_request_per_turn_and_each_caller_gets_its_own_outcome() -> None:
    double = EpisodeDouble()

    async def run() -> None:
        async with double.async_client() as client:
            handles = [await client.envs.create(scenario_id="scn_a") for _ in range(3)]
            batch = StepBatch(client)
            del double.envs[handles[1].id]
            results = await asyncio.gather(*(batch.step(h, BUMP) for h in handles), return_exceptions=True)
            assert [getattr(r, "observation", None) for r in results] == ["1", None, "1"]
            assert isinstance(results[1], NotFound) and batch.requests == 1
            second = await asyncio.gather(batch.step(handles[0], BUMP), batch.step(handles[2], BUMP))
            assert [r.observation for r in second] == ["2", "2"] and batch.requests == 2
            with pytest.raises(ValueError, match="twice"):
                await asyncio.gather(batch.step(handles[0], BUMP), batch.step(handles[0], BUMP))

    asyncio.run(run())
    assert [len(body["steps"]) for body in double.calls("POST", "/v1/envs:step")] == [3, 2, 1]


@pytest.mark.parametrize(("reply", "error"), [
    (httpx.Response(422, json={"error": {"code": "invalid_request", "message": "no", "field": "steps"}}),
     InvalidRequest),
    (httpx.Response(200, json={"results": []}), SandpitError),  # fewer outcomes than steps
])
def test_a_failed_request_fails_every_caller(reply: httpx.Response, error: type[Exception]) -> None:
    double = EpisodeDouble()

    def handle(request: httpx.Request) -> httpx.Response:
        return reply if request.url.path == "/v1/envs:step" else double.handle(request)

    async def run() -> list[Any]:
        async with AsyncClient("http://x", api_key="k", transport=httpx.MockTransport(handle),
                               max_retry_wait_s=0) as client:
            handles = [await client.envs.create(scenario_id="scn_a") for _ in range(2)]
            batch = StepBatch(client)
            return await asyncio.wait_for(asyncio.gather(*(batch.step(h, BUMP) for h in handles),
                                                         return_exceptions=True), 10)

    results = asyncio.run(run())
    assert all(isinstance(r, error) for r in results), results
