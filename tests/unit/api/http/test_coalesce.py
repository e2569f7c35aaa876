"""One socket write per response (``sandpit.api.http.coalesce``): the transport's held
writes, and uvicorn serving through :class:`CoalescingHttpProtocol` answering byte for byte
what its own ``httptools`` protocol answers (keep-alive, pipelined requests, streamed and
large bodies, ``Connection: close``, a client gone mid-response)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from sandpit.api.http.coalesce import FLUSH_BYTES, CoalescingHttpProtocol, CoalescingTransport
from starlette.types import Receive, Scope, Send


class Recording(asyncio.Transport):
    """The underlying transport: what it was given, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append("eof")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7


def run(test: Any) -> None:
    asyncio.run(test())


def test_the_writes_of_one_pass_reach_the_socket_as_one() -> None:
    async def test() -> None:
        under = Recording()
        transport = CoalescingTransport(under, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert under.writes == [], "the head waits for the body"
        transport.write(b"{}")
        assert under.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        await asyncio.sleep(0)
        assert len(under.writes) == 1, "nothing is written twice"

    run(test)


def test_a_lone_write_goes_out_on_the_next_pass_and_order_holds() -> None:
    async def test() -> None:
        under = Recording()
        transport = CoalescingTransport(under, asyncio.get_running_loop())
        transport.write(b"a")
        transport.write(bytearray(b"b"))
        transport.write(memoryview(b"c"))
        assert under.writes == [b"ab"]
        assert transport.get_write_buffer_size() == 7 + 1, "held bytes count as buffered"
        await asyncio.sleep(0)
        assert under.writes == [b"ab", b"c"]
        transport.write(b"")
        transport.writelines([b"d", b"e", b"f"])
        await asyncio.sleep(0)
        assert b"".join(under.writes) == b"abcdef"

    run(test)


def test_a_large_write_is_not_held() -> None:
    async def test() -> None:
        under = Recording()
        transport = CoalescingTransport(under, asyncio.get_running_loop())
        big = b"x" * FLUSH_BYTES
        transport.write(big)
        assert under.writes == [big]

    run(test)


def test_close_and_write_eof_hand_over_what_is_held_first() -> None:
    async def test() -> None:
        under = Recording()
        transport = CoalescingTransport(under, asyncio.get_running_loop())
        transport.write(b"last")
        transport.write_eof()
        assert (under.writes, under.events) == ([b"last"], ["eof"])
        transport.write(b"bye")
        transport.close()
        assert (under.writes, under.events) == ([b"last", b"bye"], ["eof", "close"])
        transport.write(b"after close")
        await asyncio.sleep(0)
        assert under.writes == [b"last", b"bye"], "a closing transport is given nothing more"

    run(test)


def test_abort_drops_what_is_held() -> None:
    async def test() -> None:
        under = Recording()
        transport = CoalescingTransport(under, asyncio.get_running_loop())
        transport.write(b"dropped")
        transport.abort()
        await asyncio.sleep(0)
        assert (under.writes, under.events) == ([], ["abort"])

    run(test)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """A small ASGI app: ``/small`` (head and body), ``/stream`` (many chunks, some
    after a yield), ``/big`` (a 1 MiB body), ``/echo`` (the request body back)."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(50):
            await send({"type": "http.response.body", "body": b"chunk %d;" % i, "more_body": True})
            if i % 7 == 0:
                await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b""})
        return
    data = {"/small": b'{"ok": true}', "/big": bytes(range(256)) * 4096, "/echo": body}.get(path, b"missing")
    await send({"type": "http.response.start", "status": 200 if path != "/missing" else 404,
                "headers": [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


@pytest.fixture(scope="module", params=["httptools", "coalescing"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    http: Any = CoalescingHttpProtocol if request.param == "coalescing" else "httptools"
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", http=http,
                            date_header=False, server_header=False)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield request.param, port
    srv.should_exit = True
    thread.join(10)


def exchange(port: int, raw: bytes, until_closed: bool = False, expect: int = 1) -> bytes:
    """Send ``raw`` on a new connection; read ``expect`` whole responses (or to EOF)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        got = b""
        while True:
            more = sock.recv(1 << 20)
            if not more:
                return got
            got += more
            if not until_closed and complete(got) >= expect:
                return got


def complete(data: bytes) -> int:
    """How many whole responses ``data`` holds (content-length or chunked)."""
    count = 0
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next((int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")), None)
        if length is not None:
            if len(rest) < length:
                return count
            data = rest[length:]
        else:
            end = rest.find(b"\r\n0\r\n\r\n")
            if end < 0 and not rest.startswith(b"0\r\n\r\n"):
                return count
            data = rest[end + 7:] if end >= 0 else rest[5:]
        count += 1
    return count


REQUESTS = {
    "small": b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n",
    "missing": b"GET /missing HTTP/1.1\r\nhost: x\r\n\r\n",
    "stream": b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n",
    "big": b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n",
    "echo": b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello",
    "pipelined": b"GET /small HTTP/1.1\r\nhost: x\r\n\r\n" * 3 + b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi",
}
EXPECT = {"pipelined": 4}
answers: dict[str, dict[str, bytes]] = {}


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_uvicorn_answers_the_same_bytes_through_the_coalescing_protocol(server: tuple[str, int], name: str) -> None:
    kind, port = server
    got = exchange(port, REQUESTS[name], expect=EXPECT.get(name, 1))
    assert complete(got) == EXPECT.get(name, 1)
    answers.setdefault(name, {})[kind] = got
    if len(answers[name]) == 2:
        assert answers[name]["coalescing"] == answers[name]["httptools"]


def test_connection_close_gets_the_whole_response_then_eof(server: tuple[str, int]) -> None:
    _, port = server
    got = exchange(port, b"GET /big HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", until_closed=True)
    assert got.endswith(bytes(range(256)) * 4096)
    assert b"connection: close" in got.partition(b"\r\n\r\n")[0].lower()


def test_a_client_gone_mid_response_leaves_the_server_serving(server: tuple[str, int]) -> None:
    _, port = server
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.sendall(REQUESTS["big"] + REQUESTS["stream"])
        sock.close()  # reset: the server's writes find the connection gone
    got = exchange(port, REQUESTS["small"])
    assert got.endswith(b'{"ok": true}')
