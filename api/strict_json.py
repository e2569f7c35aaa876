"""Request bodies parsed strictly, before FastAPI sees them.

Python's ``json`` accepts ``NaN``/``Infinity`` and recurses once per nesting level, so a
hostile body could smuggle non-JSON numbers into stored state or hit the recursion limit.
:class:`StrictJSONRoute` re-parses every JSON body with constants refused and nesting
bounded (iteratively, before parsing), answering 413/422 in the API's error shape.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from .errors import InvalidRequest, PayloadTooLarge, error_response

_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True when ``body`` nests arrays/objects deeper than ``limit`` (strings skipped)."""
    depth = 0
    in_string = False
    escaped = False
    # bytes.translate-free scan; bodies are capped by max_body_bytes before this runs
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
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


class StrictJSONRoute(APIRoute):
    """An APIRoute whose JSON body must pass :func:`strict_loads` and the body size cap
    (``request.app.state.settings.max_body_bytes``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

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
                    try:
                        strict_loads(body, settings.max_json_depth)
                    except InvalidRequest as exc:
                        return error_response(exc)
            return await original(request)

        return handler
