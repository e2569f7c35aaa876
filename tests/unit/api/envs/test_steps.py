"""Steps (:mod:`sandpit.api.envs.steps`) on the fake executor: state changes and the
trajectory, tool errors and malformed actions as recorded results, a lost sandbox as a
status, episodes that end by their termination action or ``max_steps`` with the reward
of their scenario's checks."""

from __future__ import annotations

import pytest
from env_calls import ME, create, state, step
from sandpit.api.app import Services
from sandpit.api.envs.actions import INVALID_ACTION
from sandpit.api.errors import Conflict, EpisodeEnded, InvalidRequest
from sandpit.api.schemas.envs import (
    EnvCreate,
    EpisodeOptions,
    StepRequest,
)
from sandpit.executor.fake import FakeExecutor


def test_steps_change_the_state_and_every_step_stays_readable(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    first = step(services, env_id, "bump", include="state_diff", by=2)
    assert (first.status, first.observation, first.step, first.reward) == ("ok", "2", 1, 0.0)
    assert first.state_diff == {"count": {"changed": {"old": 0, "new": 2}}, "log": {"changed": {"old": [],
                                                                                             "new": ["bump 2"]}}}
    second = step(services, env_id, "set_record", include="state", key="a", value="x")
    assert second.state is not None and second.state["records"] == {"a": {"value": "x"}}
    assert state(services, env_id, 1)["count"] == 2 and state(services, env_id)["records"] == {"a": {"value": "x"}}
    trajectory = services.history.trajectory(ME, env_id, None, None, 0)
    assert [s.action for s in trajectory.steps] == [{"name": "bump", "arguments": {"by": 2}},
                                                    {"name": "set_record", "arguments": {"key": "a", "value": "x"}}]
    with pytest.raises(Conflict):
        state(services, env_id, 3)
    with pytest.raises(InvalidRequest):
        step(services, env_id, "bump", include="everything")


def test_a_tool_error_is_a_result_and_malformed_actions_are_recorded(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    raised = step(services, env_id, "fail", message="boom")
    assert raised.status == "error" and raised.observation.startswith("Error: ValueError: boom")
    assert state(services, env_id)["count"] == -1  # its state changes count (EnvScaler)
    unknown = step(services, env_id, "explode")
    assert (unknown.status, unknown.observation, unknown.observation_role) == ("rejected", INVALID_ACTION, "user")
    assert "unknown tool 'explode'" in (unknown.error or "")
    bad = services.steps.step(ME, env_id, StepRequest(name="bump", arguments=[1]), None).public()
    assert bad.status == "rejected" and bad.step == 3
    assert services.history.trajectory(ME, env_id, None, None, 0).count == 3


def test_a_lost_sandbox_is_a_status_and_the_episode_goes_on(services: Services, fake: FakeExecutor,
                                                             environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=2)
    fake.fail_call("crashed", tool="bump", lost=True)
    crashed = step(services, env_id, "bump", by=5)
    assert crashed.status == "crashed" and state(services, env_id)["count"] == 2
    again = step(services, env_id, "bump", by=1)
    assert again.recovered and again.observation == "3"
    assert b'sandpit_sandbox_failures_total{status="crashed"} 1.0' in services.metrics.render()


def test_an_episode_ends_by_its_termination_action_with_the_checks_reward(services: Services,
                                                                           scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    assert env.observation == "Bring the counter to 3." and env.task == env.observation
    assert "chat_with_user" in {t["function"]["name"] for t in env.tools}
    assert step(services, env.id, "bump", by=2).reward == 0.0
    done = step(services, env.id, "chat_with_user", content="Done: the counter is 3.")
    assert done.terminated and not done.truncated and done.observation == "Task finished"
    assert done.reward == 1.0 and [c.passed for c in done.checks or []] == [True, True]
    with pytest.raises(EpisodeEnded):
        step(services, env.id, "bump")
    assert services.envs.read(ME, env.id).episode_status == "terminated"
    again = services.episodes.reset(ME, env.id, None)  # the same scenario, a fresh episode
    assert again.episode == 2 and again.episode_status == "running" and state(services, env.id)["count"] == 1


def test_max_steps_truncates_and_scores_the_episode(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id, episode=EpisodeOptions(max_steps=2))).public
    assert step(services, env.id, "bump").reward == 0.0
    last = step(services, env.id, "bump")
    assert last.truncated and not last.terminated and last.reward == 0.5  # count is 3; two bumps logged
    trajectory = services.history.trajectory(ME, env.id, None, None, 0)
    assert trajectory.status == "truncated" and trajectory.reward == 0.5
