"""The host link (the Ray backend's direct data path) on loopback, without Ray: a
:class:`LinkServer` answering with a plain dispatch function and real sockets. Requests are
answered by id whatever their order; anything but an authenticated peer speaking the
protocol is cut off without disturbing the other connections."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sandpit.executor.errors import LinkRefused, SandboxLost
from sandpit.executor.ray.link import HostLink, LinkServer
from sandpit.sandbox_images.runner import protocol

TOKEN = bytes(range(32))
MAX_FRAME = 1 << 20


def dispatch(op: str, args: list[Any]) -> dict[str, Any]:
    """``noop`` echoes its args; ``call`` sleeps args[0] seconds then echoes args[1];
    ``read`` raises (a bug in the host must not take the link down)."""
    if op == "call":
        time.sleep(float(args[0]))
        return {"ok": args[1]}
    if op == "read":
        raise RuntimeError("boom")
    if op == "restore":
        return {"ok": float("nan")}  # not JSON: answered as an error
    return {"ok": args}


@pytest.fixture
def server() -> Iterator[LinkServer]:
    made = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=16, hello_timeout_s=1.0)
    try:
        yield made
    finally:
        made.close()


def link(server: LinkServer, token: bytes = TOKEN) -> HostLink:
    return HostLink("h", server.address, server.port, token.hex(), MAX_FRAME)


def raw(server: LinkServer) -> socket.socket:
    sock = socket.create_connection((server.address, server.port), timeout=5)
    sock.settimeout(5)
    return sock


def hello(sock: socket.socket) -> None:
    sock.sendall(protocol.encode({"op": "hello", "token": TOKEN.hex()}))
    assert protocol.recv_frame(sock)["status"] == "ok"


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_a_request_is_answered_with_what_dispatch_returned(server: LinkServer) -> None:
    client = link(server)
    try:
        assert client.request("noop", [1, "two", {"3": [4.5, None, True]}], 5) == {
            "ok": [1, "two", {"3": [4.5, None, True]}]}
        assert server.connections() == 1
    finally:
        client.close()


def test_concurrent_requests_on_one_link_are_matched_by_id(server: LinkServer) -> None:
    client = link(server)
    try:
        delays = [0.3, 0.0, 0.2, 0.1, 0.0, 0.25, 0.05, 0.15]
        with ThreadPoolExecutor(len(delays)) as threads:
            answers = list(threads.map(lambda i: client.request("call", [delays[i], i], 5), range(len(delays))))
        assert answers == [{"ok": i} for i in range(len(delays))]
    finally:
        client.close()


def test_a_failing_or_unencodable_answer_is_an_error_and_the_link_lives_on(server: LinkServer) -> None:
    client = link(server)
    try:
        failed = client.request("read", [], 5)
        assert failed["error"]["type"] == "ExecutorError" and "boom" in failed["error"]["message"]
        assert client.request("restore", [], 5)["error"]["type"] == "ExecutorError"
        assert client.request("noop", [7], 5) == {"ok": [7]} and client.alive
    finally:
        client.close()


@pytest.mark.parametrize("op", ["pool_call", "evict", "shutdown", "drain", "__init__", "_link_dispatch", "", None, 3])
def test_only_the_direct_methods_are_served(server: LinkServer, op: Any) -> None:
    sock = raw(server)
    try:
        hello(sock)
        sock.sendall(protocol.encode({"id": 5, "op": op, "args": []}))
        reply = protocol.recv_frame(sock)
        assert reply["id"] == 5 and reply["answer"]["error"]["type"] == "ValueError"
    finally:
        sock.close()


def test_arguments_not_a_list_are_refused(server: LinkServer) -> None:
    sock = raw(server)
    try:
        hello(sock)
        sock.sendall(protocol.encode({"id": 1, "op": "noop", "args": {"a": 1}}))
        assert protocol.recv_frame(sock)["answer"]["error"]["type"] == "ValueError"
    finally:
        sock.close()


def test_a_wrong_token_is_refused(server: LinkServer) -> None:
    with pytest.raises(LinkRefused):
        link(server, token=bytes(32))
    assert server.refused >= 1 and server.connections() == 0


@pytest.mark.parametrize("first", [
    protocol.encode({"op": "noop", "id": 1, "args": []}),  # a request before the hello
    protocol.encode({"op": "hello"}),
    protocol.encode({"op": "hello", "token": 12}),
    protocol.encode({"op": "hello", "token": "é" * 64}),
    protocol.encode({"op": "hello", "token": TOKEN.hex()[:-2]}),
    struct.pack(">I", 1 << 30) + b"{",  # a huge declared frame
    struct.pack(">I", 9) + b"not json!",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_anything_but_a_good_hello_closes_the_connection(server: LinkServer, first: bytes) -> None:
    sock = raw(server)
    try:
        sock.sendall(first)
        assert closed_by_peer(sock)
    finally:
        sock.close()
    good = link(server)  # others are not disturbed
    try:
        assert good.request("noop", [], 5) == {"ok": []}
    finally:
        good.close()


def test_a_silent_connection_is_closed_after_the_hello_timeout(server: LinkServer) -> None:
    sock = raw(server)
    try:
        started = time.monotonic()
        assert closed_by_peer(sock)
        assert time.monotonic() - started < 4.5
    finally:
        sock.close()


@pytest.mark.parametrize("frame", [
    struct.pack(">I", MAX_FRAME + 1) + b"{}",
    struct.pack(">I", 5) + b"[1,2]",
    protocol.encode({"id": "1", "op": "noop", "args": []}),
    protocol.encode({"id": True, "op": "noop", "args": []}),
    struct.pack(">I", 403) + b"[" * 201 + b"]" * 201 + b"\n",
])
def test_a_malformed_request_after_the_hello_closes_that_connection_only(server: LinkServer, frame: bytes) -> None:
    other = link(server)
    sock = raw(server)
    try:
        hello(sock)
        sock.sendall(frame)
        assert closed_by_peer(sock)
        assert other.request("noop", [1], 5) == {"ok": [1]}
    finally:
        sock.close()
        other.close()


def test_requests_in_flight_fail_with_sandbox_lost_when_the_server_goes(server: LinkServer) -> None:
    client = link(server)
    failures: list[BaseException] = []

    def slow() -> None:
        try:
            client.request("call", [3.0, 1], 10)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.3)
    server.close()
    thread.join(10)
    assert len(failures) == 1 and isinstance(failures[0], SandboxLost)
    assert not client.alive
    with pytest.raises(SandboxLost):
        client.request("noop", [], 5)
    client.close()
    with pytest.raises(LinkRefused):
        link(server)


def test_a_reply_that_does_not_come_in_time_is_sandbox_lost(server: LinkServer) -> None:
    client = link(server)
    try:
        with pytest.raises(SandboxLost) as caught:
            client.request("call", [2.0, 1], 0.3)
        assert caught.value.status == "timeout"
    finally:
        client.close()


def test_arguments_that_are_not_json_are_refused_before_anything_is_sent(server: LinkServer) -> None:
    client = link(server)
    try:
        with pytest.raises(ValueError):
            client.request("noop", [float("inf")], 5)
        with pytest.raises(TypeError):
            client.request("noop", [object()], 5)
        assert client.request("noop", [], 5) == {"ok": []} and client.alive
    finally:
        client.close()
