"""The app's exception handlers and the error responses they send.

Statuses, headers and bodies are decided by :mod:`sandpit.api.errors` (plain data); this
module renders them as Starlette responses. Handlers are registered once, by class
(:func:`register_handlers`), so a handler of a base class covers every subclass:

==========================  ==================================================
exception                   response
==========================  ==================================================
``ApiError``                :func:`~sandpit.api.errors.error_reply` (429s counted)
``RequestValidationError``  422 ``invalid_request`` naming the first field
``HTTPException``           its status (404/405/413/...), 405 with ``Allow``
anything else               500 ``internal``, logged with its traceback
==========================  ==================================================
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from ..errors import (
    ApiError,
    QuotaExceeded,
    error_body,
    error_reply,
    internal_error_body,
    invalid_request_body,
)
from ..metrics import Metrics

log = logging.getLogger("sandpit.api")


def error_response(exc: ApiError) -> JSONResponse:
    """Render an :class:`ApiError` (:func:`~sandpit.api.errors.error_reply`: status,
    ``Retry-After``/``WWW-Authenticate`` headers, :class:`~sandpit.api.errors.ErrorBody`)."""
    reply = error_reply(exc)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)


def count_rejection(exc: ApiError, metrics: Metrics | None) -> None:
    """Count a 429 on ``sandpit_quota_rejections_total`` by its limit (other errors: nothing)."""
    if isinstance(exc, QuotaExceeded) and metrics is not None:
        metrics.quota_rejections.labels(exc.limit).inc()


def internal_error_response(exc: BaseException) -> JSONResponse:
    """Log ``exc`` (with its traceback) and give the 500 ``internal`` every unexpected
    error gets: the catch-all handler's and the step door's."""
    log.error("unhandled error", exc_info=exc)
    return JSONResponse(internal_error_body(), status_code=500)


def allowed_methods(request: Request) -> str:
    """The ``Allow`` of a 405: every method of every route whose path matches the
    request's (``app.state.api_routes``). Starlette's own lists only the first route that
    matched the path, so ``OPTIONS /v1/envs`` answered ``Allow: POST`` where GET works too."""
    methods: set[str] = set()
    for route in getattr(request.app.state, "api_routes", ()):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods))


def register_handlers(app: FastAPI) -> None:
    """Install the exception handlers of the module's table (by class)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        count_rejection(exc, getattr(request.app.state, "metrics", None))
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(invalid_request_body(exc.errors()), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request)
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers or None)

    @app.exception_handler(Exception)
    async def _bug(_request: Request, exc: Exception) -> JSONResponse:
        return internal_error_response(exc)
