"""The Python client (sync, async, the gymnasium adapter) against the real server."""

from __future__ import annotations

import asyncio

import pytest
from sandpit.client import AsyncClient, Client, NotFound
from sandpit.client.rl import RLEnv

pytestmark = pytest.mark.docker


def test_sync_client_and_rl_adapter(server, counter_env_id: str) -> None:
    with Client(server.url, api_key=server.api_key) as client:
        env = client.envs.create(counter_env_id, init_config={"count": 1})
        assert env.step("bump", by=2).observation == "3"
        forks = env.fork(count=2)
        assert [f.state()["count"] for f in forks] == [3, 3]
        action = env.trajectory().steps[0].action
        assert action is not None and (action.name, action.arguments) == ("bump", {"by": 2})
        env.restore(0)
        assert env.state()["count"] == 1
        for handle in (env, *forks):
            handle.delete()
        with pytest.raises(NotFound):
            client.envs.get(env.id)

        observations = []
        rl = RLEnv(client, environment_id=counter_env_id, init_config={"count": 0}, episode={"max_steps": 3})
        observation, info = rl.reset()
        assert info["env_id"] and observation == ""  # open-ended: no task, no reward
        for _ in range(3):
            observation, reward, terminated, truncated, info = rl.step({"name": "bump", "arguments": {"by": 1}})
            observations.append((observation, reward))
        assert observations == [("1", 0.0), ("2", 0.0), ("3", 0.0)] and truncated and not terminated
        rl.close()


def test_async_client(server, counter_env_id: str) -> None:
    async def run() -> list[str]:
        async with AsyncClient(server.url, api_key=server.api_key) as client:
            handles = await asyncio.gather(*(client.envs.create(counter_env_id) for _ in range(4)))
            results = await asyncio.gather(*(h.step("bump", by=i) for i, h in enumerate(handles)))
            for handle in handles:
                await handle.delete()
            return [r.observation for r in results]

    assert asyncio.run(run()) == ["0", "1", "2", "3"]
