"""PID 1's deadline heap (``pid1_deadlines``): the same expiries, in the same rounds, and
the same wait to the next deadline as a scan of every session's in-flight item (what PID 1
did before it kept a heap), over random sequences of requests sent, answered, re-timed and
failed; and stale entries do not pile up."""

from __future__ import annotations

import random
from typing import Any

import pytest
from sandpit.sandbox_images.runner.pid1_deadlines import COMPACT_MIN, Deadlines


class FakeSession:
    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.current: dict[str, Any] | None = None


def scan(sessions: list[FakeSession], now: float) -> tuple[set[int], float | None]:
    """The reference: every session looked at, as ``Sessions.check_deadlines`` did."""
    due, wait = set(), None
    for session in sessions:
        item = session.current
        if item is None:
            continue
        remaining = item["deadline"] - now
        if remaining <= 0:
            due.add(session.sid)
        else:
            wait = remaining if wait is None else min(wait, remaining)
    return due, wait


@pytest.mark.parametrize("seed", range(20))
def test_expiries_and_waits_equal_a_scan_of_every_session(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible sequence of operations, not a secret
    sessions = [FakeSession(i) for i in range(rng.choice([1, 5, 40]))]
    deadlines = Deadlines(lambda session, item: session.current is item)
    now = 0.0
    for _ in range(600):
        session = rng.choice(sessions)
        op = rng.random()
        if op < 0.35:  # a request sent: a new in-flight item
            session.current = {"token": rng.random()}
            deadlines.arm(session, session.current, now + rng.choice([0.0, 0.5, 1.0, 10.0]))
        elif op < 0.55 and session.current is not None:  # answered in time
            session.current = None
        elif op < 0.65 and session.current is not None:  # re-timed (``hello`` answered)
            deadlines.arm(session, session.current, now + rng.choice([0.1, 10.0]))
        else:  # a round: deadlines checked
            now += rng.choice([0.0, 0.05, 0.3, 2.0])
            expected, _ = scan(sessions, now)
            got = set()
            for owner, item in deadlines.due(now):
                assert owner.current is item
                got.add(owner.sid)
                owner.current = None  # failed: timeout
            assert got == expected
            assert deadlines.next_in(now) == scan(sessions, now)[1]


def test_a_deadline_armed_while_due_ones_are_handled_is_kept() -> None:
    deadlines = Deadlines(lambda session, item: session.current is item)
    first, second = FakeSession(1), FakeSession(2)
    first.current, second.current = {}, {}
    deadlines.arm(first, first.current, 1.0)
    deadlines.arm(second, second.current, 1.5)
    seen = []
    for owner, _item in deadlines.due(2.0):
        seen.append(owner.sid)
        owner.current = {"requeued": True}  # the failed session is re-created: a new request
        deadlines.arm(owner, owner.current, 5.0)
    assert seen == [1, 2]
    assert deadlines.next_in(2.0) == 3.0
    assert {owner.sid for owner, _ in deadlines.due(5.0)} == {1, 2}
    assert deadlines.next_in(5.0) is None


def test_stale_entries_are_dropped_and_never_expire() -> None:
    deadlines = Deadlines(lambda session, item: session.current is item)
    session = FakeSession(1)
    for n in range(10 * COMPACT_MIN):  # calls answered in time, one after the other
        session.current = {"n": n}
        deadlines.arm(session, session.current, 10.0 + n)
        session.current = None
    assert len(deadlines) <= 2 * COMPACT_MIN + 1
    assert list(deadlines.due(1e9)) == []
    assert deadlines.next_in(0.0) is None and len(deadlines) == 0


def test_an_item_whose_deadline_was_changed_outside_is_not_expired_on_the_old_one() -> None:
    deadlines = Deadlines(lambda session, item: session.current is item)
    session = FakeSession(1)
    session.current = {}
    deadlines.arm(session, session.current, 1.0)
    session.current["deadline"] = 9.0  # not armed: the heap never heard of 9.0
    assert list(deadlines.due(2.0)) == []
