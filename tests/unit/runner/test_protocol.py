"""Framing shared by host and runner: length prefix, size cap, strict JSON, depth bound."""

from __future__ import annotations

import json
import socket

import pytest
from sandpit.sandbox_images.runner import limits, protocol
from sandpit.sandbox_images.runner.protocol import FrameBuffer, ProtocolViolation


def frame(body: bytes) -> bytes:
    return protocol.HEADER.pack(len(body)) + body


def test_encode_is_length_prefixed_compact_utf8_json() -> None:
    data = protocol.encode({"id": 1, "text": "héllo"})
    (length,) = protocol.HEADER.unpack(data[:4])
    assert length == len(data) - 4
    assert data[4:] == '{"id":1,"text":"héllo"}'.encode()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_encode_refuses_non_finite_floats(value: float) -> None:
    with pytest.raises(ValueError):
        protocol.encode({"x": [value]})


def test_encode_refuses_non_json_values() -> None:
    with pytest.raises(TypeError):
        protocol.encode({"x": object()})


def test_frame_buffer_reassembles_byte_by_byte_and_several_per_chunk() -> None:
    messages = [{"id": i, "payload": "x" * i} for i in range(5)]
    stream = b"".join(protocol.encode(m) for m in messages)
    buf = FrameBuffer()
    out: list[dict] = []
    for i in range(len(stream)):
        out += buf.feed(stream[i:i + 1])
    assert out == messages
    assert buf.pending == 0
    assert FrameBuffer().feed(stream) == messages


def test_frame_buffer_rejects_oversize_header_before_body_arrives() -> None:
    buf = FrameBuffer(max_frame=100)
    with pytest.raises(ProtocolViolation, match="exceeds the 100-byte limit"):
        buf.feed(protocol.HEADER.pack(101))  # no body at all: refused on the header alone
    assert FrameBuffer(max_frame=100).feed(frame(b'{"a":"' + b"x" * 92 + b'"}')) == [{"a": "x" * 92}]


def test_frame_buffer_rejects_maximal_declared_length() -> None:
    with pytest.raises(ProtocolViolation):
        FrameBuffer().feed(b"\xff\xff\xff\xff")


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_decode_refuses_non_standard_constants(constant: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="non-standard JSON constant"):
        protocol.decode_payload(b'{"x": [1, ' + constant + b"]}")


@pytest.mark.parametrize("payload", [b"[1, 2]", b'"text"', b"42", b"null"])
def test_decode_refuses_non_objects(payload: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="not a JSON object"):
        protocol.decode_payload(payload)


@pytest.mark.parametrize("payload", [b"\xff\xfe{}", b'{"a": ', b"", b"{'a': 1}"])
def test_decode_refuses_invalid_json_and_utf8(payload: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="not valid JSON"):
        protocol.decode_payload(payload)


def test_depth_limit_refuses_deep_nesting_without_recursing() -> None:
    depth = 100_000  # would blow the json module's stack if it got that far
    payload = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ProtocolViolation, match="nested deeper than"):
        protocol.decode_payload(payload)
    with pytest.raises(ProtocolViolation):
        FrameBuffer().feed(frame(payload))


def test_depth_limit_boundary() -> None:
    def nested(levels: int) -> bytes:  # the outer object is one level
        return b'{"a":' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"

    assert protocol.decode_payload(nested(limits.MAX_FRAME_DEPTH)) == json.loads(nested(limits.MAX_FRAME_DEPTH))
    with pytest.raises(ProtocolViolation):
        protocol.decode_payload(nested(limits.MAX_FRAME_DEPTH + 1))


def test_brackets_inside_strings_do_not_count_towards_depth() -> None:
    text = '[{"\\"[' * 1000  # brackets, quotes and escapes, all inside one string
    message = {"s": text}
    assert protocol.decode_payload(json.dumps(message).encode()) == message


def test_recv_frame_over_a_socket_pair() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(protocol.encode({"id": 7, "op": "ping"}) + protocol.HEADER.pack(10_000))
        assert protocol.recv_frame(right) == {"id": 7, "op": "ping"}
        with pytest.raises(ProtocolViolation):
            protocol.recv_frame(right, max_frame=1000)
        left.close()
        with pytest.raises(EOFError):
            protocol.recv_frame(right)


def test_recv_frame_eof_mid_body() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(protocol.HEADER.pack(50) + b'{"a":')
        left.close()
        with pytest.raises(EOFError):
            protocol.recv_frame(right)


def test_frames_before_a_bad_one_are_kept() -> None:
    good = protocol.encode({"id": 1, "x": "a"}) + protocol.encode({"id": 2})
    buffer = protocol.FrameBuffer(1024)
    with pytest.raises(protocol.ProtocolViolation) as info:
        buffer.feed(good + b"\x00\x00\x00\x05hello")
    assert info.value.messages == [{"id": 1, "x": "a"}, {"id": 2}]
    with pytest.raises(protocol.ProtocolViolation) as info:
        protocol.FrameBuffer(8).feed(b"\xff\xff\xff\xff")
    assert info.value.messages == []


class TestRecvReady:
    """``recv_ready``: what a socket holds now, in one or two reads, never waiting."""

    def test_nothing_there_is_none_and_end_of_stream_is_empty(self) -> None:
        a, b = socket.socketpair()
        with a, b:
            assert protocol.recv_ready(b) is None
            a.close()
            assert protocol.recv_ready(b) == b""

    def test_a_small_frame_comes_whole(self) -> None:
        a, b = socket.socketpair()
        with a, b:
            frame = protocol.encode({"id": 1, "op": "call", "name": "bump"})
            a.sendall(frame)
            assert protocol.recv_ready(b) == frame

    @pytest.mark.parametrize("size", [protocol.FIRST_READ, protocol.FIRST_READ + 1, 3 * protocol.FIRST_READ])
    def test_more_than_the_first_read_comes_in_the_same_call(self, size: int) -> None:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        with a, b:
            data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
            a.sendall(data)
            got = protocol.recv_ready(b) or b""
            while len(got) < size:  # the kernel may hand a large write over in pieces
                more = protocol.recv_ready(b)
                assert more, "bytes were lost"
                got += more
            assert got == data

    def test_never_more_than_read_chunk(self) -> None:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        with a, b:
            a.setblocking(False)
            sent = 0
            try:
                while sent < 2 * protocol.READ_CHUNK:
                    sent += a.send(b"y" * 65536)
            except BlockingIOError:
                pass
            total = 0
            while (got := protocol.recv_ready(b)):
                assert len(got) <= protocol.READ_CHUNK
                total += len(got)
            assert total == sent

    def test_end_of_stream_after_a_full_first_read_keeps_the_bytes(self) -> None:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(b"z" * protocol.FIRST_READ)
            a.close()
            assert protocol.recv_ready(b) == b"z" * protocol.FIRST_READ
            assert protocol.recv_ready(b) == b""
