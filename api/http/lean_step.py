"""The lean step path: ``POST /v1/envs/{id}/step`` answered by a plain ASGI handler in
front of FastAPI's router, for the requests that make up an RL trainer's traffic.

Profiled on 2 cores (``benchmarks/api.py``), a step through FastAPI cost the server about
3.5 ms of CPU around a 0.6 ms sandbox round trip: route matching over every route, four
sync dependencies each run on the thread pool (a thread hop apiece), request and response
models, and a transaction per step. :class:`LeanStep` does the same work with one thread
hop: it reads the body on the event loop, parses it with orjson and validates it as the
route's own :class:`~sandpit.api.schemas.envs.StepRequest`, then runs authentication,
quotas, the step and its JSON reply (:meth:`Steps.step`, which the FastAPI
route calls too) in one worker thread, and sends the bytes.

It only takes requests whose answer it can give exactly as the FastAPI route would;
everything else goes on to the router untouched (the body it read is replayed), so every
4xx keeps its one implementation there. A request falls through when: the method, path or
``root_path`` differ; there is no ``Content-Length`` or it is over :data:`LEAN_MAX_BODY`;
a header it reads is repeated or ``Transfer-Encoding`` is set; the content type is not
JSON; ``include`` is repeated or longer than the route allows; the body is not strict JSON
(orjson refuses it, a lone surrogate, more brackets than ``max_json_depth``, a run of 19
digits that orjson would read differently from Python's parser); or it is not a valid
``StepRequest``. What the lean path answers itself: the step (200) and the errors raised
while taking it (401/403 of the key, 404, 409, 413/429 of the arguments and quotas, 503),
rendered by the same :func:`~sandpit.api.http.handlers.error_response`; anything else raised
is logged and answered 500 ``internal``, the body of the app's catch-all handler.

Where it sits: in front of FastAPI's whole middleware stack (:class:`SandpitApp` calls it
before ``FastAPI.__call__``), so a step pays neither Starlette's error and exception
middleware nor FastAPI's telemetry check (a look-up of the OpenTelemetry providers per
request) nor the body-limit wrapper: on a profile of one client stepping, those layers
held the GIL for ~15% of the server's time. It therefore does what the outer layers did
for it: the body must arrive within ``body_timeout_s`` of the request's start (408
``request_timeout`` with ``Connection: close``, as :class:`~.body_timeout.BodyReadTimeout`),
a client gone while its body is read is one log line, and an unexpected error is a 500.
The step runs on a thread pool of its own (``threads`` workers, ``ApiSettings.http_threads``)
through ``loop.run_in_executor``: anyio's ``to_thread`` (backend look-up, capacity
limiter, cancel scope per call) cost about as much again as the hop itself.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qsl

import orjson
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..envs.steps import Steps
from ..errors import ApiError
from ..json_rules import lone_surrogate_at
from ..metrics import StepClock
from ..schemas.envs import StepRequest
from ..services.tenants import TenantService
from .access_log import note_route, note_tenant
from .body_timeout import body_timed_out, log_disconnect, with_connection_close
from .handlers import count_rejection, error_response, internal_error_response

STEP_PATH = re.compile(r"/v1/envs/([^/]+)/step")
"""The route's path (Starlette's ``{env_id}`` matches one segment)."""
STEP_TEMPLATE = "/v1/envs/{env_id}/step"
"""The route's path template (what the access log names it by)."""
LEAN_MAX_BODY = 64 * 1024
"""Larger bodies (bytes) take the FastAPI route (a step body is usually under 1 KiB)."""
INCLUDE_MAX_CHARS = 64
"""The route's ``include`` limit (``Query(max_length=64)``)."""
_LONG_NUMBER = re.compile(rb"\d{19}")
_JSON_TYPE = re.compile(r"\s*application/json\s*(;.*)?", re.IGNORECASE | re.DOTALL)


class _Fallback(Exception):
    """The request is not one the lean path answers: the router takes it."""


class LeanStep:
    """ASGI front answering plain step requests itself (see the module docstring).

    Args:
        app: the rest of the application (``FastAPI.__call__``: its whole stack), which
            takes every request the lean path does not answer.
        translate: turns a foreign exception raised by the step into an
            :class:`ApiError` (the app gives the executor's translation), or None to
            answer it as a server error.
        body_timeout_s: seconds from the request's start for its whole body (the app's
            ``body_read_timeout_s``).
        threads: worker threads that run steps (at most that many steps at once in this
            process; more wait for a free thread).
    """

    def __init__(self, app: ASGIApp, translate: Callable[[Exception], ApiError | None] | None = None,
                 body_timeout_s: float = 30.0, threads: int = 40) -> None:
        self.app = app
        self.translate = translate
        self.body_timeout_s = body_timeout_s
        self.max_threads = threads
        self._threads: ThreadPoolExecutor | None = None

    def _pool(self) -> ThreadPoolExecutor:
        """The step threads (made on first use, again after :meth:`close`)."""
        pool = self._threads
        if pool is None:
            pool = self._threads = ThreadPoolExecutor(max_workers=self.max_threads, thread_name_prefix="sandpit-step")
        return pool

    def close(self) -> None:
        """Let the step threads end once the steps they run return (the app's lifespan
        calls it at shutdown; a later request makes new ones)."""
        pool, self._threads = self._threads, None
        if pool is not None:
            pool.shutdown(wait=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        match = STEP_PATH.fullmatch(scope["path"])
        state = getattr(scope.get("app"), "state", None)
        steps: Steps | None = getattr(state, "steps", None)
        tenants: TenantService | None = getattr(state, "tenants", None)
        headers = _headers(scope) if match is not None and steps is not None else None
        if headers is None or tenants is None or steps is None or match is None:
            await self.app(scope, receive, send)
            return
        note_route(scope, STEP_TEMPLATE)  # the router's own replaces it if the request falls through
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await _read(receive, chunks)
        except TimeoutError:
            await self._error(body_timed_out(scope, sum(map(len, chunks)), self.body_timeout_s), scope, receive,
                              _closing(send))
            return
        except ClientDisconnect:
            log_disconnect(scope, sum(map(len, chunks)))
            return
        replay = _replay(body, receive)
        started = time.thread_time()
        try:
            request, include = _parse(body, scope, steps.settings.max_json_depth)
        except _Fallback:
            await self.app(scope, replay, send)
            return
        except Exception as exc:  # a bug, not the request's fault: the catch-all's 500
            await internal_error_response(exc)(scope, replay, send)
            return
        parse_cpu = time.thread_time() - started
        env_id: str = match.group(1)
        authorization = headers.get(b"authorization")

        def work() -> bytes:
            clock = StepClock()
            clock.cpu["parse"] = parse_cpu
            caller = tenants.authenticate(authorization.decode("latin-1") if authorization is not None else None)
            note_tenant(scope, caller.tenant)
            clock.lap("auth")
            data = steps.step(caller, env_id, request, include, clock).json()
            clock.lap("serialize")
            clock.flush(steps.metrics)
            return data

        try:
            data = await asyncio.get_running_loop().run_in_executor(self._pool(), work)
        except ApiError as exc:
            await self._error(exc, scope, replay, send)
            return
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is None:
                await internal_error_response(exc)(scope, replay, send)
                return
            await self._error(translated, scope, replay, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode("ascii")),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _error(exc: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        """The error response the app's ``ApiError`` handler gives (429s counted)."""
        count_rejection(exc, getattr(getattr(scope.get("app"), "state", None), "metrics", None))
        await error_response(exc)(scope, receive, send)


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` on the response (the body was not read whole)."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = with_connection_close(message)
        await send(message)

    return closing_send


def _headers(scope: Scope) -> dict[bytes, bytes] | None:
    """The headers the lean path reads, or None when the request must fall through."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in (b"content-length", b"content-type", b"authorization"):
            if name in found:
                return None
            found[name] = value
        elif name == b"transfer-encoding":
            return None
    length = found.get(b"content-length")
    if length is None or not length.isdigit() or int(length) > LEAN_MAX_BODY:
        return None
    content_type = found.get(b"content-type")
    if content_type is not None and not _JSON_TYPE.fullmatch(content_type.decode("latin-1")):
        return None
    return found


async def _read(receive: Receive, chunks: list[bytes]) -> bytes:
    """The whole request body, gathered in ``chunks`` (what arrived so far, when the
    caller's timeout cancels it). Raises ClientDisconnect (logged by the caller)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` once, then defers to ``receive``."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _parse(body: bytes, scope: Scope, max_depth: int) -> tuple[StepRequest, str | None]:
    """The step request and ``include`` of a request the lean path answers. Raises
    _Fallback for anything else (module docstring)."""
    include: str | None = None
    query: bytes = scope.get("query_string", b"")
    if query:
        values = [v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k == "include"]
        if len(values) > 1 or values and len(values[0]) > INCLUDE_MAX_CHARS:
            raise _Fallback
        include = values[0] if values else None
    if body.count(b"[") + body.count(b"{") > max_depth or _LONG_NUMBER.search(body):
        raise _Fallback
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _Fallback from None
    if type(parsed) is not dict or lone_surrogate_at(body, parsed) is not None:
        raise _Fallback
    try:
        return StepRequest.model_validate(parsed), include
    except ValidationError:
        raise _Fallback from None
