"""Envs through the services on the fake executor: create, step, state, trajectory,
reset, restore, fork, delete, recovery of an evicted or lost session, capacity, tenant
isolation, and episodes that end with the reward of their scenario's checks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from api_fakes import caller
from sandpit.api.app import Services
from sandpit.api.db import models
from sandpit.api.envs.actions import INVALID_ACTION
from sandpit.api.errors import Conflict, EpisodeEnded, InvalidRequest, NoCapacity, NotFound, QuotaExceeded
from sandpit.api.schemas.envs import (
    EnvCreate,
    EpisodeOptions,
    ForkRequest,
    ResetRequest,
    RestoreRequest,
    StepRequest,
)
from sandpit.api.schemas.evaluations import EvaluateRequest
from sandpit.api.schemas.scenarios import CheckSpec, ScenarioCreate
from sandpit.api.schemas.tenants import TenantCreate
from sandpit.executor.errors import CapacityError
from sandpit.executor.fake import FakeExecutor
from sqlalchemy import func, select

ME = caller()


def create(services: Services, environment_id: str, **body: Any) -> str:
    return services.envs.create(ME, EnvCreate(environment_id=environment_id, **body)).id


def step(services: Services, env_id: str, name: str, include: str | None = None, **arguments: Any) -> Any:
    return services.steps.take(ME, env_id, StepRequest(name=name, arguments=arguments), include)


def state(services: Services, env_id: str, at: int | None = None, episode: int | None = None) -> dict[str, Any]:
    return services.history.state_at(ME, env_id, at, episode).state


def test_an_env_starts_at_step_zero_with_the_environment_tools(services: Services, environment_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(environment_id=environment_id, init_config={"count": 5}))
    assert (env.episode, env.step, env.status, env.episode_status) == (1, 0, "live", "running")
    assert {t["function"]["name"] for t in env.tools} == {"bump", "set_record", "fail"}
    assert state(services, env.id) == {"count": 5, "records": {}, "log": []}
    assert services.envs.read(ME, env.id).id == env.id
    assert services.envs.page(ME, 10, 0).count == 1


def test_steps_change_the_state_and_every_step_stays_readable(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    first = step(services, env_id, "bump", include="state_diff", by=2)
    assert (first.status, first.observation, first.step, first.reward) == ("ok", "2", 1, 0.0)
    assert first.state_diff == {"count": {"changed": {"old": 0, "new": 2}}, "log": {"changed": {"old": [],
                                                                                             "new": ["bump 2"]}}}
    second = step(services, env_id, "set_record", include="state", key="a", value="x")
    assert second.state is not None and second.state["records"] == {"a": {"value": "x"}}
    assert state(services, env_id, 1)["count"] == 2 and state(services, env_id)["records"] == {"a": {"value": "x"}}
    trajectory = services.history.trajectory_page(ME, env_id, None, None, 0)
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
    bad = services.steps.take(ME, env_id, StepRequest(name="bump", arguments=[1]), None)
    assert bad.status == "rejected" and bad.step == 3
    assert services.history.trajectory_page(ME, env_id, None, None, 0).count == 3


def test_an_evicted_env_is_restored_from_its_last_committed_state(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=3)
    services.live.drop(env_id)
    assert services.envs.read(ME, env_id).status == "evicted"
    after = step(services, env_id, "bump")
    assert after.recovered and after.observation == "4"
    assert services.live.evict_idle(0) == 1 and env_id not in services.live


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


def test_restore_discards_later_steps_and_the_session_follows(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    for by in (1, 2, 3):
        step(services, env_id, "bump", by=by)
    env = services.envs.restore_env(ME, env_id, RestoreRequest(step=1))
    assert env.step == 1 and state(services, env_id)["count"] == 1
    assert services.history.trajectory_page(ME, env_id, None, None, 0).count == 1
    assert step(services, env_id, "bump", by=10).observation == "11"
    with pytest.raises(Conflict):
        services.envs.restore_env(ME, env_id, RestoreRequest(step=5))


def test_restore_without_a_free_slot_leaves_the_session_to_the_next_request(services: Services,
                                                                            environment_id: str) -> None:
    services.tenants.create(TenantCreate(id="team-a", quotas={"max_running_calls": 1}, create_key=False))
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=1)
    step(services, env_id, "bump", by=2)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with services.sandboxes.slot("team-a"):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(5)
        env = services.envs.restore_env(ME, env_id, RestoreRequest(step=1))  # no 429: it needs no slot now
    finally:
        release.set()
        thread.join()
    assert env.step == 1 and env.status == "evicted"
    again = step(services, env_id, "bump", by=10)
    assert again.recovered and again.observation == "11"


def test_forks_share_the_history_and_go_their_own_way(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=1)
    step(services, env_id, "bump", by=2)
    forks = services.envs.fork_env(ME, env_id, ForkRequest(step=1, count=2))
    assert forks.count == 2 and all(f.forked_from == env_id and f.step == 1 for f in forks.data)
    assert {f.status for f in forks.data} == {"evicted"}  # sessions start on first use
    a, b = (f.id for f in forks.data)
    assert step(services, a, "bump", by=100).observation == "101"
    assert state(services, b)["count"] == 1 and state(services, env_id)["count"] == 3
    assert len(services.history.trajectory_page(ME, b, None, None, 0).steps) == 1
    with pytest.raises(InvalidRequest):
        services.envs.fork_env(ME, env_id, ForkRequest(count=10_000))


def test_reset_starts_the_next_episode_and_keeps_the_last_one_readable(services: Services,
                                                                         environment_id: str) -> None:
    env_id = create(services, environment_id, init_config={"count": 7})
    step(services, env_id, "bump")
    env = services.envs.reset_env(ME, env_id, ResetRequest(init_config={"count": 1}))
    assert (env.episode, env.step) == (2, 0) and state(services, env_id)["count"] == 1
    assert state(services, env_id, 1, episode=1)["count"] == 8
    episodes = services.history.episodes_page(ME, env_id, 10, 0)
    assert [(e.episode, e.steps) for e in episodes.data] == [(1, 1), (2, 0)]
    with pytest.raises(NotFound):
        state(services, env_id, episode=9)


def test_delete_frees_the_session_and_collection_frees_the_storage(services: Services, fake: FakeExecutor,
                                                                     environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "set_record", key="k", value="v" * 5000)
    services.envs.delete(ME, env_id)
    assert all(s.closed for s in fake.sessions.values() if s.tenant == "team-a")
    assert services.envs.collect_garbage_if_wanted() > 0
    with services.db.read() as db:
        assert (db.scalar(select(func.count()).select_from(models.Blob)) or 0) == 0
    with pytest.raises(NotFound):
        services.envs.read(ME, env_id)


def test_other_tenants_ids_are_not_found(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    other = caller("team-b")
    for attempt in (lambda: services.envs.read(other, env_id),
                    lambda: services.steps.take(other, env_id, StepRequest(name="bump"), None),
                    lambda: services.history.state_at(other, env_id, None, None),
                    lambda: services.envs.delete(other, env_id),
                    lambda: services.environments.read(other, environment_id),
                    lambda: services.envs.create(other, EnvCreate(environment_id=environment_id))):
        with pytest.raises(NotFound) as raised:
            attempt()
        assert "team-a" not in raised.value.message
    assert services.envs.page(other, 10, 0).count == 0


def test_no_capacity_evicts_the_least_recently_used_env_first(services: Services, fake: FakeExecutor,
                                                               environment_id: str) -> None:
    idle = create(services, environment_id)
    fake.fail("open_session", CapacityError("full", retry_after_s=1.0))
    busy = create(services, environment_id)
    assert idle not in services.live and busy in services.live
    fake.fail("open_session", CapacityError("full", retry_after_s=1.0), times=None)
    with pytest.raises(NoCapacity) as raised:
        create(services, environment_id)
    assert raised.value.retry_after == services.envs.settings.capacity_retry_after_s


def test_quotas_are_applied_before_anything_runs(services: Services, fake: FakeExecutor,
                                                 environment_id: str) -> None:
    tight = caller(max_live_envs=1, max_concurrent_calls=1)
    services.envs.create(tight, EnvCreate(environment_id=environment_id))
    opened = len(fake.sessions)
    with pytest.raises(QuotaExceeded) as raised:
        services.envs.create(tight, EnvCreate(environment_id=environment_id))
    assert raised.value.limit == "max_live_envs" and len(fake.sessions) == opened


def test_instantiation_failures_name_init_config(services: Services, environment_id: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        create(services, environment_id, init_config={"explode": True})
    assert raised.value.field == "init_config" and "init refused" in raised.value.message


CHECK_COUNT = "def check_func(final_state):\n    return final_state['count'] == 3\n"
CHECK_LOG = "def check_func(final_state):\n    return len(final_state['log']) == 1\n"


@pytest.fixture
def scenario_id(services: Services, fake: FakeExecutor, environment_id: str) -> str:
    fake.script_check(CHECK_COUNT, lambda initial, final: final["count"] == 3)
    fake.script_check(CHECK_LOG, lambda initial, final: len(final["log"]) == 1)
    return services.scenarios.create(ME, ScenarioCreate(
        environment_id=environment_id, task="Bring the counter to 3.", init_config={"count": 1},
        checklist_with_func=[CheckSpec(check_item="count is 3", check_func=CHECK_COUNT),
                             CheckSpec(check_item="one bump", check_func=CHECK_LOG)])).id


def test_an_episode_ends_by_its_termination_action_with_the_checks_reward(services: Services,
                                                                           scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id))
    assert env.observation == "Bring the counter to 3." and env.task == env.observation
    assert "chat_with_user" in {t["function"]["name"] for t in env.tools}
    assert step(services, env.id, "bump", by=2).reward == 0.0
    done = step(services, env.id, "chat_with_user", content="Done: the counter is 3.")
    assert done.terminated and not done.truncated and done.observation == "Task finished"
    assert done.reward == 1.0 and [c.passed for c in done.checks or []] == [True, True]
    with pytest.raises(EpisodeEnded):
        step(services, env.id, "bump")
    assert services.envs.read(ME, env.id).episode_status == "terminated"
    again = services.envs.reset_env(ME, env.id, None)  # the same scenario, a fresh episode
    assert again.episode == 2 and again.episode_status == "running" and state(services, env.id)["count"] == 1


def test_max_steps_truncates_and_scores_the_episode(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id, episode=EpisodeOptions(max_steps=2)))
    assert step(services, env.id, "bump").reward == 0.0
    last = step(services, env.id, "bump")
    assert last.truncated and not last.terminated and last.reward == 0.5  # count is 3; two bumps logged
    trajectory = services.history.trajectory_page(ME, env.id, None, None, 0)
    assert trajectory.status == "truncated" and trajectory.reward == 0.5


def test_restoring_an_ended_episode_before_its_end_runs_it_again(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id))
    step(services, env.id, "bump", by=2)
    step(services, env.id, "chat_with_user", content="done")
    restored = services.envs.restore_env(ME, env.id, RestoreRequest(step=1))
    assert restored.episode_status == "running" and restored.reward is None
    assert step(services, env.id, "bump").observation == "4"


def test_evaluate_runs_the_scenarios_checks_on_the_current_state(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id))
    step(services, env.id, "bump", by=2)
    result = services.envs.evaluate_env(ME, env.id, None)
    assert (result.passed, result.total, result.reward) == (2, 2, 1.0)
    plain = services.envs.create(ME, EnvCreate(environment_id=services.scenarios.read(ME, scenario_id)
                                               .environment_id))
    with pytest.raises(Conflict):
        services.envs.evaluate_env(ME, plain.id, None)


def test_evaluate_remembers_passing_check_sources_and_names_a_refused_one(services: Services, scenario_id: str,
                                                                          fake: FakeExecutor) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id))
    step(services, env.id, "bump", by=2)
    good = [CheckSpec(check_item="count is 3", check_func=CHECK_COUNT)]
    for _ in range(2):  # the second time from memory: same verdict, same result
        assert services.envs.evaluate_env(ME, env.id, EvaluateRequest(checks=good)).reward == 1.0
    refused = CheckSpec(check_item="escape", check_func="def check_func(s):\n    return ().__class__.__bases__\n")
    with pytest.raises(InvalidRequest) as caught:
        services.envs.evaluate_env(ME, env.id, EvaluateRequest(checks=[*good, refused]))
    assert caught.value.field == "checks.1.check_func"
    with pytest.raises(InvalidRequest):  # a refused source is never remembered
        services.envs.evaluate_env(ME, env.id, EvaluateRequest(checks=[refused]))
