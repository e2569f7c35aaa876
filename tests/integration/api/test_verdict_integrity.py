"""Reward integrity through the HTTP API: an environment cannot set its own reward.

A hostile environment (``tests/support/hostile_environments.py``: a module that
installs profile/trace/audit hooks and patches ``json``, ``pickle``, ``builtins`` and
``sys.modules`` when it loads, with objects of its own classes in its state, one of
whose ``__reduce__`` runs code when unpickled) is registered and judged by a scenario's
honest checks: two are False, one is True, so the honest reward is 0.3333. Every path
that computes a reward gives exactly that by default, under runc and under gVisor:
``POST /v1/envs/{id}/evaluate``, the episode-end reward of a scenario env, and a replay
evaluation job; ``/v1/validate`` of a check runs no environment code at all. A scenario
with ``check_objects: environment`` documents what the environment's classes still decide.

The same module also shows that an environment which replaces ``json`` for its own
purposes registers and steps (the session's frames use the runner's own codec).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from hostile_environments import HONEST as HONEST_SOURCES
from hostile_environments import HOSTILE

pytestmark = [pytest.mark.docker, pytest.mark.slow]

HONEST = [{"check_item": f"honest {i}", "check_func": source} for i, source in enumerate(HONEST_SOURCES)]
HONEST_REWARD = 0.3333
API_ATTACKS = "profile,trace,audit,json,pickle,modules"
"""Every import-time attack but patched builtins and a frame-walking thread (the executor
tests cover those; here they would only make registration's introspection slow or break
the environment's own tools)."""
BOX_EQUAL = {"check_item": "box unchanged",
             "check_func": "def check_func(final_state):\n    return final_state['box'] == initial_state['box']\n"}

JSON_PATCHER = '''
import json, sys, types

_real_dumps = json.dumps
json.dumps = lambda value, *a, **k: "not json at all"
json.loads = lambda *a, **k: {"forged": True}
fake = types.ModuleType("json")
fake.dumps = json.dumps
fake.loads = json.loads
sys.modules["json"] = fake


class Ledger:
    """Keeps its entries as JSON text of its own making."""

    def __init__(self, init_config=None):
        self.entries = []

    def add(self, amount: int) -> str:
        """Record an amount.

        Args:
            amount (int): the amount.
        """
        self.entries.append({"amount": amount, "text": _real_dumps({"amount": amount})})
        return json.dumps(self.entries)
'''


@pytest.fixture(scope="module", params=["runc", "runsc"])
def judged(request, make_module_server, docker_client) -> Any:
    """A server per runtime, and the hostile environment registered on it."""
    if request.param == "runsc" and "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    server = make_module_server(SANDPIT_EXECUTOR_RUNTIME=request.param)
    with server.client() as api:
        response = api.post("/v1/environments", json={
            "name": "hostile", "source_code": HOSTILE.format(attack=API_ATTACKS),
            "class_name": "Hostile", "policy": "audit"})
        assert response.status_code == 201, response.text
    return server, response.json()["id"]


def _scenario(api: httpx.Client, environment_id: str, checks: list[dict[str, str]], **fields: Any) -> str:
    response = api.post("/v1/scenarios", json={"environment_id": environment_id, "task": "bump once",
                                                "checklist_with_func": checks, **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _bumped_env(api: httpx.Client, scenario_id: str) -> str:
    created = api.post("/v1/envs", json={"scenario_id": scenario_id, "episode": {"max_steps": None}})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    step = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {}})
    assert step.status_code == 200 and step.json()["status"] == "ok", step.text
    return env_id


def test_evaluate_gives_the_honest_reward(judged) -> None:
    server, environment_id = judged
    with server.client() as api:
        env_id = _bumped_env(api, _scenario(api, environment_id, HONEST))
        state = api.get(f"/v1/envs/{env_id}/state").json()
        assert state["state"]["box"]["$object"]["type"] == "Box"  # an object of its own class: pickled
        evaluation = api.post(f"/v1/envs/{env_id}/evaluate")
        assert evaluation.status_code == 200, evaluation.text
        body = evaluation.json()
        assert body["reward"] == HONEST_REWARD, body
        assert [r["passed"] for r in body["results"]] == [False, False, True]
        inline = api.post(f"/v1/envs/{env_id}/evaluate", json={"checks": HONEST})
        assert inline.json()["reward"] == HONEST_REWARD, inline.text


def test_the_episode_end_reward_is_the_honest_one(judged) -> None:
    server, environment_id = judged
    with server.client() as api:
        env_id = _bumped_env(api, _scenario(api, environment_id, HONEST))
        end = api.post(f"/v1/envs/{env_id}/step", json={"name": "chat_with_user", "arguments": {"content": "done"}})
        assert end.status_code == 200, end.text
        assert end.json()["terminated"] is True and end.json()["reward"] == HONEST_REWARD, end.json()


def test_an_evaluation_job_gives_the_honest_reward(judged) -> None:
    server, environment_id = judged
    with server.client() as api:
        scenario_id = _scenario(api, environment_id, HONEST)
        job = api.post("/v1/evaluations", json={"mode": "replay", "episodes": [
            {"scenario_id": scenario_id, "tool_calls": [{"name": "bump", "arguments": {}}]}] * 2})
        assert job.status_code in (200, 201, 202), job.text
        job_id = job.json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = api.get(f"/v1/evaluations/{job_id}").json()
            if status["status"] not in ("queued", "running"):
                break
            time.sleep(0.2)
        assert status["status"] == "completed", status
        lines = api.get(f"/v1/evaluations/{job_id}/results").text.splitlines()
        import json

        rewards = [json.loads(line)["reward"] for line in lines]
        assert rewards == [HONEST_REWARD, HONEST_REWARD], lines


def test_validate_runs_no_environment_code(judged) -> None:
    """``/v1/validate`` judges a check on JSON states: objects given as ``$object`` tags
    are stand-ins there too; nothing of any environment is loaded."""
    server, _ = judged
    with server.client() as api:
        box = {"$object": {"type": "Box", "attrs": {"value": 0}}}
        response = api.post("/v1/validate", json={
            "kind": "check_function", "source_code": BOX_EQUAL["check_func"],
            "cases": [{"initial_state": {"box": box}, "final_state": {"box": {"$object": {
                           "type": "Box", "attrs": {"value": 1}}}}},
                      {"initial_state": {"box": box}, "final_state": {"box": box}}]})
        assert response.status_code == 200, response.text
        assert [case["passed"] for case in response.json()["cases"]] == [False, True], response.json()


def test_opting_in_lets_the_environments_classes_decide_for_their_objects(judged) -> None:
    """``check_objects: environment``: the module is loaded for the checks. Its import-time
    hooks are taken back (the honest checks keep their verdicts), but ``==`` on its
    objects is its own ``Box.__eq__`` (always True): ``docs/isolation.md`` says so."""
    server, environment_id = judged
    with server.client() as api:
        checks = HONEST + [BOX_EQUAL]
        standins = _scenario(api, environment_id, checks)
        opted = _scenario(api, environment_id, checks, check_objects="environment")
        assert api.get(f"/v1/scenarios/{opted}").json()["check_objects"] == "environment"
        by_default = api.post(f"/v1/envs/{_bumped_env(api, standins)}/evaluate").json()
        opted_in = api.post(f"/v1/envs/{_bumped_env(api, opted)}/evaluate").json()
        assert [r["passed"] for r in by_default["results"]] == [False, False, True, False], by_default
        assert [r["passed"] for r in opted_in["results"]] == [False, False, True, True], opted_in
        override = api.post(f"/v1/envs/{_bumped_env(api, standins)}/evaluate", json={"check_objects": "environment"})
        assert [r["passed"] for r in override.json()["results"]] == [False, False, True, True], override.text


def test_hostile_check_objects_values_are_refused(judged) -> None:
    server, environment_id = judged
    with server.client() as api:
        for value in ("Environment", "", None, 1, ["environment"], "standins; drop"):
            response = api.post("/v1/scenarios", json={"environment_id": environment_id, "task": "t",
                                                        "check_objects": value})
            assert response.status_code == 422, (value, response.text)
            assert "check_objects" in response.text


def test_an_environment_that_replaces_json_registers_and_steps(judged) -> None:
    server, _ = judged
    with server.client() as api:
        registered = api.post("/v1/environments", json={"source_code": JSON_PATCHER, "class_name": "Ledger",
                                                         "policy": "audit"})
        assert registered.status_code == 201, registered.text
        assert [t["function"]["name"] for t in registered.json()["tools"]] == ["add"]
        env = api.post("/v1/envs", json={"environment_id": registered.json()["id"]})
        assert env.status_code == 201, env.text
        env_id = env.json()["id"]
        step = api.post(f"/v1/envs/{env_id}/step", json={"name": "add", "arguments": {"amount": 5}})
        assert step.status_code == 200, step.text
        assert step.json()["status"] == "ok" and step.json()["observation"] == "not json at all", step.json()
        state = api.get(f"/v1/envs/{env_id}/state").json()["state"]
        assert state == {"entries": [{"amount": 5, "text": '{"amount": 5}'}]}, state
