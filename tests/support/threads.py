"""Holding something on another thread while a test acts on this one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager


@contextmanager
def held_elsewhere(hold: Callable[[], AbstractContextManager[object]], release_after_s: float = 10.0) -> Iterator[None]:
    """Enter ``hold()`` (a lock, a call slot) on another thread and keep it entered until
    the block ends: the block runs while something else holds it. Fails (AssertionError)
    when the thread has not entered it within 5 s; the thread lets go at the block's end
    (or after ``release_after_s`` seconds, whichever is first) and is joined."""
    holding, release = threading.Event(), threading.Event()

    def run() -> None:
        with hold():
            holding.set()
            release.wait(release_after_s)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert holding.wait(5), "the other thread did not get hold of it within 5 s"
        yield
    finally:
        release.set()
        thread.join(10)
