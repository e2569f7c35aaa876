"""The whole env lifecycle through the real app over HTTP: register, create, step (both
call forms), state, trajectory, restore, fork, reset, delete."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


def _step(api: httpx.Client, env_id: str, name: str, include: str | None = None, **arguments) -> dict:
    params = {"include": include} if include else None
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments}, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_registering_derives_tools_in_a_sandbox(api: httpx.Client, counter_env_id: str) -> None:
    environment = api.get(f"/v1/environments/{counter_env_id}").json()
    tools = {t["function"]["name"]: t["function"] for t in environment["tools"]}
    assert {"bump", "set_record", "get_record", "fail", "spin", "weird"} <= set(tools)
    assert "_secret" not in tools and "total" not in tools
    bump = tools["bump"]["parameters"]
    assert bump["properties"]["by"]["type"] == "integer" and bump.get("required", []) == []
    assert tools["set_record"]["parameters"]["required"] == ["key", "value"]
    listed = api.get("/v1/environments").json()
    assert counter_env_id in [e["id"] for e in listed["data"]] and listed["count"] >= 1


def test_episode_state_trajectory_restore_fork_reset(api: httpx.Client, counter_env_id: str) -> None:
    created = api.post("/v1/envs", json={"environment_id": counter_env_id, "init_config": {"count": 5}})
    assert created.status_code == 201, created.text
    env = created.json()
    env_id = env["id"]
    assert (env["episode"], env["step"], env["status"]) == (1, 0, "live")
    assert {t["function"]["name"] for t in env["tools"]} >= {"bump"}

    first = _step(api, env_id, "bump", include="state_diff,state", by=2)
    assert (first["step"], first["observation"], first["status"]) == (1, "7", "ok")
    assert first["state"]["count"] == 7
    assert first["state_diff"]["count"] == {"changed": {"old": 5, "new": 7}}  # EnvScaler get_state_diff shape
    assert first["state_diff"]["log"] == {"changed": {"old": [], "new": ["bump 2"]}}

    tool_call = {"type": "function", "id": "call_1",
                 "function": {"name": "set_record", "arguments": json.dumps({"key": "a", "value": "v1"})}}
    second = api.post(f"/v1/envs/{env_id}/step", json=tool_call, params={"include": "state_diff"}).json()
    assert (second["step"], second["observation"], second["status"]) == (2, "stored a", "ok")
    assert second["state_diff"]["records"] == {"a": {"added": {"value": "v1", "pad": ""}}}

    error = _step(api, env_id, "fail", message="boom")
    assert (error["status"], error["observation"]) == ("error", "Error: ValueError: boom")
    assert _step(api, env_id, "bump", by=1)["observation"] == "8"

    states = {k: api.get(f"/v1/envs/{env_id}/state", params={"step": k}).json()["state"] for k in range(5)}
    assert [states[k]["count"] for k in range(5)] == [5, 7, 7, 7, 8]
    assert api.get(f"/v1/envs/{env_id}/state").json()["state"] == states[4]

    trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    assert [s["step"] for s in trajectory["steps"]] == [1, 2, 3, 4]
    assert trajectory["steps"][1]["action"] == {"name": "set_record", "arguments": {"key": "a", "value": "v1"}}
    assert [s["status"] for s in trajectory["steps"]] == ["ok", "ok", "error", "ok"]

    forks = api.post(f"/v1/envs/{env_id}/fork", json={"step": 2, "count": 3})
    assert forks.status_code == 201, forks.text
    fork_ids = [f["id"] for f in forks.json()["data"]]
    assert len(fork_ids) == 3
    for number, fork_id in enumerate(fork_ids):
        assert api.get(f"/v1/envs/{fork_id}/state").json()["state"] == states[2]
        assert [s["step"] for s in api.get(f"/v1/envs/{fork_id}/trajectory").json()["steps"]] == [1, 2]
        assert _step(api, fork_id, "bump", by=100 + number)["observation"] == str(107 + number)
    assert api.get(f"/v1/envs/{env_id}/state").json()["state"] == states[4]  # the parent is untouched

    restored = api.post(f"/v1/envs/{env_id}/restore", json={"step": 1})
    assert restored.status_code == 200 and restored.json()["step"] == 1
    assert api.get(f"/v1/envs/{env_id}/state").json()["state"] == states[1]
    assert _step(api, env_id, "bump", by=10)["step"] == 2
    assert api.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 17
    assert api.post(f"/v1/envs/{env_id}/restore", json={"step": 3}).status_code == 409

    reset = api.post(f"/v1/envs/{env_id}/reset", json={"init_config": {"count": 100}})
    assert reset.status_code == 200, reset.text
    reset = reset.json()
    assert (reset["episode"], reset["step"]) == (2, 0)
    assert _step(api, env_id, "bump")["observation"] == "101"
    assert api.get(f"/v1/envs/{env_id}/trajectory").json()["episode"] == 2

    for doomed in [env_id, *fork_ids]:
        assert api.delete(f"/v1/envs/{doomed}").status_code == 204
        assert api.get(f"/v1/envs/{doomed}").status_code == 404
        assert api.post(f"/v1/envs/{doomed}/step", json={"name": "bump"}).status_code == 404


def test_a_reset_answers_the_env_as_a_read_shows_it_right_after(api: httpx.Client, counter_env_id: str) -> None:
    """A reset's reply is made from the rows it wrote (no read back): it must equal the env
    as ``GET`` shows it right after, field for field, whether the reset keeps the config,
    changes it or changes the episode's options. Unknown and malformed ids are 404 and
    change nothing."""
    created = api.post("/v1/envs", json={"environment_id": counter_env_id, "init_config": {"count": 2}})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    _step(api, env_id, "bump", by=3)
    bodies: list[dict] = [{}, {"init_config": {"count": 40}}, {"episode": {"max_steps": 2}}, {}]
    for number, body in enumerate(bodies, start=2):
        reset = api.post(f"/v1/envs/{env_id}/reset", json=body)
        assert reset.status_code == 200, reset.text
        answered = reset.json()
        assert answered.pop("construction")["path"] in ("template", "constructed")
        read = api.get(f"/v1/envs/{env_id}").json()
        assert read.pop("construction") is None  # said only by the request that made the instance
        assert answered == read
        assert (answered["episode"], answered["step"], answered["status"]) == (number, 0, "live")
    assert answered["init_config"] == {"count": 40}  # the last reset kept the config before it
    assert answered["episode_config"]["max_steps"] == 2  # and the options
    assert _step(api, env_id, "bump")["observation"] == "41"
    for unknown in ("env_00000000000000000000000", "x" * 300, "%00"):
        missing = api.post(f"/v1/envs/{unknown}/reset", json={})
        assert missing.status_code == 404, missing.text
    assert api.get(f"/v1/envs/{env_id}").json()["episode"] == 5
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_inline_source_and_environment_deletion(api: httpx.Client, counter_source: str) -> None:
    created = api.post("/v1/envs", json={"source_code": counter_source, "class_name": "Counter"})
    assert created.status_code == 201, created.text
    env = created.json()
    assert _step(api, env["id"], "bump", by=3)["observation"] == "3"
    assert api.delete(f"/v1/environments/{env['environment_id']}").status_code == 409
    assert api.delete(f"/v1/envs/{env['id']}").status_code == 204
    assert api.delete(f"/v1/environments/{env['environment_id']}").status_code == 204


def test_tool_errors_timeouts_and_odd_text_are_results(api: httpx.Client, counter_env_id: str) -> None:
    created = api.post("/v1/envs", json={"environment_id": counter_env_id, "profile": {"call_timeout_s": 1.0}})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    _step(api, env_id, "bump", by=4)
    timed_out = _step(api, env_id, "spin")
    assert timed_out["status"] == "timeout" and timed_out["step"] == 2
    assert _step(api, env_id, "bump")["observation"] == "5"  # state from before the timeout
    weird = _step(api, env_id, "weird")
    assert weird["status"] == "ok" and weird["observation"].startswith("bad ")
    metrics = api.get("/metrics").text
    assert 'sandpit_sandbox_failures_total{status="timeout"}' in metrics
    assert "sandpit_step_seconds_bucket" in metrics
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_health_and_readiness(api: httpx.Client) -> None:
    assert api.get("/healthz").json()["status"] == "ok"
    ready = api.get("/readyz")
    assert ready.status_code in (200, 503)
    assert ready.json()["checks"]["database"] == "ok" and ready.json()["checks"]["docker"] == "ok"
