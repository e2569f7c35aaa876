"""Sending `Call`s: the sync and async transports over httpx and their retry policy.

Retries (tenacity): 429 and 503 are retried for every call, since the server guarantees it
did nothing, sleeping what `Retry-After` says, until the total sleep would exceed
`max_retry_wait_s`; then the last error is raised. Transport failures before the request was
sent (connect error or timeout, pool timeout) are retried for every call, at most 3 attempts.
Failures after it was sent (read timeout, dropped connection) are retried for GET and for
calls that carry an ``Idempotency-Key`` (step, create, reset, fork: a new uuid4 per call,
the same on each retry, so the server runs the call at most once and a retry gets the
first answer); a 409 ``idempotency_key_in_flight`` (the first attempt still runs) is
retried after its `Retry-After` like a 503. Any other call (restore, delete, ...) that
lost its connection after sending raises `SandpitConnectionError` with
`request_sent=True` instead of risking doing it twice.

Keys: a call marked `auth="operator"` (`/v1/admin`) carries the operator key instead of
the tenant's API key; without an operator key it is refused before anything is sent.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import httpx
import tenacity

from .calls import Call
from .errors import (
    RateLimited,
    RequestInFlight,
    SandpitConnectionError,
    Unauthorized,
    Unavailable,
    _RetryAfterError,
    error_from_response,
    error_from_transport,
)

__all__ = ["DEFAULT_URL", "USER_AGENT", "AsyncTransport", "RetryPolicy", "SyncTransport"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8600"
"""Where `sandpit serve` listens by default."""
USER_AGENT = "sandpit-python-client/0.1"
MIN_RETRY_SLEEP_S = 0.05
"""Floor for `Retry-After: 0`, so a busy server is not hammered."""
MAX_BACKOFF_S = 5.0
"""Without Retry-After: 0.25 s, 0.5 s, 1 s, ... capped here."""
TRANSPORT_ATTEMPTS = 3
"""Attempts of a call whose transport failed in a way that is safe to repeat."""
URL_CACHE_SIZE = 4096
"""Request paths whose absolute URL a transport keeps (:class:`_Urls`); when full it starts over."""


def _retry_sleep(state: tenacity.RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, _RetryAfterError) and exc.retry_after is not None:
        return max(exc.retry_after, MIN_RETRY_SLEEP_S)
    return float(min(0.25 * 2 ** (state.attempt_number - 1), MAX_BACKOFF_S))


class RetryPolicy:
    """What to retry and for how long (see the module docstring); shared by both transports.

    Args:
        max_retry_wait_s: total seconds one call may sleep between retries; 0 disables them.

    Raises:
        ValueError: `max_retry_wait_s` < 0.
    """

    def __init__(self, max_retry_wait_s: float) -> None:
        if max_retry_wait_s < 0:
            raise ValueError("max_retry_wait_s must be >= 0")
        self.max_retry_wait_s = max_retry_wait_s

    def kwargs(self, call: Call[Any]) -> dict[str, Any]:
        """tenacity `Retrying` arguments for `call`."""
        def should_retry(exc: BaseException) -> bool:
            if isinstance(exc, RateLimited | Unavailable):
                return call.retry_busy
            if isinstance(exc, RequestInFlight):
                return True
            return isinstance(exc, SandpitConnectionError) and exc.retry_safe

        def stop(state: tenacity.RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, SandpitConnectionError) and state.attempt_number >= TRANSPORT_ATTEMPTS:
                return True
            return state.idle_for + _retry_sleep(state) > self.max_retry_wait_s

        return {"retry": tenacity.retry_if_exception(should_retry), "stop": stop,
                "wait": _retry_sleep, "reraise": True}


def from_environment(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """`base_url`/`api_key`, or `SANDPIT_URL` (else :data:`DEFAULT_URL`) / `SANDPIT_API_KEY`."""
    return (base_url or os.environ.get("SANDPIT_URL") or DEFAULT_URL,
            api_key if api_key is not None else (os.environ.get("SANDPIT_API_KEY") or None))


def http_kwargs(base_url: str, api_key: str | None, timeout: float,
                headers: Mapping[str, str] | None) -> dict[str, Any]:
    """Arguments of the `httpx.Client` / `httpx.AsyncClient` under a Sandpit client."""
    merged = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    if api_key:
        merged["Authorization"] = f"Bearer {api_key}"
    return {"base_url": base_url, "headers": merged, "timeout": httpx.Timeout(timeout),
            "follow_redirects": False}


def _result(call: Call[T], response: httpx.Response) -> T:
    if response.is_success:
        return call.parse(response)
    raise error_from_response(response)


class _Urls:
    """The absolute URL of each request path on an httpx client's ``base_url``, built once.

    httpx parses a path given as a string twice per request to join it to ``base_url``
    (about 20 µs of CPU each on a loaded 2-core VM, some 5% of what the client spends on
    a step); a :class:`httpx.URL` that is already absolute goes through as it is. The join
    is httpx's own (``Client._merge_url``: ``base_url`` ends with ``/``, the path's leading
    ``/`` is dropped, so a ``base_url`` with a path prefix keeps it). A new ``base_url`` on
    the client starts a new cache; at :data:`URL_CACHE_SIZE` paths (an env's step and
    state paths are a few each) it starts over. Safe to share between threads: the cache
    is one ``(base_url, {path: url})`` pair read and replaced whole, so a dict only ever
    holds URLs built on its own base; a race builds a URL twice, never a wrong one.
    """

    def __init__(self) -> None:
        self._cache: tuple[httpx.URL | None, dict[str, httpx.URL]] = (None, {})

    def url(self, base: httpx.URL, path: str) -> httpx.URL:
        """``path`` (a relative path such as ``/v1/envs/env_1/step``) joined to ``base``."""
        cached_base, urls = self._cache
        if cached_base is not base:
            urls = {}
            self._cache = (base, urls)
        url = urls.get(path)
        if url is None:
            relative = httpx.URL(path)
            if not relative.is_relative_url:
                return relative
            if len(urls) >= URL_CACHE_SIZE:
                urls = {}
                self._cache = (base, urls)
            url = urls[path] = base.copy_with(raw_path=base.raw_path + relative.raw_path.lstrip(b"/"))
        return url


class _Base:
    def __init__(self, policy: RetryPolicy, operator_key: str | None) -> None:
        self.policy = policy
        self._operator_key = operator_key
        self._urls = _Urls()

    def _headers(self, call: Call[Any]) -> dict[str, str] | None:
        headers: dict[str, str] | None = None
        if call.idempotency_key is not None or call.attempt is not None:
            headers = {}
            if call.idempotency_key is not None:
                headers["Idempotency-Key"] = call.idempotency_key
            if call.attempt is not None:
                headers["Sandpit-Attempt"] = call.attempt
        if call.auth != "operator":
            return headers
        if not self._operator_key:
            raise Unauthorized(f"{call.method} {call.path} needs the operator key: pass operator_key= to the client",
                               code="no_operator_key")
        return {**(headers or {}), "Authorization": f"Bearer {self._operator_key}"}


class SyncTransport(_Base):
    """Runs `Call`s on an `httpx.Client` with the retry policy."""

    def __init__(self, http: httpx.Client, policy: RetryPolicy, operator_key: str | None = None) -> None:
        super().__init__(policy, operator_key)
        self.http = http

    def run(self, call: Call[T]) -> T:
        """Send `call` (retrying as the policy says) and return its parsed answer.

        Raises:
            SandpitError: the error of the last attempt (see `sandpit.client.errors`).
        """
        headers = self._headers(call)
        result: T = tenacity.Retrying(**self.policy.kwargs(call))(self._once, call, headers)
        return result

    def _once(self, call: Call[T], headers: dict[str, str] | None) -> T:
        try:
            response = self.http.request(call.method, self._urls.url(self.http.base_url, call.path),
                                         params=call.params, json=call.json, headers=headers)
        except httpx.RequestError as exc:
            raise error_from_transport(exc, call.method, call.path, call.idempotent) from exc
        return _result(call, response)


class AsyncTransport(_Base):
    """Runs `Call`s on an `httpx.AsyncClient` with the retry policy."""

    def __init__(self, http: httpx.AsyncClient, policy: RetryPolicy, operator_key: str | None = None) -> None:
        super().__init__(policy, operator_key)
        self.http = http

    async def run(self, call: Call[T]) -> T:
        """See `SyncTransport.run`."""
        headers = self._headers(call)
        result: T = await tenacity.AsyncRetrying(**self.policy.kwargs(call))(self._once, call, headers)
        return result

    async def _once(self, call: Call[T], headers: dict[str, str] | None) -> T:
        try:
            response = await self.http.request(call.method, self._urls.url(self.http.base_url, call.path),
                                               params=call.params, json=call.json, headers=headers)
        except httpx.RequestError as exc:
            raise error_from_transport(exc, call.method, call.path, call.idempotent) from exc
        return _result(call, response)
