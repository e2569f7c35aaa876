"""FairScheduler: per-tenant limits, round-robin between tenant queues, timeouts."""

from __future__ import annotations

import threading
import time

import pytest
from sandpit.api.scheduler import FairScheduler, SchedulerBusy


def _hold(scheduler: FairScheduler, tenant: str, limit: int, release: threading.Event, order: list[str],
          timeout_s: float = 5.0) -> threading.Thread:
    def run() -> None:
        with scheduler.slot(tenant, limit, timeout_s):
            order.append(tenant)
            release.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_tenant_at_its_limit_leaves_slots_for_others() -> None:
    scheduler = FairScheduler(slots=4)
    release = threading.Event()
    order: list[str] = []
    noisy = [_hold(scheduler, "noisy", 2, release, order) for _ in range(10)]
    _wait_for(lambda: scheduler.stats()["running"] == 2)
    assert scheduler.stats()["queued"] == {"noisy": 8}
    started = time.monotonic()
    with scheduler.slot("quiet", 2, 1.0) as waited:  # starts at once although 8 noisy calls queue
        assert waited < 0.05
    assert time.monotonic() - started < 0.5
    release.set()
    for thread in noisy:
        thread.join(5)
    assert order.count("noisy") == 10 and scheduler.stats()["running"] == 0


def test_queues_are_served_round_robin() -> None:
    scheduler = FairScheduler(slots=1)
    gate = threading.Event()
    order: list[str] = []
    blocker = _hold(scheduler, "blocker", 1, gate, order)
    _wait_for(lambda: scheduler.stats()["running"] == 1)
    proceed = threading.Event()
    proceed.set()
    threads = []
    for tenant in ["a"] * 4 + ["b"] * 2:  # a queues 4 calls before b queues any
        threads.append(_hold(scheduler, tenant, 1, proceed, order))
        queued = len(threads)
        _wait_for(lambda queued=queued: sum(scheduler.stats()["queued"].values()) == queued)
    gate.set()
    for thread in [blocker, *threads]:
        thread.join(5)
    assert order == ["blocker", "a", "b", "a", "b", "a", "a"]


def test_waiting_too_long_raises_and_leaves_the_queue() -> None:
    scheduler = FairScheduler(slots=1)
    release = threading.Event()
    holder = _hold(scheduler, "t", 1, release, [])
    _wait_for(lambda: scheduler.stats()["running"] == 1)
    with pytest.raises(SchedulerBusy, match="no execution slot"), scheduler.slot("t", 1, 0.05):
        pass
    assert scheduler.stats()["queued"] == {}
    release.set()
    holder.join(5)
    with scheduler.slot("t", 1, 0.05):  # the slot came back
        pass


def test_an_error_in_the_block_frees_the_slot() -> None:
    scheduler = FairScheduler(slots=1)
    with pytest.raises(RuntimeError), scheduler.slot("t", 1, 1.0):
        raise RuntimeError("boom")
    assert scheduler.stats()["running"] == 0
    with pytest.raises(ValueError):
        FairScheduler(slots=0)
