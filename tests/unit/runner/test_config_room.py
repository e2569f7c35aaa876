"""Making room for a config template (``pid1_templates.make_room``, ``pid1_children.private_bytes``):
the fewest least recently used templates whose memory covers what is over, none at all
when they would not (or a size cannot be read), and the memory a real process maps
privately, read the way PID 1 reads its children's."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
from sandpit.sandbox_images.runner import pid1_children, pid1_templates
from sandpit.sandbox_images.runner.pid1_templates import make_room

MiB = 1024 * 1024


def templates(*pids: int) -> list[pid1_templates.Template]:
    """Stand-ins carrying only what make_room reads (``child.pid``), in LRU order."""
    return [types.SimpleNamespace(child=types.SimpleNamespace(pid=pid)) for pid in pids]  # type: ignore[misc]


SIZES = {1: 40 * MiB, 2: 10 * MiB, 3: 60 * MiB}


@pytest.mark.parametrize("over,expected", [
    (1, [1]), (40 * MiB, [1]), (40 * MiB + 1, [1, 2]), (50 * MiB, [1, 2]), (110 * MiB, [1, 2, 3]),
    (110 * MiB + 1, None),
], ids=["a-byte", "exactly-one", "a-byte-more", "two", "all", "more-than-all"])
def test_the_fewest_least_recently_used_that_cover_what_is_over(over: int, expected: list[int] | None) -> None:
    victims = make_room(templates(1, 2, 3), over, SIZES.get)
    assert (None if victims is None else [t.child.pid for t in victims]) == expected


def test_nothing_is_killed_when_a_size_cannot_be_read_or_there_is_no_candidate() -> None:
    assert make_room(templates(1, 4, 3), 45 * MiB, SIZES.get) is None  # pid 4: unreadable
    assert make_room([], 1, SIZES.get) is None


def test_private_bytes_of_a_real_process_grow_with_what_it_allocates() -> None:
    code = "import sys; x = bytearray(64 * 2**20); x[::4096] = b'1' * len(x[::4096]); print(1, flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"1\n"
            size = pid1_children.private_bytes(proc.pid)
            assert size is not None and 64 * MiB <= size < 128 * MiB
        finally:
            proc.kill()
    assert pid1_children.private_bytes(proc.pid) is None  # gone: unreadable, never 0
    assert (pid1_children.private_bytes(os.getpid()) or 0) > 0
