"""Pure helpers of the one-shot job process (``child_oneshot``): syntax error texts, exit
statuses, the go-ahead channel, and the clean-up after a read-only check ran in the zygote, on this file's own two fixed check
sources (run here like the zygote runs them). Untrusted checks and scripts only ever run in
sandboxes."""

from __future__ import annotations

import pytest
from sandpit.sandbox_images.runner import child_oneshot, protocol


def test_syntax_error_texts() -> None:
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


def test_a_check_in_place_leaves_no_decimal_flags_nor_source_lines() -> None:
    import decimal
    import linecache

    source = ("def check_func(final_state):\n    try:\n        final_state['price'] / 0\n"
              "    except ZeroDivisionError:\n        pass\n    return final_state['price'] / 3 > final_state['x']\n")
    decimal.getcontext().clear_flags()
    out = child_oneshot._check_in_place(source, {}, {"price": decimal.Decimal("1.10")})
    assert (out["status"], out["error"]) == ("error", "Error: KeyError: 'x'")
    assert "return final_state['price'] / 3" in out["traceback"]  # its lines were there for its traceback
    assert not any(decimal.getcontext().flags.values())  # DivisionByZero, Inexact, Rounded were raised
    assert child_oneshot.CHECK_FILENAME not in linecache.cache


def test_modules_imported_by_a_check_are_forgotten() -> None:
    import sys

    before = set(sys.modules)
    out = child_oneshot._check_in_place("def check_func(s):\n    return str(b'xn--bcher-kva', 'idna') == 'b\\u00fccher'\n",
                                        {}, {})
    assert (out["status"], out["passed"]) == ("ok", True)
    child_oneshot._forget_new_modules(before)
    assert set(sys.modules) == before
