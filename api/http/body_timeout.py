"""Request bodies arrive within a deadline; a client that goes away is one log line.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but has no limit on
a request whose headers arrived and whose body stalls: without a deadline the app's
``receive()`` would wait forever, and slow-loris uploads would hold connections open.
:class:`BodyReadTimeout` wraps ``receive``: the whole body must arrive within
``timeout_s`` of the request's start, else the ``receive`` raises
:class:`~sandpit.api.errors.RequestTimeout` (408 ``request_timeout``). Any response that starts
before the body was read whole carries ``Connection: close``, so uvicorn closes the
connection after it: neither a stalled body nor one the route never read can hold it. A
request without a body (no ``Content-Length`` other than 0, no ``Transfer-Encoding``: a
GET) is read whole from the start, so its connection stays open for the next request.

A client that disconnects while its body is read makes Starlette raise
``ClientDisconnect`` in the route; it is logged here, in one line, instead of reaching the
catch-all handler (a full traceback per disconnect).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import RequestTimeout

log = logging.getLogger("sandpit.api")


class BodyReadTimeout:
    """ASGI middleware: at most ``timeout_s`` seconds (from the start of the request)
    for the request body."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = time.monotonic() + self.timeout_s
        received = 0
        body_done = not has_body(scope)  # a request without one (a GET) keeps its connection

        async def timed_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # e.g. a streaming response listening for http.disconnect
                return await receive()
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    body_done = not message.get("more_body", False)
                else:  # http.disconnect
                    body_done = True
                return message
            raise body_timed_out(scope, received, self.timeout_s)

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not body_done:
                message = with_connection_close(message)
            await send(message)

        try:
            await self.app(scope, timed_receive, closing_send)
        except ClientDisconnect:
            log_disconnect(scope, received)


def has_body(scope: Scope) -> bool:
    """Whether the HTTP request of ``scope`` has a body to read (RFC 9112 section 6.3: a
    ``Transfer-Encoding``, or a ``Content-Length`` other than 0); a request with neither
    (a GET, a DELETE) has none, so it is read whole before the app starts."""
    for name, value in scope.get("headers") or ():
        if name == b"transfer-encoding" or name == b"content-length" and value.strip() != b"0":
            return True
    return False


def body_timed_out(scope: Scope, received: int, timeout_s: float) -> RequestTimeout:
    """Log that the body of the request in ``scope`` did not arrive within ``timeout_s``
    seconds (``received`` bytes did) and return the 408 to raise or answer."""
    log.warning("request body timed out: %s %s from %s sent %d byte(s) in %g s; answered 408, closing",
                scope.get("method"), scope.get("path"), _client(scope), received, timeout_s)
    return RequestTimeout(f"the request body did not arrive within {timeout_s:g} s ({received} byte(s) received)")


def log_disconnect(scope: Scope, received: int) -> None:
    """One log line for a client gone after ``received`` bytes of its request body."""
    log.warning("client disconnected: %s %s from %s after %d byte(s) of the request body",
                scope.get("method"), scope.get("path"), _client(scope), received)


def with_connection_close(message: Message) -> Message:
    """An ``http.response.start`` message whose only ``Connection`` header is ``close``
    (the server then closes the connection after the response)."""
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
    return {**message, "headers": [*headers, (b"connection", b"close")]}


def _client(scope: Scope) -> str:
    client: Any = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"
