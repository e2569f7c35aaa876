"""Live entries and sessions (:mod:`sandpit.api.envs.sessions`) on the fake executor: an
evicted env comes back from its last committed state, and no capacity evicts the least
recently used idle env first."""

from __future__ import annotations

import pytest
from env_calls import ME, create, step
from sandpit.api.app import Services
from sandpit.api.db.store import PendingBlobs, encode_state
from sandpit.api.envs.sessions import InitialStates
from sandpit.api.errors import NoCapacity
from sandpit.executor.errors import CapacityError
from sandpit.executor.fake import FakeExecutor


def test_an_evicted_env_is_restored_from_its_last_committed_state(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=3)
    services.live.drop(env_id)
    assert services.envs.read(ME, env_id).status == "evicted"
    after = step(services, env_id, "bump")
    assert after.recovered and after.observation == "4"
    assert services.live.evict_idle(0) == 1 and env_id not in services.live


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


def test_initial_states_are_per_tenant_and_bounded() -> None:
    states = InitialStates(max_entries=2)
    made = {n: encode_state({"n": ["j", n]}, PendingBlobs()) for n in range(3)}
    for n, cache in made.items():
        states.put("team-a", f"digest-{n}", cache, PendingBlobs())
    assert states.get("team-b", "digest-2") is None  # another tenant's digest space
    assert states.get("team-a", "digest-0") is None  # least recently used: gone
    hit = states.get("team-a", "digest-2")
    assert hit is not None and hit[0] is made[2]
