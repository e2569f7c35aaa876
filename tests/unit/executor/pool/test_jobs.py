"""Host side of one-shot jobs: argument checks (caps, types, timeouts) and validation of
what a sandbox answers to ``exec`` and ``checks`` (nothing it sends is trusted)."""

from __future__ import annotations

import pytest
from sandpit.executor.errors import SessionError
from sandpit.executor.pool import jobs
from sandpit.executor.profiles import ResourceProfile
from sandpit.sandbox_images.runner import limits

PROFILE = ResourceProfile(call_timeout_s=10.0, tmpfs_mib=8, output_cap_bytes=100)
CHECK = {"check_item": "balance is 80", "check_func": "def check_func(final_state):\n    return True\n"}


def test_check_timeouts() -> None:
    assert jobs.check_checks([CHECK], {}, {}, PROFILE, None)[0] == limits.DEFAULT_CHECK_TIMEOUT_S
    short = PROFILE.model_copy(update={"call_timeout_s": 2.0})
    assert jobs.check_checks([CHECK], {}, {}, short, None)[0] == 2.0
    assert jobs.check_checks([CHECK], {}, {}, PROFILE, 7)[0] == 7.0
    for bad in (0, -1, float("nan"), float("inf"), 10.5, "1", True):
        with pytest.raises(ValueError):
            jobs.check_checks([CHECK], {}, {}, PROFILE, bad)


@pytest.mark.parametrize(("checks", "initial", "final", "message"), [
    ("x", {}, {}, "must be a list"),
    ([CHECK] * (limits.MAX_CHECKS + 1), {}, {}, "at most 256"),
    ([{"check_func": "x"}], {}, {}, "check_item"),
    ([{**CHECK, "check_item": "i" * (limits.MAX_CHECK_ITEM_CHARS + 1)}], {}, {}, "check_item"),
    ([{**CHECK, "check_func": None}], {}, {}, "check_func must be a string"),
    ([{**CHECK, "check_func": "é" * (limits.MAX_CHECK_SOURCE_BYTES // 2 + 1)}], {}, {}, "bytes; at most"),
    ([{**CHECK, "check_func": "\udc80"}], {}, {}, "not valid text"),
    ([{**CHECK, "weight": 1}], {}, {}, "keys"),
    ([CHECK], None, {}, "initial_state must be an object"),
    ([CHECK], {}, {"a": {1, 2}}, r"final_state\['a'\] is not an encoded value"),
    ([CHECK], {}, {"a": ["j", {1, 2}]}, "final_state is not JSON-encodable"),
    ([CHECK], {"a": ["j", float("inf")]}, {}, "initial_state is not JSON-encodable"),
    ([CHECK], {"a": ["p", 5]}, {}, r"initial_state\['a'\] is not an encoded value"),
    ([CHECK], {}, {"big": ["j", "x" * limits.MAX_STATE_BYTES]}, "final_state has"),
    ([CHECK], {}, {"a": ["j", "\udc80"]}, "final_state is not JSON-encodable"),
    ([CHECK], {}, {"a": ["j", {"k": "v"}], 5: ["j", 1]}, r"final_state\['5'\] is not an encoded value"),
])
def test_check_arguments(checks: object, initial: object, final: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        jobs.check_checks(checks, initial, final, PROFILE, None)


def test_states_go_to_the_runner_as_compact_json_without_pickles_renderings() -> None:
    initial = {"d": ["j", {"é": [1, 2.5, None, "\"[{"]}], "o": ["p", "gAN9cQAu", {"$object": {"type": "Big"}}]}
    final = {"u": ["u", {"$repr": "<x>"}]}
    _, initial_text, final_text = jobs.check_checks([CHECK], initial, final, PROFILE, None)
    assert initial_text == '{"d":["j",{"é":[1,2.5,null,"\\"[{"]}],"o":["p","gAN9cQAu"]}'.encode()
    assert final_text == b'{"u":["u",{"$repr":"<x>"}]}'
    assert initial["o"][2] == {"$object": {"type": "Big"}}  # the caller's state is left as it was
    exact = {"big": ["j", "x" * (limits.MAX_STATE_BYTES - len('{"big":["j",""]}'))]}
    assert len(jobs.check_checks([CHECK], {}, exact, PROFILE, None)[2]) == limits.MAX_STATE_BYTES
    with pytest.raises(ValueError, match=f"has {limits.MAX_STATE_BYTES + 1} bytes"):
        jobs.check_checks([CHECK], {}, {"big": ["j", exact["big"][1] + "x"]}, PROFILE, None)


def test_exec_arguments() -> None:
    request = jobs.check_exec("print(1)", None, None, None, PROFILE)
    assert request.fields() == {"code": "print(1)", "stdin": None, "files": {}, "time_limit_s": 10.0}
    assert jobs.check_exec("", "in", {"a/b.txt": "x"}, 0.5, PROFILE).timeout_s == 0.5
    for args, message in [
        ((b"print(1)", None, None, None), "code must be a string"),
        (("x" * (limits.MAX_CODE_BYTES + 1), None, None, None), "code has more"),
        (("", 5, None, None), "stdin must be"),
        (("", "x" * (limits.MAX_STDIN_BYTES + 1), None, None), "stdin has more"),
        (("", None, {"/abs": ""}, None), "absolute"),
        (("", None, {"a": "x" * (2 * 1024 * 1024 + 1), "b": "x" * (2 * 1024 * 1024)}, None), "work space"),
        (("", None, None, 11), "above the profile"),
        (("\ud800", None, None, None), "not valid text"),
    ]:
        with pytest.raises(ValueError, match=message):
            jobs.check_exec(*args, PROFILE)


def test_snippets() -> None:
    requests = jobs.check_snippets([{"code": "a"}, {"code": "b", "stdin": "s", "timeout_s": 1}], 2, PROFILE)
    assert [r.code for r in requests] == ["a", "b"] and requests[1].timeout_s == 1.0
    for snippets, concurrency, message in [
        ([], 0, "concurrency"), ([], limits.MAX_EXEC_CONCURRENCY + 1, "concurrency"), ([], 2.0, "concurrency"),
        ("x", 1, "must be a list"), ([{"code": "a"}] * (limits.MAX_SNIPPETS + 1), 1, "must be a list"),
        ([{"code": "a"}, {"stdin": "x"}], 1, r"snippets\[1\]"), ([{"code": "a", "env": {}}], 1, r"snippets\[0\]"),
        ([{"code": "a"}, {"code": "b", "files": {"..": ""}}], 1, r"snippets\[1\]: file path"),
    ]:
        with pytest.raises(ValueError, match=message):
            jobs.check_snippets(snippets, concurrency, PROFILE)


def result(**changes: object) -> dict:
    return {"status": "ok", "passed": True, "result": "True", "error": None, "traceback": None,
            "duration_ms": 0.2, "stdout": "", "stderr": "", **changes}


def test_check_replies() -> None:
    checks = [CHECK, {**CHECK, "check_item": "second"}]
    reply = {"status": "ok", "results": [result(), result(status="error", passed=True, error="returned int 1")],
             "restarts": 1}
    parsed, restarts = jobs.parse_check_results(reply, checks)
    assert restarts == 1
    assert [(r.check_item, r.status, r.passed) for r in parsed] == [("balance is 80", "ok", True),
                                                                    ("second", "error", False)]
    bad_replies = [
        {"status": "fault", "message": "no"}, {"status": "ok", "results": [result()], "restarts": 0},
        {"status": "ok", "results": "x", "restarts": 0}, {"status": "ok", "results": [result()] * 2},
        {"status": "ok", "results": [result(status="weird"), result()], "restarts": 0},
        {"status": "ok", "results": [result(passed="yes"), result()], "restarts": 0},
        {"status": "ok", "results": [result(result="r" * 5000), result()], "restarts": 0},
        {"status": "ok", "results": [result(stdout="o" * 100000), result()], "restarts": 0},
        {"status": "ok", "results": [result(duration_ms=-5), result()], "restarts": 0},
        {"status": "ok", "results": [result(error=7), result()], "restarts": 0},
        {"status": "ok", "results": [5, result()], "restarts": 0},
    ]
    for bad in bad_replies:
        with pytest.raises(SessionError):
            jobs.parse_check_results(bad, checks)


def exec_reply(**changes: object) -> dict:
    return {"status": "ok", "exit_code": 0, "stdout": "1\n", "stderr": "", "stdout_truncated": False,
            "stderr_truncated": False, "duration_ms": 3.0, "error": None, **changes}


def test_exec_replies() -> None:
    parsed = jobs.parse_exec_result(exec_reply(), PROFILE, 12.5)
    assert (parsed.status, parsed.exit_code, parsed.stdout, parsed.duration_ms) == ("ok", 0, "1\n", 12.5)
    timeout = jobs.parse_exec_result(exec_reply(status="timeout", exit_code=None, error="timed out"), PROFILE, 1)
    assert (timeout.status, timeout.exit_code) == ("timeout", None)
    for bad in [exec_reply(status="fault", message="x"), exec_reply(status="nope"), exec_reply(exit_code="0"),
                exec_reply(exit_code=1000), exec_reply(stdout="o" * 101), exec_reply(stderr=None),
                exec_reply(stdout_truncated=1), exec_reply(error=["x"]), exec_reply(error="e" * 10000)]:
        with pytest.raises(SessionError):
            jobs.parse_exec_result(bad, PROFILE, 1.0)


def test_lost_sandbox_results() -> None:
    lost = jobs.lost_checks([CHECK, CHECK], "oom", "the sandbox was lost")
    assert [(r.status, r.passed, r.error) for r in lost] == [("oom", False, "the sandbox was lost")] * 2
    assert jobs.lost_exec("crashed", "gone", 5.0).model_dump() == {
        "status": "crashed", "exit_code": None, "stdout": "", "stderr": "", "stdout_truncated": False,
        "stderr_truncated": False, "duration_ms": 5.0, "error": "gone"}


def test_a_prepared_state_is_sent_as_the_text_it_was_prepared_with() -> None:
    initial = {"d": ["j", {"é": [1, 2.5, None]}], "o": ["p", "gAN9cQAu", {"$object": {"type": "Big"}}]}
    final = {"n": ["j", 3]}
    prepared = jobs.prepare_state(initial, "initial_state")
    _, initial_text, final_text = jobs.check_checks([CHECK], prepared, jobs.prepare_state(final), PROFILE, None)
    assert (initial_text, final_text) == jobs.check_checks([CHECK], initial, final, PROFILE, None)[1:]
    assert prepared.encoded() == {"d": ["j", {"é": [1, 2.5, None]}], "o": ["p", "gAN9cQAu"]}  # as sent
    with pytest.raises(ValueError, match="initial_state has"):
        jobs.prepare_state({"big": ["j", "x" * limits.MAX_STATE_BYTES]}, "initial_state")
    with pytest.raises(ValueError, match=r"state\['a'\] is not an encoded value"):
        jobs.prepare_state({"a": 1})


@pytest.mark.parametrize("text", [
    b"", b"[1]", b'"x"', b"{", "{}", bytearray(b"{}"), None, b"{" + b" " * limits.MAX_STATE_BYTES + b"}",
])
def test_a_prepared_state_must_be_an_objects_text_within_the_cap(text: object) -> None:
    with pytest.raises(ValueError, match="JSON text of an object"):
        jobs.PreparedState(text)  # type: ignore[arg-type]


def test_a_prepared_state_that_is_not_json_says_so_when_read_back() -> None:
    for text, message in [(b"{nope}", "not JSON"), (b"{}", None)]:
        state = jobs.PreparedState(text)
        if message is None:
            assert state.encoded() == {}
            continue
        with pytest.raises(ValueError, match=message):
            state.encoded()
