"""Reset, restore and fork (:mod:`sandpit.api.envs.episodes`) on the fake executor."""

from __future__ import annotations

import pytest
from env_calls import ME, create, state, step
from sandpit.api.app import Services
from sandpit.api.errors import Conflict, InvalidRequest, NotFound
from sandpit.api.schemas.envs import (
    EnvCreate,
    ForkRequest,
    ResetRequest,
    RestoreRequest,
)
from sandpit.api.schemas.tenants import TenantCreate
from threads import held_elsewhere


def test_restore_discards_later_steps_and_the_session_follows(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    for by in (1, 2, 3):
        step(services, env_id, "bump", by=by)
    env = services.episodes.restore(ME, env_id, RestoreRequest(step=1))
    assert env.step == 1 and state(services, env_id)["count"] == 1
    assert services.history.trajectory(ME, env_id, None, None, 0).count == 1
    assert step(services, env_id, "bump", by=10).observation == "11"
    with pytest.raises(Conflict):
        services.episodes.restore(ME, env_id, RestoreRequest(step=5))


def test_restore_without_a_free_slot_leaves_the_session_to_the_next_request(services: Services,
                                                                            environment_id: str) -> None:
    services.tenants.create(TenantCreate(id="team-a", quotas={"max_running_calls": 1}, create_key=False))
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=1)
    step(services, env_id, "bump", by=2)
    with held_elsewhere(lambda: services.sandboxes.slot("team-a")):
        env = services.episodes.restore(ME, env_id, RestoreRequest(step=1))  # no 429: it needs no slot now
    assert env.step == 1 and env.status == "evicted"
    again = step(services, env_id, "bump", by=10)
    assert again.recovered and again.observation == "11"


def test_forks_share_the_history_and_go_their_own_way(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=1)
    step(services, env_id, "bump", by=2)
    forks = services.episodes.fork(ME, env_id, ForkRequest(step=1, count=2))
    assert forks.count == 2 and all(f.forked_from == env_id and f.step == 1 for f in forks.data)
    assert {f.status for f in forks.data} == {"evicted"}  # sessions start on first use
    a, b = (f.id for f in forks.data)
    assert step(services, a, "bump", by=100).observation == "101"
    assert state(services, b)["count"] == 1 and state(services, env_id)["count"] == 3
    assert len(services.history.trajectory(ME, b, None, None, 0).steps) == 1
    with pytest.raises(InvalidRequest):
        services.episodes.fork(ME, env_id, ForkRequest(count=10_000))


def test_reset_starts_the_next_episode_and_keeps_the_last_one_readable(services: Services,
                                                                         environment_id: str) -> None:
    env_id = create(services, environment_id, init_config={"count": 7})
    step(services, env_id, "bump")
    env = services.episodes.reset(ME, env_id, ResetRequest(init_config={"count": 1}))
    assert (env.episode, env.step) == (2, 0) and state(services, env_id)["count"] == 1
    assert state(services, env_id, 1, episode=1)["count"] == 8
    episodes = services.history.episodes(ME, env_id, 10, 0)
    assert [(e.episode, e.steps) for e in episodes.data] == [(1, 1), (2, 0)]
    with pytest.raises(NotFound):
        state(services, env_id, episode=9)


def test_restoring_an_ended_episode_before_its_end_runs_it_again(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    step(services, env.id, "bump", by=2)
    step(services, env.id, "chat_with_user", content="done")
    restored = services.episodes.restore(ME, env.id, RestoreRequest(step=1))
    assert restored.episode_status == "running" and restored.reward is None
    assert step(services, env.id, "bump").observation == "4"
