"""PID 1's side of one-shot jobs (``pid1_job_requests``): validation of job requests
and of check-result frames, descriptions of a process's end."""

from __future__ import annotations

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


def test_check_requests_are_validated() -> None:
    good = {"checks": [{"check_func": "def check_func(s): return True"}], "initial_state": {}, "final_state": {}}
    assert requests.checks_request(good)["checks"] == ["def check_func(s): return True"]
    for change, message in [
        ({"checks": []}, "1 to 256"), ({"checks": [{}] * 257}, "1 to 256"), ({"checks": "x"}, "1 to 256"),
        ({"checks": [{"check_func": 1}]}, r"checks\[0\]"), ({"checks": [5]}, r"checks\[0\]"),
        ({"checks": [{"check_func": "#" * (limits.MAX_CHECK_SOURCE_BYTES + 1)}]}, r"checks\[0\]"),
        ({"initial_state": []}, "must be an encoded state"), ({"final_state": None}, "must be an encoded state"),
        ({"final_state": {"a": 1}}, "must be an encoded state"), ({"final_state": {"a": ["q", 1]}}, "encoded state"),
        ({"source": 5}, "'source'"),
    ]:
        with pytest.raises(ValueError, match=message):
            requests.checks_request({**good, **change})


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
