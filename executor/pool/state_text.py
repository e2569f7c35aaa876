"""The JSON text of a state as the host sends it into a sandbox: a check batch's two
states (``jobs.check_state``), a restore's snapshot (``session.Session.restore``) and an
open's (``configs.snapshot_field``), each as base64 in the runner's frame
(:func:`b64_member`). The runner forwards the text to a process that parses it with the
standard library, so any text that parses to the same values will do; this one is
orjson's where orjson writes the values exactly (about six times faster than
``json.dumps`` on a 1.5 MB state), else ``protocol.snapshot_text``'s.

A frame member holding such base64 is a :class:`JsonText`, which the channel splices into
the request's frame as it is (``protocol.encode_raw``) instead of having ``json.dumps``
scan megabytes of base64 for characters to escape: the frame's bytes are the same but
for the order of its members.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from sandpit.sandbox_images.runner import protocol


def state_text(state: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON text of ``state`` (encoded attributes, or any JSON object).

    orjson writes it unless it cannot write the value exactly, in which case the text is
    ``protocol.snapshot_text(state, errors="strict")``'s, which raises what it raises:
    orjson refuses integers beyond 64 bits, keys that are not strings (the standard
    library writes them as strings), lone surrogates, nesting deeper than 255 and values
    JSON has no form for; and it writes NaN and the infinities as ``null``, so a text
    holding ``null`` at all is written by the standard library (which refuses them).

    Raises:
        ValueError: a value JSON has no form for (NaN, infinities), text UTF-8 cannot
            carry (a lone surrogate).
        TypeError: a value that is not JSON (a set, an object).
        RecursionError: nesting deeper than the interpreter's recursion limit.
    """
    try:
        text = orjson.dumps(state)
    except orjson.JSONEncodeError:
        return protocol.snapshot_text(state, errors="strict")
    if b"null" in text:  # maybe NaN or an infinity: only the standard library tells them from None
        return protocol.snapshot_text(state, errors="strict")
    return text


class JsonText(bytes):
    """The UTF-8 text of one JSON value, given as a request field to
    ``channel.RunnerChannel.submit``, which splices it into the frame without encoding it
    again (``protocol.encode_raw``). Whoever makes one vouches that it is well-formed
    JSON: only :func:`b64_member` does, and base64 between quotes is a JSON string with
    nothing to escape."""

    __slots__ = ()


def b64_member(text: bytes) -> JsonText:
    """``text`` (bytes) as the JSON string of its standard, padded base64: a frame member
    such as ``snapshot_b64``, ``config_b64`` or a check batch's ``initial_state_b64``,
    equal to what ``json.dumps`` writes for ``base64.b64encode(text).decode()``."""
    return JsonText(b'"' + base64.b64encode(text) + b'"')


def state_b64(state: dict[str, Any]) -> JsonText:
    """:func:`state_text` of ``state`` as a base64 frame member (:func:`b64_member`): a
    snapshot field of the runner's ``open`` and ``restore`` (``snapshot_b64``). Raises as
    :func:`state_text`."""
    return b64_member(state_text(state))
