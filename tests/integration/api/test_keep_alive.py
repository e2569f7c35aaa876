"""``sandpit serve`` keeps an idle keep-alive connection open ``SANDPIT_KEEP_ALIVE_S``
seconds (default 75, where uvicorn's own default closes it after 5): an agent that thinks
for longer than 5 s between steps sends its next step on the same connection, and a
server whose setting is shorter than the pause closes the connection at the end of it."""

from __future__ import annotations

import socket
import time

import pytest
from api_server import ApiServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True


def _get(sock: socket.socket, host: str) -> bytes:
    """One ``GET /healthz`` on ``sock`` (keep-alive): the response's status line, or b""
    when the server had closed the connection."""
    try:
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode("ascii"))
    except OSError:
        return b""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return b""
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of a response"
        body += chunk
    return head.split(b"\r\n", 1)[0]


def _connection(server: ApiServer) -> tuple[socket.socket, str]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock, f"127.0.0.1:{server.port}"


def test_a_connection_idle_longer_than_uvicorns_default_serves_the_next_request(server: ApiServer) -> None:
    sock, host = _connection(server)
    with sock:
        assert _get(sock, host) == b"HTTP/1.1 200 OK"
        time.sleep(6.5)  # past uvicorn's default of 5 s
        assert _get(sock, host) == b"HTTP/1.1 200 OK", "the server closed an idle connection before 75 s"


def test_a_shorter_setting_closes_the_idle_connection(make_server) -> None:
    server = make_server(SANDPIT_KEEP_ALIVE_S="1")
    sock, host = _connection(server)
    with sock:
        assert _get(sock, host) == b"HTTP/1.1 200 OK"
        time.sleep(0.3)
        assert _get(sock, host) == b"HTTP/1.1 200 OK"  # within the second: the same connection
        deadline = time.monotonic() + 10
        closed = False
        while not closed and time.monotonic() < deadline:  # the server closes it after about 1 s idle
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                break
            except OSError:
                closed = True
        assert closed, "the connection stayed open past SANDPIT_KEEP_ALIVE_S=1"


@pytest.mark.parametrize("value", ["0", "-1", "3601", "1.5", "soon"])
def test_a_bad_setting_refuses_to_start(tmp_path, value: str) -> None:
    server = ApiServer(tmp_path / "bad", SANDPIT_KEEP_ALIVE_S=value)
    with pytest.raises(AssertionError, match="keep_alive_s"):
        server.start()
