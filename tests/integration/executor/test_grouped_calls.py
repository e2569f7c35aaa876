"""Grouped calls (``call_many``, the runner's ``calls`` request) on real sandboxes: each
call's result is the one it gets alone; a call that loops, kills its process or returns
a huge result fails (or is capped) alone; a closed session is that call's error; PID 1
refuses a malformed group whole and answers an unknown session as that call's fault."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor import call_many
from sandpit.executor.docker import docker_pool
from sandpit.executor.errors import SessionClosed, SessionError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.executor.results import CallResult
from sandpit.sandbox_images.runner.limits import MAX_GROUP_CALLS

from ..conftest import FAST, PROBE_SOURCE, TENANT

pytestmark = pytest.mark.docker



@pytest.fixture(scope="module")
def wide_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """Eight sessions per sandbox, so a test's sessions share one sandbox."""
    with docker_pool(pool_settings("grouped", sessions_per_sandbox=8, pool_size=0, idle_timeout_s=300.0)) as pool:
        yield pool


@pytest.fixture
def sessions(wide_pool: SandboxPool) -> Iterator[list[Session]]:
    """Six open Probe sessions of one sandbox (counters 0..5), closed at teardown."""
    opened = [wide_pool.open_session(tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                                     init_config={"counter": i}, profile=wide_pool.profile(overrides=FAST))
              for i in range(6)]
    assert len({s._sandbox.id for s in opened}) == 1
    yield opened
    for session in opened:
        session.close()


def _sent(session: Session, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the ops of the requests sent to ``session``'s sandbox."""
    sandbox = session._sandbox
    ops: list[str] = []
    real = sandbox.submit

    def submit(op: str, timeout_s: float | None = None, **fields: object) -> Any:
        ops.append(op)
        return real(op, timeout_s, **fields)

    monkeypatch.setattr(sandbox, "submit", submit)
    return ops


def _same(grouped: CallResult, alone: CallResult) -> None:
    assert (grouped.status, grouped.observation, grouped.delta, grouped.stdout, grouped.stderr,
            grouped.observation_truncated) == (alone.status, alone.observation, alone.delta, alone.stdout,
                                               alone.stderr, alone.observation_truncated)


CALLS = [("bump", {"by": 2}), ("run", {"code": "print('out')\nraise ValueError('no')"}),
         ("bump", {"by": "x"}), ("_private", {}), ("run", {"code": "self.log = {'a': [1, 2]}\nresult = 7"})]


def test_grouped_call_equals_the_same_call_alone(wide_pool: SandboxPool, monkeypatch: pytest.MonkeyPatch) -> None:

    def open_one() -> Session:
        return wide_pool.open_session(tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                                      init_config={"counter": 3}, profile=wide_pool.profile(overrides=FAST))

    group = [open_one() for _ in CALLS]
    single = [open_one() for _ in CALLS]
    try:
        ops = _sent(group[0], monkeypatch)
        grouped = call_many([(s, name, args, "sandpit") for s, (name, args) in zip(group, CALLS, strict=True)])
        assert ops == ["calls"]  # one frame for the calls that reach the sandbox (_private is rejected here)
        for outcome, session, (name, args) in zip(grouped, single, CALLS, strict=True):
            assert isinstance(outcome, CallResult)
            _same(outcome, session.call(name, args))
        assert [s.state() for s in group] == [s.state() for s in single]
        envscaler = call_many([(group[0], "bump", {"by": 1}, "envscaler"), (group[1], "nope", {}, "envscaler")])
        _same(envscaler[0], single[0].call("bump", {"by": 1}, "envscaler"))  # type: ignore[arg-type]
        _same(envscaler[1], single[1].call("nope", {}, "envscaler"))  # type: ignore[arg-type]
    finally:
        for session in group + single:
            session.close()


def test_a_call_that_loops_crashes_or_is_huge_fails_alone(sessions: list[Session]) -> None:
    loops, dies, huge, fine = sessions[:4]
    outcomes = call_many([
        (loops, "run", {"code": "self.counter = -1\nwhile True:\n    pass"}, "sandpit"),
        (dies, "run", {"code": "self.counter = -1\nos._exit(3)"}, "sandpit"),
        (huge, "run", {"code": "result = 'x' * (8 << 20)"}, "sandpit"),
        (fine, "bump", {"by": 10}, "sandpit"),
    ])
    assert [o.status for o in outcomes if isinstance(o, CallResult)] == ["timeout", "crashed", "ok", "ok"], outcomes
    assert isinstance(outcomes[2], CallResult) and outcomes[2].observation_truncated
    assert isinstance(outcomes[3], CallResult) and outcomes[3].observation == "13"
    # only the failed calls' sessions were restarted, from their last good state
    assert loops.call("bump").observation == "1" and dies.call("bump").observation == "2"
    assert fine.state() == {"counter": 13, "log": [10]} and not any(s.closed for s in sessions)


def test_a_closed_session_is_that_calls_error(sessions: list[Session]) -> None:
    sessions[1].close()
    outcomes = call_many([(s, "bump", {"by": 1}, "sandpit") for s in sessions[:3]])
    assert isinstance(outcomes[1], SessionClosed)
    assert [o.observation for o in (outcomes[0], outcomes[2]) if isinstance(o, CallResult)] == ["1", "3"]
    with pytest.raises(ValueError, match="twice"):
        call_many([(sessions[0], "bump", {}, "sandpit"), (sessions[0], "bump", {}, "sandpit")])


@pytest.mark.parametrize("calls,message", [
    ("not a list", "must be a list"),
    ([], "must be a list"),
    ([{"session": "s", "name": "bump", "arguments": {}}] * (MAX_GROUP_CALLS + 1), "must be a list"),
    (["not an object"], "calls[0]: field 'session'"),
    ([{"name": "bump"}], "calls[0]: field 'session'"),
    ([{"session": "x" * 1000, "name": "bump"}], "calls[0]: field 'session'"),
])
def test_pid1_refuses_a_malformed_group_whole(sessions: list[Session], calls: object, message: str) -> None:
    reply = sessions[0]._sandbox.request("calls", calls=calls)
    assert reply["status"] == "fault" and message in reply["message"], reply
    assert sessions[0].call("bump").observation == "1"  # PID 1 goes on


def test_pid1_answers_a_session_twice_whole_and_an_unknown_one_alone(sessions: list[Session]) -> None:
    sandbox = sessions[0]._sandbox
    twice = sandbox.request("calls", calls=[{"session": sessions[0].id, "name": "bump", "arguments": {}}] * 2)
    assert twice["status"] == "fault" and "named twice" in twice["message"]
    assert sessions[0].state()["counter"] == 0  # nothing ran
    reply = sandbox.request("calls", calls=[
        {"session": sessions[0].id, "name": "bump", "arguments": {"by": 5}},
        {"session": "no-such-session", "name": "bump", "arguments": {}},
        {"session": sessions[1].id, "name": "bump", "arguments": {"by": "x"}}])
    results = reply["results"]
    assert reply["status"] == "ok" and [r["status"] for r in results] == ["ok", "fault", "error"]
    assert "unknown session" in results[1]["message"] and all("id" not in r for r in results)
    with pytest.raises(SessionError):  # what the host makes of a grouped call's fault
        sessions[0].finish_call(lambda: results[1], 0.0)


def test_a_group_of_large_replies_comes_in_parts(sessions: list[Session]) -> None:
    code = "self.blob = str(self.counter) * (3 << 20)\nresult = len(self.blob)"
    outcomes = call_many([(s, "run", {"code": code}, "sandpit") for s in sessions[1:4]])
    assert [o.observation for o in outcomes if isinstance(o, CallResult)] == [str(3 << 20)] * 3
    for session, outcome, counter in zip(sessions[1:4], outcomes, (1, 2, 3), strict=True):
        assert isinstance(outcome, CallResult) and outcome.delta.set["blob"] == ["j", str(counter) * (3 << 20)]
        assert session.call("bump").observation == str(counter + 1)
