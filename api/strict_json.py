"""Request bodies parsed strictly, before FastAPI sees them.

Python's ``json`` accepts ``NaN``/``Infinity`` and recurses once per nesting level, so a
hostile body could smuggle non-JSON numbers into stored state or hit the recursion limit.
It also accepts ``"\\ud800"``: a lone UTF-16 surrogate, which JSON's grammar allows but
which is not Unicode (I-JSON, RFC 7493, refuses it) and cannot be encoded as UTF-8, so
the database, the sandbox protocol or the response encoder failed on it later (500s on
``POST /v1/envs``, ``/v1/validate``, ``/reset``; schemathesis never generates one).
:class:`StrictJSONRoute` re-parses every JSON body with constants refused, nesting
bounded (iteratively, before parsing) and lone surrogates refused, answering 413/422 in
the API's error shape.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

from .errors import InvalidRequest, PayloadTooLarge, error_response

_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A ``\\uD800``..``\\uDFFF`` escape: a body without one cannot decode to a surrogate."""
_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x2E for b in range(256))
_LONG_RUN = b"0" * 19


def has_long_number(data: bytes) -> bool:
    """True when ``data`` holds 19 digits in a row: a number orjson would not parse as
    Python's json does (integers beyond 64 bits become floats there); such bodies take
    Python's parser. Every digit mapped to ``0`` by one ``translate``, then one substring
    search, both in C (3 MB: a few ms; the regular expression ``\\d{19}`` took ~40 ms
    on a body full of numbers, retrying at every digit)."""
    return _LONG_RUN in data.translate(_DIGITS)


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A complete JSON string as :func:`_depth_exceeds_scan` reads one (a backslash escapes
the next byte)."""


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True when ``body`` nests arrays/objects deeper than ``limit`` (strings skipped).

    Byte operations in C instead of a Python loop over every byte: every complete string
    (a quote to the next quote no backslash escapes) is cut out by one regular expression,
    as the scan skips it; brackets are kept; then each pass of ``replace(b"()", b"")``
    removes the innermost level, so a body still non-empty after ``limit`` passes is deeper
    (or unbalanced, or has a string that never ends: then the exact scan decides, so
    malformed JSON keeps its own error). What is left is the scan's outside bytes, plus
    at most the tail of a string that never ends, so "not deeper" is exact too."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    outside = _STRING.sub(b"", body) if b'"' in body else body
    brackets = outside.translate(_PARENS, _NOT_BRACKETS)
    for _ in range(limit):
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
    return bool(brackets) and _depth_exceeds_scan(body, limit)


def _depth_exceeds_scan(body: bytes, limit: int) -> bool:
    """The exact byte-by-byte scan behind :func:`json_depth_exceeds`."""
    depth = 0
    in_string = False
    escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif byte in _CLOSE:
            depth -= 1
    return False


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not valid JSON (numbers must be finite)")


def strict_loads(body: bytes, max_depth: int) -> Any:
    """Parse ``body`` as strict JSON. Raises :class:`InvalidRequest` on NaN/Infinity,
    malformed JSON or nesting deeper than ``max_depth``."""
    if json_depth_exceeds(body, max_depth):
        raise InvalidRequest(f"JSON nested deeper than {max_depth} levels")
    if not has_long_number(body):
        try:  # orjson refuses NaN/Infinity, lone surrogates and bad UTF-8: json below says which
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


def lone_surrogate_at(body: bytes, parsed: Any) -> str | None:
    """The dotted path (``init_config.key``; ``""`` for the top level) of the first
    string or key of ``parsed`` holding a lone surrogate, or None. Paired surrogates
    (``\\ud83d\\ude00``) decode to one character and pass. Only walks ``parsed`` when
    ``body`` has a surrogate escape at all."""
    if not _SURROGATE_ESCAPE.search(body):
        return None
    stack: list[tuple[str, Any]] = [("", parsed)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodable(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if not _encodable(key):
                    return path or "(key)"
                stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{index}" if path else str(index), item) for index, item in enumerate(value))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ParsedJSONRequest(Request):
    """A request whose body was read and parsed already: FastAPI's ``body()`` and
    ``json()`` get those instead of reading and parsing the body again."""

    def __init__(self, request: Request, body: bytes, parsed: Any) -> None:
        super().__init__(request.scope, request.receive)
        self.raw_body = body
        self.parsed = parsed

    async def body(self) -> bytes:
        """The body as read by :class:`StrictJSONRoute`."""
        return self.raw_body

    async def json(self) -> Any:
        """The body as parsed by :func:`strict_loads`."""
        return self.parsed


LARGE_BODY_BYTES = 256 * 1024
"""Bodies from this size on are remembered by :class:`ParsedBodies` once they passed."""


class ParsedBodies:
    """The parsed value of the last large bodies that passed every check (nesting,
    strict parse, lone surrogates), by the SHA-256 digest of their bytes and the depth
    limit: a client sending the same megabytes again (the same 3 MB ``init_config`` for
    every env of a scenario) gets them parsed once, as the performance round asks (a 3 MB
    body: ~30 ms to parse and ~40 ms to check; hashing it costs ~2 ms). A verdict and a
    value are pure functions of the bytes.

    The value is shared by every request of those bytes, so handlers treat request
    JSON as read-only (none mutates it; configs are shared the same way once stored,
    :class:`~sandpit.api.sandboxes.SharedConfig`). Bounded by ``max_entries`` and by
    ``max_bytes`` of body bytes (least recently used first out); parsed, a body takes
    about 4.5 times its size in memory (tau-bench-shaped 3.3 MB: ~15 MB), so the default
    32 MiB holds ~150 MB. Thread-safe."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._values: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, digest: bytes) -> tuple[bool, Any]:
        """``(True, value)`` for bytes that passed before, else ``(False, None)``."""
        with self._lock:
            entry = self._values.get(digest)
            if entry is None:
                return False, None
            self._values.move_to_end(digest)
            return True, entry[0]

    def add(self, digest: bytes, value: Any, size: int) -> None:
        """Remember ``value``, parsed from ``size`` bytes of digest ``digest``."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._values.pop(digest, None)
            if old is not None:
                self._bytes -= old[1]
            self._values[digest] = (value, size)
            self._bytes += size
            while len(self._values) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._values.popitem(last=False)
                self._bytes -= dropped


PARSED_BODIES = ParsedBodies()
"""One parse cache for every route of the process: its memory bound holds for the whole
server (one cache per route would multiply it by the number of routes that take a body),
and the same bytes parse to the same value whichever route receives them."""


class StrictJSONRoute(APIRoute):
    """An APIRoute whose JSON body must pass :func:`strict_loads` and the body size cap
    (``request.app.state.settings.max_body_bytes``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()
        parsed_bodies = PARSED_BODIES

        async def handler(request: Request) -> Response:
            settings = request.app.state.settings
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
                return error_response(PayloadTooLarge(f"request body over {settings.max_body_bytes} bytes"))
            if request.method in ("POST", "PUT", "PATCH"):
                body = await request.body()
                if len(body) > settings.max_body_bytes:
                    return error_response(PayloadTooLarge(f"request body over {settings.max_body_bytes} bytes"))
                if body:
                    digest = (hashlib.sha256(body).digest() + settings.max_json_depth.to_bytes(4, "big")
                              if len(body) >= LARGE_BODY_BYTES else None)
                    known, parsed = parsed_bodies.get(digest) if digest is not None else (False, None)
                    if not known:
                        try:
                            parsed = strict_loads(body, settings.max_json_depth)
                        except InvalidRequest as exc:
                            return error_response(exc)
                        where = lone_surrogate_at(body, parsed)
                        if where is not None:
                            return error_response(InvalidRequest(
                                f"{where or 'body'}: a lone UTF-16 surrogate (\\ud800-\\udfff) is not valid Unicode",
                                field=where or None))
                        if digest is not None:
                            parsed_bodies.add(digest, parsed, len(body))
                    return await original(ParsedJSONRequest(request, body, parsed))  # one parse per body
            return await original(request)

        return handler
