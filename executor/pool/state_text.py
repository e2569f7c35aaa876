"""The JSON text of a state as the host sends it into a sandbox: a check batch's two
states (``jobs.check_state``), a restore's snapshot (``session.Session.restore``) and an
open's (``configs.snapshot_field``), these two as base64 (:func:`state_b64`). The runner forwards the text to a process that
parses it with the standard library, so any text that parses to the same values will
do; this one is orjson's where orjson writes the values exactly (about six times faster
than ``json.dumps`` on a 1.5 MB state), else ``protocol.snapshot_text``'s.
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


def state_b64(state: dict[str, Any]) -> str:
    """:func:`state_text` of ``state`` as base64 text: a snapshot field of the runner's
    ``open`` and ``restore`` (``snapshot_b64``). Raises as :func:`state_text`."""
    return base64.b64encode(state_text(state)).decode("ascii")
