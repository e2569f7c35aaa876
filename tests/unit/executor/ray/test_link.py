"""The gRPC host link (the Ray backend's direct data path) on loopback, without Ray: a
:class:`LinkServer` answering with a plain dispatch function, real TLS channels and real
sockets. Requests are answered whatever their order; anything but a peer that trusts the
host's certificate and presents its token is refused without disturbing the other links,
and nothing it sent reaches the dispatch."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

grpc = pytest.importorskip("grpc", reason="the host link needs the 'ray' extra's grpcio (scripts/test installs it)")

from sandpit.executor.errors import CapacityError, LinkRefused, SandboxLost  # noqa: E402
from sandpit.executor.ray.link import SERVICE, HostLink, LinkServer  # noqa: E402

TOKEN = bytes(range(32))
MAX_FRAME = 1 << 20


class Dispatch:
    """``noop`` echoes its args; ``call`` sleeps args[0] seconds then echoes args[1];
    ``read`` raises (a bug in the host must not take the link down); ``restore`` answers
    NaN (not JSON); ``open_session`` answers args[0] characters (an oversized answer).
    Every dispatched request is recorded in ``seen``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, op: str, args: list[Any]) -> dict[str, Any]:
        with self._lock:
            self.seen.append((op, args))
        if op == "call":
            time.sleep(float(args[0]))
            return {"ok": args[1]}
        if op == "read":
            raise RuntimeError("boom")
        if op == "restore":
            return {"ok": float("nan")}
        if op == "open_session":
            return {"ok": "x" * int(args[0])}
        return {"ok": args}

    def ops(self) -> list[str]:
        with self._lock:
            return [op for op, _ in self.seen]


@pytest.fixture
def dispatch() -> Dispatch:
    return Dispatch()


@pytest.fixture
def server(dispatch: Dispatch) -> Iterator[LinkServer]:
    made = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=16, hello_timeout_s=1.0)
    try:
        yield made
    finally:
        made.close()


def link(server: LinkServer, token: bytes = TOKEN, certificate: str | None = None, **kwargs: Any) -> HostLink:
    return HostLink("h", server.address, server.port, token.hex(), MAX_FRAME,
                    server.certificate if certificate is None else certificate, **kwargs)


def raw_channel(server: LinkServer, max_send: int = MAX_FRAME) -> Any:
    """A TLS channel that trusts the server, without HostLink's checks (a hostile replica)."""
    credentials = grpc.ssl_channel_credentials(root_certificates=server.certificate.encode("ascii"))
    return grpc.secure_channel(f"127.0.0.1:{server.port}", credentials,
                               [("grpc.max_send_message_length", max_send), ("grpc.use_local_subchannel_pool", 1)])


def raw_call(channel: Any, op: str, body: bytes, token: str | None = "Bearer " + TOKEN.hex()) -> bytes:
    metadata = () if token is None else (("authorization", token),)
    reply: bytes = channel.unary_unary(f"/{SERVICE}/{op}")(body, timeout=5, metadata=metadata)
    return reply


def status_of(call: Callable[[], object]) -> Any:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def eventually(condition: Callable[[], bool], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# -- what the TCP link does, on gRPC ---------------------------------------------------------------
def test_a_request_is_answered_with_what_dispatch_returned(server: LinkServer) -> None:
    client = link(server)
    try:
        assert client.request("noop", [1, "two", {"3": [4.5, None, True]}, "é\u2603"], 5) == {
            "ok": [1, "two", {"3": [4.5, None, True]}, "é\u2603"]}
        assert client.alive and server.calls() == 0  # answered: nothing left in progress
    finally:
        client.close()
    assert not client.alive


def test_the_endpoint_is_plain_data_a_replica_opens_a_link_from(server: LinkServer) -> None:
    where = server.endpoint()
    assert set(where) == {"address", "port", "token", "certificate"} and where["token"] == TOKEN.hex()
    assert where["certificate"].startswith("-----BEGIN CERTIFICATE-----")
    client = HostLink("h", where["address"], where["port"], where["token"], MAX_FRAME, where["certificate"])
    try:
        assert client.request("noop", [], 5) == {"ok": []}
    finally:
        client.close()


def test_concurrent_requests_on_one_link_are_matched_to_their_callers(server: LinkServer) -> None:
    client = link(server)
    try:
        delays = [0.3, 0.0, 0.2, 0.1, 0.0, 0.25, 0.05, 0.15]
        with ThreadPoolExecutor(len(delays)) as threads:
            answers = list(threads.map(lambda i: client.request("call", [delays[i], i], 5), range(len(delays))))
        assert answers == [{"ok": i} for i in range(len(delays))]
    finally:
        client.close()


def test_many_threads_share_one_link(server: LinkServer) -> None:
    client = link(server)

    def caller(thread: int) -> list[bool]:
        return [client.request("noop", [thread, n, "p" * (thread * 97 + n)], 5)
                == {"ok": [thread, n, "p" * (thread * 97 + n)]} for n in range(25)]

    try:
        with ThreadPoolExecutor(16) as threads:
            results = list(threads.map(caller, range(16)))
        assert all(all(matched) for matched in results) and sum(map(len, results)) == 400
        assert server.calls() == 0
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


@pytest.mark.parametrize("op", ["pool_call", "evict", "shutdown", "drain", "__init__", "_link_dispatch", "", "hello",
                                "noop/../call", "é"])
def test_only_the_direct_methods_are_served(server: LinkServer, dispatch: Dispatch, op: str) -> None:
    client = link(server)
    channel = raw_channel(server)
    try:
        assert client.request(op, [], 5)["error"]["type"] == "ValueError"  # not even sent
        if op.isascii() and op not in ("hello", ""):
            answer = raw_call(channel, op, b'{"args":[]}')
            assert b'"type":"ValueError"' in answer
        assert dispatch.ops() == []
        other = channel.unary_unary("/grpc.health.v1.Health/Check")
        assert status_of(lambda: other(b"", timeout=5, metadata=(("authorization", "Bearer " + TOKEN.hex()),))) \
            is grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
        client.close()


@pytest.mark.parametrize("body", [b'{"args":{"a":1}}', b'{"args":"x"}', b"{}", b'{"argz":[]}'])
def test_arguments_not_a_list_are_refused(server: LinkServer, dispatch: Dispatch, body: bytes) -> None:
    channel = raw_channel(server)
    try:
        assert b'"type":"ValueError"' in raw_call(channel, "noop", body)
        assert dispatch.ops() == []
    finally:
        channel.close()


@pytest.mark.parametrize("body", [
    b"not json!", b"[1,2]", b"", b'{"args":[NaN]}', b'{"args":[Infinity]}',
    b"\xff\xfe{}", b'{"args":' + b"[" * 300 + b"]" * 300 + b"}",
])
def test_a_malformed_body_is_refused_before_dispatch_and_others_are_not_disturbed(
        server: LinkServer, dispatch: Dispatch, body: bytes) -> None:
    other = link(server)
    channel = raw_channel(server)
    try:
        assert status_of(lambda: raw_call(channel, "noop", body)) is grpc.StatusCode.INVALID_ARGUMENT
        assert other.request("noop", [1], 5) == {"ok": [1]}
        assert dispatch.ops() == ["noop"]
    finally:
        channel.close()
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
    started = time.monotonic()
    server.close()
    thread.join(10)
    assert len(failures) == 1 and isinstance(failures[0], SandboxLost) and failures[0].status == "crashed"
    assert time.monotonic() - started < 2.0  # not the call's 3 s nor its 10 s deadline
    assert eventually(lambda: not client.alive)
    with pytest.raises(SandboxLost):
        client.request("noop", [], 5)
    client.close()
    with pytest.raises(LinkRefused):
        link(server)


def test_an_idle_link_whose_server_went_is_not_alive(server: LinkServer) -> None:
    client = link(server)
    try:
        assert client.alive
        server.close()
        assert eventually(lambda: not client.alive)
    finally:
        client.close()


def test_a_reply_that_does_not_come_in_time_is_sandbox_lost(server: LinkServer) -> None:
    client = link(server)
    try:
        started = time.monotonic()
        with pytest.raises(SandboxLost) as caught:
            client.request("call", [2.0, 1], 0.3)
        assert caught.value.status == "timeout" and time.monotonic() - started < 1.5
        assert client.alive and client.request("noop", [], 5) == {"ok": []}  # a timeout does not kill the link
    finally:
        client.close()


def test_arguments_that_are_not_json_are_refused_before_anything_is_sent(server: LinkServer,
                                                                       dispatch: Dispatch) -> None:
    client = link(server)
    try:
        with pytest.raises(ValueError):
            client.request("noop", [float("inf")], 5)
        with pytest.raises(ValueError):
            client.request("noop", ["\ud800"], 5)  # a lone surrogate: not UTF-8
        with pytest.raises(TypeError):
            client.request("noop", [object()], 5)
        assert dispatch.ops() == []
        assert client.request("noop", [], 5) == {"ok": []} and client.alive
    finally:
        client.close()


def test_close_is_idempotent_on_both_ends(server: LinkServer) -> None:
    client = link(server)
    client.close()
    client.close()
    assert not client.alive
    with pytest.raises(SandboxLost):
        client.request("noop", [], 5)
    server.close()
    server.close()
    assert server.closed and server.calls() == 0


# -- authentication and TLS ------------------------------------------------------------------------
def test_a_wrong_token_is_refused(server: LinkServer, dispatch: Dispatch) -> None:
    with pytest.raises(LinkRefused, match="token"):
        link(server, token=bytes(32))
    assert server.refused == 1 and dispatch.ops() == []


@pytest.mark.parametrize("token", [None, "", "Bearer", "Bearer " + bytes(32).hex(), TOKEN.hex(),
                                   "Bearer " + TOKEN.hex()[:-2], "Bearer " + TOKEN.hex() + "00",
                                   "bearer " + TOKEN.hex(), "Bearer " + TOKEN.hex().upper()])
def test_every_call_without_the_token_is_unauthenticated_and_counted(
        server: LinkServer, dispatch: Dispatch, token: str | None) -> None:
    channel = raw_channel(server)
    try:
        for op in ("noop", "call", "hello", "pool_call"):
            assert status_of(lambda op=op: raw_call(channel, op, b'{"args":[0,1]}', token)) \
                is grpc.StatusCode.UNAUTHENTICATED
        assert server.refused == 4 and dispatch.ops() == []
    finally:
        channel.close()


def test_a_binary_token_header_is_refused(server: LinkServer, dispatch: Dispatch) -> None:
    channel = raw_channel(server)
    try:
        call = channel.unary_unary(f"/{SERVICE}/noop")
        assert status_of(lambda: call(b'{"args":[]}', timeout=5, metadata=(("authorization-bin", TOKEN),))) \
            is grpc.StatusCode.UNAUTHENTICATED
        assert dispatch.ops() == []
    finally:
        channel.close()


def test_a_client_pinning_another_hosts_certificate_is_refused(server: LinkServer, dispatch: Dispatch) -> None:
    impostor = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=2)
    try:
        assert impostor.certificate != server.certificate
        with pytest.raises(LinkRefused):
            link(server, certificate=impostor.certificate)
        assert dispatch.ops() == [] and server.refused == 0  # refused at the handshake, before any call
    finally:
        impostor.close()


@pytest.mark.parametrize("certificate", ["", "not a certificate", "-----BEGIN CERTIFICATE-----\nAAAA\n"
                                         "-----END CERTIFICATE-----\n", "é"])
def test_a_client_without_a_usable_certificate_is_refused(server: LinkServer, certificate: str) -> None:
    with pytest.raises(LinkRefused):
        link(server, certificate=certificate, connect_timeout_s=2.0)


def test_a_plaintext_client_is_refused(server: LinkServer, dispatch: Dispatch) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        assert status_of(lambda: raw_call(channel, "noop", b'{"args":[]}')) is grpc.StatusCode.UNAVAILABLE
        assert dispatch.ops() == []
    finally:
        channel.close()


@pytest.mark.parametrize("first", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # the plaintext HTTP/2 preface
    b"\x00\x00\x00\x05[1,2]",  # the TCP link's framing
    b"\x16\x03\x01\xff\xff" + b"\x00" * 64,  # a TLS record that lies about its length
])
def test_a_peer_that_does_not_speak_tls_is_cut_off(server: LinkServer, first: bytes) -> None:
    sock = socket.create_connection((server.address, server.port), timeout=5)
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


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closes ``sock`` (anything it sends first, like a TLS alert, is read past)."""
    sock.settimeout(5)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_a_silent_connection_is_closed_after_the_handshake_timeout(server: LinkServer) -> None:
    sock = socket.create_connection((server.address, server.port), timeout=5)
    try:
        started = time.monotonic()
        assert closed_by_peer(sock)
        assert time.monotonic() - started < 4.5
    finally:
        sock.close()


def test_a_port_where_nothing_listens_is_refused_fast() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    started = time.monotonic()
    with pytest.raises(LinkRefused):
        HostLink("h", "127.0.0.1", port, TOKEN.hex(), MAX_FRAME, "")
    assert time.monotonic() - started < 2.0


# -- limits -----------------------------------------------------------------------------------------
def test_an_oversized_request_is_refused_before_it_is_sent(server: LinkServer, dispatch: Dispatch) -> None:
    client = link(server)
    try:
        with pytest.raises(ValueError, match="exceeds"):
            client.request("noop", ["x" * MAX_FRAME], 5)
        assert dispatch.ops() == [] and client.alive
        assert client.request("noop", ["x" * (MAX_FRAME - 100)], 5) == {"ok": ["x" * (MAX_FRAME - 100)]}
    finally:
        client.close()


def test_an_oversized_request_from_a_hostile_client_is_refused_by_the_server(server: LinkServer,
                                                                           dispatch: Dispatch) -> None:
    channel = raw_channel(server, max_send=4 * MAX_FRAME)
    try:
        body = b'{"args":["' + b"x" * MAX_FRAME + b'"]}'
        assert status_of(lambda: raw_call(channel, "noop", body)) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dispatch.ops() == []
    finally:
        channel.close()


def test_an_oversized_answer_is_sandbox_lost(server: LinkServer, dispatch: Dispatch) -> None:
    client = link(server)
    try:
        with pytest.raises(SandboxLost) as caught:
            client.request("open_session", [MAX_FRAME], 5)
        assert caught.value.status == "crashed" and dispatch.ops() == ["open_session"]  # it ran: outcome unknown
        assert not client.alive
    finally:
        client.close()


def test_a_deep_request_is_refused_before_dispatch(server: LinkServer, dispatch: Dispatch) -> None:
    client = link(server)
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    try:
        with pytest.raises(ValueError, match="deeper"):
            client.request("noop", deep, 5)
        assert dispatch.ops() == [] and client.alive
    finally:
        client.close()


def test_a_dispatch_that_hangs_past_the_deadline_frees_its_worker(dispatch: Dispatch) -> None:
    """One worker: a request that hangs times out for its caller; one queued behind it
    whose deadline passes while it waits is never dispatched; the worker serves again
    once the hang ends."""
    lone = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=1)
    client = link(lone)
    try:
        with ThreadPoolExecutor(2) as threads:
            hung = threads.submit(client.request, "call", [1.0, "hung"], 0.3)
            time.sleep(0.1)
            queued = threads.submit(client.request, "noop", ["queued"], 0.3)
            for future in (hung, queued):
                with pytest.raises(SandboxLost) as caught:
                    future.result(5)
                assert caught.value.status == "timeout"
        assert client.alive
        assert eventually(lambda: client.request("noop", ["after"], 5) == {"ok": ["after"]})
        assert dispatch.seen == [("call", [1.0, "hung"]), ("noop", ["after"])]
    finally:
        client.close()
        lone.close()


class FreezingProxy:
    """A TCP relay on loopback that can stop relaying while keeping both connections
    open: a peer that is gone without closing (a dead node, a cut network)."""

    def __init__(self, port: int, address: str = "127.0.0.1") -> None:
        self._upstream = port
        self._listener = socket.create_server((address, 0))
        self.connections = 0
        self.port = self._listener.getsockname()[1]
        self.frozen = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self._upstream))
            self.connections += 1
            self._sockets += [down, up]
            for source, sink in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                if self.frozen.is_set():
                    return  # swallow everything from now on; keep the sockets open
                sink.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()


def test_keepalive_detects_a_peer_that_vanished_without_closing(dispatch: Dispatch) -> None:
    server = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=2, keepalive_s=0.5)
    proxy = FreezingProxy(server.port)
    client = HostLink("h", "127.0.0.1", proxy.port, TOKEN.hex(), MAX_FRAME, server.certificate,
                      keepalive_s=0.5, keepalive_timeout_s=0.5)
    try:
        assert client.request("noop", [], 5) == {"ok": []}
        proxy.frozen.set()
        started = time.monotonic()
        with pytest.raises(SandboxLost) as caught:
            client.request("call", [0.0, 1], 30)
        assert caught.value.status == "crashed" and time.monotonic() - started < 10
        assert not client.alive
    finally:
        client.close()
        proxy.close()
        server.close()


def test_an_address_the_certificate_does_not_name_is_refused(server: LinkServer) -> None:
    """The certificate names 127.0.0.1: the same server reached as 127.0.0.2 (through a
    relay) fails the TLS check, though the connection itself was made."""
    proxy = FreezingProxy(server.port, address="127.0.0.2")
    try:
        with pytest.raises(LinkRefused):
            HostLink("h", "127.0.0.2", proxy.port, TOKEN.hex(), MAX_FRAME, server.certificate, connect_timeout_s=2.0)
        assert proxy.connections >= 1 and server.refused == 0
    finally:
        proxy.close()


def test_calls_over_the_servers_cap_are_refused_undispatched(dispatch: Dispatch) -> None:
    """``max_calls`` (LINK_MAX_CALLS) bounds the calls a host holds; one more is refused
    before dispatch as a CapacityError (nothing ran: the caller may retry later) and the
    link stays up; :meth:`LinkServer.calls` counts the calls being dispatched."""
    capped = LinkServer(dispatch, "127.0.0.1", TOKEN, MAX_FRAME, workers=4, max_calls=2)
    client, other = link(capped), link(capped)
    try:
        with ThreadPoolExecutor(2) as threads:
            held = [threads.submit(client.request, "call", [0.8, n], 5) for n in range(2)]
            assert eventually(lambda: len(dispatch.seen) == 2)
            assert capped.calls() == 2
            with pytest.raises(CapacityError):
                other.request("noop", ["over"], 5)
            assert other.alive
            assert [future.result(5) for future in held] == [{"ok": 0}, {"ok": 1}]
        assert dispatch.ops() == ["call", "call"] and client.alive and capped.calls() == 0
        assert other.request("noop", ["after"], 5) == {"ok": ["after"]}
    finally:
        client.close()
        other.close()
        capped.close()
