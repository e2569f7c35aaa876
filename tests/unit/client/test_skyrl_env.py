"""The SkyRL text env (`sandpit.client.skyrl_env`) through the real `skyrl_gym` package (its
registry and `make`) against the in-process episode double; the prompt building and the
settings checks need no server at all."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
import skyrl_gym
from episode_double import EpisodeDouble
from sandpit.client import Client, NotFound
from sandpit.client.skyrl_env import SKYRL_ID, SandpitTextEnv, chat_prompt, system_text
from skyrl_gym.envs.base_text_env import BaseTextEnv

BUMP = '<think>bump it</think>\n<tool_call>\n{"name": "bump", "arguments": {"by": 2}}\n</tool_call>'


@pytest.fixture
def double() -> EpisodeDouble:
    return EpisodeDouble()


@pytest.fixture
def client(double: EpisodeDouble) -> Iterator[Client]:
    with double.client() as c:
        yield c


def test_registered_on_import() -> None:
    assert skyrl_gym.registry[SKYRL_ID].entry_point == "sandpit.client.skyrl_env:SandpitTextEnv"


def test_an_episode_through_skyrl_gym_make(client: Client, double: EpisodeDouble) -> None:
    env = skyrl_gym.make(SKYRL_ID, env_config={}, extras={"scenario_id": "scn_a", "max_turns": 5,
                                                           "data_source": "sandpit", "reward_spec": {}},
                         client=client)
    assert isinstance(env, BaseTextEnv) and env.max_turns == 5
    messages, info = env.init([{"role": "system", "content": "Be brief."}])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n# Environment\n\nA counter.\n\n# Tools")
    assert '"name": "bump"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[1]["content"] == "Make the counter 2." == info["task"]
    assert double.calls("POST", "/v1/envs")[0]["episode"] == {"max_steps": 5}  # max_turns -> max_steps

    out = env.step(BUMP)
    assert out["observations"] == [{"role": "tool", "content": "2"}] and (out["reward"], out["done"]) == (0.0, False)
    meta = out["metadata"]
    assert (meta["env_id"], meta["episode"], meta["step"], meta["status"]) == (info["env_id"], 1, 1, "ok")
    assert meta["scenario_id"] == "scn_a" and meta["action"] == {"name": "bump", "arguments": {"by": 2}}
    garbage = env.step("oops <tool_call>{not json</tool_call>")
    assert garbage["metadata"]["status"] == "rejected" and not garbage["done"]
    assert garbage["observations"][0]["role"] == "user"
    last = env.step("Done: the counter is 2.")
    assert (last["observations"], last["reward"], last["done"]) == ([], 1.0, True)
    assert last["metadata"]["observation"] == "Task finished" and last["metadata"]["terminated"]
    assert env.get_metrics() == {"steps": 3, "rejected_steps": 1, "truncated": 0, "reward": 1.0}
    with pytest.raises(RuntimeError, match="has ended: init"):
        env.step(BUMP)
    messages, info = env.init([])  # the next episode, on the same server-side env
    assert info["episode"] == 2 and env.step(BUMP)["metadata"]["episode"] == 2
    env.close()
    env.close()
    assert double.envs == {}
    with pytest.raises(RuntimeError, match="closed"):
        env.step(BUMP)
    with pytest.raises(RuntimeError, match="closed"):
        env.init([])


def test_truncation_and_user_roles(client: Client) -> None:
    env = SandpitTextEnv({"observations": "user", "episode": {"max_steps": 9}},
                         {"scenario_id": "scn_b", "episode": {"max_steps": 2}, "max_turns": 7}, client=client)
    env.init(None)
    assert env.step(BUMP)["observations"][0]["role"] == "user"  # a tool's output as a user message
    out = env.step(BUMP)  # the row's max_steps (2) wins over max_turns and env_config's
    assert out["done"] and out["metadata"]["truncated"] and not out["metadata"]["terminated"]
    assert env.get_metrics()["truncated"] == 1
    env.close()


def test_step_before_init(client: Client) -> None:
    env = SandpitTextEnv(None, {"scenario_id": "scn_a"}, client=client)
    with pytest.raises(RuntimeError, match="init"):
        env.step(BUMP)
    env.close()


def test_a_huge_action_is_a_rejected_step(client: Client) -> None:
    env = SandpitTextEnv(None, {"scenario_id": "scn_a"}, client=client)
    env.init([])
    out = env.step("<tool_call>" + "x" * 20_000 + "</tool_call>")  # over the double's 10 kB limit
    assert out["metadata"]["status"] == "rejected" and "size limit" in out["metadata"]["error"] and not out["done"]
    env.close()


def test_an_unknown_scenario_is_not_found(client: Client, double: EpisodeDouble) -> None:
    env = SandpitTextEnv(None, {"scenario_id": "scn_nope"}, client=client)
    with pytest.raises(NotFound):
        env.init([])
    env.close()
    assert double.envs == {}


@dataclasses.dataclass
class DataclassConfig:
    """A config as SkyRL's dataclass configs give it (None fields count as unset)."""

    base_url: str | None = None
    timeout: float = 5.0
    observations: str = "user"


def test_env_config_forms() -> None:
    made = SandpitTextEnv(DataclassConfig(), {"scenario_id": "scn_a"})
    assert made.observations == "user" and made.episode_options == {}
    made.close()
    omegaconf = pytest.importorskip("omegaconf")
    config = omegaconf.OmegaConf.create({"episode": {"max_steps": 3}, "observations": "user"})
    made = SandpitTextEnv(config, {"scenario_id": "scn_a"})
    assert made.episode_options == {"max_steps": 3} and made.observations == "user"
    made.close()


@pytest.mark.parametrize(("env_config", "extras", "error", "match"), [
    (None, None, ValueError, "scenario_id"),
    (None, {"scenario_id": ""}, ValueError, "scenario_id"),
    (None, {"scenario_id": 7}, ValueError, "scenario_id"),
    (None, {"scenario_id": "scn_a", "api_key": "sk-leaked"}, ValueError, "dataset row"),
    (None, {"scenario_id": "scn_a", "base_url": "http://x"}, ValueError, "dataset row"),
    ({"api_kye": "k"}, {"scenario_id": "scn_a"}, ValueError, "unknown env_config keys"),
    ({"observations": "tool"}, {"scenario_id": "scn_a"}, ValueError, "observations"),
    ({"timeout": 0}, {"scenario_id": "scn_a"}, ValueError, "timeout"),
    ({"timeout": "60"}, {"scenario_id": "scn_a"}, ValueError, "timeout"),
    ({"timeout": float("nan")}, {"scenario_id": "scn_a"}, ValueError, "timeout"),
    (None, {"scenario_id": "scn_a", "max_turns": 0}, ValueError, "max_turns"),
    (None, {"scenario_id": "scn_a", "max_turns": True}, ValueError, "max_turns"),
    (None, {"scenario_id": "scn_a", "seed": -1}, ValueError, "seed"),
    (None, {"scenario_id": "scn_a", "seed": "1"}, ValueError, "seed"),
    (None, {"scenario_id": "scn_a", "episode": "long"}, TypeError, "episode"),
    (None, {"scenario_id": "scn_a", "init_config": [1]}, TypeError, "init_config"),
    ("base_url=x", {"scenario_id": "scn_a"}, TypeError, "env_config must be a mapping"),
    (None, ["scn_a"], TypeError, "extras must be a mapping"),
])
def test_settings_it_cannot_use_are_refused(env_config: Any, extras: Any, error: type[Exception],
                                            match: str) -> None:
    with pytest.raises(error, match=match):
        SandpitTextEnv(env_config, extras)


def test_a_client_beside_connection_settings_is_refused(client: Client) -> None:
    with pytest.raises(ValueError, match="not both"):
        SandpitTextEnv({"api_key": "k"}, {"scenario_id": "scn_a"}, client=client)


def test_a_malformed_prompt_fails_before_the_server_is_asked(client: Client, double: EpisodeDouble) -> None:
    env = SandpitTextEnv(None, {"scenario_id": "scn_a"}, client=client)
    for prompt in ("a bare string", [{"role": "user"}], [{"content": "x"}], ["hi"], 42):
        with pytest.raises(TypeError, match="prompt"):
            env.init(prompt)
    assert double.calls("POST", "/v1/envs") == []
    env.close()


def test_chat_prompt_and_system_text() -> None:
    tools = [{"type": "function", "function": {"name": "bump", "parameters": {"type": "object"}}}]
    system = system_text("  A counter.  ", tools)
    assert system.startswith("A counter.\n\n# Tools\n") and system.endswith("a message to the user.")
    lines = system.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in lines] == tools
    assert system_text(None, []).startswith("# Tools")
    prompt = [{"role": "user", "content": "earlier"}]
    assert chat_prompt(prompt, "S", "T") == [{"role": "system", "content": "S"}, {"role": "user", "content": "earlier"},
                                             {"role": "user", "content": "T"}]
    assert prompt == [{"role": "user", "content": "earlier"}]  # not changed
    assert chat_prompt([{"role": "system", "content": ""}], "S", "T")[0] == {"role": "system", "content": "S"}
    assert chat_prompt((), "S", "")[-1] == {"role": "user", "content": ""}
