"""Frames with attachments: how the host sends PID 1 a request that carries large byte
strings (a check batch's two states, JSON texts of up to 16 MiB each) beside its JSON
instead of as base64 inside it. PID 1 forwards those bytes to a process without reading
them, so it then neither parses megabytes of base64 text in the frame nor decodes them:
a 1.5 MB state cost it about 5 ms of CPU that way.

Stdlib only. The layout (sizes big-endian, ``protocol.HEADER``)::

    [4: size | ATTACHED] [4: n, the JSON body's size] [n: JSON object with
    "attached": [s1, s2, ...]] [s1 bytes] [s2 bytes] ...

``size`` counts everything after the first header, and the attachments must fill it
exactly. Only the host's connection reads such frames (:class:`HostFrameBuffer`, in
PID 1): every other frame buffer (``protocol.FrameBuffer``) takes the set top bit for a
size over its limit and refuses the frame, so no process in the sandbox can send one.
The decoded message holds the attachments' bytes under ``attached``, in order.
"""

from __future__ import annotations

import json

from .limits import MAX_ATTACHMENTS
from .protocol import HEADER, FrameBuffer, ProtocolViolation, decode_payload

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

ATTACHED = 1 << 31
"""The top bit of a frame's size header: the frame has attachments."""


def encode_attached(message: Mapping[str, Any], attachments: Sequence[bytes]) -> bytes:
    """A frame of ``message`` (compact JSON, which must not have a member ``attached``)
    with ``attachments`` after it (module docstring). Raises ValueError for NaN or
    infinity, a member ``attached``, more than :data:`MAX_ATTACHMENTS` attachments or a
    frame of 2 GiB or more; TypeError for values that are not JSON."""
    if "attached" in message or len(attachments) > MAX_ATTACHMENTS:
        raise ValueError(f"a frame carries at most {MAX_ATTACHMENTS} attachments, under `attached`")
    body = json.dumps({**message, "attached": [len(part) for part in attachments]}, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode("utf-8")
    size = HEADER.size + len(body) + sum(len(part) for part in attachments)
    if size >= ATTACHED:
        raise ValueError("a frame with attachments must be smaller than 2 GiB")
    return b"".join([HEADER.pack(size | ATTACHED), HEADER.pack(len(body)), body, *attachments])


def _split(payload: bytes, max_depth: int) -> dict[str, Any]:
    """The message of an attached frame's ``payload`` (after its first header), its
    ``attached`` member replaced by the attachments' bytes. Raises ProtocolViolation."""
    if len(payload) < HEADER.size:
        raise ProtocolViolation("frame with attachments has no body size")
    (body_size,) = HEADER.unpack_from(payload, 0)
    start = HEADER.size + body_size
    if start > len(payload):
        raise ProtocolViolation("frame with attachments declares a body beyond its end")
    message = decode_payload(payload[HEADER.size:start], max_depth)
    sizes = message.get("attached")
    if (type(sizes) is not list or not 1 <= len(sizes) <= MAX_ATTACHMENTS
            or any(type(size) is not int or size < 0 for size in sizes) or start + sum(sizes) != len(payload)):
        raise ProtocolViolation("frame's `attached` must list the sizes of the bytes that fill it")
    parts = []
    for size in sizes:
        parts.append(payload[start:start + size])
        start += size
    message["attached"] = parts
    return message


class HostFrameBuffer(FrameBuffer):
    """PID 1's reader of the host's frames: ``protocol.FrameBuffer`` that also takes
    frames with attachments (module docstring), within the same ``max_frame`` bytes."""

    size_bits = ~ATTACHED & 0xFFFFFFFF

    def decode(self, header: int, payload: bytes) -> dict[str, Any]:
        """The message of one frame's ``payload``, its attachments under ``attached``
        when ``header`` has the :data:`ATTACHED` flag. Raises ProtocolViolation."""
        return _split(payload, self.max_depth) if header & ATTACHED else super().decode(header, payload)
