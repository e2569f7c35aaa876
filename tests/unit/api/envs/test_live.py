"""The live-session cache (:mod:`sandpit.api.envs.live`): closing it at shutdown closes
every session, several at a time, and a session whose close fails does not keep the others
open."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from sandpit.api.db.store import PendingBlobs, encode_state
from sandpit.api.envs.live import LiveEnv, LiveEnvs


class ClosingSession:
    """What :meth:`LiveEnvs.close` uses of a session: ``close()``, counted; ``meet`` makes
    it wait at a barrier first (closes that run one at a time never meet)."""

    def __init__(self, meet: threading.Barrier | None = None, fails: bool = False) -> None:
        self.meet = meet
        self.fails = fails
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        if self.meet is not None:
            self.meet.wait(timeout=30)
        if self.fails:
            raise RuntimeError("the sandbox went away")


def entry(session: ClosingSession) -> LiveEnv:
    return LiveEnv(session=cast(Any, session), cache=encode_state({}, PendingBlobs()), episode=1, step=0,
                   toolset=cast(Any, None), tenant="t", environment_id="e",
                   expires_at=datetime(2100, 1, 1, tzinfo=UTC))


def test_close_closes_every_session_several_at_once() -> None:
    live = LiveEnvs()
    meet = threading.Barrier(4)
    sessions = [ClosingSession(meet if n < 4 else None) for n in range(40)]
    for n, session in enumerate(sessions):
        live.put(f"env-{n}", entry(session))
    live.close(concurrency=4)
    assert not meet.broken  # four closes were under way at the same time
    assert [s.closes for s in sessions] == [1] * 40
    assert len(live) == 0


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_failing_close_leaves_no_other_session_open(concurrency: int) -> None:
    live = LiveEnvs()
    sessions = [ClosingSession(fails=n % 3 == 0) for n in range(10)]
    for n, session in enumerate(sessions):
        live.put(f"env-{n}", entry(session))
    live.close(concurrency=concurrency)
    assert [s.closes for s in sessions] == [1] * 10
    assert len(live) == 0
    live.close()  # nothing left: no-op
    assert [s.closes for s in sessions] == [1] * 10


def test_a_retired_session_closes_on_another_thread_and_shutdown_waits_for_it() -> None:
    """``retire`` returns before the session's close ends (the close runs on a thread of
    its own); ``close`` at shutdown waits for retired closes, failing ones included, and
    after it ``retire`` closes at once."""
    live = LiveEnvs()
    started, release = threading.Event(), threading.Event()

    class SlowSession(ClosingSession):
        def close(self) -> None:
            started.set()
            assert release.wait(timeout=30)
            super().close()

    slow, failing = SlowSession(), ClosingSession(fails=True)
    live.retire(cast(Any, slow))
    live.retire(cast(Any, failing))
    assert started.wait(timeout=30) and slow.closes == 0  # retire did not wait for it
    live.put("env-0", entry(kept := ClosingSession()))
    threading.Timer(0.2, release.set).start()
    live.close()
    assert (slow.closes, failing.closes, kept.closes) == (1, 1, 1)
    late = ClosingSession()
    live.retire(cast(Any, late))
    assert late.closes == 1  # closed at once: the threads are gone
