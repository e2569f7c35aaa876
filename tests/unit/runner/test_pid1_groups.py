"""PID 1's grouped calls (``pid1_groups``) without a sandbox: a malformed group is refused
whole; the replies of a group's calls are gathered into one frame in the request's order,
or sent ahead in parts once they pass GROUP_PART_BYTES; a reply that is not a group's
goes to the host as it is; each call is handed to the sessions as a ``call`` of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sandpit.sandbox_images.runner import limits, pid1_groups
from sandpit.sandbox_images.runner.pid1_groups import Group, GroupingHost, Member, group_problem, handle_calls


class FakeHost:
    """The host channel's two send methods, recording the JSON each frame carries."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def reply(self, message: dict[str, Any]) -> None:
        self.frames.append(json.loads(json.dumps(message)))

    def reply_raw(self, message: dict[str, Any], raw: dict[str, bytes]) -> None:
        self.frames.append({**message, **{k: json.loads(v) for k, v in raw.items()}})

    def fault(self, rid: object, message: str) -> None:
        self.reply({"id": rid, "status": "fault", "message": message})


@pytest.mark.parametrize("calls,problem", [
    (None, "must be a list"), ([], "must be a list"), ([{"session": "a"}] * (limits.MAX_GROUP_CALLS + 1), "must be a list"),
    ([1], "calls[0]: field 'session'"), ([{"session": ""}], "calls[0]: field 'session'"),
    ([{"session": "a"}, {"session": "b"}, {"session": "a"}], "calls[2]: session 'a' is named twice"),
])
def test_a_malformed_group_is_refused_whole(calls: object, problem: str) -> None:
    found = group_problem(calls)
    assert found is not None and problem in found
    host = FakeHost()
    handled: list[Any] = []
    handle_calls(GroupingHost(host), lambda *args: handled.append(args), 7, {"calls": calls})  # type: ignore[arg-type]
    assert handled == [] and host.frames == [{"id": 7, "status": "fault", "message": found}]


def test_each_call_goes_to_the_sessions_and_the_group_answers_once_in_order() -> None:
    host = FakeHost()
    grouping = GroupingHost(host)  # type: ignore[arg-type]
    handled: list[tuple[Member, object, dict[str, Any]]] = []
    handle_calls(grouping, lambda rid, op, msg: handled.append((rid, op, msg)), 9, {"calls": [
        {"session": "a", "name": "bump", "arguments": {"by": 1}, "rules": "envscaler"},
        {"session": "b", "name": "x", "arguments": {}, "rules": "other"}]})
    assert [(op, msg) for _, op, msg in handled] == [
        ("call", {"op": "call", "session": "a", "name": "bump", "arguments": {"by": 1}, "rules": "envscaler"}),
        ("call", {"op": "call", "session": "b", "name": "x", "arguments": {}})]
    grouping.reply({"id": "not a member", "status": "ok"})  # not a group's: sent as it is
    assert host.frames == [{"id": "not a member", "status": "ok"}]
    second, first = handled[1][0], handled[0][0]
    grouping.fault(second, "unknown session 'b'")
    assert len(host.frames) == 1  # the group still waits for its first call
    grouping.reply({"id": first, "status": "ok", "observation": "1"})
    grouping.reply({"id": first, "status": "crashed"})  # a second reply to one call is ignored
    assert host.frames[1:] == [{"id": 9, "status": "ok", "results": [
        {"status": "ok", "observation": "1"}, {"status": "fault", "message": "unknown session 'b'"}]}]


def test_large_replies_go_ahead_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pid1_groups, "GROUP_PART_BYTES", 100)
    host = FakeHost()
    grouping = GroupingHost(host)  # type: ignore[arg-type]
    group = Group(3, 3)
    big = "x" * 150
    grouping.reply({"id": Member(group, 2), "status": "ok", "observation": big})
    grouping.reply({"id": Member(group, 0), "status": "ok", "observation": "small"})
    grouping.reply({"id": Member(group, 1), "status": "ok", "observation": float("nan")})  # not JSON: its fault
    assert host.frames[0] == {"id": 3, "status": "ok", "part": True, "indices": [2],
                              "results": [{"status": "ok", "observation": big}]}
    last = host.frames[1]
    assert last["indices"] == [0, 1] and "part" not in last and len(host.frames) == 2
    assert last["results"][0] == {"status": "ok", "observation": "small"}
    assert last["results"][1]["status"] == "fault" and "could not be encoded" in last["results"][1]["message"]
