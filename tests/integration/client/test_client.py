"""The Python client (sync, async, the gymnasium adapter) against the real server."""

from __future__ import annotations

import asyncio

import pytest
from sandpit.client import AsyncClient, Client, NotFound
from sandpit.client.rl import RLEnv

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


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


def test_step_takes_openai_tool_calls_sdk_objects_and_text(server, counter_env_id: str) -> None:
    """`EnvHandle.step` given an OpenAI tool-call dict, an openai SDK object or `text=` runs
    that tool call; shapes that are no action are refused before sending, so they count
    toward no `max_steps`; arguments that are not JSON are the model's mistake: a rejected
    step the episode goes on from."""
    from openai.types.chat import ChatCompletionMessageToolCall

    with Client(server.url, api_key=server.api_key) as client:
        env = client.envs.create(counter_env_id, init_config={"count": 0}, episode={"max_steps": 5})
        call = {"id": "call_1", "type": "function", "function": {"name": "bump", "arguments": '{"by": 2}'}}
        first = env.step(call)
        assert (first.status, first.observation, first.step) == ("ok", "2", 1)
        assert first.action == {"name": "bump", "arguments": {"by": 2}}
        sdk = ChatCompletionMessageToolCall(id="call_2", type="function",
                                            function={"name": "bump", "arguments": '{"by": 3}'})
        assert env.step(sdk).observation == "5"
        raw = env.step(text='<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>')
        assert (raw.status, raw.observation, raw.step) == ("ok", "6", 3)

        hostile: list[tuple[object, dict[str, object]]] = [
            ({"id": "call_3", "type": "function"}, {}),  # neither name nor function
            ({"id": "call_3", "arguments": '{"by": 1}'}, {}),
            (call, {"text": "and some text"}),  # both a call and text=
            (sdk, {"by": 1}),
            (None, {"text": "raw", "by": 1}),
            (None, {"text": None}),
            (None, {}),
            (["bump"], {}),
        ]
        for action, keywords in hostile:
            with pytest.raises(TypeError):
                env.step(action, **keywords)
        assert len(env.trajectory().steps) == 3 and env.state()["count"] == 6

        not_json = env.step({"id": "call_4", "type": "function", "function": {"name": "bump", "arguments": "{by: 2"}})
        assert (not_json.status, not_json.step, not_json.truncated) == ("rejected", 4, False)
        assert env.step("bump", by=1).observation == "7"  # the episode goes on from it
        env.delete()

    async def run() -> tuple[str, str]:
        async with AsyncClient(server.url, api_key=server.api_key) as client:
            handle = await client.envs.create(counter_env_id, init_config={"count": 0})
            with pytest.raises(TypeError):
                await handle.step({"function": {"name": "bump", "arguments": "{}"}}, text="both")
            by_dict = await handle.step(call)
            by_text = await handle.step(text='<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>')
            await handle.delete()
            return by_dict.observation, by_text.observation

    assert asyncio.run(run()) == ("2", "3")
