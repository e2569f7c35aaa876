"""Batch evaluations (``/v1/evaluations``) on a real server, real sandboxes and the real
``openai`` client against a scripted OpenAI-compatible server on 127.0.0.1.

Scenarios run on the ``Counter`` environment with two checks (``count == 5``, record
``a`` stored), so a trajectory's reward is known in advance: both -> 1.0, one -> 0.5,
none -> 0.0.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import httpx
import pytest
from fake_openai import Rule, ScriptedLLM, ToolCallScript

pytestmark = pytest.mark.docker

CHECKS = [
    {"check_item": "count is 5", "check_func": "def check_func(final_state):\n    return final_state['count'] == 5\n"},
    {"check_item": "record a stored",
     "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"},
]
BUMP5 = {"name": "bump", "arguments": {"by": 5}}
STORE_A = {"name": "set_record", "arguments": {"key": "a", "value": "x"}}


@pytest.fixture(scope="module")
def llm() -> Any:
    """One scripted model endpoint for the module; tests add rules keyed by their own task
    markers. ``llm.seen`` records ``(model, Authorization header)`` of every chat request."""
    server = ScriptedLLM()
    server.seen = []

    @server.app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        body = json.loads(await request.body() or b"{}")
        server.seen.append((body.get("model"), request.headers.get("authorization")))
        return await call_next(request)

    with server:
        yield server


def scenario(api: httpx.Client, environment_id: str, task: str) -> str:
    response = api.post("/v1/scenarios", json={"environment_id": environment_id, "task": task,
                                                "init_config": {"count": 0}, "checklist_with_func": CHECKS})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def wait(api: httpx.Client, evaluation_id: str, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = api.get(f"/v1/evaluations/{evaluation_id}").json()
        if job["status"] not in ("queued", "running") and job["progress"]["running"] == 0:
            return job
        time.sleep(0.2)
    raise AssertionError(f"evaluation not finished: {job}")


def results(api: httpx.Client, evaluation_id: str, include: str | None = None) -> list[dict[str, Any]]:
    response = api.get(f"/v1/evaluations/{evaluation_id}/results", params={"include": include} if include else None)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_replay_gives_the_known_rewards(api: httpx.Client, counter_env_id: str) -> None:
    sid = scenario(api, counter_env_id, "replay task")
    episodes = [
        {"scenario_id": sid, "tool_calls": [BUMP5, STORE_A]},
        {"scenario_id": sid, "tool_calls": [
            BUMP5, {"name": "nope", "arguments": {}},
            {"type": "function", "function": {"name": "bump", "arguments": "{oops"}},
            {"name": "fail", "arguments": {"message": "boom"}}]},
        {"scenario_id": sid, "tool_calls": []},
    ]
    created = api.post("/v1/evaluations", json={"mode": "replay", "episodes": episodes, "concurrency": 2})
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["total"] == 3 and job["mode"] == "replay" and job["concurrency"] == 2
    job = wait(api, job["id"])
    assert job["status"] == "completed"
    assert job["progress"] | {"mean_reward": None} == {"total": 3, "done": 3, "errors": 0, "running": 0, "pending": 0,
                                                       "cancelled": 0, "mean_reward": None, "success": 1}
    summary = job["summary"]
    assert summary["mean_reward"] == pytest.approx(0.5) and summary["success_rate"] == pytest.approx(1 / 3)
    assert summary["by_environment"] == {counter_env_id: {"name": "counter", "episodes": 3, "mean_reward": pytest.approx(0.5),
                                                          "success_rate": pytest.approx(1 / 3)}}
    assert summary["errors_by_status"] == {}
    # a rejected step is the agent's, a raising tool the environment's: the worse one counts
    assert summary["by_failure"] == {"none": 2, "agent": 0, "environment": 1, "infrastructure": 0, "verifier": 0}

    lines = results(api, job["id"])
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert [line["reward"] for line in lines] == [1.0, 0.5, 0.0]
    assert [(line["failure"], line["mask"]) for line in lines] == [("none", False), ("environment", False),
                                                                    ("none", False)]
    assert [s["failure"] for s in lines[1]["trajectory"]] == ["none", "agent", "agent", "environment"]
    assert [line["status"] for line in lines] == ["done"] * 3
    assert "transcript" not in lines[0]
    steps = lines[1]["trajectory"]
    assert [s["status"] for s in steps] == ["ok", "rejected", "rejected", "error"]
    assert "unknown tool 'nope'" in steps[1]["observation"]
    assert steps[2]["action"] == {"name": "bump", "arguments": "{oops"}
    assert "ValueError: boom" in steps[3]["observation"]
    assert lines[1]["steps"] == 4 and lines[2]["steps"] == 0
    assert lines[0]["checks"][0]["passed"] is True and lines[1]["checks_total"] == 2
    for line in lines:  # episodes delete their env
        assert api.get(f"/v1/envs/{line['env_id']}").status_code == 404

    listed = api.get("/v1/evaluations").json()
    assert job["id"] in [j["id"] for j in listed["data"]] and listed["count"] >= 1


def test_rollout_reaches_expected_rewards(server: Any, api: httpx.Client, counter_env_id: str,
                                          llm: ScriptedLLM) -> None:
    model = "scripted-rollout"
    key = "sk-test-" + secrets.token_hex(16)
    llm.rules += [
        Rule(model=model, contains=["TASK-R1"], turn=0, errors=[500], tool_calls=[ToolCallScript(**BUMP5)]),
        Rule(model=model, contains=["TASK-R1"], turn=1, tool_calls=[ToolCallScript(**STORE_A)]),
        Rule(model=model, contains=["TASK-R1"], turn=2, content="done"),
        Rule(model=model, contains=["TASK-R2"], turn=0, errors=[429], tool_calls=[
            ToolCallScript(name="nope"), ToolCallScript(name="bump", arguments="{by: 5")]),
        Rule(model=model, contains=["TASK-R2"], turn=1, tool_calls=[ToolCallScript(**BUMP5)]),
        Rule(model=model, contains=["TASK-R2"], turn=2, content="done"),
        Rule(model=model, contains=["TASK-R3"], content="I cannot do that."),
        Rule(model=model, contains=["TASK-R5"], errors=[500] * 20, content="never"),
        Rule(model=model, contains=["TASK-R6"], tool_calls=[ToolCallScript(name="bump", arguments={"by": 1})]),
    ]  # TASK-R4 has no rule: the scripted server answers 400
    ids = [scenario(api, counter_env_id, f"TASK-R{n}: make the counter 5 and store record a") for n in range(1, 7)]
    body = {"mode": "rollout", "scenario_ids": ids, "model": model, "base_url": llm.base_url, "api_key": key,
            "max_steps": 3, "retries": 2, "retry_initial_s": 0.01, "temperature": 0.0}
    created = api.post("/v1/evaluations", json=body)
    assert created.status_code == 201, created.text
    assert key not in created.text and "api_key" not in created.json()["config"]
    job = wait(api, created.json()["id"])
    assert job["status"] == "completed", job

    lines = results(api, job["id"], include="transcript")
    by_index = {line["index"]: line for line in lines}
    assert sorted(by_index) == list(range(6))
    assert [by_index[i]["status"] for i in range(6)] == ["done", "done", "done", "error", "error", "done"]
    assert [by_index[i]["reward"] for i in range(6)] == [1.0, 0.5, 0.0, None, None, 0.0]
    assert by_index[3]["error_status"] == "model_error" and "400" in by_index[3]["error"]
    assert by_index[4]["error_status"] == "model_unavailable"
    assert by_index[4]["usage"]["retries"] == 2

    first = by_index[0]  # a 500, retried, then two tool calls and a final answer
    assert first["usage"]["requests"] == 3 and first["usage"]["retries"] == 1
    assert first["usage"]["prompt_tokens"] > 0 and first["usage"]["completion_tokens"] > 0
    roles = [m["role"] for m in first["transcript"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert '"counter"' in first["transcript"][0]["content"] and "TASK-R1" in first["transcript"][1]["content"]
    assert first["transcript"][3]["content"] == "5"

    second = by_index[1]  # a 429, retried; an unknown tool and malformed arguments are rejected steps
    assert [s["status"] for s in second["trajectory"]] == ["rejected", "rejected", "ok"]
    assert "unknown tool 'nope'" in second["trajectory"][0]["observation"]
    assert "not valid JSON" in second["trajectory"][1]["observation"]
    assert second["usage"]["retries"] == 1
    told = [m["content"] for m in second["transcript"] if m["role"] == "tool"]
    assert "unknown tool" in told[0] and "not valid JSON" in told[1]

    assert by_index[5]["steps"] == 3  # max_steps
    assert [s["action"] for s in by_index[5]["trajectory"]] == [{"name": "bump", "arguments": {"by": 1}}] * 3

    request = next(r for r in llm.chat_requests() if "TASK-R1" in json.dumps(r["messages"]))
    assert {t["function"]["name"] for t in request["tools"]} >= {"bump", "set_record", "get_record"}
    assert request["temperature"] == 0.0

    # a refused model request is the agent's; a model endpoint still failing after the retries is not
    assert [(by_index[i]["failure"], by_index[i]["mask"]) for i in (1, 3, 4)] == [
        ("agent", False), ("agent", False), ("infrastructure", True)]
    summary = job["summary"]
    assert summary["errors_by_status"] == {"model_error": 1, "model_unavailable": 1}
    assert sum(summary["by_failure"].values()) == 6 and summary["by_failure"]["infrastructure"] == 1
    assert summary["mean_reward"] == pytest.approx(1.5 / 6) and summary["success_rate"] == pytest.approx(1 / 6)
    assert summary["usage"]["requests"] == sum(line["usage"]["requests"] for line in lines)

    assert {auth for name, auth in llm.seen if name == model} == {f"Bearer {key}"}
    # the model API key appears nowhere: responses, audit log, server log
    for path in (f"/v1/evaluations/{job['id']}", "/v1/evaluations", f"/v1/evaluations/{job['id']}/results?include=transcript",
                 "/v1/audit"):
        assert key not in api.get(path).text
    audit = api.get("/v1/audit", params={"action": "evaluation.create"}).json()["data"]
    assert any(e["resource_id"] == job["id"] and e["detail"]["api_key_source"] == "request" for e in audit)
    assert key not in server.log_path.read_text(errors="replace")


def test_tenant_default_endpoint_and_key(server: Any, counter_source: str, llm: ScriptedLLM) -> None:
    stored = "sk-tenant-" + secrets.token_hex(16)
    api_key = server.new_tenant("evals-d")
    patched = httpx.patch(f"{server.url}/v1/admin/tenants/evals-d", headers=server.operator_headers, timeout=30,
                          json={"model_base_url": llm.base_url, "model_api_key": stored})
    assert patched.status_code == 200, patched.text
    model = "scripted-default"
    llm.rules.append(Rule(model=model, contains=["TASK-DEFAULT"], content="nothing to do"))
    with server.client(api_key=api_key) as api:
        environment = api.post("/v1/environments", json={"name": "counter", "source_code": counter_source,
                                                         "class_name": "Counter"}).json()["id"]
        sid = scenario(api, environment, "TASK-DEFAULT")
        job = api.post("/v1/evaluations", json={"mode": "rollout", "model": model, "scenario_ids": [sid]}).json()
        assert job["config"]["base_url"] == llm.base_url and job["config"]["api_key_source"] == "tenant"
        assert wait(api, job["id"])["progress"]["done"] == 1
        assert llm.seen[-1] == (model, f"Bearer {stored}")
        # another endpoint named by the caller never receives the tenant's stored key
        other = llm.base_url.replace("127.0.0.1", "localhost")
        job = api.post("/v1/evaluations", json={"mode": "rollout", "model": model, "scenario_ids": [sid],
                                                "base_url": other}).json()
        assert job["config"]["api_key_source"] == "none"
        assert wait(api, job["id"])["progress"]["done"] == 1
        assert llm.seen[-1] == (model, "Bearer EMPTY")
        for path in ("/v1/evaluations", "/v1/audit"):
            assert stored not in api.get(path).text
    assert stored not in server.log_path.read_text(errors="replace")


def test_hostile_input_is_refused_without_creating_anything(server: Any, api: httpx.Client, counter_env_id: str,
                                                            llm: ScriptedLLM) -> None:
    sid = scenario(api, counter_env_id, "hostile task")
    other_key = server.new_tenant("evil-evals")
    with server.client(api_key=other_key) as other:
        environment = other.post("/v1/environments", json={"name": "c", "source_code": COUNTER,
                                                           "class_name": "Counter"}).json()["id"]
        foreign = scenario(other, environment, "theirs")
    before = api.get("/v1/evaluations").json()["count"]
    rollout = {"mode": "rollout", "model": "m", "base_url": llm.base_url}

    def refused(body: Any, status: int, field: str | None = None) -> dict[str, Any]:
        response = api.post("/v1/evaluations", json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        if field is not None:
            assert error["field"] == field, error
        return error

    refused({"mode": "replay", "episodes": [{"scenario_id": sid}, {"scenario_id": "scn_nope"}]}, 404,
            "episodes.1.scenario_id")
    refused({"mode": "replay", "episodes": [{"scenario_id": foreign}]}, 404, "episodes.0.scenario_id")
    refused({**rollout, "scenario_ids": [sid, foreign]}, 404, "scenario_ids.1")
    refused({"mode": "replay", "episodes": [{"scenario_id": sid}] * 10_001}, 422, "episodes")
    refused({"mode": "replay", "episodes": [{"scenario_id": sid, "tool_calls": [BUMP5] * 201}]}, 422)
    refused({"mode": "replay", "episodes": []}, 422, "episodes")
    refused({"mode": "replay", "scenario_ids": [sid]}, 422)
    refused({"mode": "rollout", "scenario_ids": [sid], "base_url": llm.base_url}, 422)  # no model
    refused({**rollout, "scenario_ids": [sid], "max_steps": 201}, 422, "max_steps")
    refused({**rollout, "scenario_ids": [sid], "concurrency": 0}, 422, "concurrency")
    for url in ("ftp://127.0.0.1/v1", "not a url", "http://user:pw@127.0.0.1/v1", "http:///v1"):
        refused({**rollout, "scenario_ids": [sid], "base_url": url}, 422, "base_url")
    refused({"mode": "rollout", "model": "m", "scenario_ids": [sid]}, 422, "base_url")  # none stored either
    refused({"mode": "bogus"}, 422, "mode")
    refused({**rollout, "scenario_ids": [sid], "extra": 1}, 422)
    garbage = api.post("/v1/evaluations", content=b"{not json", headers={"content-type": "application/json"})
    assert garbage.status_code == 422
    assert api.get("/v1/evaluations").json()["count"] == before

    for path in ("/v1/evaluations/evj_nope", "/v1/evaluations/evj_nope/results", "/v1/evaluations/../x"):
        assert api.get(path).status_code == 404
    assert api.post("/v1/evaluations/evj_nope/cancel").status_code == 404
    assert api.get("/v1/evaluations", params={"limit": 0}).status_code == 422

    # an endpoint that does not answer: per-episode error statuses, never a 500
    dead = f"http://127.0.0.1:{_closed_port()}/v1"
    created = api.post("/v1/evaluations", json={**rollout, "base_url": dead, "scenario_ids": [sid, sid], "retries": 1,
                                                "retry_initial_s": 0.01})
    assert created.status_code == 201, created.text
    job = wait(api, created.json()["id"])
    assert job["status"] == "completed"
    assert job["summary"]["errors_by_status"] == {"model_unavailable": 2}
    assert api.get(f"/v1/evaluations/{job['id']}/results", params={"include": "bogus"}).status_code == 422
    assert all(line["env_id"] is None or api.get(f"/v1/envs/{line['env_id']}").status_code == 404
               for line in results(api, job["id"]))


def test_every_route_is_tenant_isolated(server: Any, api: httpx.Client, counter_env_id: str) -> None:
    sid = scenario(api, counter_env_id, "isolation task")
    job = api.post("/v1/evaluations", json={"mode": "replay", "episodes": [{"scenario_id": sid,
                                                                             "tool_calls": [BUMP5]}]}).json()
    wait(api, job["id"])
    other_key = server.new_tenant("evals-b")
    with server.client(api_key=other_key) as other:
        unknown = other.get("/v1/evaluations/evj_000000000000000000000000")
        for response in (other.get(f"/v1/evaluations/{job['id']}"),
                         other.get(f"/v1/evaluations/{job['id']}/results"),
                         other.post(f"/v1/evaluations/{job['id']}/cancel")):
            assert response.status_code == 404
            assert response.json()["error"]["code"] == unknown.json()["error"]["code"] == "not_found"
        assert other.get("/v1/evaluations").json() == {"data": [], "count": 0}
        # nor can the other tenant run this tenant's scenarios
        refused = other.post("/v1/evaluations", json={"mode": "replay", "episodes": [{"scenario_id": sid}]})
        assert refused.status_code == 404
    assert api.get(f"/v1/evaluations/{job['id']}").status_code == 200


@pytest.mark.slow
def test_quotas_and_cancel(server: Any, counter_source: str, llm: ScriptedLLM) -> None:
    key = server.new_tenant("evals-q", quotas={"max_active_evaluations": 1, "max_evaluation_concurrency": 2})
    model = "scripted-slow"
    llm.rules += [Rule(model=model, contains=["TASK-SLOW"], turn=0, delay_s=0.3,
                       tool_calls=[ToolCallScript(name="bump", arguments={"by": 5})]),
                  Rule(model=model, contains=["TASK-SLOW"], turn=1, delay_s=0.3, content="done")]
    with server.client(api_key=key) as api:
        environment = api.post("/v1/environments", json={"name": "counter", "source_code": counter_source,
                                                         "class_name": "Counter"}).json()["id"]
        sid = scenario(api, environment, "TASK-SLOW")
        body = {"mode": "rollout", "model": model, "base_url": llm.base_url, "scenario_ids": [sid] * 12}
        too_wide = api.post("/v1/evaluations", json={**body, "concurrency": 3})
        assert too_wide.status_code == 429
        assert too_wide.json()["error"]["limit"] == "max_evaluation_concurrency"
        assert "max_evaluation_concurrency=2" in too_wide.json()["error"]["message"]
        assert int(too_wide.headers["Retry-After"]) >= 1

        job = api.post("/v1/evaluations", json=body).json()
        assert job["concurrency"] == 2
        second = api.post("/v1/evaluations", json=body)
        assert second.status_code == 429 and second.json()["error"]["limit"] == "max_active_evaluations"
        assert int(second.headers["Retry-After"]) >= 1

        deadline = time.monotonic() + 60
        while True:
            progress = api.get(f"/v1/evaluations/{job['id']}").json()["progress"]
            assert progress["running"] <= 2
            if progress["done"] >= 2:
                break
            assert time.monotonic() < deadline, progress
            time.sleep(0.1)
        cancelled = api.post(f"/v1/evaluations/{job['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        final = wait(api, job["id"])
        assert final["status"] == "cancelled"
        lines = results(api, job["id"])
        assert [line["index"] for line in lines] == list(range(12))
        statuses = [line["status"] for line in lines]
        assert set(statuses) <= {"done", "cancelled"} and statuses.count("done") >= 2 and "cancelled" in statuses
        assert all(line["reward"] == 0.5 for line in lines if line["status"] == "done")
        assert final["summary"]["cancelled"] == statuses.count("cancelled")
        assert api.get("/v1/envs").json()["count"] == 0  # running episodes deleted their envs too
        assert api.post(f"/v1/evaluations/{job['id']}/cancel").status_code == 200  # idempotent
        audit = api.get("/v1/audit", params={"action": "evaluation.cancel"}).json()["data"]
        assert [e["resource_id"] for e in audit] == [job["id"]] * 2
        # the slot is free again
        again = api.post("/v1/evaluations", json={**body, "scenario_ids": [sid]})
        assert again.status_code == 201, again.text
        assert wait(api, again.json()["id"])["summary"]["mean_reward"] == 0.5


@pytest.mark.slow
def test_restart_mid_evaluation_loses_and_duplicates_nothing(make_server: Any, counter_source: str,
                                                             llm: ScriptedLLM) -> None:
    from sandpit.client import Client

    server = make_server()
    key = "sk-restart-" + secrets.token_hex(16)
    model = "scripted-restart"
    llm.rules += [Rule(model=model, contains=["TASK-RESTART"], turn=0, delay_s=0.4,
                       tool_calls=[ToolCallScript(**BUMP5), ToolCallScript(**STORE_A)]),
                  Rule(model=model, contains=["TASK-RESTART"], turn=1, delay_s=0.2, content="done")]
    with server.client() as api:
        environment = api.post("/v1/environments", json={"name": "counter", "source_code": counter_source,
                                                         "class_name": "Counter"}).json()["id"]
        sid = scenario(api, environment, "TASK-RESTART")
    with Client(server.url, api_key=server.api_key) as client:
        job = client.evaluations.rollout([sid] * 6, model=model, base_url=llm.base_url, api_key=key,
                                         concurrency=2, retry_initial_s=0.01)
        deadline = time.monotonic() + 60
        while True:
            progress = client.evaluations.get(job.id).progress
            if progress.done >= 2 and progress.running >= 1:
                break
            assert time.monotonic() < deadline, progress
            time.sleep(0.05)
        server.kill()
        server.start()
        final = client.evaluations.wait(job.id, poll_s=0.2, timeout_s=90)
        assert final.status == "completed"
        assert final.progress.done == 6 and final.progress.errors == 0
        lines = client.evaluations.results(job.id)
        assert [line.index for line in lines] == list(range(6))  # each exactly once
        assert [line.reward for line in lines] == [1.0] * 6  # a rerun starts from a fresh env: count is 5, not 10
        assert max(line.attempt for line in lines) == 2
        assert all(len(line.trajectory or []) == 2 for line in lines)
        assert final.summary is not None and final.summary.success_rate == 1.0
        # every env of the killed server's episodes was deleted (ids are recorded before creation)
        assert client.envs.list().data == []
    assert key not in server.log_path.read_text(errors="replace")


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


COUNTER = '''
class Counter:
    def __init__(self, init_config: dict):
        self.count = init_config.get("count", 0)
        self.records = {}

    def bump(self, by: int = 1) -> int:
        """Add to the counter.

        Args:
            by (int): how much to add.
        """
        self.count += by
        return self.count
'''


def test_cli_replay_follows_and_prints_the_summary(server: Any, api: httpx.Client, counter_env_id: str,
                                                   tmp_path: Any) -> None:
    from sandpit.eval_cli import eval_app
    from typer.testing import CliRunner

    sid = scenario(api, counter_env_id, "cli task")
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text("\n".join(json.dumps(e) for e in [
        {"scenario_id": sid, "tool_calls": [BUMP5, STORE_A]}, {"scenario_id": sid, "tool_calls": [BUMP5]}]) + "\n")
    out = tmp_path / "results.jsonl"
    common = ["--url", server.url, "--api-key", server.api_key]
    run = CliRunner(env={"COLUMNS": "200"}).invoke(
        eval_app, ["replay", str(trajectories), *common, "--poll", "0.2", "--results", str(out)], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert "mean reward" in run.output and "0.750" in run.output and "success rate" in run.output
    per_scenario = run.output[run.output.index("per scenario"):]
    assert "overall pass rate" in per_scenario
    row = next(line for line in per_scenario.splitlines() if sid in line).split()
    assert row[2:] == ["│", "2", "│", "0.750", "│", "0.500", "│", "0.500", "│", "2", "│"]  # overall: 1 pass in 2
    assert [json.loads(line)["reward"] for line in out.read_text().splitlines()] == [1.0, 0.5]

    listed = CliRunner().invoke(eval_app, ["list", *common], catch_exceptions=False)
    assert listed.exit_code == 0 and "completed" in listed.output
    bad = CliRunner().invoke(eval_app, ["replay", str(tmp_path / "missing.jsonl"), *common])
    assert bad.exit_code == 2
    unknown = CliRunner().invoke(eval_app, ["watch", "evj_nope", *common])
    assert unknown.exit_code == 1 and "not found" in unknown.output
