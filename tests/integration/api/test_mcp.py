"""Envs and scenarios as MCP servers (``/v1/envs/{id}/mcp``, ``/v1/scenarios/{id}/mcp``),
driven by the ``mcp`` SDK's own client (``streamable_http_client`` + ``ClientSession``)
against two real ``sandpit serve`` replicas on one SQLite database, with real sandboxes.
The client's HTTP transport alternates its requests between the replicas, so one MCP
session's calls land on both. Hostile input goes in over raw HTTP: malformed JSON-RPC,
unknown methods, missing and wrong keys, another tenant's env or session, tools that do
not exist, arguments of the wrong type."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from api_server import COUNTER_SOURCE, ApiServer, create_envs
from markdown_docs import section_blocks
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
META = "sandpit/step"
CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n"
                                                     "    return final_state['count'] == 3\n"}]
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
T = TypeVar("T")


class RoundRobin(httpx.AsyncBaseTransport):
    """An HTTP transport that sends each request to the next replica in turn (a load
    balancer without affinity): the URL's port is replaced by the replica's."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = itertools.cycle(ports)
        self.inner = httpx.AsyncHTTPTransport()
        self.seen: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = next(self.ports)
        self.seen.append(port)
        request.url = request.url.copy_with(port=port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, leak_check, sandbox_image) -> Iterator[list[ApiServer]]:
    """Two replicas: the second serves the first's SQLite database (same operator key,
    same tenant ``default``)."""
    first = ApiServer(tmp_path_factory.mktemp("mcp0")).start()
    second = ApiServer(tmp_path_factory.mktemp("mcp1"), SANDPIT_OPERATOR_KEY=first.operator_key,
                       SANDPIT_DATABASE_URL=f"sqlite:///{first.db_path}")
    second.api_key = first.api_key
    try:
        second.start()
        yield [first, second]
    finally:
        second.stop()
        first.stop()


@pytest.fixture(scope="module")
def scenario_id(replicas: list[ApiServer]) -> str:
    with replicas[0].client() as client:
        environment = client.post("/v1/environments", json={"name": "counter", "source_code": COUNTER_SOURCE,
                                                             "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        scenario = client.post("/v1/scenarios", json={"environment_id": environment.json()["id"],
                                                      "task": "Bring the counter to 3.", "init_config": {"count": 0},
                                                      "checklist_with_func": CHECKS})
        assert scenario.status_code == 201, scenario.text
        return str(scenario.json()["id"])


def _new_env(server: ApiServer, scenario_id: str, api_key: str | None = None) -> str:
    with server.client(api_key) as client:
        response = client.post("/v1/envs", json={"scenario_id": scenario_id})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])


def _session(replicas: list[ApiServer], path: str, body: Callable[[ClientSession, RoundRobin], Awaitable[T]],
             api_key: str | None = None) -> T:
    """Run ``body`` in an initialized SDK client session of ``path``, its requests
    alternating between ``replicas`` (one replica: all to it)."""

    async def run() -> T:
        transport = RoundRobin([server.port for server in replicas])
        headers = {"Authorization": f"Bearer {api_key or replicas[0].api_key}"}
        async with httpx.AsyncClient(transport=transport, headers=headers, timeout=60) as http:
            async with streamable_http_client(f"{replicas[0].url}{path}", http_client=http) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await body(session, transport)

    return asyncio.run(run())


def _rpc(server: ApiServer, path: str, message: Any, api_key: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    """One raw JSON-RPC POST (``raw`` bytes instead of ``message`` when given)."""
    with server.client(api_key) as client:
        if raw is not None:
            return client.post(path, content=raw, headers={**ACCEPT, **(headers or {})})
        return client.post(path, json=message, headers={**ACCEPT, **(headers or {})})


def _call(name: str, arguments: Any, ident: int | str = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


def test_tools_list_is_the_agents_tool_list(replicas: list[ApiServer], scenario_id: str) -> None:
    env_id = _new_env(replicas[0], scenario_id)
    with replicas[1].client() as client:
        shown = client.get(f"/v1/envs/{env_id}").json()["tools"]

    async def body(session: ClientSession, _: RoundRobin) -> Any:
        return (await session.list_tools()).tools

    tools = _session(replicas, f"/v1/envs/{env_id}/mcp", body)
    assert [t.name for t in tools] == [s["function"]["name"] for s in shown]
    assert "chat_with_user" in {t.name for t in tools}  # the episode's termination action
    for tool, schema in zip(tools, shown, strict=True):
        assert tool.inputSchema == schema["function"]["parameters"]
        assert tool.description == schema["function"].get("description")


def test_tool_calls_are_recorded_steps_on_either_replica(replicas: list[ApiServer], scenario_id: str) -> None:
    env_id = _new_env(replicas[0], scenario_id)
    path = f"/v1/envs/{env_id}/mcp"

    async def body(session: ClientSession, transport: RoundRobin) -> dict[str, Any]:
        bumps = [await session.call_tool("bump", {"by": by}) for by in (1, 2)]
        state = await session.read_resource(f"sandpit://envs/{env_id}/state")  # type: ignore[arg-type]
        trajectory = await session.read_resource(f"sandpit://envs/{env_id}/trajectory")  # type: ignore[arg-type]
        resources = await session.list_resources()
        done = await session.call_tool("chat_with_user", {"content": "done"})
        with pytest.raises(McpError) as ended:
            await session.call_tool("bump", {"by": 1})
        return {"bumps": bumps, "state": state, "trajectory": trajectory, "resources": resources, "done": done,
                "ended": ended.value.error, "ports": set(transport.seen)}

    seen = _session(replicas, path, body)
    assert seen["ports"] == {replicas[0].port, replicas[1].port}
    first, second = seen["bumps"]
    assert [b.content[0].text for b in seen["bumps"]] == ["1", "3"]
    assert [b.isError for b in seen["bumps"]] == [False, False]
    assert [b.meta[META]["step"] for b in seen["bumps"]] == [1, 2]
    assert second.meta[META] | {"duration_ms": 0} == {
        "env_id": env_id, "episode": 1, "step": 2, "status": "ok", "reward": 0.0, "terminated": False,
        "truncated": False, "duration_ms": 0, "recovered": second.meta[META]["recovered"], "error": None,
        "checks": None, "failure": "none", "mask": False, "episode_failure": "none", "episode_mask": False}
    state = json.loads(seen["state"].contents[0].text)
    assert state["state"]["count"] == 3 and state["step"] == 2
    assert seen["state"].contents[0].mimeType == "application/json"
    trajectory = json.loads(seen["trajectory"].contents[0].text)
    assert [s["action"] for s in trajectory["steps"]] == [{"name": "bump", "arguments": {"by": 1}},
                                                          {"name": "bump", "arguments": {"by": 2}}]
    assert {str(r.uri) for r in seen["resources"].resources} == {f"sandpit://envs/{env_id}/state",
                                                                  f"sandpit://envs/{env_id}/trajectory"}
    done = seen["done"].meta[META]
    assert (done["terminated"], done["reward"], done["step"]) == (True, 1.0, 3)
    assert [c["passed"] for c in done["checks"]] == [True]
    assert seen["ended"].data["status"] == 409 and seen["ended"].data["error"]["code"] == "episode_ended"
    with replicas[1].client() as client:  # the REST view of the same steps, from the other replica
        steps = client.get(f"/v1/envs/{env_id}/trajectory").json()
    assert [s["step"] for s in steps["steps"]] == [1, 2, 3] and steps["reward"] == 1.0


def test_failing_unknown_and_mistyped_calls_are_error_results(replicas: list[ApiServer], scenario_id: str) -> None:
    env_id = _new_env(replicas[0], scenario_id)

    async def body(session: ClientSession, _: RoundRobin) -> list[Any]:
        return [await session.call_tool("fail", {"message": "boom"}),
                await session.call_tool("no_such_tool", {}),
                await session.call_tool("_secret", {}),
                await session.call_tool("bump", {"by": "three"}),
                await session.call_tool("bump", {"by": 3})]

    # one replica: a rejected step on a replica whose live head is stale is another matter (below)
    failed, unknown, private, mistyped, bumped = _session(replicas[:1], f"/v1/envs/{env_id}/mcp", body)
    assert failed.isError and failed.meta[META]["status"] == "error" and "boom" in failed.content[0].text
    assert unknown.isError and unknown.meta[META]["status"] == "rejected"
    assert private.isError and private.meta[META]["status"] == "rejected"
    assert mistyped.isError and mistyped.meta[META]["status"] == "error"
    assert not bumped.isError and bumped.content[0].text == "3"  # nothing above changed the count
    assert [r.meta[META]["step"] for r in (failed, unknown, private, mistyped, bumped)] == [1, 2, 3, 4, 5]
    assert [(r.meta[META]["failure"], r.meta[META]["mask"]) for r in (failed, unknown, private, mistyped, bumped)] == [
        ("environment", False), ("agent", False), ("agent", False), ("environment", False), ("none", False)]
    assert {r.meta[META]["episode_failure"] for r in (failed, bumped)} == {"environment"}
    assert not bumped.meta[META]["episode_mask"]


def test_rejected_steps_alternating_between_replicas(replicas: list[ApiServer], scenario_id: str) -> None:
    env_id = _new_env(replicas[0], scenario_id)

    async def body(session: ClientSession, _: RoundRobin) -> list[Any]:
        return [await session.call_tool(name, {}) for name in ("bump", "no_such_tool", "no_such_tool", "bump")]

    results = _session(replicas, f"/v1/envs/{env_id}/mcp", body)
    assert [r.meta[META]["step"] for r in results] == [1, 2, 3, 4]


def test_direct_tools_calls_answer_as_the_sdk_does(replicas: list[ApiServer], scenario_id: str) -> None:
    """A plain ``tools/call`` is answered without the SDK's transport (api/http/mcp_calls.py);
    one with ``_meta`` in its params goes through the SDK. Two envs of the scenario get the
    same calls, one each way: the replies are equal (status, content type, body) but for
    the env's id and the durations, for results and for errors alike."""
    first, second = replicas
    direct_env, sdk_env = _new_env(first, scenario_id), _new_env(first, scenario_id)
    calls = [("bump", {"by": 1}, 7), ("no_such_tool", {}, "a-string-id"), ("bump", {"by": "x"}, 8),
             ("x" * 5000, {}, 9), ("chat_with_user", {"content": "done"}, 10), ("bump", {"by": 1}, 11)]

    def normal(response: httpx.Response, env_id: str) -> tuple[int, str, Any]:
        text = response.text.replace(env_id, "<env>")
        body = json.loads(text)
        meta = body.get("result", {}).get("_meta", {}).get(META)
        if meta is not None:
            meta["duration_ms"] = 0
            for check in meta["checks"] or []:
                check["duration_ms"] = 0
        return response.status_code, response.headers["content-type"], body

    for index, (name, arguments, ident) in enumerate(calls):
        server = replicas[index % 2]
        plain = _call(name, arguments, ident)
        with_meta = {**plain, "params": {**plain["params"], "_meta": {}}}
        direct = normal(_rpc(server, f"/v1/envs/{direct_env}/mcp", plain), direct_env)
        through_sdk = normal(_rpc(server, f"/v1/envs/{sdk_env}/mcp", with_meta), sdk_env)
        assert direct == through_sdk, (name, direct, through_sdk)
    assert "error" in direct[2] and direct[2]["error"]["data"]["error"]["code"] == "episode_ended"


def test_rest_steps_on_a_stale_replica_go_on_from_the_committed_head(replicas: list[ApiServer],
                                                                      scenario_id: str) -> None:
    """The plain step route between the same two replicas: a replica whose live view of
    the env is behind (the other one stepped, or reset the env) neither fails nor writes
    into the past: each step goes on from the committed head, with the committed state."""
    first, second = replicas
    env_id = _new_env(first, scenario_id)
    with first.client() as one, second.client() as two:
        def step(client: httpx.Client, name: str, by: int = 1) -> dict[str, Any]:
            response = client.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": {"by": by}})
            assert response.status_code == 200, response.text
            return dict(response.json())

        assert step(one, "bump")["observation"] == "1"
        assert step(two, "bump")["observation"] == "2"
        assert (step(one, "no_such_tool")["step"], step(two, "no_such_tool")["step"]) == (3, 4)
        assert step(one, "bump")["observation"] == "3"  # from the committed state, not its own sandbox's 1
        assert two.post(f"/v1/envs/{env_id}/reset").status_code == 200
        after_reset = step(one, "bump", 5)  # the stale replica's step lands in the new episode
        assert (after_reset["episode"], after_reset["step"], after_reset["observation"]) == (2, 1, "5")
        trajectory = two.get(f"/v1/envs/{env_id}/trajectory", params={"episode": 1}).json()
        assert [s["step"] for s in trajectory["steps"]] == [1, 2, 3, 4, 5]
        assert two.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 5


def test_hostile_requests(replicas: list[ApiServer], scenario_id: str) -> None:
    first, second = replicas
    env_id = _new_env(first, scenario_id)
    path = f"/v1/envs/{env_id}/mcp"
    malformed = _rpc(first, path, None, raw=b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == -32700
    unknown = _rpc(second, path, {"jsonrpc": "2.0", "id": 2, "method": "no/such_method"})
    assert unknown.json()["error"]["code"] == -32602  # the SDK validates it against every known method
    not_offered = _rpc(first, path, {"jsonrpc": "2.0", "id": 4, "method": "prompts/list"})
    assert not_offered.json()["error"]["code"] == -32601
    not_object = _rpc(first, path, _call("bump", [1, 2]))
    assert not_object.json()["error"]["code"] == -32602
    long_name = _rpc(second, path, _call("x" * 5000, {}))
    assert long_name.json()["error"]["code"] == -32602
    bad_uri = _rpc(first, path, {"jsonrpc": "2.0", "id": 3, "method": "resources/read",
                                 "params": {"uri": "sandpit://envs/other/state"}})
    assert bad_uri.json()["error"]["code"] == -32002
    assert _rpc(first, path, _call("bump", {}), api_key="not-a-key").status_code == 401
    with httpx.Client(base_url=first.url) as anonymous:
        assert anonymous.post(path, json=_call("bump", {}), headers=ACCEPT).status_code == 401
    assert _rpc(first, path, _call("bump", {}), api_key=first.operator_key).status_code == 403
    with first.client() as client:
        assert client.get(path, headers={"Accept": "text/event-stream"}).status_code == 405
    other_key = first.new_tenant("mcp-other")
    theirs = _rpc(second, path, _call("bump", {"by": 1}), api_key=other_key)
    nowhere = _rpc(second, "/v1/envs/env-does-not-exist/mcp", _call("bump", {"by": 1}), api_key=other_key)
    assert theirs.status_code == nowhere.status_code == 404
    assert theirs.json()["error"]["code"] == nowhere.json()["error"]["code"] == "not_found"
    with first.client() as client:  # none of the above ran or recorded anything
        assert client.get(f"/v1/envs/{env_id}").json()["step"] == 0


def test_scenario_sessions_are_fresh_envs_across_replicas(replicas: list[ApiServer], scenario_id: str) -> None:
    first, second = replicas
    path = f"/v1/scenarios/{scenario_id}/mcp"
    with first.client() as client:
        before = {e["id"] for e in client.get("/v1/envs", params={"limit": 1000}).json()["data"]}

    async def body(session: ClientSession, transport: RoundRobin) -> tuple[Any, ...]:
        tools = await session.list_tools()
        bumped = await session.call_tool("bump", {"by": 3})
        done = await session.call_tool("chat_with_user", {"content": "done"})
        return tools, bumped, done, set(transport.seen)

    sessions = [_session(replicas, path, body) for _ in range(2)]
    env_ids = [bumped.meta[META]["env_id"] for _, bumped, _, _ in sessions]
    assert len(set(env_ids)) == 2 and not set(env_ids) & before  # one fresh env per session
    for tools, bumped, done, ports in sessions:
        assert "bump" in {t.name for t in tools.tools}
        assert bumped.meta[META]["step"] == 1 and bumped.content[0].text == "3"
        assert done.meta[META]["reward"] == 1.0 and done.meta[META]["terminated"]
        assert ports == {first.port, second.port}
    with second.client() as client:  # the session's end (DELETE) deleted its env
        assert {client.get(f"/v1/envs/{e}").status_code for e in env_ids} == {404}


def test_scenario_session_hostile(replicas: list[ApiServer], scenario_id: str) -> None:
    first, second = replicas
    path = f"/v1/scenarios/{scenario_id}/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "0"}}}
    with first.client() as client:
        count = len(client.get("/v1/envs", params={"limit": 1000}).json()["data"])
    no_session = _rpc(first, path, _call("bump", {"by": 1}))
    assert no_session.status_code == 400 and no_session.json()["error"]["code"] == -32600
    assert _rpc(first, "/v1/scenarios/no-such-scenario/mcp", init).status_code == 404
    assert _rpc(first, path, init, api_key="wrong").status_code == 401
    bad_init = _rpc(second, path, {**init, "params": {"protocolVersion": 7}})  # the SDK refuses it: no env kept
    assert bad_init.status_code == 200 and "error" in bad_init.json()
    with first.client() as client:
        assert len(client.get("/v1/envs", params={"limit": 1000}).json()["data"]) == count
    opened = _rpc(first, path, init)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    assert _rpc(second, path, _call("bump", {"by": 1}), headers={"Mcp-Session-Id": session}).json()[
        "result"]["_meta"][META]["env_id"] == session
    other_key = first.new_tenant("mcp-other2")
    theirs = _rpc(second, path, _call("bump", {"by": 1}), api_key=other_key, headers={"Mcp-Session-Id": session})
    assert theirs.status_code == 404
    plain_env = _new_env(first, scenario_id)  # an env made outside MCP, of another scenario's path
    with first.client() as client:
        other_scenario = client.post("/v1/scenarios", json={
            "environment_id": client.get(f"/v1/envs/{plain_env}").json()["environment_id"], "task": "other",
            "checklist_with_func": CHECKS}).json()["id"]
    elsewhere = _rpc(second, f"/v1/scenarios/{other_scenario}/mcp", _call("bump", {"by": 1}),
                     headers={"Mcp-Session-Id": session})
    assert elsewhere.status_code == 404
    with first.client(other_key) as client:
        assert client.delete(path, headers={"Mcp-Session-Id": session}).status_code == 404
    with first.client() as client:
        assert client.delete(path, headers={"Mcp-Session-Id": session}).status_code == 204
        assert client.get(f"/v1/envs/{session}").status_code == 404
        client.delete(f"/v1/envs/{plain_env}")


def test_the_documented_client_runs(replicas: list[ApiServer], scenario_id: str, tmp_path: Path) -> None:
    """docs/mcp.md's client example, saved and run as written against a replica."""
    blocks = [b for b in section_blocks((ROOT / "docs" / "mcp.md").read_text(), "A client") if b.language == "python"]
    assert len(blocks) == 1
    script = tmp_path / "mcp_episode.py"
    script.write_text(blocks[0].code)
    env = {**os.environ, "SANDPIT_URL": replicas[1].url, "SANDPIT_API_KEY": replicas[1].api_key,
           "SANDPIT_SCENARIO": scenario_id}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[2:] == ["observation 3 error False", "count 3", "terminated True reward 1.0"], run.stdout
    assert lines[0].startswith("env env_") and "'bump'" in lines[1]


def test_a_servers_first_mcp_requests_at_once_all_get_their_answers(tmp_path: Path, leak_check,
                                                                     sandbox_image) -> None:
    """The MCP server is built on a server's first MCP request (``McpDoor``): eight first
    requests arriving together (tools/list, malformed JSON, a wrong key, an unknown env)
    each get the answer they get on a server that built it long before."""
    fresh = ApiServer(tmp_path / "fresh").start()
    try:
        with fresh.client() as client:
            environment = client.post("/v1/environments", json={"name": "counter", "source_code": COUNTER_SOURCE,
                                                                 "class_name": "Counter"})
            assert environment.status_code == 201, environment.text
            env_id = create_envs(client, environment.json()["id"], 1)[0]
            shown = [s["function"]["name"] for s in client.get(f"/v1/envs/{env_id}").json()["tools"]]
        path = f"/v1/envs/{env_id}/mcp"
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        requests: list[Callable[[], httpx.Response]] = [
            lambda: _rpc(fresh, path, listing), lambda: _rpc(fresh, path, listing), lambda: _rpc(fresh, path, listing),
            lambda: _rpc(fresh, path, None, raw=b'{"jsonrpc": "2.0", "id": 1, "method": '),
            lambda: _rpc(fresh, path, None, raw=b"\xff\x00" * 64),
            lambda: _rpc(fresh, path, listing, api_key="not-a-key"),
            lambda: _rpc(fresh, "/v1/envs/env-does-not-exist/mcp", listing),
            lambda: _rpc(fresh, path, listing)]
        with ThreadPoolExecutor(len(requests)) as threads:
            answers = list(threads.map(lambda send: send(), requests))
        for answer in (*answers[:3], answers[7]):
            assert answer.status_code == 200, answer.text
            assert [tool["name"] for tool in answer.json()["result"]["tools"]] == shown
        for answer in answers[3:5]:
            assert answer.status_code == 400 and answer.json()["error"]["code"] == -32700, answer.text
        assert answers[5].status_code == 401, answers[5].text
        assert answers[6].status_code == 404 and answers[6].json()["error"]["code"] == "not_found"
        assert "Traceback" not in fresh.log_tail()
    finally:
        fresh.stop()
