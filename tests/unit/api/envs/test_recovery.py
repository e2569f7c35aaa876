"""The API as the one owner of an env's state (:mod:`sandpit.api.envs.steps`,
:mod:`sandpit.api.envs.sessions`) on the fake executor: a lost sandbox closes the session
handle, and the next step re-opens the env from the live head (no database read of the
state) with no acknowledged step lost; a keyed delta is applied once, to the API's copy,
sharing what it did not touch; a keyed delta that does not apply is refused with nothing
committed; a template-forked open names its state by digest and a known digest is never
transferred again."""

from __future__ import annotations

from typing import Any

import pytest
from env_calls import ME, create, state, step
from sandpit.api.app import Services
from sandpit.api.envs import sessions as sessions_module
from sandpit.api.errors import ServiceUnavailable
from sandpit.api.schemas.envs import RestoreRequest
from sandpit.executor.fake import FakeExecutor, FakeSession
from sandpit.executor.results import CallResult, OpenedState, StateDelta


def _no_stored_head(*_: Any) -> None:
    raise AssertionError("the state was read from the database")


def test_the_step_after_a_loss_reopens_from_the_live_head(services: Services, fake: FakeExecutor,
                                                           environment_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=2)
    step(services, env_id, "set_record", key="a", value="x")
    fake.fail_call("oom", tool="bump", lost=True)
    lost = step(services, env_id, "bump", by=5)
    assert lost.status == "oom" and lost.step == 3 and not lost.recovered
    entry = services.live.get(env_id)
    assert entry is not None and entry.session.closed  # the handle closed with its sandbox
    head = entry.cache
    monkeypatch.setattr(sessions_module, "load_state", _no_stored_head)
    again = step(services, env_id, "bump", by=1)
    assert again.recovered and again.observation == "3" and again.step == 4
    newest = list(fake.sessions.values())[-1]
    assert not newest.closed and newest.read_state()["records"] == head.entry("records")  # opened from that head
    monkeypatch.undo()
    assert state(services, env_id)["records"] == {"a": {"value": "x"}}
    assert [s.status for s in services.history.trajectory(ME, env_id, None, None, 0).steps] == ["ok", "ok", "oom", "ok"]


def test_a_stale_live_head_is_not_reused(services: Services, fake: FakeExecutor, environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=2)
    fake.fail_call("crashed", tool="bump", lost=True)
    step(services, env_id, "bump")
    entry = services.live.get(env_id)
    assert entry is not None
    entry.step = 0  # as if another replica had moved the env on since: the live head is not the committed one
    again = step(services, env_id, "bump", by=1)
    assert again.recovered and again.observation == "3"  # from the stored head


def test_a_restore_right_after_a_loss_goes_on_from_the_restored_step(services: Services, fake: FakeExecutor,
                                                                      environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump", by=2)
    step(services, env_id, "bump", by=3)
    fake.fail_call("crashed", tool="bump", lost=True)
    step(services, env_id, "bump")
    services.episodes.restore(ME, env_id, RestoreRequest(step=1))
    after = step(services, env_id, "bump", by=1)
    assert after.observation == "3" and after.step == 2


def _keyed(session: FakeSession, delta: dict[str, Any]) -> None:
    """Make ``session``'s next call answer ``delta`` (as a sandbox would: keyed entries)."""
    def call(name: str, arguments: dict[str, Any] | None = None, rules: str = "sandpit") -> CallResult:
        return CallResult(status="ok", observation="keyed", duration_ms=1.0, delta=StateDelta(set=delta))
    session.call = call  # type: ignore[method-assign]


def test_a_keyed_delta_is_applied_once_to_the_apis_copy(services: Services, fake: FakeExecutor,
                                                        environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "set_record", key="a", value="x")
    step(services, env_id, "set_record", key="b", value="y")
    entry = services.live.get(env_id)
    assert entry is not None
    before = entry.cache.entry("records")
    assert before is not None
    _keyed(list(fake.sessions.values())[-1], {"records": ["k", {"v": 2, "ops": [["s", ["b", "value"], "z"]]}]})
    done = step(services, env_id, "bump")
    assert done.status == "ok"
    after = entry.cache.entry("records")
    assert after is not None and after[1] == {"a": {"value": "x"}, "b": {"value": "z"}}
    assert after[1]["a"] is before[1]["a"]  # untouched records are the same objects: the encoder skips them
    assert before[1]["b"] == {"value": "y"}  # the previous head was not changed in place
    assert state(services, env_id)["records"]["b"] == {"value": "z"}


@pytest.mark.parametrize("keyed", [
    ["k", {"v": 2, "ops": [["d", ["missing"]]]}],  # a key that does not exist
    ["k", {"v": 2, "ops": [["s", ["a", "value", "deeper"], 1]]}],  # a step into a scalar
    ["k", {"v": 2, "ops": "not a list"}],
    ["k", {"v": 3}],
    ["k", None],
])
def test_a_keyed_delta_that_does_not_apply_is_refused_and_nothing_is_committed(
        services: Services, fake: FakeExecutor, environment_id: str, keyed: list[Any]) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "set_record", key="a", value="x")
    _keyed(list(fake.sessions.values())[-1], {"records": keyed, "count": ["j", 99]})
    with pytest.raises(ServiceUnavailable):
        step(services, env_id, "bump")
    assert env_id not in services.live  # the session was dropped
    assert services.history.trajectory(ME, env_id, None, None, 0).count == 1
    assert state(services, env_id) == {"count": 0, "records": {"a": {"value": "x"}}, "log": []}
    assert step(services, env_id, "bump").observation == "1"  # re-attached from the committed head


def test_a_keyed_delta_of_an_attribute_the_state_lacks_is_refused(services: Services, fake: FakeExecutor,
                                                                  environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "bump")
    _keyed(list(fake.sessions.values())[-1], {"nowhere": ["k", {"v": 2, "ops": [["s", [], 1]]}]})
    with pytest.raises(ServiceUnavailable):
        step(services, env_id, "bump")
    assert services.history.trajectory(ME, env_id, None, None, 0).count == 1


def test_a_template_forked_state_is_read_once_per_digest(services: Services, fake: FakeExecutor,
                                                         environment_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    opened = fake.open_session

    def forked(**kwargs: Any) -> FakeSession:
        session = opened(**kwargs)
        if kwargs.get("snapshot") is None:  # a fresh open: named by digest only, as a template fork is
            session.take_opened()
            session.take_opened = lambda: OpenedState(digest="f" * 64)  # type: ignore[method-assign]
            read = session.read_state

            def counted() -> dict[str, Any]:
                reads.append(session.id)
                return read()
            session.read_state = counted  # type: ignore[method-assign]
        return session
    monkeypatch.setattr(fake, "open_session", forked)
    first = create(services, environment_id)
    second = create(services, environment_id)
    assert len(reads) == 1  # the second env's identical state came from the API's initial-state cache
    assert state(services, first) == state(services, second) == {"count": 0, "records": {}, "log": []}
    fake.fail_call("crashed", tool="bump", lost=True)
    assert step(services, second, "bump").status == "crashed"  # lost during the first step after the fork
    again = step(services, second, "bump", by=2)
    assert again.recovered and again.observation == "2" and len(reads) == 1
