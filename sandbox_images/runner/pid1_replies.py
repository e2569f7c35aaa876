"""What PID 1 takes from a session process's replies (stdlib only; PID 1 never runs
environment code).

A session's process runs untrusted code, and that code can write any frame to the
process's control channel, even one carrying the right request token (the token is in the
process's own memory). So a reply is checked before PID 1 uses it or forwards it to the
host: one that is not in shape counts as the process breaking the protocol (``crashed``:
the process is killed and the session re-created from its last good snapshot), never as
an exception in PID 1 or a value the host cannot take.

* :func:`call_reply`: a call's ``observation`` (text), ``duration_ms`` (none, or a number
  from 0 to 1e9), ``traceback`` (text), ``observation_truncated`` (a bool) and ``delta``
  (``wire.check_delta``, keyed changes allowed: PID 1 applies them to its snapshot);
* :func:`state_of`: the encoded state of an ``init`` or a ``restore`` (whole entries only);
* :func:`failure_text`: the observation and traceback of a failed ``init``, as text;
* :func:`describe_reply`: tools within MAX_SCHEMAS_BYTES and notes, or a capped error.
"""

from __future__ import annotations

from . import protocol
from .limits import (
    DESCRIBE_ERROR_CHARS,
    DESCRIBE_TRACEBACK_CHARS,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_SCHEMAS_BYTES,
)
from .wire import check_delta

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

    from .protocol import CallReply, DescribeReply, Encoded


def call_reply(rid: object, status: str, msg: dict[str, Any], stdout: str, stderr: str) -> CallReply | None:
    """The host's reply to a call, from the process's reply ``msg`` (``status`` already
    checked) and the output PID 1 read; None when ``msg`` is not in shape (module
    docstring). A missing ``delta`` is an empty one, as for a call that changed nothing."""
    observation, duration = msg.get("observation"), msg.get("duration_ms")
    traceback, truncated = msg.get("traceback"), msg.get("observation_truncated", False)
    delta = check_delta(msg.get("delta", {}))
    timed = type(duration) is int or type(duration) is float
    if (type(observation) is not str or not (duration is None or timed and 0 <= duration < 1e9)
            or not (traceback is None or type(traceback) is str) or type(truncated) is not bool or delta is None):
        return None
    reply: CallReply = {"id": rid, "status": status, "observation": observation, "stdout": stdout,
                        "stderr": stderr, "delta": delta}
    if duration is not None:
        reply["duration_ms"] = float(duration)
    if traceback:
        reply["traceback"] = traceback
    if truncated:
        reply["observation_truncated"] = True
    return reply


def state_of(msg: dict[str, Any]) -> Encoded | None:
    """The encoded state an ``init`` or ``restore`` reply carries as its delta's ``set``
    (whole entries, no keyed change); None when it is not in shape."""
    delta = check_delta(msg.get("delta", {}), keyed=False)
    return None if delta is None else dict(delta["set"])


def failure_text(msg: dict[str, Any]) -> tuple[str, str | None]:
    """The ``observation`` and ``traceback`` of a failed ``init``, as text (what the
    process sent, turned into text when it is not)."""
    traceback = msg.get("traceback")
    return str(msg.get("observation")), traceback if isinstance(traceback, str) else None


def describe_reply(rid: object, status: str, msg: dict[str, Any]) -> DescribeReply:
    """The host reply to a ``describe`` answered by a session's process. ``tools`` must be
    a list and encode to at most MAX_SCHEMAS_BYTES, ``notes`` a list of at most MAX_NOTES
    entries (each cut to MAX_NOTE_CHARS), an error's observation and traceback are cut to
    DESCRIBE_ERROR_CHARS and DESCRIBE_TRACEBACK_CHARS; anything else becomes an ``error``
    result (the host validates each schema's shape)."""
    if status != "ok":
        out: DescribeReply = {"id": rid, "status": status,
                              "observation": str(msg.get("observation"))[:DESCRIBE_ERROR_CHARS]}
        if isinstance(msg.get("traceback"), str):
            out["traceback"] = msg["traceback"][:DESCRIBE_TRACEBACK_CHARS]
        return out
    tools = msg.get("tools")
    notes = msg.get("notes")
    if not isinstance(tools, list) or not isinstance(notes, list) or len(notes) > MAX_NOTES:
        return {"id": rid, "status": "error", "observation": "Error: malformed describe reply from the session"}
    try:
        size = len(protocol.encode({"tools": tools}, errors="replace")) - 64  # frame header and key
    except (TypeError, ValueError, RecursionError):  # not JSON (never so in a frame PID 1 parsed)
        size = MAX_SCHEMAS_BYTES + 1
    if size > MAX_SCHEMAS_BYTES:
        return {"id": rid, "status": "error",
                "observation": f"Error: tool schemas exceed {MAX_SCHEMAS_BYTES} bytes"}
    return {"id": rid, "status": "ok", "tools": tools, "notes": [str(n)[:MAX_NOTE_CHARS] for n in notes]}
