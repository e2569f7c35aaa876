"""PID 1's side of one-shot jobs (``pid1_job_requests``): validation of job requests
and of check-result frames, descriptions of a process's end."""

from __future__ import annotations

import base64

import pytest
from sandpit.sandbox_images.runner import limits
from sandpit.sandbox_images.runner import pid1_job_requests as requests


def test_exec_requests_are_validated() -> None:
    assert requests.exec_request({"code": "print(1)"}) == {"code": "print(1)", "stdin": "", "files": {}}
    for bad, message in [
        ({"code": 5}, "'code'"), ({"code": "x" * (limits.MAX_CODE_BYTES + 1)}, "'code'"),
        ({"code": "", "stdin": 5}, "'stdin'"), ({"code": "", "files": {"../x": ""}}, "'..'"),
        ({"code": "", "files": []}, "must be an object"),
    ]:
        with pytest.raises(ValueError, match=message):
            requests.exec_request(bad)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_check_requests_are_validated() -> None:
    state = b'{"a":["j",{"x":"\\"[{"}]}'
    good = {"checks": [{"check_func": "def check_func(s): return True"}],
            "initial_state_b64": b64(b"{}"), "final_state_b64": b64(state)}
    fields, states = requests.checks_request(good)
    assert fields == {"checks": ["def check_func(s): return True"], "source": None,
                      "untagged": ["initial_state", "final_state"]}
    assert states == {"initial_state": b"{}", "final_state": state}  # the host's bytes, unparsed
    for change, message in [
        ({"checks": []}, "1 to 256"), ({"checks": [{}] * 257}, "1 to 256"), ({"checks": "x"}, "1 to 256"),
        ({"checks": [{"check_func": 1}]}, r"checks\[0\]"), ({"checks": [5]}, r"checks\[0\]"),
        ({"checks": [{"check_func": "#" * (limits.MAX_CHECK_SOURCE_BYTES + 1)}]}, r"checks\[0\]"),
        ({"initial_state_b64": None}, "'initial_state_b64'"), ({"final_state_b64": 5}, "'final_state_b64'"),
        ({"initial_state_b64": {}}, "'initial_state_b64'"), ({"final_state_b64": b64(b"[]")}, "'final_state_b64'"),
        ({"final_state_b64": b64(b"")}, "'final_state_b64'"), ({"final_state_b64": b64(b'{"a":1} ')}, "encoded"),
        ({"final_state_b64": b64(b"{}")[:-1]}, "base64"), ({"final_state_b64": " " + b64(b"{}")}, "base64"),
        ({"final_state_b64": b64(b"{}") + "="}, "base64"), ({"final_state_b64": "e30*"}, "base64"),
        ({"final_state_b64": "\u00e9" + b64(b"{}")}, "base64"), ({"initial_state": {}}, "'initial_state_b64'"),
        ({"source": 5}, "'source'"),
    ]:
        request = {**good, **change}
        if change == {"initial_state": {}}:  # the parsed form is not read
            del request["initial_state_b64"]
        with pytest.raises(ValueError, match=message):
            requests.checks_request(request)


@pytest.mark.parametrize(("text", "tagged"), [
    (b'{"a":["j",{"$set":[1]}]}', True), (b'{"a":["j",{"\\u0024set":[1]}]}', True),
    (b'{"a":["j","$5"]}', True), (b'{"a":["j","\\"$"]}', True),  # a string that only might hold a tag
    (b'{"a":["j","price $5"]}', False), (b'{"a":["j",{"k$":"u0024"}]}', False), (b'{"a":["j",null]}', False),
    (b'{"a":["j","a\\\\b \\n"]}', False), (b'{"a":["j","\\\\u0024"]}', True),  # escapes; the second only looks like a $'s
    (b'{"a":["j","\\u0024 and $"]}', True), (b'{"a":["j","no dollar"]}', False),
])
def test_states_whose_text_holds_no_tag_are_named(text: bytes, tagged: bool) -> None:
    request = {"checks": [{"check_func": "def check_func(s): return True"}],
               "initial_state_b64": b64(b"{}"), "final_state_b64": b64(text)}
    fields, _ = requests.checks_request(request)
    assert fields["untagged"] == ["initial_state"] + ["final_state"] * (not tagged)


def frame(**changes: object) -> dict:
    return {"id": "t", "index": 2, "status": "ok", "passed": True, "result": "True", "error": None,
            "traceback": None, "duration_ms": 0.5, **changes}


def test_check_result_frames_are_validated_and_capped() -> None:
    assert requests.check_result_at(frame(), 2) == {"status": "ok", "passed": True, "result": "True", "error": None,
                                              "traceback": None, "duration_ms": 0.5}
    assert requests.check_result_at(frame(status="error", passed=True), 2)["passed"] is False  # only ok passes
    long = requests.check_result_at(frame(error="e" * 100000, traceback="t" * 100000, result="r" * 100000), 2)
    assert len(long["error"]) == limits.ERROR_CHARS and len(long["result"]) <= limits.RESULT_REPR_CHARS + 8
    for bad in [frame(index=3), frame(index="2"), frame(status="fault"), frame(status="timeout"),
                frame(passed=1), frame(duration_ms=-1), frame(duration_ms=float("inf")), frame(duration_ms="1"),
                frame(result=5), frame(error=["x"]), frame(traceback={})]:
        assert requests.check_result_at(bad, 2) is None, bad


def test_check_requests_take_their_states_from_the_frames_attachments() -> None:
    state = b'{"a":["j",{"x":"\\"[{"}]}'
    request = {"checks": [{"check_func": "def check_func(s): return True"}], "attached": [b"{}", state]}
    fields, states = requests.checks_request(request)
    assert states == {"initial_state": b"{}", "final_state": state}
    assert fields["untagged"] == ["initial_state", "final_state"]
    for attached in ([b"{}"], [b"{}", state, state], [b"{}", b"[]"], [b"{}", b""], [b"{}", "{}"], [1, 2], "{}{}",
                     [b"{}", b'{"a":1} ']):
        with pytest.raises(ValueError, match="attachments"):
            requests.checks_request({**request, "attached": attached})
