"""How the host reads a ``calls`` reply (``executor/pool/grouped.py``): the results in
order, or put back in order from parts by their positions; anything malformed (a
position missing, twice, out of range, not an int; results that are not objects; a
refused group) is None, which fails each call of the group with SessionError."""

from __future__ import annotations

from typing import Any

import pytest
from sandpit.executor.pool.grouped import _results

A, B, C = {"status": "ok", "observation": "a"}, {"status": "error"}, {"status": "timeout"}


def test_a_whole_group_in_order() -> None:
    assert _results({"id": 1, "status": "ok", "results": [A, B]}, 2) == [A, B]


def test_parts_put_back_by_position() -> None:
    reply = {"status": "ok", "indices": [0, 2], "results": [A, C],
             "parts": [{"status": "ok", "part": True, "indices": [1], "results": [B]}]}
    assert _results(reply, 3) == [A, B, C]


@pytest.mark.parametrize("reply", [
    {"status": "fault", "message": "no"},
    {"status": "ok", "results": [A]},
    {"status": "ok", "results": [A, "not an object"]},
    {"status": "ok", "results": "not a list"},
    {"status": "ok", "indices": [0, 0], "results": [A, B]},
    {"status": "ok", "indices": [0, 5], "results": [A, B]},
    {"status": "ok", "indices": [0, True], "results": [A, B]},
    {"status": "ok", "indices": [0], "results": [A]},
    {"status": "ok", "indices": [0, 1], "results": [A]},
    {"status": "ok", "indices": [1], "results": [B], "parts": ["not a frame"]},
    {"status": "ok", "indices": [1], "results": [B], "parts": [{"indices": [1], "results": [A]}]},
])
def test_a_malformed_reply_is_none(reply: dict[str, Any]) -> None:
    assert _results(reply, 2) is None
