"""Frames with attachments (``runner/attached.py``): how the host sends a check batch's
states beside the frame's JSON. PID 1's reader takes them whole or in pieces and refuses
every malformed one; every other reader refuses them outright."""

from __future__ import annotations

import json

import pytest
from sandpit.sandbox_images.runner import limits, protocol
from sandpit.sandbox_images.runner.attached import ATTACHED, HostFrameBuffer, encode_attached
from sandpit.sandbox_images.runner.limits import MAX_ATTACHMENTS

STATES = [b'{"a":["j",{"k":"\\"[{"}]}', b"{}"]


def test_attachments_come_back_as_the_bytes_sent_whole_or_in_pieces() -> None:
    frame = encode_attached({"id": 3, "op": "checks", "checks": [{"check_func": "x"}]}, STATES)
    plain = protocol.encode({"id": 4, "op": "ping"})
    expected = [{"id": 3, "op": "checks", "checks": [{"check_func": "x"}], "attached": STATES}, {"id": 4, "op": "ping"}]
    assert HostFrameBuffer(1 << 20).feed(frame + plain) == expected
    pieces, buffer = [], HostFrameBuffer(1 << 20)
    for index in range(0, len(frame + plain), 7):
        pieces += buffer.feed((frame + plain)[index:index + 7])
    assert pieces == expected and buffer.pending == 0
    assert HostFrameBuffer(1 << 20).feed(encode_attached({"op": "x"}, [b"", b"{}"]))[0]["attached"] == [b"", b"{}"]


def test_no_other_reader_takes_a_frame_with_attachments() -> None:
    with pytest.raises(protocol.ProtocolViolation, match="exceeds"):
        protocol.FrameBuffer(limits.MAX_FRAME_BYTES).feed(encode_attached({"op": "checks"}, STATES))


def test_the_encoder_refuses_what_the_reader_would() -> None:
    for message, parts in [({"attached": []}, STATES), ({"op": "x"}, [b"{}"] * (MAX_ATTACHMENTS + 1)),
                           ({"n": float("nan")}, STATES)]:
        with pytest.raises(ValueError):
            encode_attached(message, parts)


def hand_made(body: bytes, tail: bytes, body_size: int | None = None, size: int | None = None) -> bytes:
    """An attached frame with any body, declared body size and declared frame size."""
    payload = protocol.HEADER.pack(len(body) if body_size is None else body_size) + body + tail
    return protocol.HEADER.pack((len(payload) if size is None else size) | ATTACHED) + payload


@pytest.mark.parametrize(("frame", "message"), [
    (hand_made(b'{"attached":[2]}', b"{}x"), "sizes"),  # a byte too many
    (hand_made(b'{"attached":[3]}', b"{}"), "sizes"),  # a byte too few
    (hand_made(b'{"attached":[-1,3]}', b"{}"), "sizes"),
    (hand_made(b'{"attached":[true,1]}', b"{}"), "sizes"),
    (hand_made(b'{"attached":[2.0]}', b"{}"), "sizes"),
    (hand_made(b'{"attached":[]}', b""), "sizes"),
    (hand_made(b'{"attached":"2"}', b"{}"), "sizes"),
    (hand_made(b'{"op":"checks"}', b"{}"), "sizes"),
    (hand_made(b'{"attached":[1,1,1,1,1,1,1,1,1]}', b"{" * 9), "sizes"),
    (hand_made(b'{"attached":[2]}', b"{}", body_size=1 << 20), "beyond its end"),
    (hand_made(b"[2]", b"{}"), "not a JSON object"),
    (hand_made(b'{"attached":[2]', b"{}"), "not valid JSON"),
    (hand_made(b'{"attached":[2],"x":' + b"[" * 200 + b"]" * 200 + b"}", b"{}"), "deeper"),
    (protocol.HEADER.pack(2 | ATTACHED) + b"ab", "no body size"),
    (hand_made(b'{"attached":[2]}', b"{}", size=(1 << 20) + 1), "exceeds"),
])
def test_malformed_attached_frames_are_violations_that_keep_the_frames_before(frame: bytes, message: str) -> None:
    good = protocol.encode({"id": 1, "op": "ping"})
    with pytest.raises(protocol.ProtocolViolation, match=message) as caught:
        HostFrameBuffer(1 << 20).feed(good + frame)
    assert caught.value.messages == [{"id": 1, "op": "ping"}]


def test_json_sizes_round_trip_through_a_plain_frame_are_not_attachments() -> None:
    """A plain frame naming ``attached`` gives numbers, which the checks request refuses."""
    message = HostFrameBuffer(1 << 20).feed(protocol.encode({"op": "checks", "attached": [2, 2]}))[0]
    assert message["attached"] == [2, 2] and json.dumps(message)
