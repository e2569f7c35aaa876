"""Polling a condition in tests, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 60.0, poll_s: float = 0.2) -> None:
    """Return once ``predicate()`` is true; fail (AssertionError naming ``what``) after
    ``timeout_s`` seconds, checking every ``poll_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(poll_s)
