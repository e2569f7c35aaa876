"""The scripted :class:`FakeExecutor`: an :class:`Executor` (mypy and ``isinstance``) that
answers like the real pool (encodings, observations, rejections, errors) and never runs
the code it is given. Type-checked by ``scripts/lint``."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sandpit.executor.errors import (
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    SessionClosed,
    SessionOpenError,
    ToolSchemaError,
)
from sandpit.executor.fake import Encoded, FakeExecutor
from sandpit.executor.interface import Executor, ExecutorSession
from sandpit.executor.results import CheckResult, ExecResult, Snapshot
from sandpit.sandbox_images.runner import limits

NEVER_RUN = "import os\nos._exit(3)  # would end the test process if anything ran it\n"


def bump(state: dict[str, Any], by: int = 1) -> int:
    """Add to the counter.

    Args:
        by: how much to add.
    """
    state["count"] += by
    state["log"].append(by)
    return int(state["count"])


def tag(state: dict[str, Any], name: str) -> str:
    """Tag the counter with a set of names."""
    state.setdefault("tags", set()).add(name)
    return name


def lock(state: dict[str, Any]) -> None:
    """Keep something that cannot be pickled."""
    state["lock"] = threading.Lock()


def forget(state: dict[str, Any], key: str) -> None:
    """Drop an attribute, then fail."""
    del state[key]
    raise KeyError(key)


@pytest.fixture
def fake() -> FakeExecutor:
    executor = FakeExecutor()
    executor.register("Counter", {"bump": bump, "tag": tag, "lock": lock, "forget": forget},
                      init=lambda config: {"count": 0, "log": []})
    return executor


def test_it_is_an_executor_with_executor_sessions(fake: FakeExecutor) -> None:
    executor: Executor = fake
    session: ExecutorSession = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter")
    assert isinstance(executor, Executor) and isinstance(session, ExecutorSession)
    assert (session.tenant, session.closed) == ("t", False) and session.id in fake.sessions


def test_calls_change_the_state_and_report_deltas_in_the_state_encoding(fake: FakeExecutor) -> None:
    session = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter", init_config={"count": 5, "x": 1})
    assert session.state() == {"count": 5, "log": [], "x": 1}  # init, then setattr per config key
    result = session.call("bump", {"by": 2})
    assert (result.status, result.observation, result.recovered) == ("ok", "7", False)
    assert result.delta.set == {"count": ["j", 7], "log": ["j", [2]]} and result.delta.deleted == []
    tagged = session.call("tag", {"name": "a"})
    assert tagged.delta.set["tags"][0] == "p" and tagged.delta.set["tags"][2] == {"$set": ["a"]}
    locked = session.call("lock")
    assert locked.delta.set["lock"][0] == "u" and session.state()["lock"]["$repr"]["type"].endswith("lock")
    assert session.state()["tags"] == {"$set": ["a"]}
    assert session.read_state()["count"] == ["j", 7]
    assert [name for name, _ in session.calls] == ["bump", "tag", "lock"]


def test_tool_errors_and_rejections_are_results(fake: FakeExecutor) -> None:
    session = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter")
    failed = session.call("forget", {"key": "log"})
    assert failed.status == "error" and failed.observation == "Error: KeyError: 'log'"
    assert failed.traceback and "KeyError" in failed.traceback
    assert failed.delta.deleted == ["log"]  # what the tool did before raising counts (EnvScaler)
    wrong_arguments = session.call("bump", {"nope": 1})
    assert wrong_arguments.status == "error" and "unexpected keyword argument 'nope'" in wrong_arguments.observation
    for name, arguments, text in [
        ("_private", {}, "is not a public tool name"), ("__class__", {}, "is not a public tool name"),
        ("x" * 200, {}, "is not a public tool name"), ("missing", {}, "'missing' is not a tool of this environment"),
        ("bump", [1], "arguments must be an object"), ("bump", {"by": float("nan")}, "not JSON-encodable"),
        ("bump", {"by": "\ud800"}, "not JSON-encodable"),
    ]:
        result = session.call(name, arguments)  # type: ignore[arg-type]
        assert result.status == "rejected" and text in result.observation, (name, result.observation)
    long = fake.open_session(tenant="t", source="", class_name="Counter",
                             profile=fake.profile().model_copy(update={"observation_cap_bytes": 1024}))
    long.call("tag", {"name": "n" * 2000})
    capped = long.call("tag", {"name": "m" * 2000})
    assert capped.observation_truncated and capped.observation.endswith("[truncated 976 characters]")


def test_the_opened_state_is_handed_over_once(fake: FakeExecutor) -> None:
    session = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter")
    assert session.take_opened().attributes == {"count": ["j", 0], "log": ["j", []]}
    assert session.take_opened().attributes is None  # once: the handle keeps no copy
    restored = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter", snapshot={"count": ["j", 3]})
    assert restored.take_opened().attributes is None  # the caller gave the state


def test_snapshot_and_restore_follow_the_sandbox_rules(fake: FakeExecutor) -> None:
    session = fake.open_session(tenant="t", source=NEVER_RUN, class_name="Counter")
    session.call("tag", {"name": "a"})
    good = Snapshot(attributes=session.read_state())
    session.call("bump", {"by": 3})
    session.call("lock")
    session.restore(good)
    assert session.state() == {"count": 0, "log": [], "tags": {"$set": ["a"]}}  # "lock" was not in it: dropped
    assert session.call("tag", {"name": "b"}).delta.set["tags"][2] == {"$set": ["a", "b"]}  # a real set again
    opaque = Snapshot(attributes={"count": ["j", 1], "blob": ["p", "AAAA", {"$repr": {"type": "X", "repr": "X()"}}],
                                  "gone": ["u", {"$repr": {"type": "Lock", "repr": "<lock>"}}]})
    session.restore(opaque)
    assert session.read_state() == {"count": ["j", 1], "blob": opaque.attributes["blob"]}
    again = fake.open_session(tenant="t", source="", class_name="Counter", snapshot=opaque.attributes)
    assert again.state() == {"count": 1, "blob": {"$repr": {"type": "X", "repr": "X()"}}}


def test_encoded_values_can_be_scripted_into_the_state() -> None:
    fake = FakeExecutor()
    fake.register("Opaque", {}, init=lambda config: {"when": Encoded(["p", "QUJD", {"$date": "2024-05-01"}])})
    session = fake.open_session(tenant="t", source="", class_name="Opaque")
    assert session.read_state() == {"when": ["p", "QUJD", {"$date": "2024-05-01"}]}
    assert session.state() == {"when": {"$date": "2024-05-01"}}


def test_describe_derives_schemas_like_the_sandbox_or_serves_the_scripted_ones(fake: FakeExecutor) -> None:
    tools = fake.describe(tenant="t", source=NEVER_RUN, class_name="Counter")
    assert [t["function"]["name"] for t in tools] == ["bump", "tag", "lock", "forget"]
    assert tools[0]["function"]["description"] == "Add to the counter."
    assert tools[0]["function"]["parameters"] == {
        "type": "object", "properties": {"by": {"type": "integer", "description": "how much to add.", "default": 1}},
        "required": [], "additionalProperties": False}
    session = fake.open_session(tenant="t", source="", class_name="Counter")
    assert session.describe() == tools
    given = [{"type": "function", "function": {"name": "go", "description": "Go.", "parameters": {
        "type": "object", "properties": {}, "required": [], "additionalProperties": False}}}]
    fake.register("Given", {}, schemas=given)
    assert fake.describe(tenant="t", source="", class_name="Given") == given
    with pytest.raises(ValueError, match="host would refuse"):
        fake.register("Bad", {}, schemas=[{"type": "function"}])
    fake.register("Huge", {f"t{i}": bump for i in range(limits.MAX_TOOLS + 1)})
    with pytest.raises(ToolSchemaError) as refused:
        fake.describe(tenant="t", source="", class_name="Huge")
    assert refused.value.status == "rejected"


def test_open_failures(fake: FakeExecutor) -> None:
    with pytest.raises(SessionOpenError) as missing:
        fake.open_session(tenant="t", source="", class_name="Nope")
    assert missing.value.status == "error" and "class 'Nope' is not defined" in missing.value.observation

    def broken(config: dict[str, Any]) -> dict[str, Any]:
        raise ValueError(f"bad config {config}")

    fake.register("Broken", {}, init=broken)
    with pytest.raises(SessionOpenError) as raised:
        fake.open_session(tenant="t", source="", class_name="Broken", init_config={"a": 1})
    assert raised.value.observation == "Error: ValueError: bad config {'a': 1}" and raised.value.traceback
    with pytest.raises(ValueError, match="tenant"):
        fake.open_session(tenant="", source="", class_name="Counter")
    with pytest.raises(ValueError, match="class_name"):
        fake.open_session(tenant="t", source="", class_name="not a name")
    fake.fail("open_session", CapacityError("all 64 sandboxes are in use", retry_after_s=2.0))
    with pytest.raises(CapacityError) as full:
        fake.open_session(tenant="t", source="", class_name="Counter")
    assert full.value.retry_after_s == 2.0
    assert fake.open_session(tenant="t", source="", class_name="Counter")  # only the next one failed


def test_injected_call_failures(fake: FakeExecutor) -> None:
    session = fake.open_session(tenant="t", source="", class_name="Counter",
                                profile=fake.profile().model_copy(update={"call_timeout_s": 2.0}))
    session.call("bump")
    fake.fail_call("timeout", tool="bump")
    timed_out = session.call("bump", {"by": 10})
    assert timed_out.status == "timeout" and timed_out.observation == "Error: tool call exceeded the 2 s time limit"
    assert timed_out.delta.set == {} and session.state()["count"] == 1  # the tool never ran
    assert session.call("tag", {"name": "x"}).status == "ok"
    fake.fail_call("oom", lost=True)
    lost = session.call("bump")
    assert lost.status == "oom" and "restored from its last snapshot" in lost.observation
    assert session.closed and fake.stats()["failures"] == {"timeout": 1, "oom": 1}
    for request in (lambda: session.call("bump"), session.state, session.read_state, session.describe,
                    lambda: session.restore(Snapshot(attributes={}))):
        with pytest.raises(SessionClosed):  # a lost sandbox closes the handle: recovering is the caller's
            request()
    with pytest.raises(ValueError):
        fake.fail_call("ok")


def test_checks_are_answered_by_their_scripted_verdicts(fake: FakeExecutor) -> None:
    fake.script_check("def check_func(s): return True", True)
    fake.script_check("def check_func(s): return s['count'] == 2", lambda initial, final: final["count"] == 2)
    fake.script_check("slow", "timeout")
    fake.script_check("one", lambda initial, final: 1)
    fake.script_check("raises", lambda initial, final: final["missing"])
    fake.script_check("given", CheckResult(check_item="", passed=False, status="crashed", error="x", duration_ms=1))
    checks = [{"check_item": item, "check_func": source} for item, source in [
        ("always", "def check_func(s): return True"), ("count", "def check_func(s): return s['count'] == 2"),
        ("slow", "slow"), ("one", "one"), ("raises", "raises"), ("given", "given")]]
    results = fake.run_checks(tenant="t", checks=checks, initial_state={"count": ["j", 0]},
                              final_state={"count": ["j", 2]}, per_check_timeout_s=1.5)
    assert [(r.check_item, r.status, r.passed) for r in results] == [
        ("always", "ok", True), ("count", "ok", True), ("slow", "timeout", False), ("one", "error", False),
        ("raises", "error", False), ("given", "crashed", False)]
    assert results[0].result == "True" and results[2].error == "timed out after 1.5 s"
    assert results[3].error == "returned int 1, not a bool" and results[4].error == "Error: KeyError: 'missing'"
    assert fake.run_checks(tenant="t", checks=[], initial_state={}, final_state={}) == []
    with pytest.raises(LookupError, match="no verdict scripted"):
        fake.run_checks(tenant="t", checks=[{"check_item": "?", "check_func": "unscripted"}],
                        initial_state={}, final_state={})
    with pytest.raises(ValueError, match="at most 256 checks"):
        fake.run_checks(tenant="t", checks=checks * 50, initial_state={}, final_state={})
    with pytest.raises(ValueError, match="not an encoded value"):
        fake.run_checks(tenant="t", checks=checks, initial_state={"count": 2}, final_state={})


def test_scripts_are_answered_by_their_scripted_results(fake: FakeExecutor) -> None:
    fake.script_exec(NEVER_RUN, "hello\n")
    fake.script_exec("fails", ExecResult(status="error", exit_code=1, stderr="Traceback", duration_ms=1.0,
                                         error="exited with status 1"))
    fake.script_exec("echo", lambda request: request.stdin or "")
    fake.script_exec("loud", "x" * 100)
    assert fake.execute(tenant="t", code=NEVER_RUN).stdout == "hello\n"
    assert fake.execute(tenant="t", code="fails").exit_code == 1
    assert fake.execute(tenant="t", code="echo", stdin="in").stdout == "in"
    quiet = fake.profile().model_copy(update={"output_cap_bytes": 10})
    loud = fake.execute(tenant="t", code="loud", profile=quiet)
    assert loud.stdout == "x" * 10 and loud.stdout_truncated
    with pytest.raises(LookupError, match="no result scripted"):
        fake.execute(tenant="t", code="print(2)")
    with pytest.raises(ValueError, match="absolute"):
        fake.execute(tenant="t", code="echo", files={"/etc/passwd": ""})


def test_ping_warm_stats_and_close(fake: FakeExecutor) -> None:
    fake.ping()
    fake.fail("ping", DockerUnavailable("engine down"), times=None)
    for _ in range(3):
        with pytest.raises(DockerUnavailable):
            fake.ping()
    fake.clear_failures()
    fake.ping()
    assert fake.warm("t", count=3) == 3
    session = fake.open_session(tenant="t", source="", class_name="Counter")
    assert fake.stats() | {"failures": {}} == {"sandboxes": 4, "idle": 3, "active": 1, "starting": 0, "sessions": 1,
                                               "failures": {}, "check_restarts": 0, "max_sandboxes": 64}
    fake.close()
    assert session.closed
    with pytest.raises(SessionClosed):
        session.call("bump")
    with pytest.raises(ExecutorError, match="closed"):
        fake.open_session(tenant="t", source="", class_name="Counter")
    with pytest.raises(ValueError, match="one of"):
        fake.fail("nap", RuntimeError())
