"""The gymnasium adapters (`sandpit.client.rl`) against an in-process double of the env and
episode routes (`tests/support/episode_double.py`): spaces, gymnasium's own checker and
wrappers, request shapes, hostile actions, the async twin and the vector env."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from episode_double import TOOLS, EpisodeDouble
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from gymnasium.wrappers import RecordEpisodeStatistics
from openai.types.chat import ChatCompletionMessageToolCall
from sandpit.client import Client, NotFound
from sandpit.client.rl import (
    GYMNASIUM_ID,
    AsyncRLEnv,
    RLEnv,
    SandpitVectorEnv,
    ToolCallSpace,
    UnicodeText,
    action_body,
)
from sandpit.client.spaces import MAX_ACTION_CHARS, NOT_A_TOOL_CALL

BUMP = {"name": "bump", "arguments": {"by": 1}}


@pytest.fixture
def double() -> EpisodeDouble:
    return EpisodeDouble()


@pytest.fixture
def client(double: EpisodeDouble) -> Iterator[Client]:
    with double.client() as c:
        yield c


# --------------------------------------------------------------------------- spaces


def test_text_spaces_admit_any_characters_and_sample_short_printable_text() -> None:
    space = UnicodeText(100)
    assert "" in space and "héllo ☃ <tool_call>{}</tool_call>\n" in space and "x" * 101 not in space
    assert b"bytes" not in space and 3 not in space
    space.seed(7)
    first = [space.sample() for _ in range(20)]
    space.seed(7)
    assert [space.sample() for _ in range(20)] == first
    assert all(len(s) <= 64 and s.isprintable() for s in first)
    assert len(space.sample(mask=(5, None))) == 5
    assert not space.is_np_flattenable

    actions = ToolCallSpace(100)
    assert BUMP in actions and "plain text" in actions and {"text": "hi"} in actions
    assert SimpleNamespace(function=SimpleNamespace(name="bump", arguments="{}")) in actions
    assert 42 not in actions and None not in actions and {"no": "name"} not in actions
    batched = batch_space(actions, 3)
    assert isinstance(batched, gym.spaces.Tuple) and ("a", BUMP, "c") in batched
    assert UnicodeText(5) == UnicodeText(5) and UnicodeText(5) != ToolCallSpace(5)


def test_action_body_never_raises() -> None:
    assert action_body(BUMP) == (BUMP, None)
    assert action_body("<tool_call>x</tool_call>") == ({"text": "<tool_call>x</tool_call>"}, None)
    for hostile in (42, None, ["bump"], {"no": "name"}, {"function": "bump"}, object()):
        body, why = action_body(hostile)
        assert body["name"] == NOT_A_TOOL_CALL and why is not None and "not a tool call" in why
    body, why = action_body({"name": "bump", "arguments": {"by": math.nan}})
    assert body["name"] == NOT_A_TOOL_CALL and "JSON" in str(why)
    body, why = action_body({"name": "bump", "arguments": {"by": object()}})
    assert body["name"] == NOT_A_TOOL_CALL and body["arguments"]["type"] == "dict"
    body, why = action_body("\ud800<tool_call>")  # a lone surrogate: no UTF-8 for it
    assert body["name"] == NOT_A_TOOL_CALL and "JSON" in str(why) and "\\ud800" in body["arguments"]["repr"]
    body, why = action_body("y" * (MAX_ACTION_CHARS + 1))  # the server's schema would answer 422
    assert body["name"] == NOT_A_TOOL_CALL and "size limit" in str(why) and len(body["arguments"]["repr"]) < 300
    assert action_body("y" * MAX_ACTION_CHARS)[1] is None


# --------------------------------------------------------------------------- RLEnv


def test_check_env_passes(client: Client, double: EpisodeDouble) -> None:
    env = RLEnv(client, ["scn_a", "scn_b"])
    check_env(env)  # warnings are errors in this suite: none may be raised either
    env.close()
    assert double.envs == {}


def test_reset_info_has_the_tools_every_episode(client: Client, double: EpisodeDouble) -> None:
    with RLEnv(client, "scn_a") as env:
        for episode in (1, 2, 3):
            observation, info = env.reset()
            assert observation == "Make the counter 2."
            assert info["episode"] == episode and info["scenario_id"] == "scn_a"
            assert [t["function"]["name"] for t in info["tools"]] == ["bump", "fail", "chat_with_user"]
            assert info["task"] == observation and info["introduction"].startswith("# Environment")
            assert info["env_id"] == env.handle.id and info["episode_config"]["max_steps"] == 30
            info["tools"].clear()  # the caller's copy: the next episode's info is fresh
    assert len(double.calls("POST", "/v1/envs")) == 1 and len(double.calls("POST", "/reset")) == 2


def test_scenario_choice_is_seeded_and_options_are_one_off(client: Client, double: EpisodeDouble) -> None:
    env = RLEnv(client, ["scn_a", "scn_b", "scn_c"])

    def run(seed: int) -> list[str]:
        return [env.reset(seed=seed)[1]["scenario_id"]] + [env.reset()[1]["scenario_id"] for _ in range(7)]

    first = run(3)
    assert run(3) == first and len(set(first)) > 1
    observation, info = env.reset(options={"scenario_id": "scn_c", "init_config": {"count": 5},
                                           "episode": {"max_steps": 2}})
    assert info["scenario_id"] == "scn_c" and info["episode_config"]["max_steps"] == 2
    assert double.calls("POST", "/reset")[-1] == {"init_config": {"count": 5}, "scenario_id": "scn_c",
                                                  "episode": {"max_steps": 2}}
    env.reset(options={"scenario_id": "scn_a"})  # back to the constructor's (server defaults)
    assert double.calls("POST", "/reset")[-1] == {"init_config": None, "scenario_id": "scn_a", "episode": {}}
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"scenario": "scn_a"})
    with pytest.raises(NotFound, match="scn_nope"):
        env.reset(options={"scenario_id": "scn_nope"})
    assert env.reset()[0]  # the env survived the refusal
    env.close()


def test_step_shapes_and_the_scored_end(client: Client, double: EpisodeDouble) -> None:
    env = RLEnv(client, "scn_a")
    env.reset()
    observation, reward, terminated, truncated, info = env.step(BUMP)
    assert (observation, reward, terminated, truncated) == ("1", 0.0, False, False)
    assert info == {"env_id": env.handle.id, "step": 1, "status": "ok", "observation_role": "tool",
                    "duration_ms": 1.25, "error": None, "checks": None, "action": BUMP,
                    "argument_findings": None, "traceback": None, "recovered": False, "failure": "none",
                    "mask": False, "episode_failure": "none", "episode_mask": False}
    sdk = ChatCompletionMessageToolCall(id="c1", type="function", function={"name": "bump", "arguments": '{"by": 1}'})
    assert env.step(sdk)[0] == "2"  # the openai SDK's own object
    assert env.step('<think>hm</think><tool_call>{"name": "bump", "arguments": {"by": 0}}</tool_call>')[0] == "2"
    observation, reward, terminated, truncated, info = env.step("Task Completed: the counter is 2.")
    assert (observation, reward, terminated, truncated) == ("Task finished", 1.0, True, False)
    assert [c["passed"] for c in info["checks"]] == [True, True] and info["observation_role"] == "user"
    assert double.calls("POST", "/step")[:4] == [
        BUMP, {"type": "function", "function": {"name": "bump", "arguments": '{"by": 1}'}},
        {"text": '<think>hm</think><tool_call>{"name": "bump", "arguments": {"by": 0}}</tool_call>'},
        {"text": "Task Completed: the counter is 2."}]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(BUMP)  # the episode ended: nothing is sent
    assert len(double.calls("POST", "/step")) == 4
    env.reset()
    env.step({"name": "bump", "arguments": {"by": 3}})
    observation, reward, terminated, _, info = env.step({"type": "function", "function": {
        "name": "chat_with_user", "arguments": '{"content": "done"}'}})
    assert (reward, terminated) == (0.5, True)  # count 3: one of the two checks passes
    env.close()


def test_hostile_actions_are_recorded_rejected_steps(double: EpisodeDouble) -> None:
    double.max_text_bytes = 100
    with double.client() as client, RLEnv(client, "scn_a") as env:
        env.reset()
        hostile: list[Any] = [42, None, {"no": "name"}, {"name": "bump", "arguments": {"by": object()}},
                              {"name": "bump", "arguments": [1]}, {"name": "nope"}, "<tool_call>{oops</tool_call>",
                              "x" * 1000, {"type": "function", "function": {"name": "bump", "arguments": "{by: 1"}}]
        for number, action in enumerate(hostile, start=1):
            observation, reward, terminated, truncated, info = env.step(action)
            assert info["status"] == "rejected" and info["step"] == number, (action, info)
            assert observation.startswith("Error: ") and info["error"]
            assert (reward, terminated, truncated) == (0.0, False, False)
        infos = [env.step(a)[4] for a in (42, "y" * 1000)]
        assert "not a tool call" in infos[0]["error"] and "size limit" in infos[1]["error"]
        assert env.step(BUMP)[0] == "1"  # the episode went on


def test_truncation_tool_errors_and_unscored_truncation(client: Client) -> None:
    env = RLEnv(client, "scn_c", episode={"max_steps": 2})
    env.reset()
    assert env.step({"name": "fail"})[1:4] == (0.0, False, False)
    observation, reward, terminated, truncated, info = env.step(BUMP)
    assert (reward, terminated, truncated) == (1.0, False, True)  # count 1 == target 1, scored
    env.reset(options={"episode": {"max_steps": 1, "score_truncated": False}})
    assert env.step(BUMP)[1:4] == (0.0, False, True)
    env.reset(options={"episode": {"on_tool_error": "terminate"}})
    assert env.step({"name": "fail"})[1:4] == (0.0, True, False)
    env.close()


def test_open_ended_env_and_constructor_checks(client: Client, double: EpisodeDouble) -> None:
    env = RLEnv(client, environment_id="environment_1", init_config={"count": 4})
    observation, info = env.reset()
    assert observation == "" and info["scenario_id"] is None and info["task"] is None
    assert double.calls("POST", "/v1/envs")[0] == {"environment_id": "environment_1", "init_config": {"count": 4}}
    assert env.step(BUMP)[:4] == ("5", 0.0, False, False)
    assert env.step("plain text")[4]["status"] == "rejected"  # no chat action without an episode
    env.reset(options={"init_config": {"count": 0}})
    env.reset()
    assert double.calls("POST", "/reset")[-1]["init_config"] == {"count": 4}
    with pytest.raises(ValueError, match="scenario ids"):
        env.reset(options={"scenario_id": "scn_a"})
    env.close()
    with pytest.raises(ValueError):
        RLEnv(client)
    with pytest.raises(ValueError):
        RLEnv(client, "scn_a", environment_id="environment_1")
    with pytest.raises(ValueError):
        RLEnv(client, ["scn_a", ""])
    with pytest.raises(ValueError):
        RLEnv(client, "scn_a", base_url="http://elsewhere")
    with pytest.raises(RuntimeError, match="reset"):
        RLEnv(client, "scn_a").step(BUMP)


def test_an_expired_env_is_replaced_on_reset(client: Client, double: EpisodeDouble) -> None:
    env = RLEnv(client, "scn_a")
    first = env.reset()[1]["env_id"]
    double.expire(first)
    observation, info = env.reset()
    assert info["env_id"] != first and info["episode"] == 1 and first not in double.envs
    assert observation == "Make the counter 2." and info["tools"]
    del double.envs[info["env_id"]]  # deleted behind its back
    assert env.reset()[1]["env_id"] not in (first, info["env_id"])
    env.close()


def test_close_deletes_and_is_idempotent(double: EpisodeDouble) -> None:
    client = double.client()
    env = RLEnv(client, "scn_a")
    env.close()  # nothing created yet
    env.reset()
    env.close()
    env.close()
    assert double.envs == {} and len(double.calls("DELETE")) == 1
    env.reset()  # the caller's client is still open: a new env
    assert len(double.envs) == 1
    env.close()
    client.close()


def test_gymnasium_make_and_wrappers(client: Client) -> None:
    env = gym.make(GYMNASIUM_ID, client=client, scenario_ids=["scn_a"], disable_env_checker=False)
    assert env.spec is not None and env.spec.nondeterministic
    env = RecordEpisodeStatistics(env)
    env.reset(seed=1)
    env.step(BUMP)
    env.step(BUMP)
    _, reward, terminated, _, info = env.step("done")
    assert reward == 1.0 and terminated and info["episode"]["r"] == 1.0 and info["episode"]["l"] == 3
    check_env(env.unwrapped)
    env.close()


# --------------------------------------------------------------------------- async


def test_async_twin(double: EpisodeDouble) -> None:
    async def run() -> None:
        async with double.async_client() as client, AsyncRLEnv(client, ["scn_a", "scn_b"]) as env:
            observation, info = await env.reset(seed=5)
            again = AsyncRLEnv(client, ["scn_a", "scn_b"])
            assert (await again.reset(seed=5))[1]["scenario_id"] == info["scenario_id"]
            await again.close()
            assert info["tools"] == [*TOOLS, info["tools"][-1]]
            assert (await env.step(BUMP))[0] == "1"
            assert (await env.step(42))[4]["status"] == "rejected"
            _, _, terminated, _, info = await env.step("done")
            assert terminated and len(info["checks"]) == 2
            with pytest.raises(RuntimeError):
                await env.step(BUMP)
            double.expire(env.handle.id)
            assert (await env.reset())[1]["episode"] == 1

    asyncio.run(run())
    assert double.envs == {}


# --------------------------------------------------------------------------- vector


def vector(double: EpisodeDouble, mode: AutoresetMode, n: int = 3, **kwargs: Any) -> SandpitVectorEnv:
    return SandpitVectorEnv(n, "scn_c", client=double.async_client(), autoreset_mode=mode, **kwargs)


def test_vector_next_step_autoreset(double: EpisodeDouble) -> None:
    envs = vector(double, AutoresetMode.NEXT_STEP)
    observations, infos = envs.reset(seed=0)
    assert observations == ("Make the counter 1.",) * 3 and list(infos["episode"]) == [1, 1, 1]
    assert observations in envs.observation_space
    _, rewards, terminated, truncated, infos = envs.step([BUMP, "done", 42])
    assert list(rewards) == [0.0, 0.0, 0.0] and list(terminated) == [False, True, False]
    assert list(infos["status"]) == ["ok", "ok", "rejected"] and infos["checks"][1] is not None
    observations, rewards, terminated, _, infos = envs.step(["done", "ignored", BUMP])
    assert list(rewards) == [1.0, 0.0, 0.0] and list(terminated) == [True, False, False]
    assert observations[1] == "Make the counter 1." and infos["_episode"][1] and infos["episode"][1] == 2
    envs.close()
    assert double.envs == {}


def test_vector_same_step_autoreset_and_seeds(double: EpisodeDouble) -> None:
    envs = SandpitVectorEnv(2, ["scn_a", "scn_b", "scn_c"], client=double.async_client(),
                            autoreset_mode=AutoresetMode.SAME_STEP)
    first = envs.reset(seed=11)[1]["scenario_id"]
    assert list(envs.reset(seed=11)[1]["scenario_id"]) == list(first)
    envs.reset(seed=[4, 4])
    observations, rewards, terminated, _, infos = envs.step(["done", BUMP])
    assert terminated[0] and infos["_final_obs"][0] and infos["final_obs"][0] == "Task finished"
    assert infos["final_info"]["checks"][0] is not None and infos["episode"][0] == 4  # reset at once
    assert observations[0].startswith("Make the counter")
    with pytest.raises(ValueError):
        envs.step([BUMP])
    envs.close()


def test_vector_disabled_autoreset_uses_reset_mask(double: EpisodeDouble) -> None:
    envs = vector(double, AutoresetMode.DISABLED, n=2)
    envs.reset()
    envs.step(["done", BUMP])
    with pytest.raises(RuntimeError, match="reset_mask"):
        envs.step([BUMP, BUMP])
    observations, infos = envs.reset(options={"reset_mask": np.array([True, False])})
    assert list(infos["_episode"]) == [True, False] and observations[1] == "1"
    assert list(envs.step([BUMP, BUMP])[0]) == ["1", "2"]
    envs.close()


def test_vector_failure_is_raised_after_the_others_finished(double: EpisodeDouble) -> None:
    envs = vector(double, AutoresetMode.NEXT_STEP, n=2)
    envs.reset()
    victim = envs.envs[1].handle
    assert victim is not None
    del double.envs[victim.id]
    with pytest.raises(NotFound):
        envs.step([BUMP, BUMP])
    assert envs.envs[0].handle is not None and double.envs[envs.envs[0].handle.id].count == 1
    envs.close()


def test_a_vector_step_is_one_batched_request_equal_to_each_envs_own_steps(double: EpisodeDouble) -> None:
    actions: list[list[Any]] = [[BUMP, "x" * 1000, 42, {"name": "fail"}],
                                [{"name": "bump", "arguments": {"by": 2}}, BUMP, "done", "<tool_call>{oops"],
                                ["done", BUMP, BUMP, BUMP]]
    double.max_text_bytes = 100  # "x" * 1000: the batch's 413 for that step, then its stand-in alone
    envs = vector(double, AutoresetMode.NEXT_STEP, n=4)
    envs.reset(seed=0)
    batched = [envs.step(row) for row in actions]
    assert len(double.calls("POST", "/v1/envs:step")) == 3  # one request per vector step...
    assert len(double.calls("POST", "/step")) == 1  # ...and the over-size action's stand-in alone
    envs.close()

    alone = EpisodeDouble(max_text_bytes=100)

    async def each_alone() -> list[list[tuple[Any, ...]]]:
        async with alone.async_client() as client:
            singles = [AsyncRLEnv(client, "scn_c") for _ in range(4)]
            for env in singles:
                await env.reset()
            rows = []
            for row in actions:
                rows.append([await env.step(action) if env._running else await env.reset()  # noqa: SLF001
                             for env, action in zip(singles, row, strict=True)])
            for env in singles:
                await env.close()
            return rows

    def comparable(info: dict[str, Any]) -> dict[str, Any]:  # gymnasium nests dict values: compare the rest
        return {k: v for k, v in info.items() if k != "env_id" and not isinstance(v, dict)}

    for (observations, rewards, terminated, truncated, infos), row in zip(batched, asyncio.run(each_alone()),
                                                                          strict=True):
        for i, single in enumerate(row):
            if len(single) == 2:  # an autoreset
                assert observations[i] == single[0] and infos["episode"][i] == single[1]["episode"]
                continue
            assert (observations[i], rewards[i], terminated[i], truncated[i]) == single[:4]
            assert comparable({k: infos[k][i] for k in comparable(single[4])}) == comparable(single[4])
            assert infos["action"]["name"][i] == single[4]["action"]["name"]
    assert not alone.calls("POST", "/v1/envs:step")


def test_a_vector_step_over_the_batch_limit_is_several_requests(double: EpisodeDouble) -> None:
    envs = vector(double, AutoresetMode.NEXT_STEP, n=300)
    envs.reset()
    observations, *_ = envs.step([BUMP] * 300)
    assert observations == ("1",) * 300
    assert sorted(len(body["steps"]) for body in double.calls("POST", "/v1/envs:step")) == [44, 256]
    envs.close()


def test_gymnasium_make_vec_uses_the_vector_entry_point(double: EpisodeDouble) -> None:
    envs = gym.make_vec(GYMNASIUM_ID, num_envs=2, vectorization_mode="vector_entry_point",
                        client=double.async_client(), scenario_ids=["scn_a"])
    assert isinstance(envs, SandpitVectorEnv) and envs.num_envs == 2
    assert envs.reset(seed=0)[0] == ("Make the counter 2.",) * 2
    envs.close()


def test_an_owned_client_is_closed_and_its_key_is_not_in_the_spec() -> None:
    env = RLEnv(None, "scn_a", base_url="http://127.0.0.1:9", api_key="sk-secret")
    assert "sk-secret" not in repr(env.spec) and env.spec is not None and env.spec.kwargs["client"] is env.client
    sibling = env.spec.make()
    sibling.close()  # shares the client: does not close it
    assert not env.client._http.is_closed
    env.close()
    assert env.client._http.is_closed
