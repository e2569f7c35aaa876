"""The lean step path: ``POST /v1/envs/{id}/step`` answered by a plain ASGI handler in
front of FastAPI's router, for the requests that make up an RL trainer's traffic.

Profiled on 2 cores (``benchmarks/api.py``), a step through FastAPI cost the server about
3.5 ms of CPU around a 0.6 ms sandbox round trip: route matching over every route, four
sync dependencies each run on the thread pool (a thread hop apiece), request and response
models, and a transaction per step. :class:`LeanStep` does the same work with one thread
hop: it reads the body on the event loop, parses it with orjson and validates it as the
route's own :class:`~sandpit.api.schemas.envs.StepRequest`, then runs authentication,
quotas, the step and its JSON reply (:meth:`StepService.take_json`, which the FastAPI
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
rendered by the same :func:`~sandpit.api.errors.error_response`; anything else raised
goes up to the app's server-error handler (500, logged), as from the route.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import anyio.to_thread
import orjson
from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, QuotaExceeded, error_response
from .schemas.envs import StepRequest
from .services.steps import StepClock, StepService
from .services.tenants import TenantService
from .strict_json import lone_surrogate_at

STEP_PATH = re.compile(r"/v1/envs/([^/]+)/step")
"""The route's path (Starlette's ``{env_id}`` matches one segment)."""
LEAN_MAX_BODY = 64 * 1024
"""Larger bodies (bytes) take the FastAPI route (a step body is usually under 1 KiB)."""
INCLUDE_MAX_CHARS = 64
"""The route's ``include`` limit (``Query(max_length=64)``)."""
_LONG_NUMBER = re.compile(rb"\d{19}")
_JSON_TYPE = re.compile(r"\s*application/json\s*(;.*)?", re.IGNORECASE | re.DOTALL)


class _Fallback(Exception):
    """The request is not one the lean path answers: the router takes it."""


class LeanStep:
    """ASGI middleware answering plain step requests itself (see the module docstring).

    Args:
        app: the rest of the application (FastAPI's stack).
        translate: turns a foreign exception raised by the step into an
            :class:`ApiError` (the app gives the executor's translation), or None to let
            it propagate as a server error.
    """

    def __init__(self, app: ASGIApp, translate: Callable[[Exception], ApiError | None] | None = None) -> None:
        self.app = app
        self.translate = translate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        match = STEP_PATH.fullmatch(scope["path"])
        state = getattr(scope.get("app"), "state", None)
        steps: StepService | None = getattr(state, "steps", None)
        tenants: TenantService | None = getattr(state, "tenants", None)
        headers = _headers(scope) if match is not None and steps is not None else None
        if headers is None or tenants is None or steps is None or match is None:
            await self.app(scope, receive, send)
            return
        try:
            body = await _read(receive)
        except ApiError as exc:  # 408 of BodyReadTimeout: the body did not arrive in time
            await self._error(exc, scope, receive, send)
            return
        replay = _replay(body, receive)
        started = time.thread_time()
        try:
            request, include = _parse(body, scope, steps.settings.max_json_depth)
        except _Fallback:
            await self.app(scope, replay, send)
            return
        parse_cpu = time.thread_time() - started
        env_id: str = match.group(1)
        authorization = headers.get(b"authorization")

        def work() -> bytes:
            clock = StepClock()
            clock.cpu["parse"] = parse_cpu
            caller = tenants.authenticate(authorization.decode("latin-1") if authorization is not None else None)
            clock.lap("auth")
            return steps.take_json(caller, env_id, request, include, clock)

        try:
            data = await anyio.to_thread.run_sync(work)
        except ApiError as exc:
            await self._error(exc, scope, replay, send)
            return
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is None:
                raise
            await self._error(translated, scope, replay, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode("ascii")),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _error(exc: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        """The error response the app's ``ApiError`` handler gives (429s counted)."""
        if isinstance(exc, QuotaExceeded):
            metrics = getattr(getattr(scope.get("app"), "state", None), "metrics", None)
            if metrics is not None:
                metrics.quota_rejections.labels(exc.limit).inc()
        await error_response(exc)(scope, receive, send)


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


async def _read(receive: Receive) -> bytes:
    """The whole request body. Raises ClientDisconnect (logged by ``BodyReadTimeout``)."""
    chunks: list[bytes] = []
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
