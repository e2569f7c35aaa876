"""The RL adapters (`sandpit.client.rl`, `sandpit.client.gem_env`) against a real `sandpit serve`
(real SQLite, real sandboxes): gymnasium's env checker, scenario-bound rewards, truncation,
a conversational episode whose simulated user is the scripted OpenAI-compatible server
(`fake_openai`, loopback), the vector env's autoreset and throughput, the GEM envs through
the real `gem` package, and hostile actions.

Scenarios run on the `Counter` environment with two checks (`count == 5`, record `a`
stored), so rewards are known in advance: both -> 1.0, one -> 0.5, none -> 0.0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest
from fake_openai import Rule, ScriptedLLM
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode
from sandpit.client import Client, NotFound
from sandpit.client.rl import GYMNASIUM_ID, RLEnv, SandpitVectorEnv

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

CHECKS = [
    {"check_item": "count is 5", "check_func": "def check_func(final_state):\n    return final_state['count'] == 5\n"},
    {"check_item": "record a stored",
     "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"},
]
BUMP5 = {"name": "bump", "arguments": {"by": 5}}
STORE_A = '<think>store it</think>\n<tool_call>\n{"name": "set_record", "arguments": {"key": "a", "value": "x"}}\n</tool_call>'
TOOL_NAMES = {"bump", "set_record", "get_record", "fail", "spin", "weird", "chat_with_user"}


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[Client]:
    with Client(server.url, api_key=server.api_key, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def scenarios(client: Client, counter_env_id: str) -> list[str]:
    return [client.scenarios.create({"environment_id": counter_env_id, "task": f"TASK-{n}: make the counter 5 "
                                     "and store record a", "init_config": {"count": 0},
                                     "checklist_with_func": CHECKS}).id for n in range(2)]


def test_gymnasium_check_env_passes(client: Client, scenarios: list[str]) -> None:
    env = RLEnv(client, scenarios)
    check_env(env)  # warnings are errors in this suite
    env.close()
    made = gym.make(GYMNASIUM_ID, client=client, scenario_ids=scenarios)
    check_env(made.unwrapped)
    made.close()


def test_tools_every_episode_and_the_reward_is_the_mean_of_the_checks(client: Client, scenarios: list[str]) -> None:
    with RLEnv(client, scenarios) as env:
        rewards = []
        for episode, actions in enumerate(([BUMP5, "Task Completed."], [BUMP5, STORE_A, "Task Completed."],
                                           ["Task Completed."]), start=1):
            observation, info = env.reset(seed=episode)
            assert observation.startswith("TASK-") and observation == info["task"]
            assert {t["function"]["name"] for t in info["tools"]} == TOOL_NAMES, info["tools"]
            assert info["episode"] == episode and info["scenario_id"] in scenarios
            for action in actions:
                observation, reward, terminated, truncated, step_info = env.step(action)
            assert (observation, terminated, truncated) == ("Task finished", True, False)
            checks = step_info["checks"]
            assert len(checks) == 2 and reward == round(sum(c["passed"] for c in checks) / 2, 4)
            rewards.append(reward)
        assert rewards == [0.5, 1.0, 0.0]
        trajectory = env.handle.trajectory(episode=2)
        assert trajectory.status == "terminated" and trajectory.reward == 1.0
        assert [s.action.name for s in trajectory.steps if s.action] == ["bump", "set_record", "chat_with_user"]


def test_truncation_at_max_steps(client: Client, scenarios: list[str]) -> None:
    with RLEnv(client, scenarios[0], episode={"max_steps": 2}) as env:
        env.reset()
        assert env.step(BUMP5)[2:4] == (False, False)
        observation, reward, terminated, truncated, info = env.step(STORE_A)
        assert (reward, terminated, truncated) == (1.0, False, True) and len(info["checks"]) == 2
        with pytest.raises(RuntimeError):
            env.step(BUMP5)
        env.reset(options={"episode": {"max_steps": 1, "score_truncated": False}})
        assert env.step(BUMP5)[1:4] == (0.0, False, True)
        env.reset()  # back to the constructor's options
        assert env.step(BUMP5)[2:4] == (False, False)


def test_hostile_actions_never_crash_the_loop(client: Client, scenarios: list[str]) -> None:
    with RLEnv(client, scenarios[0]) as env:
        env.reset()
        hostile: list[Any] = [
            "<tool_call>{not json</tool_call>", "<think>never closed", "   ", '<tool_call>{"name": "bump"}</tool_call>',
            {"name": "nope", "arguments": {}}, {"name": "_secret"}, {"name": "__class__"}, {"name": "bump",
            "arguments": [1]}, {"type": "function", "function": {"name": "bump", "arguments": "{by: 1"}},
            42, None, {"no": "name"}, {"name": "bump", "arguments": {"by": float("nan")}},
            "<tool_call>" + "x" * 300_000 + "</tool_call>"]
        for number, action in enumerate(hostile, start=1):
            observation, reward, terminated, truncated, info = env.step(action)
            assert info["status"] == "rejected" and info["step"] == number, (action, info)
            assert observation.startswith("Error: ") and info["error"] and not (terminated or truncated)
        observation, *_, info = env.step({"name": "fail", "arguments": {"message": "boom"}})
        assert info["status"] == "error" and "boom" in observation and info["traceback"]
        assert env.step({"name": "bump", "arguments": {"by": "two"}})[4]["status"] == "error"
        assert env.step(BUMP5)[0] == "5"  # and the episode goes on
    with pytest.raises(NotFound, match="scn_nope"):
        RLEnv(client, "scn_nope").reset()


@pytest.fixture(scope="module")
def user_llm() -> Iterator[ScriptedLLM]:
    """The simulated user's model: asks for the work, then says ###STOP### once told it is done."""
    rules = [Rule(contains=["CONV-TASK"], turn=0, content="# Thought:\nstart\n# Reply:\nPlease bump my counter by 5."),
             Rule(contains=["CONV-TASK"], last_contains=["done"], content="###STOP###"),
             Rule(contains=["CONV-TASK"], content="# Thought:\nwait\n# Reply:\nIs it done yet?")]
    with ScriptedLLM(rules) as llm:
        yield llm


@pytest.fixture(scope="module")
def conv_scenario(client: Client, counter_env_id: str) -> str:
    return client.scenarios.create({"environment_id": counter_env_id, "task": "CONV-TASK: bump the counter by 5",
                                    "init_config": {"count": 0}, "checklist_with_func": CHECKS}).id


def test_conversational_episode_with_a_simulated_user(client: Client, conv_scenario: str,
                                                      user_llm: ScriptedLLM) -> None:
    sid = conv_scenario
    episode = {"mode": "conversational", "user": {"model": "user-sim", "base_url": user_llm.base_url,
                                                  "api_key": "sk-user"}}
    with RLEnv(client, sid, episode=episode) as env:
        observation, info = env.reset()
        assert observation == "Please bump my counter by 5." and info["task"].startswith("CONV-TASK")
        assert "chat_with_user" in {t["function"]["name"] for t in info["tools"]}
        observation, reward, terminated, _, step = env.step("Which counter?")
        assert (observation, step["observation_role"], terminated) == ("Is it done yet?", "user", False)
        assert env.step(BUMP5)[4]["observation_role"] == "tool"
        observation, reward, terminated, truncated, step = env.step(
            {"name": "chat_with_user", "arguments": {"content": "It is done: the counter is 5."}})
        assert (observation, terminated, truncated, reward) == ("###STOP###", True, False, 0.5)
    last = user_llm.chat_requests()[-1]
    assert last["model"] == "user-sim" and "It is done" in last["messages"][-1]["content"]


def test_vector_env_autoreset_and_throughput(server: Any, counter_source: str) -> None:
    """Episodes of 3 steps (truncated, scored): bump 5, store a, read a, in a rotating
    order, so every episode ends with reward 1.0. Prints env-steps/s (not asserted), in a
    tenant that may run 4 calls at once (the default on 2 cores is 1)."""
    key = server.new_tenant("rl-vector", {"max_running_calls": 4})
    with Client(server.url, api_key=key) as tenant:
        environment = tenant.environments.create(counter_source, "Counter")
        scenarios = [tenant.scenarios.create({"environment_id": environment.id, "task": f"TASK-V{n}",
                                              "init_config": {"count": 0}, "checklist_with_func": CHECKS}).id
                     for n in range(2)]
    cycle = [BUMP5, STORE_A, {"name": "get_record", "arguments": {"key": "a"}}]
    for mode in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
        n, rounds = 4, 12
        envs = SandpitVectorEnv(n, scenarios, base_url=server.url, api_key=key, autoreset_mode=mode,
                                episode={"max_steps": 3})
        started = time.perf_counter()
        observations, infos = envs.reset(seed=0)
        reset_s = time.perf_counter() - started
        assert all(o.startswith("TASK-") for o in observations) and all(len(t) == 7 for t in infos["tools"])
        ended = []
        started = time.perf_counter()
        for number in range(rounds):
            observations, rewards, terminated, truncated, infos = envs.step([cycle[number % 3]] * n)
            ended += [float(rewards[i]) for i in range(n) if truncated[i]]
            assert not terminated.any()
            if mode is AutoresetMode.SAME_STEP and truncated.any():
                assert all(o.startswith("TASK-") for o in observations) and min(infos["episode"]) >= 2
                assert len(infos["final_info"]["checks"][0]) == 2
        elapsed = time.perf_counter() - started
        # SAME_STEP ends every env's episode each 3rd round; NEXT_STEP spends a 4th on the reset
        assert ended == [1.0] * (n * rounds // (3 if mode is AutoresetMode.SAME_STEP else 4))
        print(f"\nSandpitVectorEnv {mode.value}: {n} envs x {rounds} steps in {elapsed:.2f} s = "
              f"{n * rounds / elapsed:.1f} env-steps/s (reset of {n} new envs: {reset_s:.2f} s)")
        envs.close()


def test_gem_envs_through_the_real_gem_package(server: Any, scenarios: list[str], conv_scenario: str,
                                              user_llm: ScriptedLLM) -> None:
    gem = pytest.importorskip("gem", reason="gem-llm is installed with the dev extra (Python <= 3.12)")
    from gem.wrappers.episode_tracking_wrapper import EpisodeTrackingWrapper
    from sandpit.client import gem_env

    envs = gem.make_vec([gem_env.NON_CONV_ID] * 2, wrappers=[EpisodeTrackingWrapper], async_mode=True, seed=5,
                        base_url=server.url, api_key=server.api_key, scenario_ids=scenarios, mode="train")
    observations, infos = envs.reset()
    assert all(o["type"] == "user" and o["content"].startswith("TASK-") for o in observations)
    assert all(i["env_name"] == "envscaler_non_conversation_rl" and i["tools"] for i in infos)
    bump = '<tool_call>{"name": "bump", "arguments": {"by": 5}}</tool_call>'
    episode_rewards = []
    for actions in ([bump, "Task Completed."], [STORE_A, bump], ["Task Completed.", "oops <tool_call>{"]):
        observations, rewards, terminated, truncated, infos = envs.step(actions)
        episode_rewards += [(i, float(r)) for i, (r, t) in enumerate(zip(rewards, terminated, strict=True)) if t]
    assert episode_rewards == [(1, 0.0), (0, 1.0)]
    assert infos[0]["prev_ep_cumulative_rewards"] == 1.0 and observations[0]["content"].startswith("TASK-")
    assert infos[1]["status"] == "rejected"  # the garbage was recorded, the episode goes on
    assert envs.step([bump, '<tool_call>{"name": "fail", "arguments": {"message": "x"}}</tool_call>'])[2][1]
    for env in envs.envs:
        env.close()

    conv = gem.make(gem_env.CONV_ID, base_url=server.url, api_key=server.api_key, scenario_ids=[conv_scenario],
                    mode="train",
                    user_model="user-sim", provider="openai", user_base_url=user_llm.base_url)
    observation, info = conv.reset(seed=1)
    assert observation == {"type": "user", "content": "Please bump my counter by 5."}
    assert info["env_name"] == "envscaler_conversation_rl"
    assert conv.step(bump)[0] == {"type": "tool", "content": "5"}
    observation, reward, terminated, _, _ = conv.step("All done.")
    assert (observation["content"], reward, terminated) == ("###STOP###", 0.5, True)
    conv.close()
