"""API errors and the one table that maps them to HTTP statuses.

Exception tree (services raise these; routes never build HTTP errors themselves)::

    ApiError                      status  code
    ├── NotFound                  404     not_found        unknown id (or another tenant's)
    ├── InvalidRequest            422     invalid_request  names the offending ``field``
    │   └── UnknownTool           422     unknown_tool
    ├── Conflict                  409     conflict         e.g. restore past the end
    │   ├── EpisodeEnded          409     episode_ended    a step after the episode ended (reset first)
    │   ├── StaleAttempt          409     stale_attempt    the call's attempt token is not the env's current one
    │   ├── IdempotencyKeyReused  409     idempotency_key_reused     the key was used for another request
    │   └── IdempotencyKeyInFlight 409    idempotency_key_in_flight  the key's first request still runs; Retry-After
    ├── PayloadTooLarge           413     payload_too_large
    ├── RequestTimeout            408     request_timeout  the body did not arrive in time; connection closed
    ├── Unauthorized              401     unauthorized     missing/unknown/revoked/expired key
    ├── Forbidden                 403     forbidden        e.g. an admin route without the operator key
    ├── QuotaExceeded             429     quota_exceeded   names the ``limit``; with ``Retry-After``
    ├── NoCapacity                503     no_capacity      with ``Retry-After``
    └── ServiceUnavailable        503     unavailable      Docker Engine or DB down
        └── HeadMoved             503     unavailable      the env's head moved under a step (another replica)
    DatabaseNotMigrated           (start-up only: the server refuses to start)

Executor errors are translated at the edge, by the adapter (:mod:`.sandboxes`):
``CapacityError`` -> 503 ``no_capacity``, ``DockerUnavailable``/``SandboxLost`` -> 503,
``ProfileError`` -> 422 (subclasses of the classes above). Request validation errors -> 422 naming the field. Anything else
is a bug: logged with its traceback and answered 500 ``internal`` without details.
Every error body is :class:`ErrorBody`: ``{"error": {"code", "message", "field"}}``; 429s
add ``limit``, and errors with a ``Retry-After`` header (429, 503) add ``retry_after``.

This module is plain data: which status, headers and body an error gets
(:func:`error_reply`, :func:`invalid_request_body`). The HTTP layer renders them
(:mod:`sandpit.api.http.handlers`); nothing here imports the web framework.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DatabaseNotMigrated(RuntimeError):
    """The control database is not at the newest migration (message says what to run)."""


class ApiError(Exception):
    """Base of errors a request can end in; ``status``/``code`` come from :data:`TABLE`."""

    def __init__(self, message: str, *, field: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after = retry_after


class NotFound(ApiError):
    """Unknown id, or an id that belongs to another tenant (indistinguishable on purpose)."""


class InvalidRequest(ApiError):
    """The request is well-formed JSON but not acceptable; ``field`` names the part."""


class UnknownTool(InvalidRequest):
    """The tool name is not a public method of the environment."""


class Conflict(ApiError):
    """The request contradicts the resource's state (restore past the end, expired env)."""


class EpisodeEnded(Conflict):
    """A step on an env whose current episode has terminated or been truncated."""


class StaleAttempt(Conflict):
    """A call on an env carrying an attempt token (``Sandpit-Attempt``) that is not the
    env's current one: the env was resumed by a newer attempt since; nothing was done."""


class IdempotencyKeyReused(Conflict):
    """An ``Idempotency-Key`` the tenant already used for another request (another method,
    route, env or body); nothing was run."""


class IdempotencyKeyInFlight(Conflict):
    """The first request with this ``Idempotency-Key`` has not finished yet (on any
    replica); nothing was run. Retry after ``retry_after`` seconds to get its response."""


class PayloadTooLarge(ApiError):
    """Code, init_config, arguments or the whole body is over its configured cap."""


class RequestTimeout(ApiError):
    """The request body did not arrive within ``body_read_timeout_s`` (the HTTP layer
    raises it and closes the connection)."""


class Unauthorized(ApiError):
    """No ``Authorization: Bearer <key>``, or a key that is unknown, revoked or expired."""


class Forbidden(ApiError):
    """The caller is authenticated but may not do this (admin routes need the operator key)."""


class QuotaExceeded(ApiError):
    """A per-tenant limit (:class:`sandpit.api.settings.Quotas`) was hit; ``limit`` names it
    and ``retry_after`` (seconds, always set) says when trying again can help. ``fixed``:
    a fixed limit (a size, the resource profile, a job's concurrency), which waiting does
    not lift (the message says so); else a dynamic one (calls in flight, the step rate,
    live envs)."""

    def __init__(self, message: str, *, limit: str, retry_after: int, field: str | None = None,
                 fixed: bool = False) -> None:
        super().__init__(message, field=field, retry_after=max(1, int(retry_after)))
        self.limit = limit
        self.fixed = fixed


class NoCapacity(ApiError):
    """No sandbox capacity right now; retry after ``retry_after`` seconds."""


class ServiceUnavailable(ApiError):
    """A dependency (Docker Engine, database) is unreachable."""


class HeadMoved(ServiceUnavailable):
    """A step's write found its env's head no longer where the step started from (another
    API replica, or a reset, moved it meanwhile); nothing of the step was committed. The
    step door re-attaches from the committed head and carries the action out once more;
    only a second move in a row reaches the caller (503, retry)."""


TABLE: dict[type[ApiError], tuple[int, str]] = {
    NotFound: (404, "not_found"),
    UnknownTool: (422, "unknown_tool"),
    InvalidRequest: (422, "invalid_request"),
    EpisodeEnded: (409, "episode_ended"),
    StaleAttempt: (409, "stale_attempt"),
    IdempotencyKeyReused: (409, "idempotency_key_reused"),
    IdempotencyKeyInFlight: (409, "idempotency_key_in_flight"),
    Conflict: (409, "conflict"),
    PayloadTooLarge: (413, "payload_too_large"),
    RequestTimeout: (408, "request_timeout"),
    Unauthorized: (401, "unauthorized"),
    Forbidden: (403, "forbidden"),
    QuotaExceeded: (429, "quota_exceeded"),
    NoCapacity: (503, "no_capacity"),
    ServiceUnavailable: (503, "unavailable"),
}
"""Error class -> (HTTP status, error code). The only place statuses are decided."""


def status_of(exc: ApiError) -> tuple[int, str]:
    """Look ``exc`` up in :data:`TABLE` by its most specific class."""
    for cls in type(exc).__mro__:
        if cls in TABLE:
            return TABLE[cls]
    return 500, "internal"


class ErrorDetail(BaseModel):
    """What went wrong. Statuses and codes: see :data:`TABLE`; besides those, ``not_found``
    and ``method_not_allowed`` for unknown paths and methods, ``http_error`` for other
    protocol errors, ``internal`` (500) for bugs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    code: str
    """Machine-readable: ``not_found``, ``invalid_request``, ``unknown_tool``, ``conflict``,
    ``episode_ended``, ``stale_attempt``, ``idempotency_key_reused``, ``idempotency_key_in_flight``,
    ``payload_too_large``, ``request_timeout``, ``unauthorized``, ``forbidden``,
    ``quota_exceeded``, ``no_capacity``, ``unavailable``, ..."""
    message: str
    """For people; names the offending value and the limit it broke."""
    field: str | None
    """The request part at fault as a dotted path (``profile.memory_mib``,
    ``snippets.0.code``, ``arguments``), when there is one."""
    limit: str | None = Field(default=None)
    """429 only: the quota that was hit (``max_live_envs``, ``max_profile.memory_mib``, ...)."""
    retry_after: int | None = Field(default=None, ge=1)
    """429, 503 and 409 ``idempotency_key_in_flight`` only: seconds before trying again can help (also the ``Retry-After``
    header)."""


class ErrorBody(BaseModel):
    """The body of every error response (4xx and 5xx)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    error: ErrorDetail


def error_body(code: str, message: str, field: str | None = None, **extra: Any) -> dict[str, Any]:
    """The JSON error body every non-2xx response carries (:class:`ErrorBody`; ``limit``
    and ``retry_after`` only when given). Text that cannot be sent as UTF-8 (a lone
    surrogate quoted from the request or a sandbox) is replaced, so rendering an error
    never fails."""
    return {"error": {"code": code, "message": _sendable(message),
                      "field": None if field is None else _sendable(field), **extra}}


def _sendable(text: str) -> str:
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


@dataclass(frozen=True)
class ErrorReply:
    """What the server sends for an error: ``status``, extra ``headers`` and the JSON
    ``body`` (an :class:`ErrorBody`)."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]


def error_reply(exc: ApiError) -> ErrorReply:
    """The reply of ``exc``: its status and code from :data:`TABLE`, ``Retry-After``
    when it has one (and ``retry_after`` in the body), ``WWW-Authenticate`` on a 401,
    ``limit`` on a 429."""
    status, code = status_of(exc)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="sandpit"'
    extra: dict[str, Any] = {"limit": exc.limit} if isinstance(exc, QuotaExceeded) else {}
    if exc.retry_after is not None:
        extra["retry_after"] = exc.retry_after
    return ErrorReply(status, headers, error_body(code, exc.message, exc.field, **extra))


def field_of(loc: Iterable[Any]) -> str | None:
    """The dotted ``field`` of a validation error's location, without the request part
    it was found in (``("body", "function", "name")`` -> ``function.name``; ``("header",
    "Idempotency-Key")`` -> ``Idempotency-Key``; ``("body",)`` -> None)."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def invalid_request_body(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The 422 body of request validation ``errors`` (pydantic's shape: ``loc``,
    ``msg``): the first names the field (``field: message``), the count of the others
    follows (``(and 2 more problem(s))``)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    field = field_of(tuple(first.get("loc", ())))
    message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return error_body("invalid_request", message, field)


def internal_error_body() -> dict[str, Any]:
    """The body of a 500: an unexpected error, logged with its traceback by the HTTP
    layer and never described to the client."""
    return error_body("internal", "internal error (logged)")
