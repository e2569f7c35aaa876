"""What PID 1 takes from a session process's replies (``pid1_replies``): a call's fields,
the state of an init or a restore, a failed init's texts and a describe's tools, with the
frames a hostile process could forge (any field of any type)."""

from __future__ import annotations

from typing import Any

import pytest
from sandpit.sandbox_images.runner import limits
from sandpit.sandbox_images.runner.pid1_replies import call_reply, describe_reply, failure_text, state_of


def reply(**changes: object) -> dict[str, Any]:
    return {"id": "t", "status": "ok", "observation": "3", "duration_ms": 0.25,
            "delta": {"set": {"count": ["j", 3], "log": ["k", {"v": 2, "ops": []}]}, "del": ["gone"]}, **changes}


def test_a_call_reply_in_shape_is_forwarded_with_pid1s_output() -> None:
    out = call_reply(7, "ok", reply(traceback="tb", observation_truncated=True), "printed", "")
    assert out == {"id": 7, "status": "ok", "observation": "3", "duration_ms": 0.25, "stdout": "printed",
                   "stderr": "", "delta": reply()["delta"], "traceback": "tb", "observation_truncated": True}
    bare = call_reply(7, "rejected", {"id": "t", "status": "rejected", "observation": "no"}, "", "")
    assert bare is not None and bare["delta"] == {"set": {}, "del": []}
    assert "traceback" not in bare and "duration_ms" not in bare  # nothing said: nothing forwarded


@pytest.mark.parametrize("changes", [
    {"observation": 5}, {"observation": None}, {"observation": ["x"]}, {"duration_ms": "1"}, {"duration_ms": -1},
    {"duration_ms": float("inf")}, {"duration_ms": True}, {"traceback": 7}, {"observation_truncated": "yes"},
    {"delta": []}, {"delta": None}, {"delta": "x"}, {"delta": {"set": []}}, {"delta": {"set": {"a": "x"}}},
    {"delta": {"set": {"a": ["q", 1]}}}, {"delta": {"set": {"a": ["k"]}}}, {"delta": {"del": "a"}},
    {"delta": {"del": [1]}}, {"delta": {"set": None, "del": []}},
])
def test_a_call_reply_out_of_shape_is_refused(changes: dict[str, object]) -> None:
    assert call_reply(7, "ok", reply(**changes), "", "") is None


def test_the_state_of_an_init_or_restore_is_whole_entries() -> None:
    assert state_of({"delta": {"set": {"a": ["j", 1], "b": ["p", "QUJD", {}]}, "del": []}}) == \
        {"a": ["j", 1], "b": ["p", "QUJD", {}]}
    assert state_of({}) == {}  # nothing sent: an empty state
    for bad in ({"delta": {"set": {"a": ["k", {}]}}}, {"delta": []}, {"delta": {"set": {"a": 1}}}):
        assert state_of(bad) is None, bad


def test_a_failed_init_is_reported_as_text() -> None:
    assert failure_text({"observation": "Error: X", "traceback": "tb"}) == ("Error: X", "tb")
    assert failure_text({"observation": {"forged": 1}, "traceback": ["x"]}) == ("{'forged': 1}", None)


def test_describe_replies_are_capped_or_refused() -> None:
    good = describe_reply(1, "ok", {"tools": [{"type": "function"}], "notes": ["n" * 10_000]})
    assert good["status"] == "ok" and good["notes"] == ["n" * limits.MAX_NOTE_CHARS]
    failed = describe_reply(1, "error", {"observation": "o" * 10**6, "traceback": "t" * 10**6})
    assert len(failed["observation"]) == limits.DESCRIBE_ERROR_CHARS
    assert len(failed["traceback"]) == limits.DESCRIBE_TRACEBACK_CHARS
    assert "traceback" not in describe_reply(1, "error", {"observation": "o", "traceback": 5})
    for bad in ({"tools": {}, "notes": []}, {"tools": [], "notes": "x"}, {"tools": [], "notes": [""] * 1000},
                {"tools": ["x" * (limits.MAX_SCHEMAS_BYTES + 100)], "notes": []}, {"tools": [float("nan")], "notes": []}):
        assert describe_reply(1, "ok", bad)["status"] == "error", bad
