"""The GEM environments (`sandpit.client.gem_env`) through the real `gem` package (its
registry, `make`, `make_vec` and wrappers) against the in-process episode double."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from episode_double import EpisodeDouble
from sandpit.client import Client, NotFound

gem: Any
gem_env: Any
EpisodeTrackingWrapper: Any
ObservationWrapper: Any


@pytest.fixture(scope="module", autouse=True)
def _gem() -> None:
    """`gem` and the GEM door, imported when this module's first test runs rather than when
    it is collected: they cost about 2 s of CPU, which every pytest process collecting the
    suite would pay (each xdist worker of scripts/test, every local run)."""
    global gem, gem_env, EpisodeTrackingWrapper, ObservationWrapper
    gem = pytest.importorskip("gem", reason="gem-llm is installed with the dev extra (Python <= 3.12)")
    gem_env = pytest.importorskip("sandpit.client.gem_env")
    from gem.wrappers.episode_tracking_wrapper import EpisodeTrackingWrapper
    from gem.wrappers.observation_wrapper import ObservationWrapper


@pytest.fixture
def double() -> EpisodeDouble:
    return EpisodeDouble()


@pytest.fixture
def client(double: EpisodeDouble) -> Iterator[Client]:
    with double.client() as c:
        yield c


def test_registered_on_import() -> None:
    from gem.envs.registration import ENV_REGISTRY

    assert ENV_REGISTRY[gem_env.NON_CONV_ID].entry_point == "sandpit.client.gem_env:SandpitNonConvEnv"
    assert ENV_REGISTRY[gem_env.CONV_ID].entry_point == "sandpit.client.gem_env:SandpitConvEnv"


def test_non_conversational_env_is_envscaler_shaped(client: Client, double: EpisodeDouble) -> None:
    env = gem.make(gem_env.NON_CONV_ID, client=client, mode="train")  # EnvScaler's env_config as it is
    observation, info = env.reset(seed=3)
    assert observation["type"] == "user" and observation["content"].startswith("Make the counter")
    assert info["env_name"] == "envscaler_non_conversation_rl"
    assert info["env_introduction"].startswith("# Environment") and info["tools"]
    assert info["task"]["task"] == observation["content"] and info["task"]["init_config"] == {"count": 0}
    assert double.calls("GET", "/v1/scenarios")  # scenario_ids=None: every scenario of the tenant
    assert double.calls("POST", "/v1/envs")[0]["episode"] == gem_env.ENVSCALER_EPISODE | {
        "mode": "non_conversational"}

    observation, info = env.reset(task_index=1)
    assert info["scenario_id"] == "scn_b" and info["tools"]
    observation, reward, terminated, truncated, info = env.step(
        '<think>bump it</think>\n<tool_call>\n{"name": "bump", "arguments": {"by": 3}}\n</tool_call>')
    assert observation == {"type": "tool", "content": "3"} and info["action"] == {"name": "bump",
                                                                                   "arguments": {"by": 3}}
    observation, reward, terminated, truncated, info = env.step("garbage <tool_call>{not json</tool_call>")
    assert info["status"] == "rejected" and observation["type"] == "user" and not terminated
    observation, reward, terminated, truncated, info = env.step("Task Completed.")
    assert (observation, reward, terminated, truncated) == ({"type": "user", "content": "Task finished"}, 1.0,
                                                            True, False)
    env.reset(scenario_id="scn_c")
    assert env.step({"name": "fail"})[1:4] == (0.0, True, False)  # EnvScaler: a raising tool ends it at 0
    with pytest.raises(ValueError, match="task_index"):
        env.reset(task_index=3)
    with pytest.raises(NotFound):
        env.reset(scenario_id="scn_nope")
    action = env.sample_random_action()
    assert json.loads(action.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"] == {}
    env.close()
    env.close()
    assert double.envs == {}


def test_conversational_env(client: Client, double: EpisodeDouble) -> None:
    env = gem.make(gem_env.CONV_ID, client=client, scenario_ids=["scn_a"], mode="train", user_model="gpt-4.1",
                   provider="openai", user_base_url="http://model.local/v1", user_api_key="sk-test")
    observation, info = env.reset()
    assert info["env_name"] == "envscaler_conversation_rl" and observation["content"].startswith("Hi")
    sent = double.calls("POST", "/v1/envs")[0]["episode"]
    assert sent["mode"] == "conversational" and sent["user"] == {
        "model": "gpt-4.1", "base_url": "http://model.local/v1", "api_key": "sk-test"}
    assert env.step("What should I do?")[0] == {"type": "user", "content": "Please go on."}
    env.step('<tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>')
    observation, reward, terminated, _, _ = env.step("All done, the counter is 2.")
    assert observation["content"] == "###STOP###" and reward == 1.0 and terminated
    env.close()


def test_refusals(client: Client) -> None:
    with pytest.raises(ValueError, match="sandpit import envscaler"):
        gem.make(gem_env.NON_CONV_ID, client=client, mode="train", task_items_path="tasks.json")
    with pytest.raises(ValueError, match="mode"):
        gem.make(gem_env.NON_CONV_ID, client=client, mode="test")
    with pytest.raises(ValueError, match="provider"):
        gem.make(gem_env.CONV_ID, client=client, user_model="m", provider="anthropic")
    with pytest.raises(TypeError):
        gem.make(gem_env.CONV_ID, client=client)  # no user_model
    env = gem.make(gem_env.NON_CONV_ID, client=client, scenario_ids=[])
    with pytest.raises(ValueError, match="no scenarios"):
        env.reset()
    with pytest.raises(RuntimeError):
        env.step("hi")


@pytest.mark.parametrize("async_mode", [False, True])
def test_gem_make_vec_rollout_with_autoreset(double: EpisodeDouble, async_mode: bool) -> None:
    client = double.client()
    envs = gem.make_vec([gem_env.NON_CONV_ID] * 3, wrappers=[EpisodeTrackingWrapper], async_mode=async_mode,
                        seed=7, client=client, scenario_ids=["scn_c"])
    observations, infos = envs.reset()
    assert [o["content"] for o in observations] == ["Make the counter 1."] * 3
    assert [i["env_name"] for i in infos] == ["envscaler_non_conversation_rl"] * 3
    bump = '<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>'
    _, rewards, terminated, _, _ = envs.step([bump, "Task Completed.", bump])
    assert list(rewards) == [0.0, 0.0, 0.0] and list(terminated) == [False, True, False]
    observations, rewards, terminated, _, infos = envs.step(["Task Completed.", bump, bump])
    assert list(rewards) == [1.0, 0.0, 0.0] and list(terminated) == [True, False, False]
    assert observations[0]["content"] == "Make the counter 1."  # GEM's SAME_STEP autoreset
    assert infos[0]["step_counter"] == 0 and infos[0]["prev_ep_cumulative_rewards"] == 1.0
    assert observations[1] == {"type": "tool", "content": "1"} and observations[2]["content"] == "2"
    for env in envs.envs:
        env.close()
    assert double.envs == {}
    client.close()


def test_text_observations_for_gem_observation_wrappers(client: Client) -> None:
    env = ObservationWrapper(gem.make(gem_env.NON_CONV_ID, client=client, scenario_ids="scn_a",
                                      observation_format="text"), include_action=True, include_chat_template=False)
    observation, _ = env.reset()
    assert observation == "Make the counter 2.\n"
    bump = '<tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>'
    observation, *_ = env.step(bump)
    assert observation == f"Make the counter 2.\n{bump}\n2\n"
    env.env.close()
