""":class:`~sandpit.api.http.body_timeout.BodyReadTimeout` on raw ASGI: a response that
starts before the request's body was read whole says ``Connection: close``; a request
without a body (no ``Content-Length`` other than 0, no ``Transfer-Encoding``) is whole
from the start, so its response keeps the connection; a stalled body is a 408."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sandpit.api.errors import RequestTimeout
from sandpit.api.http.body_timeout import BodyReadTimeout, has_body
from starlette.types import Message, Receive, Scope, Send


def _scope(method: str, headers: list[tuple[bytes, bytes]]) -> Scope:
    return {"type": "http", "method": method, "path": "/x", "headers": headers, "client": ("127.0.0.1", 1)}


def _run(method: str, headers: list[tuple[bytes, bytes]], body: list[Message], read: bool,
         timeout_s: float = 5.0) -> dict[str, Any]:
    """The response start message of an app that reads its body (``read``) or not,
    behind the middleware, for a request of ``method`` with ``headers`` and ``body``."""
    sent: list[Message] = []
    messages = list(body)

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # a body that never comes
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if read:
            more = True
            while more:
                message = await receive()
                more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    asyncio.run(BodyReadTimeout(app, timeout_s)(_scope(method, headers), receive, send))
    return sent[0]


def _closes(start: dict[str, Any]) -> bool:
    return (b"connection", b"close") in start["headers"]


EMPTY = [{"type": "http.request", "body": b"", "more_body": False}]
FIVE = [{"type": "http.request", "body": b"12345", "more_body": False}]


@pytest.mark.parametrize(("method", "headers", "body", "read", "closes"), [
    ("GET", [], EMPTY, False, False),  # no body to read: the connection stays
    ("DELETE", [(b"host", b"x")], EMPTY, False, False),
    ("POST", [(b"content-length", b"0")], EMPTY, False, False),
    ("POST", [(b"content-length", b" 0 ")], EMPTY, False, False),
    ("POST", [(b"content-length", b"5")], FIVE, False, True),  # a body the route never read
    ("POST", [(b"content-length", b"5")], FIVE, True, False),  # read whole
    ("POST", [(b"transfer-encoding", b"chunked")], EMPTY, False, True),
    ("POST", [(b"transfer-encoding", b"chunked")], EMPTY, True, False),
    ("GET", [(b"content-length", b"5")], FIVE, False, True),  # a GET with a body is a request with a body
    ("POST", [(b"content-length", b"00")], EMPTY, False, True),  # not "0": counted as a body (the safe side)
])
def test_connection_close_only_when_a_body_was_left_unread(method: str, headers: list[tuple[bytes, bytes]],
                                                           body: list[Message], read: bool, closes: bool) -> None:
    assert _closes(_run(method, headers, body, read)) is closes


def test_has_body_reads_the_headers() -> None:
    assert not has_body(_scope("GET", []))
    assert not has_body({"type": "http"})  # no headers at all
    assert has_body(_scope("PUT", [(b"content-length", b"1")]))
    assert has_body(_scope("PUT", [(b"transfer-encoding", b"gzip, chunked")]))


def test_a_stalled_body_is_408() -> None:
    with pytest.raises(RequestTimeout):
        _run("POST", [(b"content-length", b"5")], [], read=True, timeout_s=0.05)
