"""The verifiers adapter's parts that need no server (`sandpit.client.verifiers_env`), with
the real `verifiers` package: the per-step record, tool schemas as `vf.Tool`s, the dataset's
input checks, the rubric, and which hooks verifiers discovers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import verifiers as vf
from sandpit.client import Client
from sandpit.client.models import StepResult
from sandpit.client.verifiers_env import (
    STATE_KEY,
    SandpitRolloutError,
    SandpitRubric,
    SandpitToolEnv,
    _text,
    sandpit_reward,
    scenario_dataset,
    step_info,
    tool_defs,
)

BUMP = {"type": "function", "function": {"name": "bump", "description": "Add `by`.",
                                         "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}}}


def test_step_info_is_env_episode_step_status_and_failure() -> None:
    result = StepResult(env_id="env_1", episode=3, step=7, observation="5", status="rejected", duration_ms=1.5,
                        reward=1.0, terminated=True, failure="agent", episode_failure="verifier", episode_mask=True)
    assert step_info(result) == {"env_id": "env_1", "episode": 3, "step": 7, "status": "rejected",
                                 "failure": "agent", "mask": False, "episode_failure": "verifier",
                                 "episode_mask": True}


def test_tool_defs_are_the_envs_own_schemas() -> None:
    bare = {"type": "function", "function": {"name": "ping"}}
    [bump, ping] = tool_defs([BUMP, bare])
    assert isinstance(bump, vf.Tool) and (bump.name, bump.description) == ("bump", "Add `by`.")
    assert bump.parameters == BUMP["function"]["parameters"]  # type: ignore[index]
    assert (ping.description, ping.parameters) == ("", {"type": "object", "properties": {}})


@pytest.mark.parametrize("schema", [{}, {"type": "function"}, {"function": "bump"}, {"function": {"name": 3}},
                                    {"name": "bump", "parameters": {}}])
def test_tool_defs_refuse_what_is_no_function_schema(schema: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not an OpenAI function tool schema"):
        tool_defs([schema])


@pytest.mark.parametrize("ids", [[], [""], ["scn_1", None], [3]])
def test_the_dataset_refuses_bad_scenario_ids_before_any_call(ids: list[Any]) -> None:
    with Client("http://127.0.0.1:9", api_key="k") as client:  # nothing listens: no call may be made
        with pytest.raises(ValueError, match="scenario id"):
            scenario_dataset(client, ids)


def test_the_reward_is_sandpits_and_zero_when_the_episode_did_not_end() -> None:
    assert asyncio.run(sandpit_reward({STATE_KEY: {"reward": 0.5, "ended": True}})) == 0.5
    assert asyncio.run(sandpit_reward({})) == 0.0
    assert asyncio.run(sandpit_reward({STATE_KEY: None})) == 0.0
    rubric = SandpitRubric()
    assert rubric.funcs == [sandpit_reward] and rubric.weights == [1.0]


def test_hooks_verifiers_discovers() -> None:
    # a reply without tool calls is an action, not verifiers' `no_tools_called` stop
    assert not hasattr(SandpitToolEnv.no_tools_called, "stop")
    assert hasattr(vf.ToolEnv.no_tools_called, "stop")
    assert hasattr(SandpitToolEnv.delete_sandpit_env, "cleanup")
    assert issubclass(SandpitRolloutError, vf.InfraError) and issubclass(SandpitToolEnv, vf.ToolEnv)


@pytest.mark.parametrize(("content", "text"), [(None, ""), ("hi", "hi"), ([{"type": "text", "text": "a"}, {"type": "x"},
                                                                          {"type": "text", "text": "b"}], "ab"), (3, "3")])
def test_text_of_message_content(content: Any, text: str) -> None:
    assert _text(content) == text
