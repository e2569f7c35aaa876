"""Pure helpers of one-shot jobs (scripts and check functions): file-path and file-set
checks, EnvScaler result classification, bounded reprs, the runner's validation of job
requests and of check-result frames, capped output, and the protocol's handling of valid
frames before a bad one. Nothing here runs a check or a script: that only ever happens in
sandboxes."""

from __future__ import annotations

import pytest
from sandpit.sandbox_images.runner import child_oneshot, limits, pid1_jobs, protocol


@pytest.mark.parametrize("path", ["a", "a.txt", "dir/file.py", "a/b/c/d", "ünï/çødé.txt", ".hidden", "a..b",
                                  "x" * 255, "/".join(["d"] * limits.MAX_PATH_DEPTH)])
def test_relative_paths_are_accepted(path: str) -> None:
    assert limits.check_file_path(path) == path


@pytest.mark.parametrize(("path", "message"), [
    ("", "1 to"), ("/etc/passwd", "absolute"), ("../x", "'..'"), ("a/../../b", "'..'"), ("a/..", "'..'"),
    (".", "'.'"), ("./a", "'.'"), ("a//b", "empty"), ("a/", "empty"), ("a\x00b", "control"), ("a\nb", "control"),
    ("a\x7fb", "control"), ("a\\b", "backslash"), ("x" * 256, "255 bytes"), ("ü" * 128, "255 bytes"),
    ("/".join(["d"] * (limits.MAX_PATH_DEPTH + 1)), "deeper"), ("a" * (limits.MAX_PATH_CHARS + 1), "1 to"),
    ("\ud800", "not valid text"), (5, "not a string"), (None, "not a string"),
])
def test_hostile_paths_are_rejected(path: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        limits.check_file_path(path)


def test_file_sets() -> None:
    files = {"a.txt": "x", "d/b.txt": "ü" * 10}
    assert limits.check_files(files) is files
    assert limits.check_files({}) == {}
    for bad, message in [
        ([], "must be an object"), ({"a": b"bytes"}, "must be text"), ({"a": "\udc00"}, "not valid text"),
        ({f"f{i}": "" for i in range(limits.MAX_FILES + 1)}, "at most 64 files"),
        ({"big": "x" * (limits.MAX_FILE_BYTES + 1)}, "bytes; at most"),
        ({f"f{i}": "x" * limits.MAX_FILE_BYTES for i in range(3)}, "total"),
        ({"a": "", "a/b": ""}, "which is a file"), ({"a/b/c": "", "a/b": ""}, "which is a file"),
    ]:
        with pytest.raises(ValueError, match=message):
            limits.check_files(bad)


class BoolSub(int):
    pass


@pytest.mark.parametrize(("value", "expected"), [
    (True, ("ok", True, None)),
    (False, ("ok", False, None)),
    (None, ("error", False, "returned None, not a bool")),
    (1, ("error", False, "returned int 1, not a bool")),
    (0, ("error", False, "returned int 0, not a bool")),
    ("yes", ("error", False, "returned str 'yes', not a bool")),
    ([True], ("error", False, "returned list [True], not a bool")),
    (1.0, ("error", False, "returned float 1.0, not a bool")),
    (BoolSub(1), ("error", False, "returned BoolSub 1, not a bool")),
])
def test_only_true_passes(value: object, expected: tuple) -> None:
    assert child_oneshot.classify(value) == expected


class Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no")


class Huge:
    def __repr__(self) -> str:
        return "h" * 5000


def test_bounded_repr() -> None:
    assert child_oneshot.bounded_repr("x") == "'x'"
    assert child_oneshot.bounded_repr(Hostile()) == "<unrepresentable Hostile: RuntimeError>"
    text = child_oneshot.bounded_repr(Huge())
    assert len(text) == limits.RESULT_REPR_CHARS + 3 and text.endswith("...")
    assert child_oneshot.classify(Huge())[2].endswith(", not a bool") and len(child_oneshot.classify(Huge())[2]) < 300


def test_error_texts() -> None:
    assert child_oneshot.error_text(KeyError("x")) == "Error: KeyError: 'x'"
    assert child_oneshot.error_text(ValueError()) == "Error: ValueError"
    assert len(child_oneshot.error_text(ValueError("v" * 10000))) == limits.ERROR_CHARS
    try:
        compile("def f(:\n", "<check_func>", "exec")
    except SyntaxError as exc:
        assert child_oneshot.syntax_error_text(exc).startswith("syntax error: ") and "(line 1)" in child_oneshot.syntax_error_text(exc)
    assert child_oneshot.syntax_error_text(ValueError("source code string cannot contain null bytes")) == \
        "syntax error: source code string cannot contain null bytes"


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (256 + 4, 4), (-1, 255), (True, 1)])
def test_exit_status_of_system_exit(code: object, status: int) -> None:
    assert child_oneshot._exit_status(SystemExit(code)) == status


def test_exit_status_of_a_message_is_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert child_oneshot._exit_status(SystemExit("bad input")) == 1
    assert capsys.readouterr().err == "bad input\n"


# -- runner side -------------------------------------------------------------------------
def test_output_keeps_the_cap_and_counts_the_rest() -> None:
    out = pid1_jobs.Output(5)
    out.add(b"abc")
    out.add(b"defgh")
    out.add(b"ij")
    assert (bytes(out.data), out.dropped) == (b"abcde", 5)
    assert out.text() == "abcde" and out.text(marker=True) == "abcde\n...[5 bytes dropped]"
    out.reset()
    assert (out.text(), out.dropped) == ("", 0)
    assert pid1_jobs.Output(0).text() == ""


def test_exec_requests_are_validated() -> None:
    assert pid1_jobs._exec_request({"code": "print(1)"}) == {"code": "print(1)", "stdin": "", "files": {}}
    for bad, message in [
        ({"code": 5}, "'code'"), ({"code": "x" * (limits.MAX_CODE_BYTES + 1)}, "'code'"),
        ({"code": "", "stdin": 5}, "'stdin'"), ({"code": "", "files": {"../x": ""}}, "'..'"),
        ({"code": "", "files": []}, "must be an object"),
    ]:
        with pytest.raises(ValueError, match=message):
            pid1_jobs._exec_request(bad)


def test_check_requests_are_validated() -> None:
    good = {"checks": [{"check_func": "def check_func(s): return True"}], "initial_state": {}, "final_state": {}}
    assert pid1_jobs._checks_request(good)["checks"] == ["def check_func(s): return True"]
    for change, message in [
        ({"checks": []}, "1 to 256"), ({"checks": [{}] * 257}, "1 to 256"), ({"checks": "x"}, "1 to 256"),
        ({"checks": [{"check_func": 1}]}, r"checks\[0\]"), ({"checks": [5]}, r"checks\[0\]"),
        ({"checks": [{"check_func": "#" * (limits.MAX_CHECK_SOURCE_BYTES + 1)}]}, r"checks\[0\]"),
        ({"initial_state": []}, "must be an encoded state"), ({"final_state": None}, "must be an encoded state"),
        ({"final_state": {"a": 1}}, "must be an encoded state"), ({"final_state": {"a": ["q", 1]}}, "encoded state"),
        ({"source": 5}, "'source'"),
    ]:
        with pytest.raises(ValueError, match=message):
            pid1_jobs._checks_request({**good, **change})


def frame(**changes: object) -> dict:
    return {"id": "t", "index": 2, "status": "ok", "passed": True, "result": "True", "error": None,
            "traceback": None, "duration_ms": 0.5, **changes}


def test_check_result_frames_are_validated_and_capped() -> None:
    assert pid1_jobs._check_result(frame(), 2) == {"status": "ok", "passed": True, "result": "True", "error": None,
                                              "traceback": None, "duration_ms": 0.5}
    assert pid1_jobs._check_result(frame(status="error", passed=True), 2)["passed"] is False  # only ok passes
    long = pid1_jobs._check_result(frame(error="e" * 100000, traceback="t" * 100000, result="r" * 100000), 2)
    assert len(long["error"]) == limits.ERROR_CHARS and len(long["result"]) <= limits.RESULT_REPR_CHARS + 8
    for bad in [frame(index=3), frame(index="2"), frame(status="fault"), frame(status="timeout"),
                frame(passed=1), frame(duration_ms=-1), frame(duration_ms=float("inf")), frame(duration_ms="1"),
                frame(result=5), frame(error=["x"]), frame(traceback={})]:
        assert pid1_jobs._check_result(bad, 2) is None, bad


def test_signal_and_exit_descriptions() -> None:
    assert pid1_jobs._death(9) == "killed by signal SIGKILL"
    assert pid1_jobs._death(3 << 8) == "exited with status 3"
    assert pid1_jobs._signal_name(200) == "200"


def test_frames_before_a_bad_one_are_kept() -> None:
    good = protocol.encode({"id": 1, "x": "a"}) + protocol.encode({"id": 2})
    buffer = protocol.FrameBuffer(1024)
    with pytest.raises(protocol.ProtocolViolation) as info:
        buffer.feed(good + b"\x00\x00\x00\x05hello")
    assert info.value.messages == [{"id": 1, "x": "a"}, {"id": 2}]
    with pytest.raises(protocol.ProtocolViolation) as info:
        protocol.FrameBuffer(8).feed(b"\xff\xff\xff\xff")
    assert info.value.messages == []


def test_go_ahead_frames_name_the_next_check() -> None:
    import os

    read_fd, write_fd = os.pipe()
    try:
        channel = child_oneshot._Channel(read_fd)
        os.write(write_fd, protocol.encode({"op": "next", "index": 4}))
        assert channel.wait() == 4
        os.write(write_fd, protocol.encode({"op": "next", "index": 5}) + protocol.encode({"op": "next", "index": 7}))
        assert channel.wait() == 7  # several at once (a forked twin lagged behind): the last one counts
        os.write(write_fd, protocol.encode({"op": "next"}))
        assert channel.wait() is None
        os.write(write_fd, b"\x00\x00\x00\x03abc")
        assert channel.wait() is None
        os.close(write_fd)
        write_fd = -1
        assert channel.wait() is None  # closed
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
