"""PID 1's grouped calls: one tool call in each of several sessions, asked and answered
in one frame each way (``calls``; stdlib only).

A group is checked as a whole first (``calls`` a list of 1 to MAX_GROUP_CALLS objects,
each naming a session by a string, no session named twice); anything else answers the
whole request ``fault``. Then each call is handed to the sessions exactly as a ``call``
request of its own (``pid1_sessions.Sessions.handle``: its queue, its deadline, its
timeout/oom/crash handling, an unknown session's ``fault``), all of them before the loop
reads any reply, so every session's process is written to first. The sessions answer
through :class:`GroupingHost`: a reply whose id is a :class:`Member` is kept in its
group instead of being sent, and when the last call of a group has its reply, the group
is answered with one frame, ``{"id", "status": "ok", "results": [reply, ...]}`` (each
reply without its ``id``, in the request's order). So that no frame of a group is larger
than its largest reply would be alone, the replies gathered are sent ahead as a *part*
once they pass GROUP_PART_BYTES while calls are still running: ``{"id", "status": "ok",
"part": true, "indices": [i, ...], "results": [...]}``; the last frame of such a group
carries ``indices`` too (the host's channel gathers the parts, ``executor/pool/channel.py``). A call that loops past its deadline,
runs out of memory or kills its process is that call's reply (``timeout``/``oom``/
``crashed``); it fails only its own session.
"""

from __future__ import annotations

from . import protocol
from .limits import GROUP_PART_BYTES, MAX_GROUP_CALLS, SESSION_ID_MAX_CHARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .pid1_host import Host
    from .protocol import AnyReply, CallsReply


class Group:
    """The calls of one ``calls`` request still waiting for their replies."""

    __slots__ = ("rid", "answered", "indices", "results", "size", "parted", "waiting")

    def __init__(self, rid: object, size: int) -> None:
        self.rid = rid
        self.answered: list[bool] = [False] * size
        self.indices: list[int] = []
        """Positions of the replies in :attr:`results` (the JSON text of each, not yet sent)."""
        self.results: list[bytes] = []
        self.size = 0
        """Bytes of :attr:`results`."""
        self.parted = False
        """A part was sent ahead: every frame of the group names its ``indices``."""
        self.waiting = size


class Member:
    """The request id the sessions see for one call of a group (never sent to the host)."""

    __slots__ = ("group", "index")

    def __init__(self, group: Group, index: int) -> None:
        self.group = group
        self.index = index


class GroupingHost:
    """The host channel as the sessions use it: replies to a group's call are gathered
    (module docstring), every other reply goes to ``host`` as it is."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def reply(self, message: AnyReply) -> None:
        """Send ``message``, or keep it in its group (its id a :class:`Member`); a group
        whose last reply this is is answered. Raises OSError when the host is gone."""
        member = message.get("id")
        if not isinstance(member, Member):
            self.host.reply(message)
            return
        group = member.group
        if group.answered[member.index]:
            return
        result = dict(message)
        result.pop("id", None)
        try:  # the JSON of Host.reply's frame, without its length header
            text = protocol.encode(result, errors="replace")[protocol.HEADER.size:]
        except (ValueError, TypeError) as exc:  # what Host.reply would refuse: that call's fault
            text = protocol.encode({"status": "fault", "message": f"reply could not be encoded: {exc}"[:500]},
                                   errors="replace")[protocol.HEADER.size:]
        group.answered[member.index] = True
        group.waiting -= 1
        group.indices.append(member.index)
        group.results.append(text)
        group.size += len(group.results[-1])
        if group.waiting == 0 or group.size > GROUP_PART_BYTES:
            self._send(group, last=group.waiting == 0)

    def _send(self, group: Group, last: bool) -> None:
        """Send the replies gathered in ``group``: the whole group in order, or a part."""
        head: CallsReply = {"id": group.rid, "status": "ok"}
        if not last or group.parted:
            head["indices"] = group.indices
            group.parted = True
        if not last:
            head["part"] = True
        elif not group.parted:  # every reply in one frame: put them in the request's order
            order = sorted(range(len(group.indices)), key=group.indices.__getitem__)
            group.results = [group.results[i] for i in order]
        self.host.reply_raw(head, {"results": b"[" + b",".join(group.results) + b"]"})
        group.indices, group.results, group.size = [], [], 0

    def reply_raw(self, message: AnyReply, raw: dict[str, bytes]) -> None:
        """An ``open``'s reply with JSON text members (never a group's: groups carry calls only)."""
        self.host.reply_raw(message, raw)

    def fault(self, request_id: object, message: str) -> None:
        """Answer an unusable request ``fault`` (kept in its group when it is a group's call)."""
        self.reply({"id": request_id, "status": "fault", "message": message})


def group_problem(calls: object) -> str | None:
    """Why ``calls`` cannot be a group's (module docstring), or None when it can."""
    if not isinstance(calls, list) or not 1 <= len(calls) <= MAX_GROUP_CALLS:
        return f"field 'calls' must be a list of 1 to {MAX_GROUP_CALLS} calls"
    seen: set[str] = set()
    for index, call in enumerate(calls):
        sid = call.get("session") if isinstance(call, dict) else None
        if not isinstance(sid, str) or not sid or len(sid) > SESSION_ID_MAX_CHARS:
            return f"calls[{index}]: field 'session' must be a non-empty string"
        if sid in seen:
            return f"calls[{index}]: session {sid[:64]!r} is named twice in one group"
        seen.add(sid)
    return None


def handle_calls(grouping: GroupingHost, handle: Callable[[object, object, Any], None], rid: object,
                 msg: Any) -> None:
    """Host request ``calls {calls: [{session, name, arguments, rules?}]}``: each call
    handed to ``handle`` (``Sessions.handle``, whose replies go through ``grouping``) as
    a ``call`` of its own, the group answered once all replied
    (module docstring); a malformed group is answered ``fault`` and runs nothing."""
    calls = msg.get("calls")
    problem = group_problem(calls)
    if problem is not None:
        grouping.host.fault(rid, problem)
        return
    group = Group(rid, len(calls))
    for index, call in enumerate(calls):
        request = {"op": "call", "session": call["session"], "name": call.get("name"),
                   "arguments": call.get("arguments")}
        if call.get("rules") == "envscaler":
            request["rules"] = "envscaler"
        member = Member(group, index)
        try:
            handle(member, "call", request)
        except Exception as exc:  # noqa: BLE001 - that call's fault; the others go on
            grouping.fault(member, f"runner error: {type(exc).__name__}: {exc}")
