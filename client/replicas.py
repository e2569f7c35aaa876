"""Spreading a client's requests over several API replicas (any replica answers
any request, since they share one database and reach an env's session through its host).

A base URL with commas, ``http://127.0.0.1:8601,http://127.0.0.1:8602``, makes `Client` /
`AsyncClient` send each request to the next replica in turn (round robin, per request, not
per connection). A replica that refuses the connection is skipped for that request and the
next one is tried: nothing was sent, so this is safe for every method. Errors after the
request was sent are the caller's, as with one URL (see `sandpit.client.transport`).

All replicas must share scheme-independent path prefixes: ``http://a/sandpit`` and
``http://b/sandpit`` is fine, ``http://a/x`` and ``http://b/y`` is refused, since the
client builds every path once from the first URL.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter

import httpx

__all__ = ["AsyncReplicaTransport", "ReplicaTransport", "parse_replicas"]


def parse_replicas(base_url: str) -> list[httpx.URL]:
    """The replica URLs of a comma-separated ``base_url`` (one entry: a single server).

    Raises:
        ValueError: an empty entry, a scheme other than http/https, no host, a query or
            fragment, or replicas whose paths differ.
    """
    urls = []
    for part in base_url.split(","):
        text = part.strip()
        if not text:
            raise ValueError(f"empty replica URL in {base_url!r}")
        url = httpx.URL(text)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"replica URL {text!r} needs http:// or https:// and a host")
        if url.query or url.fragment:
            raise ValueError(f"replica URL {text!r} must not have a query or fragment")
        urls.append(url)
    paths = {url.path.rstrip("/") for url in urls}
    if len(paths) > 1:
        raise ValueError(f"replica URLs must share one path prefix, got {sorted(paths)}")
    return urls


class _Rotation:
    """Which replica each request tries first, and how many each one answered."""

    def __init__(self, replicas: list[httpx.URL]) -> None:
        if not replicas:
            raise ValueError("at least one replica URL is needed")
        self.replicas = replicas
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self.answered: Counter[str] = Counter()
        """Responses per replica (``host:port``): what a test or benchmark reads to see the spread."""

    def order(self) -> list[httpx.URL]:
        with self._lock:
            first = next(self._turn) % len(self.replicas)
        return self.replicas[first:] + self.replicas[:first]

    @staticmethod
    def aim(request: httpx.Request, target: httpx.URL) -> None:
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
        request.headers["Host"] = target.netloc.decode("ascii")

    def count(self, target: httpx.URL) -> None:
        with self._lock:
            self.answered[target.netloc.decode("ascii")] += 1


class ReplicaTransport(httpx.BaseTransport):
    """An httpx transport sending each request to the next of ``replicas`` (round robin),
    trying the others in turn when one refuses the connection.

    Args:
        replicas: from :func:`parse_replicas`.
        transport: the transport that actually sends (default a normal connection pool).

    Raises (per request):
        httpx.ConnectError / httpx.ConnectTimeout: every replica refused; the last error.
    """

    def __init__(self, replicas: list[httpx.URL], transport: httpx.BaseTransport | None = None) -> None:
        self.rotation = _Rotation(replicas)
        self.inner = transport or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` to the replica whose turn it is (see the class docstring)."""
        order = self.rotation.order()
        for index, target in enumerate(order):
            self.rotation.aim(request, target)
            try:
                response = self.inner.handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if index == len(order) - 1:
                    raise
                continue
            self.rotation.count(target)
            return response
        raise AssertionError("unreachable: the loop returns or raises")

    def close(self) -> None:
        self.inner.close()


class AsyncReplicaTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`ReplicaTransport` (same arguments and errors)."""

    def __init__(self, replicas: list[httpx.URL], transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.rotation = _Rotation(replicas)
        self.inner = transport or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """See :meth:`ReplicaTransport.handle_request`."""
        order = self.rotation.order()
        for index, target in enumerate(order):
            self.rotation.aim(request, target)
            try:
                response = await self.inner.handle_async_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if index == len(order) - 1:
                    raise
                continue
            self.rotation.count(target)
            return response
        raise AssertionError("unreachable: the loop returns or raises")

    async def aclose(self) -> None:
        await self.inner.aclose()
