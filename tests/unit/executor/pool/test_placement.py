"""The placement protocol between a session and whatever places it (the pool in
production): a :class:`Session` driven by a scripted placement and scripted sandboxes,
no Docker. Covers first placement, the handle closing with a lost or dead sandbox (no
re-placement, no state kept), leaving a retiring one with the state read from it,
closing, and that ``session.py`` does not know the pool."""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest
from memory_driver import KnownReply, MemoryDriver
from sandpit.executor.errors import SandboxLost, SessionClosed, SessionError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool import session as session_module
from sandpit.executor.pool.placement import Placement, SandboxSlot, SessionSpec
from sandpit.executor.pool.session import Session, StartedCall
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.results import CallResult, EncodedValue, OpenedState, Snapshot


class ScriptedSandbox:
    """A sandbox whose runner answers ``call`` with a counter increment."""

    def __init__(self, name: str) -> None:
        self.id = name
        self.alive = True
        self.retiring = False
        self.lose_next: str | None = None
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.state: dict[str, EncodedValue] = {}
        """What PID 1 would answer ``snapshot`` with."""

    def submit(self, op: str, timeout_s: float | None = None, **fields: object) -> KnownReply:
        return KnownReply(self.request(op, timeout_s, **fields))

    def request(self, op: str, timeout_s: float | None = None, **fields: object) -> dict[str, Any]:
        self.requests.append((op, dict(fields)))
        if self.lose_next is not None:
            status, self.lose_next = self.lose_next, None
            self.alive = False
            raise SandboxLost("the runner stopped answering", self.id, status=status)
        if op == "call":
            self.state["count"] = ["j", len(self.requests)]
            self.state.pop("gone", None)
            return {"status": "ok", "observation": "bumped", "duration_ms": 0.1,
                    "delta": {"set": {"count": ["j", len(self.requests)]}, "del": ["gone"]}}
        if op == "snapshot":
            return {"status": "ok", "snapshot": dict(self.state)}
        return {"status": "ok"}

    def check_churn(self) -> bool:
        return self.retiring


class ScriptedPlacement:
    """Places every session in a new :class:`ScriptedSandbox` and records what happened."""

    def __init__(self) -> None:
        self.sandboxes: list[ScriptedSandbox] = []
        self.log: list[tuple[str, str, str]] = []
        self.placed_with: list[dict[str, EncodedValue]] = []

    def place(self, spec: SessionSpec,
              snapshot: dict[str, EncodedValue]) -> tuple[SandboxSlot, OpenedState, list[dict[str, str]]]:
        sandbox = ScriptedSandbox(f"s{len(self.sandboxes)}")
        self.sandboxes.append(sandbox)
        self.placed_with.append(dict(snapshot))
        self.log.append(("place", sandbox.id, spec.session_id))
        sandbox.state = {"count": ["j", 0], "gone": ["j", 1], **snapshot}
        opened = OpenedState() if snapshot else OpenedState(attributes=dict(sandbox.state), digest="d" * 64)
        return sandbox, opened, []

    def release(self, sandbox: SandboxSlot, session_id: str, close: bool = True) -> None:
        self.log.append(("release" if close else "release-open", sandbox.id, session_id))

    def forget(self, sandbox: SandboxSlot, session_id: str) -> None:
        self.log.append(("forget", sandbox.id, session_id))


def _open(placement: ScriptedPlacement, snapshot: dict[str, EncodedValue] | None = None) -> Session:
    spec = SessionSpec(session_id="abc", tenant="t", profile=ResourceProfile(), source="class A: pass",
                       class_name="A", init_config={})
    session = Session(placement=placement, spec=spec)
    session.open(snapshot or {})
    return session


def test_the_pool_and_the_scripts_are_placements() -> None:
    placements: list[Placement] = [SandboxPool(MemoryDriver()), ScriptedPlacement()]  # structural: checked by mypy
    slot: SandboxSlot = ScriptedSandbox("x")
    assert all(callable(p.place) and callable(p.release) and callable(p.forget) for p in placements)
    assert slot.alive and not slot.retiring


def test_first_placement_then_calls_go_to_that_sandbox() -> None:
    placement = ScriptedPlacement()
    session = _open(placement, {"extra": ["j", "kept"]})
    assert placement.log == [("place", "s0", "abc")] and placement.placed_with == [{"extra": ["j", "kept"]}]
    assert session.take_opened() == OpenedState()  # opened with a snapshot: the caller has the state
    result = session.call("bump", {"by": 1})
    assert result.status == "ok" and not result.recovered
    assert result.delta.set == {"count": ["j", 1]} and result.delta.deleted == ["gone"]
    assert session.state() == {"count": 1, "extra": "kept"}  # read from the sandbox, not kept here
    assert placement.sandboxes[0].requests == [("call", {"session": "abc", "name": "bump", "arguments": {"by": 1}}),
                                               ("snapshot", {"session": "abc"})]
    with pytest.raises(SessionError, match="opened already"):
        session.open({})


def test_the_opened_state_is_handed_over_once() -> None:
    session = _open(ScriptedPlacement())
    first = session.take_opened()
    assert first.attributes == {"count": ["j", 0], "gone": ["j", 1]} and first.digest == "d" * 64
    assert session.take_opened() == OpenedState()


def test_keyed_changes_are_passed_on_unapplied() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    keyed = ["k", {"v": 2, "ops": [["s", ["a"], 1]]}]
    placement.sandboxes[0].request = lambda op, timeout_s=None, **fields: {  # type: ignore[method-assign]
        "status": "ok", "observation": "", "delta": {"set": {"big": keyed}, "del": []}}
    assert session.call("bump").delta.set == {"big": keyed}  # for the holder of the previous state to apply


@pytest.mark.parametrize("delta", [{"set": {"x": ["k"]}, "del": []}, {"set": [], "del": []},
                                   {"set": {"x": ["j", 1]}, "del": [1]}, "nonsense"])
def test_a_malformed_delta_is_a_session_error(delta: object) -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    placement.sandboxes[0].request = lambda op, timeout_s=None, **fields: {  # type: ignore[method-assign]
        "status": "ok", "observation": "", "delta": delta}
    with pytest.raises(SessionError, match="malformed delta"):
        session.call("bump")


def test_a_lost_sandbox_closes_the_handle_and_nothing_is_placed_again() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    session.call("bump")
    placement.sandboxes[0].lose_next = "timeout"
    lost = session.call("bump")
    assert lost.status == "timeout" and "sandbox stopped responding" in lost.observation
    assert lost.delta.set == {} and not lost.recovered
    assert placement.log[-1] == ("forget", "s0", "abc")
    assert session.closed and session.lost == "timeout"
    for request in (lambda: session.call("bump"), session.state, session.read_state, session.describe,
                    lambda: session.restore(Snapshot(attributes={}))):
        with pytest.raises(SessionClosed):
            request()
    assert len(placement.sandboxes) == 1  # never re-placed
    session.close()
    assert placement.log[-1] == ("forget", "s0", "abc")  # nothing left to release


def test_a_sandbox_that_died_between_requests_closes_the_handle() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    placement.sandboxes[0].alive = False
    with pytest.raises(SessionClosed, match="sandbox was lost"):
        session.call("bump")
    assert session.closed and placement.log[1:] == [("forget", "s0", "abc")]


def test_a_restore_whose_sandbox_is_lost_raises_and_closes_the_handle() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    placement.sandboxes[0].lose_next = "crashed"
    with pytest.raises(SandboxLost):
        session.restore(Snapshot(attributes={"count": ["j", 5]}))
    assert session.closed and len(placement.sandboxes) == 1


def test_a_retiring_sandbox_is_left_with_the_state_read_from_it() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    session.call("bump")
    placement.sandboxes[0].retiring = True
    assert session.call("bump").status == "ok"
    assert placement.log[1:] == [("release", "s0", "abc"), ("place", "s1", "abc")]
    assert placement.placed_with[-1] == {"count": ["j", 1]}  # the sandbox's own state, not a host copy


def test_close_releases_the_slot_once_and_ends_the_session() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    session.close()
    session.close()
    assert placement.log == [("place", "s0", "abc"), ("release", "s0", "abc")]
    with pytest.raises(SessionClosed):
        session.call("bump")
    with pytest.raises(SessionClosed):
        session.state()


def test_the_session_module_does_not_know_the_pool() -> None:
    tree = ast.parse(inspect.getsource(session_module))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "pool" not in imported and "sandbox" not in imported
    assert not any(isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr in {
        "_place", "_release", "_forget", "_reserve", "_reserve_slot"} for node in ast.walk(tree))


def test_the_pool_refuses_to_release_a_sandbox_it_does_not_own() -> None:
    with pytest.raises(TypeError, match="not a sandbox"):
        SandboxPool(MemoryDriver()).release(ScriptedSandbox("foreign"), "abc")


def _answer(placement: ScriptedPlacement, reply: dict[str, Any]) -> None:
    placement.sandboxes[0].request = lambda op, timeout_s=None, **fields: dict(reply)  # type: ignore[method-assign]


@pytest.mark.parametrize(("reply", "starved", "cpu_ms"), [
    ({"status": "timeout", "cpu_ms": 40.0, "wait_ms": 9_000.0}, True, 40.0),  # runnable, no CPU given
    ({"status": "timeout", "cpu_ms": 9_000.0, "wait_ms": 10.0}, False, 9_000.0),  # a loop with its CPU
    ({"status": "timeout"}, False, None),  # a runner that measured nothing: the environment's limit
    ({"status": "timeout", "cpu_ms": "40", "wait_ms": 9e9}, False, None),  # malformed: dropped
    ({"status": "timeout", "cpu_ms": float("nan"), "wait_ms": True}, False, None),
    ({"status": "crashed", "not_started": True}, True, None),  # the process never started
    ({"status": "crashed", "not_started": "yes"}, False, None),
    ({"status": "error", "cpu_ms": 1.0, "wait_ms": 9_000.0, "not_started": True}, False, 1.0),
])
def test_what_the_runner_measured_becomes_the_starved_verdict(reply: dict[str, Any], starved: bool,
                                                             cpu_ms: float | None) -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    _answer(placement, {"observation": "x", **reply})
    limit_s, cpus = ResourceProfile().call_timeout_s, ResourceProfile().cpus
    assert (limit_s, cpus) == (10.0, 0.5)  # what the measurements above are scaled to
    result = session.call("bump")
    assert (result.starved, result.cpu_ms, result.sandbox_lost) == (starved, cpu_ms, False)


def test_a_lost_sandbox_is_reported_as_lost() -> None:
    placement = ScriptedPlacement()
    session = _open(placement)
    placement.sandboxes[0].lose_next = "timeout"  # the watchdog gave up on the runner
    result = session.call("bump")
    assert (result.status, result.sandbox_lost, result.starved) == ("timeout", True, False)


def test_a_session_closed_by_a_loss_says_so_and_one_closed_on_purpose_does_not() -> None:
    from sandpit.executor.errors import SessionLost

    placement = ScriptedPlacement()
    session = _open(placement)
    placement.sandboxes[0].alive = False  # found dead before the request ran
    with pytest.raises(SessionLost, match="lost"):
        session.call("bump")
    with pytest.raises(SessionLost):  # and every later request
        session.read_state()
    closed = _open(ScriptedPlacement())
    closed.close()
    with pytest.raises(SessionClosed) as info:
        closed.call("bump")
    assert not isinstance(info.value, SessionLost)


def test_a_call_started_without_waiting_is_the_calls_result() -> None:
    placement = ScriptedPlacement()
    session, alone = _open(placement), _open(ScriptedPlacement())
    started = session.start_call("bump", {"by": 1})
    assert isinstance(started, StartedCall) and started.answered(0)
    assert not session.locked.acquire(blocking=False)  # the call holds the session until finished
    result, reference = started.finish(), alone.call("bump", {"by": 1})
    assert (result.status, result.observation, result.delta) == (reference.status, reference.observation,
                                                                 reference.delta)
    assert session.locked.acquire(blocking=False)
    assert session.start_call("bump") is None  # another request holds the session: nothing sent
    session.locked.release()
    rejected = session.start_call("_secret")
    assert isinstance(rejected, CallResult) and rejected.status == "rejected"
    placement.sandboxes[0].retiring = True  # moving the session is blocking work: not started here
    assert session.start_call("bump") is None
    assert len([r for r in placement.sandboxes[0].requests if r[0] == "call"]) == 1
    placement.sandboxes[0].retiring = False
    placement.sandboxes[0].lose_next = "crashed"
    lost = session.start_call("bump")
    assert isinstance(lost, StartedCall) and not lost.answered(0)  # finishing a loss is work for a thread
    assert lost.finish().status == "crashed" and session.closed
    assert session.start_call("bump") is None and ("forget", "s0", "abc") in placement.log
