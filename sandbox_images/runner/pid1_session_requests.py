"""What PID 1's sessions (``pid1_sessions``) accept from the host (stdlib only): the
fields of ``open`` and ``restore`` requests, validated. Malformed requests raise
ValueError with the message the runner answers ``fault`` with.

A snapshot (``open``'s, ``restore``'s) comes as the base64 of the encoded state's JSON
text (``snapshot_b64``), which PID 1 forwards to the session's process as those bytes,
spliced into the process's frame (``protocol.encode_raw``) without parsing them: a
1.5 MB state costs PID 1 a base64 decode instead of a depth check, a parse and an
encode. The process parses it and applies it (``child_session.Session.apply_snapshot``);
PID 1 keeps the state the process replies with as the session's last good snapshot.
"""

from __future__ import annotations

from .wire import state_text_field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .protocol import OpenRequest

QUEUED_OPS = ("call", "state", "snapshot", "restore", "describe")
"""Host requests that queue behind a session's in-flight request (the others: ``open``, ``close``)."""


def snapshot_text(msg: Mapping[str, object]) -> bytes:
    """The JSON text of a request's ``snapshot_b64`` (``open``'s, ``restore``'s:
    ``wire.state_text_field``). Raises ValueError when it is missing or malformed."""
    return state_text_field(msg, "snapshot_b64")


def open_request(msg: OpenRequest) -> tuple[dict[str, Any], bytes | None]:
    """The session's spec of an ``open`` (``source``, ``class_name``, ``init_config``,
    ``describe_only``, ``seed`` when given: seeds ``random`` before the constructor, as
    EnvScaler's ``reset(seed)``) and its snapshot's JSON text (None: no ``snapshot_b64``).
    ``config_hash`` is the caller's to check. Raises ValueError (a parsed ``snapshot``
    field included: the host sends the text)."""
    spec = {k: msg.get(k) for k in ("source", "class_name", "init_config")}
    spec["describe_only"] = msg.get("describe_only") is True
    seed = msg.get("seed")
    if seed is not None:
        if type(seed) is not int or not 0 <= seed < 2 ** 64:
            raise ValueError("field 'seed' must be an integer from 0 to 2**64 - 1")
        spec["seed"] = seed
    if not isinstance(spec["source"], str) or not isinstance(spec["class_name"], str):
        raise ValueError("fields 'source' and 'class_name' must be strings")
    if spec["init_config"] is not None and not isinstance(spec["init_config"], dict):
        raise ValueError("field 'init_config' must be an object")
    if "snapshot" not in msg and "snapshot_b64" not in msg:
        return spec, None
    return spec, snapshot_text({} if "snapshot" in msg else msg)  # a parsed ``snapshot``: refused, text or not
