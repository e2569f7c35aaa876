"""The direct answer to a plain MCP ``tools/call``: the request the SDK would dispatch to the
``tools/call`` handler, answered without the SDK's per-request transport.

The endpoints are stateless (:mod:`.mcp`), so for every request the SDK's
``StreamableHTTPSessionManager`` builds a transport, memory streams, a server session and a
task group, and hands the message through them to the handler and back: more work than a
step's own. A ``tools/call`` whose shape is settled needs none of it: the request is
validated with the SDK's own models (``JSONRPCRequest``, ``ClientRequest``), the handler's
work runs as the SDK handler's does (:meth:`.mcp.McpServer.step_result`), and the reply is
the SDK's ``JSONRPCResponse``/``JSONRPCError`` serialized as its transport serializes it
(``model_dump_json(by_alias=True, exclude_none=True)``, ``Content-Type: application/json``,
status 200). ``tests/integration/api/test_mcp.py`` holds the two answers equal.

:func:`direct_call` takes a request only when the SDK's transport would pass it straight to
the handler: a ``POST`` with a ``Content-Length`` within the body cap, an ``Accept`` that
includes ``application/json`` and a ``Content-Type`` of ``application/json`` (the SDK's
tests, as it makes them), no ``MCP-Protocol-Version`` header or a version the SDK supports,
one JSON-RPC request of method ``tools/call`` whose ``params`` hold only ``name`` and
``arguments`` (``_meta``, progress tokens and task options go to the SDK) and that the
SDK's models accept. Anything else, malformed input included, is left to the SDK, so every
protocol error is the SDK's own.
"""

from __future__ import annotations

import orjson
from mcp import types
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.types import Scope

PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
JSON = "application/json"
DIRECT_PARAMS = frozenset({"name", "arguments"})
"""The ``params`` keys of a ``tools/call`` answered directly (others go to the SDK)."""


def takes_body(scope: Scope, headers: Headers, limit: int) -> bool:
    """Whether a request may be a direct ``tools/call`` before its body is read: ``POST``,
    a ``Content-Length`` of at most ``limit`` bytes, the SDK's ``Accept`` and
    ``Content-Type`` tests passed, and a protocol version the SDK supports (or none)."""
    if scope["method"] != "POST":
        return False
    length = headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > limit:
        return False
    if not any(kind.strip().startswith(JSON) for kind in headers.get("accept", "").split(",")):
        return False
    content_type = headers.get("content-type", "").split(";")[0]
    if JSON not in (part.strip() for part in content_type.split(",")):
        return False
    version = headers.get(PROTOCOL_VERSION_HEADER)
    return version is None or version in SUPPORTED_PROTOCOL_VERSIONS


def direct_call(body: bytes) -> tuple[types.RequestId, types.CallToolRequest] | None:
    """``(request id, the tools/call request)`` when ``body`` is one JSON-RPC
    ``tools/call`` with only ``name`` and ``arguments`` that the SDK's models accept, else
    None (the SDK answers it)."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not params.keys() <= DIRECT_PARAMS:
        return None
    try:
        rpc = types.JSONRPCRequest.model_validate(message)
        # what the SDK's session validates, as ClientRequest (a union whose only member of
        # method "tools/call" is CallToolRequest), validated as that member at once
        request = types.CallToolRequest.model_validate(rpc.model_dump(by_alias=True, mode="json", exclude_none=True))
    except ValidationError:
        return None
    return rpc.id, request


def reply(request_id: types.RequestId, outcome: types.ServerResult | types.ErrorData) -> bytes:
    """The JSON body the SDK's transport sends for ``outcome`` of request ``request_id``:
    a ``JSONRPCResponse`` whose ``result`` is the result dumped as the SDK's session dumps
    it, or a ``JSONRPCError``."""
    if isinstance(outcome, types.ErrorData):
        error = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=outcome)
        return types.JSONRPCMessage(error).model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")
    # JSONRPCResponse's fields in its order; the result dumped as the SDK's session dumps it
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id,
                         "result": outcome.model_dump(by_alias=True, mode="json", exclude_none=True)})
