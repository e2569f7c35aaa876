"""``benchmarks/api.py``'s :class:`Server` fails fast and says why when ``sandpit serve``
cannot start: a server that exits is reported at once with the end of its log (whose
directory is often a temporary one, gone by the time anyone looks), not after the
readiness timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from benchmark_modules import load

api = load("api")


def test_a_server_that_exits_at_start_fails_at_once_quoting_its_log(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SystemExit) as failed:
        api.Server(tmp_path, "--no-such-option")
    assert time.monotonic() - started < 60  # not the readiness timeout
    message = str(failed.value)
    assert "exited with status 2" in message
    assert "no-such-option" in message  # the CLI's own complaint, from the log
    assert str(tmp_path / "server.log") in message
