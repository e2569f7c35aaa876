"""Pure helpers of the one-shot job process (``child_oneshot``): exit statuses and the
go-ahead channel. Untrusted checks and scripts only ever run in sandboxes."""

from __future__ import annotations

import pytest
from sandpit.sandbox_images.runner import child_oneshot, protocol


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
