"""The pool over a driver, with no Docker: ``SandboxPool`` on the in-memory driver of
``tests/support/memory_driver.py``. Placement, warm sets, recycling, loss and recovery,
capacity, one-shot jobs and the pool's use of its driver's lifecycle, all through the
driver and handle protocols alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from memory_driver import MemoryDriver, MemorySandbox
from sandpit.executor.errors import ArgumentError, CapacityError, SandboxStartError, SessionClosed
from sandpit.executor.pool import SandboxDriver, SandboxHandle, SandboxPool
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.settings import ExecutorSettings


def settings(**changes: object) -> ExecutorSettings:
    fields: dict[str, object] = {"pool_size": 0, "max_sandboxes": 4, "idle_timeout_s": 60.0, "watchdog_grace_s": 0.0}
    fields.update(changes)
    return ExecutorSettings(**fields)  # type: ignore[arg-type]


@pytest.fixture
def driver() -> MemoryDriver:
    return MemoryDriver()


@pytest.fixture
def pool(driver: MemoryDriver) -> Iterator[SandboxPool]:
    with SandboxPool(driver, settings()) as started:
        yield started


def _wait(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_the_test_driver_and_its_sandboxes_satisfy_the_protocols(driver: MemoryDriver) -> None:
    typed: SandboxDriver = driver  # structural: mypy checks the signatures
    assert isinstance(typed, SandboxDriver)
    assert isinstance(MemorySandbox("x", "t", {}), SandboxHandle)


def test_start_opens_the_driver_with_the_pool_id_and_close_closes_it(driver: MemoryDriver) -> None:
    pool = SandboxPool(driver, settings())
    pool.start()
    assert driver.opened and driver.pool_id == pool.id
    session = pool.open_session(tenant="t1", source="<never run>", class_name="Counter")
    pool.close()
    assert driver.closed
    assert all(s.destroyed for s in driver.started) and session.id  # every sandbox destroyed


def test_a_session_is_placed_stepped_and_its_sandbox_recycled_warm(pool: SandboxPool, driver: MemoryDriver) -> None:
    session = pool.open_session(tenant="t1", source="<never run>", class_name="Counter", init_config={"count": 2})
    result = session.call("bump", {"by": 3})
    assert (result.status, result.observation, result.delta.set) == ("ok", "5", {"count": ["j", 5]})
    assert session.state() == {"count": 5}
    session.close()
    [sandbox] = driver.started
    assert ("recycle", {}) in sandbox.requests and sandbox.alive
    assert pool.stats()["idle"] == 1 and pool.stats()["started"] == 1  # the driver's counters ride along
    again = pool.open_session(tenant="t1", source="<never run>", class_name="Counter")
    assert again.call("bump").observation == "1"
    assert len(driver.started) == 1  # the warm sandbox served it: no second start


def test_a_sandbox_serves_only_its_tenant(pool: SandboxPool, driver: MemoryDriver) -> None:
    pool.open_session(tenant="t1", source="", class_name="Counter").close()
    pool.open_session(tenant="t2", source="", class_name="Counter")
    assert [s.tenant for s in driver.started] == ["t1", "t2"]


def test_a_lost_sandbox_reports_the_call_and_closes_the_handle(pool: SandboxPool, driver: MemoryDriver) -> None:
    session = pool.open_session(tenant="t1", source="", class_name="Counter")
    assert session.take_opened().attributes == {"count": ["j", 0]}
    session.call("bump", {"by": 4})
    driver.started[0].kill()
    lost = session.call("bump")
    assert lost.status == "crashed" and "sandbox died" in lost.observation
    assert driver.started[0].destroyed  # forgotten: destroyed and dropped
    assert session.closed
    with pytest.raises(SessionClosed):
        session.call("bump")
    assert len(driver.started) == 1  # nothing was placed again: recovering is the caller's


def test_a_recovering_session_reopens_from_its_own_state_after_a_loss(pool: SandboxPool,
                                                                     driver: MemoryDriver) -> None:
    session = RecoveringSession(pool, tenant="t1", source="", class_name="Counter")
    assert session.call("bump", {"by": 4}).observation == "4"
    first = session.id
    driver.started[0].kill()
    assert session.call("bump").status == "crashed"
    again = session.call("bump")
    assert again.recovered and again.observation == "5" and session.recoveries == 1  # the lost call left no trace
    assert session.id != first and len(driver.started) == 2 and session.state() == {"count": 5}
    snapshot = session.snapshot()
    session.call("bump")
    driver.started[1].kill()
    session.restore(snapshot)  # restoring onto a lost sandbox opens a new session with it
    assert session.call("bump").observation == "6" and session.recoveries == 2
    session.close()
    with pytest.raises(SessionClosed):
        session.call("bump")


def test_an_unclean_sandbox_is_destroyed_not_reused(pool: SandboxPool, driver: MemoryDriver) -> None:
    session = pool.open_session(tenant="t1", source="", class_name="Counter")
    driver.started[0].dirty = True
    session.close()
    assert driver.started[0].destroyed and pool.stats()["failures"] == {"unclean": 1}
    pool.open_session(tenant="t1", source="", class_name="Counter")
    assert len(driver.started) == 2


def test_capacity_is_bounded_by_max_sandboxes(driver: MemoryDriver) -> None:
    with SandboxPool(driver, settings(max_sandboxes=2, sessions_per_sandbox=1)) as pool:  # a sandbox per session
        pool.open_session(tenant="t1", source="", class_name="Counter")
        pool.open_session(tenant="t1", source="", class_name="Counter")
        with pytest.raises(CapacityError) as refused:
            pool.open_session(tenant="t1", source="", class_name="Counter")
        assert refused.value.retry_after_s > 0


def test_a_failed_start_is_counted_and_frees_its_uid(driver: MemoryDriver) -> None:
    driver.fail_starts = 1
    with SandboxPool(driver, settings(uid_count=1)) as pool:
        with pytest.raises(SandboxStartError):
            pool.open_session(tenant="t1", source="", class_name="Counter")
        assert pool.stats()["failures"] == {"start": 1}
        pool.open_session(tenant="t1", source="", class_name="Counter")  # the one uid is free again


def test_the_warm_set_is_refilled_through_the_driver(driver: MemoryDriver) -> None:
    with SandboxPool(driver, settings(pool_size=2)) as pool:
        assert pool.warm("t1", timeout_s=5.0) == 2
        assert {s.tenant for s in driver.started} == {"t1"} and len(driver.started) == 2


def test_one_shot_jobs_take_a_slot_and_give_it_back(pool: SandboxPool, driver: MemoryDriver) -> None:
    result = pool.execute(tenant="t1", code="print(1)")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "ran 8 bytes\n")
    _wait(lambda: pool.stats()["idle"] == 1)  # recycled off the caller's path, then warm
    assert pool.stats()["sessions"] == 0


def test_release_refuses_what_the_pool_did_not_place(pool: SandboxPool) -> None:
    session = pool.open_session(tenant="t1", source="", class_name="Counter")
    stranger = MemorySandbox(session._sandbox.id, "t1", {})  # type: ignore[union-attr]  # same id, not ours
    with pytest.raises(TypeError, match="not a sandbox of this pool"):
        pool.release(stranger, session.id)
    with pytest.raises(TypeError, match="not a sandbox"):
        pool.forget(object(), session.id)  # type: ignore[arg-type]


def test_releasing_a_dropped_sandbox_is_a_no_op(pool: SandboxPool, driver: MemoryDriver) -> None:
    session = pool.open_session(tenant="t1", source="", class_name="Counter")
    handle = session._sandbox
    pool.forget(handle, session.id)  # type: ignore[arg-type]
    pool.release(handle, session.id)  # type: ignore[arg-type]  # dropped: nothing left to free
    assert pool.stats()["sandboxes"] == 0 and driver.started[0].destroyed


def test_admission_reads_the_handles_memory(driver: MemoryDriver) -> None:
    driver.memory_limit = 64 * 1024 * 1024
    with SandboxPool(driver, settings(sessions_per_sandbox=4, sandbox_memory_headroom_mib=1,
                                      session_memory_estimate_mib=8, memory_sample_s=0.001)) as pool:
        first = pool.open_session(tenant="t1", source="", class_name="Counter")
        driver.started[0].memory_bytes = 60 * 1024 * 1024  # nearly full: no room for one more
        time.sleep(0.01)
        pool.open_session(tenant="t1", source="", class_name="Counter")
        assert len(driver.started) == 2 and first.call("bump").status == "ok"


def test_close_tries_every_sandbox_when_a_removal_fails(driver: MemoryDriver) -> None:
    pool = SandboxPool(driver, settings(sessions_per_sandbox=1, max_sandboxes=8))
    pool.start()
    for _ in range(6):
        pool.open_session(tenant="t1", source="", class_name="Counter")
    assert len(driver.started) == 6
    failing = driver.started[len(driver.started) // 2]

    def broken() -> None:
        raise SandboxStartError("the engine did not answer", failing.id)

    failing.destroy = broken  # type: ignore[method-assign]
    destroyed_by_the_pool: list[str] = []
    close_driver = driver.close

    def close() -> None:
        destroyed_by_the_pool.extend(s.id for s in driver.started if s.destroyed)
        close_driver()

    driver.close = close  # type: ignore[method-assign]
    with pytest.raises(SandboxStartError):
        pool.close()
    assert sorted(destroyed_by_the_pool) == sorted(s.id for s in driver.started if s is not failing)


@pytest.mark.parametrize("value", [float("nan"), float("-inf"), "\ud800", {1, 2}])
def test_a_snapshot_json_cannot_carry_is_refused_before_a_slot_is_taken(pool: SandboxPool, driver: MemoryDriver,
                                                                         value: object) -> None:
    with pytest.raises(ArgumentError, match="snapshot is not JSON-encodable"):
        pool.open_session(tenant="t1", source="", class_name="Counter", snapshot={"count": ["j", value]})
    assert pool.stats()["sessions"] == 0 and driver.started == []
    session = pool.open_session(tenant="t1", source="", class_name="Counter", snapshot={"count": ["j", 3]})
    assert session.state() == {"count": 3} and session.take_opened().attributes is None
    session.close()
