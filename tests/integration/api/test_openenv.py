"""Scenarios as OpenEnv environment servers (``/v1/scenarios/{id}/openenv``), driven by
``openenv-core``'s own ``GenericEnvClient`` (sync and async) against a real ``sandpit serve``
with real sandboxes: the reward and observations equal the same episode's through the plain
API. Hostile input goes in over a raw ``websockets`` connection and raw HTTP: garbage and
binary frames, malformed actions, unknown message types, missing and wrong keys, an unknown
scenario, another tenant's scenario and env, a connection dropped in the middle of a step;
after each session its env is gone."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from api_server import COUNTER_SOURCE, ApiServer
from markdown_docs import section_blocks
from waiting import wait_until
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

pytestmark = [pytest.mark.docker, pytest.mark.slow]

if TYPE_CHECKING:
    from openenv.core import GenericEnvClient

ROOT = Path(__file__).resolve().parents[3]
CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n"
                                                     "    return final_state['count'] == 3\n"}]
ACTIONS: list[dict[str, Any]] = [
    {"name": "bump", "arguments": {"by": 1}},
    {"type": "function", "function": {"name": "bump", "arguments": "{\"by\": 2}"}},
    {"name": "no_such_tool", "arguments": {}},  # a recorded rejected step
    {"name": "chat_with_user", "arguments": {"content": "done"}},
]


@pytest.fixture(scope="module", autouse=True)
def _openenv() -> None:
    """`openenv-core`'s client, imported when this module's first test runs rather than when
    it is collected: `openenv.core` imports its web interface and Gradio, about 5 s of CPU
    that every pytest process collecting the suite would pay (each xdist worker of
    scripts/test, every local run)."""
    global GenericEnvClient
    from openenv.core import GenericEnvClient


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, leak_check, sandbox_image) -> Iterator[ApiServer]:
    api = ApiServer(tmp_path_factory.mktemp("openenv")).start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="module")
def scenario_id(server: ApiServer) -> str:
    with server.client() as client:
        environment = client.post("/v1/environments", json={"name": "counter", "source_code": COUNTER_SOURCE,
                                                             "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        scenario = client.post("/v1/scenarios", json={"environment_id": environment.json()["id"],
                                                      "task": "Bring the counter to 3.", "init_config": {"count": 0},
                                                      "checklist_with_func": CHECKS})
        assert scenario.status_code == 201, scenario.text
        return str(scenario.json()["id"])


def _base(server: ApiServer, scenario_id: str, key: str | None = None) -> str:
    return f"http://sandpit:{key or server.api_key}@127.0.0.1:{server.port}/v1/scenarios/{scenario_id}/openenv"


def _ws(server: ApiServer, scenario_id: str, key: str | None = None) -> str:
    return _base(server, scenario_id, key).replace("http://", "ws://") + "/ws"


def _env_count(server: ApiServer) -> int:
    with server.client() as client:
        return int(client.get("/v1/envs", params={"limit": 1}).json()["count"])


def _plain_episode(server: ApiServer, scenario_id: str) -> list[dict[str, Any]]:
    with server.client() as client:
        created = client.post("/v1/envs", json={"scenario_id": scenario_id})
        assert created.status_code == 201, created.text
        env_id = created.json()["id"]
        steps = [client.post(f"/v1/envs/{env_id}/step", json=action).json() for action in ACTIONS]
        client.delete(f"/v1/envs/{env_id}")
    return steps


def _comparable(step: dict[str, Any]) -> tuple[Any, ...]:
    return (step["step"], step["status"], step["observation"], step["reward"], step["terminated"],
            step["truncated"], [c["passed"] for c in step["checks"] or []])


def test_openenv_client_episode_equals_the_plain_api(server: ApiServer, scenario_id: str) -> None:
    before = _env_count(server)
    with GenericEnvClient(base_url=_base(server, scenario_id)).sync() as env:
        reset = env.reset()
        assert (reset.reward, reset.done) == (None, False)
        assert reset.observation["observation"] == "Bring the counter to 3."
        assert {"bump", "chat_with_user"} <= {t["function"]["name"] for t in reset.observation["tools"]}
        env_id = reset.observation["id"]
        results = [env.step(action) for action in ACTIONS[:3]]
        state = env.state()
        assert (state["env_id"], state["step_count"], state["state"]["count"]) == (env_id, 3, 3)
        assert state["episode_id"] == f"{env_id}:1"
        results.append(env.step(ACTIONS[3]))
        assert _env_count(server) == before + 1
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].reward == 1.0
    assert results[2].observation["status"] == "rejected"
    plain = _plain_episode(server, scenario_id)
    assert [_comparable(r.observation) for r in results] == [_comparable(p) for p in plain]
    assert [r.reward for r in results] == [p["reward"] for p in plain]
    wait_until(lambda: _env_count(server) == before, "the session's env deleted", timeout_s=30)
    with server.client() as client:
        assert client.get(f"/v1/envs/{env_id}").status_code == 404


def test_async_client_resets_seeded_and_after_the_end(server: ApiServer, scenario_id: str) -> None:
    before = _env_count(server)

    async def run() -> None:
        async with GenericEnvClient(base_url=_base(server, scenario_id)) as env:
            first = await env.reset(seed=7)
            assert first.observation["episode"] == 1
            ended = await env.step({"text": "done", "metadata": {}})  # plain text: chat_with_user
            assert ended.done and ended.reward == 0.0
            with pytest.raises(RuntimeError, match="episode_ended"):
                await env.step({"name": "bump", "arguments": {}})
            second = await env.reset()
            assert (second.observation["id"], second.observation["episode"]) == (first.observation["id"], 2)
            assert (await env.step({"name": "bump", "arguments": {"by": 3}})).observation["observation"] == "3"

    asyncio.run(run())
    wait_until(lambda: _env_count(server) == before, "the session's env deleted", timeout_s=30)


async def _exchange(url: str, frames: list[str | bytes]) -> list[dict[str, Any]]:
    async with connect(url, open_timeout=30) as socket:
        replies = []
        for frame in frames:
            await socket.send(frame)
            replies.append(json.loads(await asyncio.wait_for(socket.recv(), 120)))
        return replies


def test_garbage_frames_get_errors_and_the_session_survives(server: ApiServer, scenario_id: str) -> None:
    before = _env_count(server)
    frames: list[str | bytes] = [
        "not json", "[]", json.dumps({"type": "step"}), json.dumps({"type": "step", "data": {"name": "bump", "x": 1}}),
        json.dumps({"type": "step", "data": {"arguments": {}}}), json.dumps({"type": "nope"}),
        json.dumps({"type": "mcp", "data": {}}), json.dumps({"type": "reset", "data": {"seed": -1}}),
        json.dumps({"type": "reset", "extra": 1}), b"\x00binary", json.dumps({"type": "state", "data": []}),
        json.dumps({"type": "step", "data": {"name": "bump", "arguments": {"by": 3}}}),
    ]
    replies = asyncio.run(_exchange(_ws(server, scenario_id), frames))
    codes = [r["data"].get("code") if r["type"] == "error" else r["type"] for r in replies]
    assert codes == ["INVALID_JSON", "VALIDATION_ERROR", "invalid_request", "VALIDATION_ERROR", "VALIDATION_ERROR",
                     "UNKNOWN_TYPE", "UNKNOWN_TYPE", "VALIDATION_ERROR", "VALIDATION_ERROR", "VALIDATION_ERROR",
                     "VALIDATION_ERROR", "observation"]
    assert replies[2]["data"]["status"] == 422
    assert "/mcp" in replies[6]["data"]["message"]
    assert replies[-1]["data"]["observation"]["observation"] == "3"  # the first env-making message made it
    wait_until(lambda: _env_count(server) == before, "the session's env deleted", timeout_s=30)


@pytest.mark.parametrize("case", ["wrong key", "no key", "operator key", "unknown scenario", "other tenant"])
def test_refused_handshakes(server: ApiServer, scenario_id: str, case: str) -> None:
    before = _env_count(server)
    url = {"wrong key": _ws(server, scenario_id, "wrong"),
           "no key": f"ws://127.0.0.1:{server.port}/v1/scenarios/{scenario_id}/openenv/ws",
           "operator key": _ws(server, scenario_id, server.operator_key),
           "unknown scenario": _ws(server, "scn_nope"),
           "other tenant": _ws(server, scenario_id, server.new_tenant(f"openenv-{case.replace(' ', '-')}"))}[case]
    expected = {"wrong key": 401, "no key": 401, "operator key": 403, "unknown scenario": 404, "other tenant": 404}

    async def attempt() -> None:
        async with connect(url, open_timeout=30):
            raise AssertionError("the handshake was accepted")

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(attempt())
    assert refused.value.response.status_code == expected[case]
    assert json.loads(refused.value.response.body or b"{}")["error"]["code"] in {"unauthorized", "forbidden",
                                                                                 "not_found"}
    with pytest.raises(ConnectionError):
        GenericEnvClient(base_url=url.removesuffix("/ws")).sync().connect()
    assert _env_count(server) == before


def test_disconnect_mid_step_leaves_nothing(server: ApiServer, scenario_id: str) -> None:
    """A client that goes away while its step runs (``spin`` runs until the call's
    timeout): the step finishes, and the session's env is deleted."""
    before = _env_count(server)

    async def run() -> None:
        socket = await connect(_ws(server, scenario_id), open_timeout=30)
        await socket.send(json.dumps({"type": "reset"}))
        await asyncio.wait_for(socket.recv(), 120)
        assert _env_count(server) == before + 1
        await socket.send(json.dumps({"type": "step", "data": {"name": "spin"}}))
        await asyncio.sleep(0.3)
        socket.transport.abort()  # no close frame: the connection just drops

    asyncio.run(run())
    wait_until(lambda: _env_count(server) == before, "the dropped session's env deleted", timeout_s=120)


def test_http_routes(server: ApiServer, scenario_id: str) -> None:
    base = f"/v1/scenarios/{scenario_id}/openenv"
    basic = {"Authorization": "Basic " + base64.b64encode(f"sandpit:{server.api_key}".encode()).decode()}
    other_key = server.new_tenant("openenv-http-other")
    with server.client() as client:
        assert client.get(f"{base}/health", headers=basic).json() == {"status": "healthy"}
        assert set(client.get(f"{base}/schema").json()) == {"action", "observation", "state"}
        assert client.get(f"{base}/metadata").json()["description"] == "Bring the counter to 3."
        reset = client.post(f"{base}/reset", json={"seed": 1})
        assert reset.status_code == 200, reset.text
        env_id = reset.json()["observation"]["id"]
        step = client.post(f"{base}/step", json={"action": {"name": "bump", "arguments": {"by": 3}},
                                                 "episode_id": env_id})
        assert step.status_code == 200, step.text
        assert (step.json()["observation"]["observation"], step.json()["done"]) == ("3", False)
        assert (step.json()["observation"]["failure"], step.json()["observation"]["mask"]) == ("none", False)
        assert client.get(f"{base}/state", params={"episode_id": env_id}).json()["state"]["count"] == 3
        again = client.post(f"{base}/reset", json={"episode_id": env_id})
        assert again.json()["observation"]["episode"] == 2
        hostile = [
            client.post(f"{base}/step", content=b"{not json"),
            client.post(f"{base}/step", json={"action": {"name": "bump"}}),  # no episode_id
            client.post(f"{base}/step", json={"action": {"name": "bump", "text": "x"}, "episode_id": env_id}),
            client.post(f"{base}/reset", json={"seed": "x"}),
            client.post(f"{base}/reset", json=[1]),
            client.get(f"{base}/state"),
        ]
        assert [r.status_code for r in hostile] == [422] * 6, [r.text for r in hostile]
        assert client.post(f"{base}/step", json={"action": {"name": "bump"}, "episode_id": "env_nope"}
                           ).status_code == 404
        assert client.get("/v1/scenarios/scn_nope/openenv/health").status_code == 404
        assert client.get(f"{base}/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(f"{base}/health", headers={"Authorization": "Basic !!"}).status_code == 401
        unauthenticated = client.post(f"{base}/step", content=b"{not json", headers={"Authorization": "Bearer no"})
        assert unauthenticated.status_code == 401  # the key before the body
        assert client.post(f"{base}/reset", content=b" " * (8 * 1024 * 1024 + 1)).status_code == 413
        assert client.put(f"{base}/step").status_code == 405
    with server.client(other_key) as theirs:
        assert theirs.get(f"{base}/health").status_code == 404  # another tenant's scenario
        assert theirs.get(f"{base}/state", params={"episode_id": env_id}).status_code == 404
    with server.client() as client:
        client.delete(f"/v1/envs/{env_id}")


def test_the_documented_client_runs(server: ApiServer, scenario_id: str, tmp_path: Path) -> None:
    """docs/openenv.md's client example, saved and run as written."""
    blocks = [b for b in section_blocks((ROOT / "docs" / "openenv.md").read_text(), "A client")
              if b.language == "python"]
    assert len(blocks) == 1
    script = tmp_path / "openenv_episode.py"
    script.write_text(blocks[0].code)
    before = _env_count(server)
    env = {**os.environ, "SANDPIT_URL": server.url, "SANDPIT_API_KEY": server.api_key,
           "SANDPIT_SCENARIO": scenario_id}
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[2:] == ["observation 3 reward 0.0 done False", "count 3", "done True reward 1.0"], run.stdout
    assert lines[0].startswith("env env_") and "'bump'" in lines[1]
    wait_until(lambda: _env_count(server) == before, "the session's env deleted", timeout_s=30)

