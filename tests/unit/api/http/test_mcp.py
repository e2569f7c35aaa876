"""The MCP face's conversions (:mod:`sandpit.api.http.mcp`): OpenAI tool schemas as MCP
tools, steps as ``tools/call`` results, API errors as JSON-RPC errors, and which bodies
open a scenario session. The endpoints themselves run in tests/integration/api/test_mcp.py."""

from __future__ import annotations

import json

import pytest
from mcp import types
from sandpit.api.errors import EpisodeEnded, InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded
from sandpit.api.http.mcp import (
    META_KEY,
    SERVER_ERROR,
    _initialize,
    mcp_tool,
    rpc_error,
    state_uri,
    tool_result,
    trajectory_uri,
)


def _document(status: str = "ok", **changes: object) -> dict[str, object]:
    return {"env_id": "env_1", "episode": 1, "step": 2, "action": {"name": "bump", "arguments": {}},
            "observation": "3", "status": status, "observation_role": "tool", "reward": 0.0, "terminated": False,
            "truncated": False, "duration_ms": 1.5, "stdout": "", "stderr": "", "traceback": None, "error": None,
            "argument_findings": None, "checks": None, "recovered": False, "failure": "none", "mask": False,
            "episode_failure": "none", "episode_mask": False, "state_diff": None, "state": None, **changes}


def test_openai_schema_becomes_mcp_tool() -> None:
    parameters = {"type": "object", "properties": {"by": {"type": "integer"}}, "required": ["by"]}
    tool = mcp_tool({"type": "function", "function": {"name": "bump", "description": "Add.", "parameters": parameters}})
    assert (tool.name, tool.description, tool.inputSchema) == ("bump", "Add.", parameters)


def test_tool_without_parameters_gets_an_object_schema() -> None:
    assert mcp_tool({"name": "ping"}).inputSchema == {"type": "object"}
    assert mcp_tool({"function": {"name": "ping", "parameters": "not a schema"}}).inputSchema == {"type": "object"}


@pytest.mark.parametrize(("status", "is_error"), [("ok", False), ("error", True), ("rejected", True),
                                                  ("timeout", True), ("crashed", True)])
def test_tool_result_is_error_unless_ok(status: str, is_error: bool) -> None:
    result = tool_result(_document(status))
    assert result.isError is is_error
    assert result.content == [types.TextContent(type="text", text="3")]


def test_tool_result_meta_carries_the_step_record() -> None:
    checks = [{"check_item": "x", "passed": True}]
    result = tool_result(_document(reward=1.0, terminated=True, checks=checks, episode_failure="verifier",
                                   episode_mask=True))
    wire = json.loads(types.ServerResult(result).model_dump_json(by_alias=True, exclude_none=True))
    assert wire["_meta"][META_KEY] == {"env_id": "env_1", "episode": 1, "step": 2, "status": "ok", "reward": 1.0,
                                       "terminated": True, "truncated": False, "duration_ms": 1.5,
                                       "recovered": False, "error": None, "checks": checks, "failure": "none",
                                       "mask": False, "episode_failure": "verifier", "episode_mask": True}
    assert "stdout" not in wire["_meta"][META_KEY]


def test_api_errors_become_json_rpc_errors() -> None:
    ended = rpc_error(EpisodeEnded("episode 1 ended")).error
    assert (ended.code, ended.message) == (SERVER_ERROR, "episode 1 ended")
    assert ended.data["status"] == 409 and ended.data["error"]["code"] == "episode_ended"
    assert rpc_error(InvalidRequest("bad", field="include")).error.code == types.INVALID_PARAMS
    assert rpc_error(PayloadTooLarge("big")).error.code == types.INVALID_PARAMS
    assert rpc_error(NotFound("gone")).error.data["status"] == 404
    limited = rpc_error(QuotaExceeded("slow down", limit="steps_per_minute", retry_after=3)).error
    assert limited.data["status"] == 429 and limited.data["error"]["retry_after"] == 3


def test_resource_uris_are_stable() -> None:
    assert state_uri("env_1") == "sandpit://envs/env_1/state"
    assert trajectory_uri("env_1") == "sandpit://envs/env_1/trajectory"


@pytest.mark.parametrize(("body", "kind"), [
    (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
     b'"capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}', True),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 7}}', False),
    (b'{"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
     b'"capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}}', False),  # a notification, no id
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', None),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "initialize"}]', None),
    (b'{"jsonrpc": "2.0", "id": 1, "method": ', None),
    (b'\xff\xfe', None),
    (b'', None),
])
def test_which_bodies_open_a_session(body: bytes, kind: bool | None) -> None:
    assert _initialize(body) is kind
