"""A client over several API replicas (``sandpit.client.replicas``): requests go round robin,
per request; a replica refusing connections is skipped; bad replica lists are refused.

The replicas are real HTTP servers on 127.0.0.1 (``http.server`` in threads) that answer
every request with their own name and echo the request's method, path, Host and body."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sandpit.client import AsyncClient, Client, SandpitConnectionError
from sandpit.client.replicas import parse_replicas


def _handler(name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode() if length else ""
            payload = json.dumps({"status": "ok", "replica": name, "method": self.command, "path": self.path,
                                  "host": self.headers.get("Host"), "body": body}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def replicas() -> Iterator[list[str]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(name)) for name in ("a", "b", "c")]
    threads = [threading.Thread(target=server.serve_forever, daemon=True) for server in servers]
    for thread in threads:
        thread.start()
    try:
        yield [f"http://127.0.0.1:{server.server_address[1]}" for server in servers]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # closed when the block ends: refuses


def test_requests_go_round_robin_per_request_with_the_right_host_header(replicas: list[str]) -> None:
    with Client(",".join(replicas), api_key="k", max_retry_wait_s=0) as client:
        seen = [client.health() for _ in range(9)]
        assert [s["replica"] for s in seen] == ["a", "b", "c"] * 3
        for answer, url in zip(seen, replicas * 3, strict=True):
            assert answer["host"] == url.removeprefix("http://")
            assert answer["path"] == "/healthz"
        assert sorted(client.replica_answers.values()) == [3, 3, 3]


def test_a_refusing_replica_is_skipped_and_the_body_reaches_the_next(replicas: list[str]) -> None:
    dead = _closed_port()
    with Client(",".join([dead, replicas[0]]), api_key="k", max_retry_wait_s=0) as client:
        for _ in range(4):
            answer = client._http.post("/v1/validate", json={"kind": "snippet", "code": "x = 1"}).json()
            assert answer["replica"] == "a" and json.loads(answer["body"])["code"] == "x = 1"
        assert client.replica_answers == {replicas[0].removeprefix("http://"): 4}


def test_every_replica_refusing_is_a_connection_error_not_a_hang() -> None:
    with Client(f"{_closed_port()},{_closed_port()}", api_key="k", max_retry_wait_s=0) as client, \
            pytest.raises(SandpitConnectionError):
        client.health()


def test_the_async_client_rotates_too(replicas: list[str]) -> None:
    async def run() -> list[str]:
        async with AsyncClient(",".join(replicas[:2]), api_key="k", max_retry_wait_s=0) as client:
            answers = await asyncio.gather(*(client.health() for _ in range(6)))
            assert sorted(client.replica_answers.values()) == [3, 3]
            return [a["replica"] for a in answers]

    assert sorted(asyncio.run(run())) == ["a"] * 3 + ["b"] * 3


def test_one_url_keeps_the_plain_transport(replicas: list[str]) -> None:
    with Client(replicas[1], api_key="k") as client:
        assert client.health()["replica"] == "b"
        assert client.replica_answers == {}


@pytest.mark.parametrize("bad", [
    "http://127.0.0.1:1,", ",http://127.0.0.1:1", "http://127.0.0.1:1,,http://127.0.0.1:2",
    "http://127.0.0.1:1,ftp://127.0.0.1:2", "http://127.0.0.1:1,127.0.0.1:2", "http://a/x,http://b/y",
    "http://a/?q=1,http://b/", "http://a#f,http://b", "http://,http://b",
])
def test_bad_replica_lists_are_refused_before_anything_is_sent(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_replicas(bad)
    with pytest.raises(ValueError):
        Client(bad, api_key="k")


def test_same_path_prefix_is_accepted_and_kept() -> None:
    urls = parse_replicas("http://a:1/sandpit, http://b:2/sandpit/")
    assert [u.host for u in urls] == ["a", "b"]
    assert httpx.URL("http://a:1/sandpit").path == urls[0].path
