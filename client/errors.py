"""Errors of the Sandpit client and the one place HTTP answers and transport failures
become them.

Exception tree (every error the client raises on purpose is a `SandpitError`)::

    SandpitError                status_code (None without a response), code, message, field
    ├── SandpitConnectionError  no HTTP response: connect/read failure or timeout; request_sent
    ├── InvalidResponse         a 2xx body that is not JSON or not the documented shape
    ├── InvalidRequest          400, 422 (field names the offending input)
    ├── Unauthorized            401, 403
    ├── NotFound                404 (unknown id, or another tenant's)
    ├── Conflict                409
    │   └── RequestInFlight     409 ``idempotency_key_in_flight``; retry_after (seconds)
    ├── PayloadTooLarge         413
    ├── RateLimited             429; retry_after (seconds)
    ├── Unavailable             503; retry_after (seconds)
    └── ServerError             any other 5xx

Errors that are the platform's, not the caller's (`SandpitConnectionError`, `RateLimited`,
`Unavailable`, `ServerError`) have `failure = "infrastructure"` (the failure taxonomy of
step results, docs/failures.md): a rollout that ends on one should be dropped from
training, not scored 0.0. The others have `failure = None` (a bug in the request).

`error_from_response` maps a non-2xx response (whatever its body) and
`error_from_transport` an `httpx.RequestError` onto it; `invalid_response` describes a
2xx body that does not parse. Nothing else in the client inspects statuses or httpx errors.
"""

from __future__ import annotations

import email.utils
import json
import math
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

__all__ = [
    "Conflict",
    "InvalidRequest",
    "InvalidResponse",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "RequestInFlight",
    "SandpitConnectionError",
    "SandpitError",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "error_from_response",
    "error_from_transport",
    "invalid_response",
    "parse_retry_after",
]

MAX_MESSAGE_CHARS = 2000
"""Longest message an error carries (server text beyond it is cut, with "...")."""


class SandpitError(Exception):
    """Base of every error the client raises on purpose.

    Attributes:
        status_code: HTTP status of the response, or None when there was no response.
        code: machine-readable code from the error body (`{"error": {"code", ...}}`), or
            `http_<status>` when the body did not have one.
        message: human-readable text from the server (capped at 2000 characters).
        field: the request field the error is about (422), else None.
        failure: `"infrastructure"` for the platform's errors (no connection, 429, 503,
            other 5xx), else None (a class attribute).
    """

    failure: str | None = None

    def __init__(self, message: str, *, status_code: int | None = None, code: str = "error",
                 field: str | None = None) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.field = field
        where = f" (field {field!r})" if field else ""
        prefix = f"HTTP {status_code} {code}" if status_code is not None else code
        super().__init__(f"{prefix}: {message}{where}")

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only constructors: rebuild without __init__ so errors survive pickling
        # (multiprocessing / Ray rollout workers send them across processes)
        return (_unpickle_error, (type(self), self.args, dict(self.__dict__)))


def _unpickle_error(cls: type[SandpitError], args: tuple[Any, ...], state: dict[str, Any]) -> SandpitError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class SandpitConnectionError(SandpitError):
    """No HTTP response: the connection failed, dropped or timed out.

    Attributes:
        request_sent: False when the request certainly never reached the server (connect
            error or timeout); True when it may have been processed (read timeout, dropped
            connection) — for a step, the step may or may not have happened.
        retry_safe: True when repeating the request cannot do anything twice (it was never
            sent, or it is a GET).
    """

    failure = "infrastructure"

    def __init__(self, message: str, *, request_sent: bool, retry_safe: bool) -> None:
        super().__init__(message, code="connection_error")
        self.request_sent = request_sent
        self.retry_safe = retry_safe


class InvalidResponse(SandpitError):
    """A 2xx response whose body is not JSON or does not match the documented shape."""


class InvalidRequest(SandpitError):
    """400 or 422: the request was refused as invalid; `field` names the offending input."""


class Unauthorized(SandpitError):
    """401 or 403: missing, unknown or revoked API key (or operator key)."""


class NotFound(SandpitError):
    """404: unknown id (ids of other tenants are reported the same way)."""


class Conflict(SandpitError):
    """409: the resource is not in a state that allows the call (e.g. a closed env)."""


class PayloadTooLarge(SandpitError):
    """413: the request body (source code, init_config, arguments) exceeds a server limit."""


class _RetryAfterError(SandpitError):
    """An error the server asks to retry later; `retry_after` is in seconds (None if not sent)."""

    def __init__(self, message: str, *, status_code: int | None = None, code: str = "error",
                 field: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status_code=status_code, code=code, field=field)
        self.retry_after = retry_after


class RateLimited(_RetryAfterError):
    """429: a tenant quota was hit; nothing was done. `retry_after`: seconds, or None."""

    failure = "infrastructure"


class Unavailable(_RetryAfterError):
    """503: no capacity right now; nothing was done. `retry_after`: seconds, or None."""

    failure = "infrastructure"


class RequestInFlight(Conflict, _RetryAfterError):
    """409 ``idempotency_key_in_flight``: the first request with this call's
    ``Idempotency-Key`` is still running (the transport retries it, sleeping
    `retry_after` seconds, to get that request's response)."""


class ServerError(SandpitError):
    """Any 5xx other than 503: a failure of Sandpit itself."""

    failure = "infrastructure"


STATUS_ERRORS: dict[int, type[SandpitError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 422: InvalidRequest, 429: RateLimited, 503: Unavailable,
}
"""HTTP status -> error class; other 5xx are `ServerError`, other statuses `SandpitError`."""


def clip(text: str) -> str:
    """`text` cut to :data:`MAX_MESSAGE_CHARS` (with "..." when cut)."""
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds (fractions accepted) or an HTTP
    date; None when absent or unreadable, 0.0 for a time in the past."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def error_from_response(response: httpx.Response) -> SandpitError:
    """Map a non-2xx response to the exception tree, whatever its body looks like
    (the server's `{"error": {...}}`, a bare string, a framework `detail`, HTML, nothing)."""
    status = response.status_code
    code, message, field = f"http_{status}", "", None
    try:
        body: Any = json.loads(response.content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        if isinstance(error.get("code"), str):
            code = error["code"]
        if isinstance(error.get("message"), str):
            message = error["message"]
        if isinstance(error.get("field"), str):
            field = error["field"]
    elif isinstance(error, str):
        message = error
    elif isinstance(body, dict) and "detail" in body:  # a framework default error body
        message = str(body["detail"])
    elif response.content:
        message = response.content.decode("utf-8", "replace").strip()
    message = clip(message or response.reason_phrase or "no message")
    cls = STATUS_ERRORS.get(status) or (ServerError if status >= 500 else SandpitError)
    if status == 409 and code == "idempotency_key_in_flight":
        cls = RequestInFlight
    if issubclass(cls, _RetryAfterError):
        return cls(message, status_code=status, code=code, field=field,
                   retry_after=parse_retry_after(response.headers.get("Retry-After")))
    return cls(message, status_code=status, code=code, field=field)


def invalid_response(response: httpx.Response, expected: str, exc: Exception | None) -> InvalidResponse:
    """The error for a 2xx `response` that is not a valid `expected` (`exc`: why)."""
    request = response.request
    detail = ""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in errors[:5])
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
    elif exc is not None:
        detail = str(exc)
    else:
        detail = "wrong JSON type"
    return InvalidResponse(
        clip(f"{request.method} {request.url.path}: response is not a valid {expected}: {detail}"),
        status_code=response.status_code, code="invalid_response")


def error_from_transport(exc: httpx.RequestError, method: str, path: str,
                         repeatable: bool | None = None) -> SandpitError:
    """The error for a request that got no (readable) response. A `repeatable` request
    (default: a GET; a POST with an ``Idempotency-Key`` too) may be repeated safely after
    it was sent; anything else only when it was never sent."""
    if isinstance(exc, httpx.DecodingError):
        return InvalidResponse(clip(f"{method} {path}: undecodable response body: {exc}"), code="invalid_response")
    unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    after_send = isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.ReadError
                            | httpx.WriteError | httpx.RemoteProtocolError | httpx.CloseError)
    if repeatable is None:
        repeatable = method == "GET"
    retry_safe = unsent or (after_send and repeatable)
    what = "could not connect" if unsent else "no response"
    return SandpitConnectionError(
        clip(f"{method} {path}: {what}: {type(exc).__name__}: {exc}"),
        request_sent=not unsent, retry_safe=retry_safe)
