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
