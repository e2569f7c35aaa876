"""Which MCP requests are answered directly (api/http/mcp_calls.py) and how the reply is
made: only a plain ``tools/call`` that the SDK's transport would hand straight to the
handler; everything else, malformed input included, is the SDK's. The reply is the SDK's
own message models serialized as its transport serializes them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import types
from sandpit.api.http import mcp_calls
from starlette.datastructures import Headers

LIMIT = 1000
GOOD = {"accept": "application/json, text/event-stream", "content-type": "application/json", "content-length": "90"}


def call(**params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                       "params": params or {"name": "bump", "arguments": {"by": 1}}}).encode()


@pytest.mark.parametrize(("method", "headers", "taken"), [
    ("POST", GOOD, True),
    ("POST", {**GOOD, "accept": "application/json"}, True),
    ("POST", {**GOOD, "content-type": "application/json; charset=utf-8"}, True),
    ("POST", {**GOOD, "mcp-protocol-version": "2025-06-18"}, True),
    ("GET", GOOD, False),
    ("DELETE", GOOD, False),
    ("POST", {**GOOD, "accept": "text/event-stream"}, False),  # the SDK answers 406
    ("POST", {k: v for k, v in GOOD.items() if k != "accept"}, False),
    ("POST", {**GOOD, "content-type": "text/plain"}, False),  # the SDK answers 415
    ("POST", {**GOOD, "mcp-protocol-version": "1999-01-01"}, False),  # the SDK answers 400
    ("POST", {k: v for k, v in GOOD.items() if k != "content-length"}, False),  # chunked: the SDK reads it
    ("POST", {**GOOD, "content-length": str(LIMIT + 1)}, False),  # the SDK answers 413
    ("POST", {**GOOD, "content-length": "-1"}, False),
    ("POST", {**GOOD, "content-length": "1e3"}, False),
])
def test_only_requests_the_sdk_would_pass_on_are_read(method: str, headers: dict[str, str], taken: bool) -> None:
    assert mcp_calls.takes_body({"method": method}, Headers(headers), LIMIT) is taken


def test_a_plain_tools_call_is_direct() -> None:
    direct = mcp_calls.direct_call(call())
    assert direct is not None
    request_id, request = direct
    assert request_id == 3 and request.params.name == "bump" and request.params.arguments == {"by": 1}
    assert mcp_calls.direct_call(call(name="bump")) is not None  # no arguments: the tool's defaults


@pytest.mark.parametrize("body", [
    b"",
    b"{not json",
    b"[]",
    json.dumps([json.loads(call())]).encode(),  # a batch
    b'"tools/call"',
    call(name="bump", arguments={"by": 1}, _meta={"progressToken": 1}),  # progress: the SDK's
    call(name="bump", arguments={"by": 1}, task={"ttl": 1}),
    call(name=5, arguments={}),  # the SDK's models refuse it: its error
    call(name="bump", arguments=[1, 2]),
    json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call"}).encode(),  # no params
    json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": None}).encode(),
    json.dumps({"jsonrpc": "1.0", "id": 3, "method": "tools/call", "params": {"name": "bump"}}).encode(),
    json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "bump"}}).encode(),  # a notification
    json.dumps({"jsonrpc": "2.0", "id": None, "method": "tools/call", "params": {"name": "bump"}}).encode(),
    json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}).encode(),
    json.dumps({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}}).encode(),
])
def test_anything_else_is_left_to_the_sdk(body: bytes) -> None:
    assert mcp_calls.direct_call(body) is None


def test_the_reply_is_the_sdk_message_serialized() -> None:
    result = types.ServerResult(types.CallToolResult(content=[types.TextContent(type="text", text="1")],
                                                     isError=False, **{"_meta": {"sandpit/step": {"step": 1}}}))
    ok = json.loads(mcp_calls.reply("abc", result))
    assert ok == {"jsonrpc": "2.0", "id": "abc", "result": {
        "_meta": {"sandpit/step": {"step": 1}}, "content": [{"type": "text", "text": "1"}], "isError": False}}
    error = json.loads(mcp_calls.reply(4, types.ErrorData(code=-32000, message="no", data={"status": 409})))
    assert error == {"jsonrpc": "2.0", "id": 4, "error": {"code": -32000, "message": "no", "data": {"status": 409}}}
