"""Pool-level behaviour on the real Docker Engine: host-side watchdog, idle reaping,
capacity limits, tenant separation. Each test owns its pool and checks it leaks nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import docker
import pytest
from sandpit.executor.docker import docker_pool, engine
from sandpit.executor.errors import CapacityError, SessionClosed
from sandpit.executor.pool import SandboxPool
from sandpit.executor.profiles import ProfileOverrides
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.settings import ExecutorSettings

pytestmark = [pytest.mark.docker, pytest.mark.slow]

COUNTER = '''
class Counter:
    def __init__(self, init_config):
        self.count = init_config.get("start", 0)
    def add(self, n: int = 1):
        self.count += n
        return self.count
'''


def _docker() -> docker.DockerClient:
    try:
        client = docker.from_env()
        client.ping()
        return client
    except docker.errors.DockerException as exc:
        if os.environ.get("SANDPIT_REQUIRE_DOCKER"):
            raise
        pytest.skip(f"Docker Engine unavailable: {exc}")


@contextmanager
def make_pool(**overrides: object) -> Iterator[SandboxPool]:
    client = _docker()
    settings = ExecutorSettings(**{"pool_size": 0, "watchdog_grace_s": 1.0, **overrides})
    pool = docker_pool(settings, client=client)
    try:
        pool.start()
    except Exception as exc:
        if "sandpit image build" in str(exc) and not os.environ.get("SANDPIT_REQUIRE_DOCKER"):
            pytest.skip(str(exc))
        raise
    try:
        yield pool
    finally:
        pool.close()
        left = engine.list_sandboxes(client, pool=pool.id)
        assert not left, f"pool {pool.id} leaked containers: {[c.name for c in left]}"


def test_watchdog_kills_an_unresponsive_runner_and_the_handle_closes() -> None:
    with make_pool() as pool:
        profile = pool.profile(overrides=ProfileOverrides(call_timeout_s=1.0))
        session = pool.open_session(tenant="t-watchdog", source=COUNTER, class_name="Counter",
                                    init_config={"start": 10}, profile=profile)
        assert session.call("add", {"n": 5}).observation == "15"
        sandbox = session._sandbox
        assert sandbox is not None
        pool.driver.client.containers.get(sandbox.container_id).pause()  # runner frozen: no reply ever
        started = time.monotonic()
        result = session.call("add", {"n": 1})
        waited = time.monotonic() - started
        assert result.status == "timeout", result
        # 2 x call timeout + grace is the watchdog bound
        assert waited <= 2 * 1.0 + 1.0 + 2.0, waited
        assert engine.container_outcome(pool.driver.client, sandbox.container_id)[0] == "missing"
        assert session.closed and session.lost == "timeout"
        with pytest.raises(SessionClosed):
            session.call("add", {"n": 1})
        session.close()


def test_docker_kill_mid_episode_recovers_from_the_kept_state() -> None:
    with make_pool() as pool:
        session = RecoveringSession(pool, tenant="t-kill", source=COUNTER, class_name="Counter")
        for _ in range(3):
            session.call("add", {"n": 2})
        pool.driver.client.containers.get(session._session._sandbox.container_id).kill()  # type: ignore[attr-defined]
        first = session.call("add", {"n": 1})
        if first.status == "ok":  # death noticed before the call was sent: re-opened at once
            assert first.recovered and first.observation == "7"
        else:
            assert first.status == "crashed", first
            second = session.call("add", {"n": 1})
            assert second.status == "ok" and second.recovered and second.observation == "7"
        assert session.state() == {"count": 7}
        session.close()


def test_idle_sandboxes_are_removed_after_the_idle_timeout() -> None:
    with make_pool(idle_timeout_s=1.0) as pool:
        session = pool.open_session(tenant="t-idle", source=COUNTER, class_name="Counter")
        container_id = session._sandbox.container_id  # type: ignore[union-attr]
        session.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if engine.container_outcome(pool.driver.client, container_id)[0] == "missing":
                break
            time.sleep(0.25)
        assert engine.container_outcome(pool.driver.client, container_id)[0] == "missing"
        assert pool.stats()["sandboxes"] == 0


def test_capacity_error_creates_nothing_and_clears_when_a_slot_frees() -> None:
    with make_pool(max_sandboxes=1) as pool:
        first = pool.open_session(tenant="t-cap", source=COUNTER, class_name="Counter")
        before = {c.id for c in engine.list_sandboxes(pool.driver.client, pool=pool.id)}
        with pytest.raises(CapacityError) as info:
            pool.open_session(tenant="t-cap-other", source=COUNTER, class_name="Counter")
        assert info.value.retry_after_s > 0
        assert {c.id for c in engine.list_sandboxes(pool.driver.client, pool=pool.id)} == before
        assert pool.stats()["sessions"] == 1
        first.close()
        # the freed sandbox belongs to tenant t-cap: another tenant needs it removed first
        second = pool.open_session(tenant="t-cap", source=COUNTER, class_name="Counter")
        assert second.call("add").observation == "1"
        second.close()


def test_tenants_never_share_a_sandbox_and_labels_carry_the_tenant() -> None:
    with make_pool(sessions_per_sandbox=4) as pool:
        a1 = pool.open_session(tenant="tenant-a", source=COUNTER, class_name="Counter")
        a2 = pool.open_session(tenant="tenant-a", source=COUNTER, class_name="Counter")
        b1 = pool.open_session(tenant="tenant-b", source=COUNTER, class_name="Counter")
        assert a1._sandbox is a2._sandbox, "same tenant should be packed into one sandbox"
        assert b1._sandbox is not a1._sandbox
        for session, tenant in ((a1, "tenant-a"), (b1, "tenant-b")):
            labels = pool.driver.client.containers.get(session._sandbox.container_id).labels  # type: ignore[union-attr]
            assert labels[engine.LABEL] == "1" and labels[engine.LABEL_TENANT] == tenant
        for session in (a1, a2, b1):
            session.close()


def test_hostile_open_arguments_are_refused_before_any_container_starts() -> None:
    with make_pool() as pool:
        for kwargs in (
            {"tenant": "", "source": COUNTER, "class_name": "Counter"},
            {"tenant": "t", "source": COUNTER, "class_name": "not an identifier"},
            {"tenant": "t", "source": COUNTER, "class_name": "Counter", "init_config": ["not", "a", "dict"]},
            {"tenant": "t", "source": "x" * (5 * 1024 * 1024), "class_name": "Counter"},
        ):
            with pytest.raises(ValueError):
                pool.open_session(**kwargs)  # type: ignore[arg-type]
        assert pool.stats()["sandboxes"] == 0


def test_at_capacity_an_idle_sandbox_of_another_profile_or_tenant_is_reclaimed() -> None:
    with make_pool(max_sandboxes=1) as pool:
        first = pool.open_session(tenant="t-reclaim", source=COUNTER, class_name="Counter")
        first.close()  # its sandbox is now warm for (t-reclaim, default profile)
        lowered = pool.profile(overrides=ProfileOverrides(call_timeout_s=3))
        other = pool.open_session(tenant="t-reclaim", source=COUNTER, class_name="Counter", profile=lowered)
        assert other.call("add").status == "ok"
        with pytest.raises(CapacityError):  # busy, not idle: nothing to reclaim
            pool.open_session(tenant="t-reclaim-b", source=COUNTER, class_name="Counter")
        other.close()
        tenant_b = pool.open_session(tenant="t-reclaim-b", source=COUNTER, class_name="Counter")
        assert tenant_b.call("add").status == "ok"
        tenant_b.close()


FILL_TMP = ("def check_func(final_state):\n    for i in range(3000):\n"
            "        open(f'/tmp/f{i}', 'w').close()\n    return True\n")
"""A check whose leftovers make the recycle of its sandbox slow (3,000 files to remove)."""
LEAVE_IN_WORK = "def check_func(final_state):\n    open('/work/left', 'w').write('x')\n    return True\n"
"""A check that leaves a file the runner cannot remove (/work is not listable): unclean."""
PASSING_CHECK = "def check_func(final_state):\n    return final_state['count'] == 1\n"


def _batch(pool: SandboxPool, source: str) -> list[tuple[str, bool]]:
    state = {"count": ["j", 1]}
    results = pool.run_checks(tenant="t", checks=[{"check_item": "x", "check_func": source}],
                              initial_state=state, final_state=state)
    return [(r.status, r.passed) for r in results]


def _wait_recycled(pool: SandboxPool) -> dict[str, object]:
    deadline = time.monotonic() + 30
    while pool.stats()["recycling"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return pool.stats()


def test_a_batch_replies_before_its_sandbox_is_recycled_and_the_next_one_waits_for_it() -> None:
    with make_pool() as pool:
        assert _batch(pool, FILL_TMP) == [("ok", True)]
        stats = pool.stats()
        # the reply came back while the runner still empties /tmp: not warm yet, not placeable
        assert stats["recycling"] == 1 and stats["idle"] == 0 and stats["sandboxes"] == 1, stats
        # the next batch waits for that sandbox instead of starting a container, and finds /tmp empty
        assert _batch(pool, "def check_func(final_state):\n    import os\n    return os.listdir('/tmp') == []\n") \
            == [("ok", True)]
        assert len(pool.started_ms) == 1
        stats = _wait_recycled(pool)
        assert stats["recycling"] == 0 and stats["idle"] == 1 and not stats["failures"].get("unclean"), stats


def test_an_unclean_recycle_off_the_callers_path_still_destroys_the_sandbox() -> None:
    with make_pool() as pool:
        assert _batch(pool, LEAVE_IN_WORK) == [("ok", True)]
        stats = _wait_recycled(pool)
        assert stats["failures"].get("unclean") == 1 and stats["sandboxes"] == 0 and stats["idle"] == 0, stats
        deadline = time.monotonic() + 30
        while engine.list_sandboxes(pool.driver.client, pool=pool.id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engine.list_sandboxes(pool.driver.client, pool=pool.id)  # the container is gone
        assert _batch(pool, PASSING_CHECK) == [("ok", True)]  # in a new sandbox
        assert len(pool.started_ms) == 2
