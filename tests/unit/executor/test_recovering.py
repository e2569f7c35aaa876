"""``RecoveringSession`` (:mod:`sandpit.executor.recovering`) on the fake executor: it keeps
the state from the opened state and each delta (keyed changes resolved, hostile ones
refused with nothing kept), re-opens a lost session from it, and restores onto a lost one."""

from __future__ import annotations

from typing import Any

import pytest
from api_fakes import fake_executor
from sandpit.executor.errors import SessionClosed, SessionError
from sandpit.executor.fake import FakeExecutor, FakeSession
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.results import CallResult, OpenedState, StateDelta


@pytest.fixture
def fake() -> FakeExecutor:
    return fake_executor()


def _open(fake: FakeExecutor) -> RecoveringSession:
    return RecoveringSession(fake, tenant="t", source="<never run>", class_name="Counter")


def _answer(session: RecoveringSession, delta: dict[str, Any]) -> None:
    """The wrapped session's next call answers ``delta`` (keyed entries, as a sandbox sends)."""
    def call(name: str, arguments: dict[str, Any] | None = None, rules: str = "sandpit") -> CallResult:
        return CallResult(status="ok", observation="", duration_ms=1.0, delta=StateDelta(set=delta))
    session._session.call = call  # type: ignore[method-assign]


def test_it_goes_on_from_its_own_state_after_a_loss(fake: FakeExecutor) -> None:
    session = _open(fake)
    assert session.call("bump", {"by": 2}).observation == "2"
    first = session.id
    fake.fail_call("crashed", lost=True)
    assert session.call("bump").status == "crashed"
    again = session.call("bump", {"by": 3})
    assert (again.observation, again.recovered, session.recoveries) == ("5", True, 1)
    assert session.id != first and fake.sessions[first].closed
    assert session.state() == {"count": 5, "records": {}, "log": ["bump 2", "bump 3"]}
    later = session.call("bump")
    assert not later.recovered


def test_keyed_changes_are_resolved_and_hostile_ones_refused(fake: FakeExecutor) -> None:
    session = _open(fake)
    session.call("set_record", {"key": "a", "value": "x"})
    before = session.read_state()["records"]
    _answer(session, {"records": ["k", {"v": 2, "ops": [["s", ["b"], {"value": "y"}]]}]})
    result = session.call("set_record", {"key": "b", "value": "y"})
    assert result.delta.set["records"] == ["j", {"a": {"value": "x"}, "b": {"value": "y"}}]
    assert session.read_state()["records"][1]["a"] is before[1]["a"]  # untouched: the same object
    kept = session.read_state()
    for hostile in (["k", {"v": 2, "ops": [["d", ["missing"]]]}], ["k", "ops"], ["k", {"v": 2, "ops": [1]}]):
        _answer(session, {"records": hostile, "count": ["j", 99]})
        with pytest.raises(SessionError, match="does not apply"):
            session.call("bump")
        assert session.read_state() == kept  # nothing of the refused delta was kept


def test_a_state_named_by_digest_only_is_read_from_the_sandbox(fake: FakeExecutor,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    opened = fake.open_session

    def forked(**kwargs: Any) -> FakeSession:
        session = opened(**kwargs)
        session.take_opened = lambda: OpenedState(digest="d" * 64)  # type: ignore[method-assign]
        return session
    monkeypatch.setattr(fake, "open_session", forked)
    assert _open(fake).state() == {"count": 0, "records": {}, "log": []}


def test_restore_onto_a_lost_session_opens_a_new_one_and_close_ends_it(fake: FakeExecutor) -> None:
    session = _open(fake)
    session.call("bump", {"by": 4})
    snapshot = session.snapshot()
    session.call("bump")
    fake.fail_call("oom", lost=True)
    session.call("bump")
    session.restore(snapshot)
    assert session.recoveries == 1 and session.call("bump").observation == "5"
    session.close()
    assert session.closed
    with pytest.raises(SessionClosed):
        session.call("bump")
    with pytest.raises(SessionClosed):
        session.restore(snapshot)
