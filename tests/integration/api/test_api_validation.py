"""Validation of generated code, scenarios and rewards, code execution, and the EnvScaler
importer, through the real app over HTTP (untrusted code only ever runs in sandboxes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.docker
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "envscaler"


def _ok(response: httpx.Response, status: int = 200) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


def _check(body: str) -> str:
    return "def check_func(final_state):\n" + "".join(f"    {line}\n" for line in body.splitlines())


# -- validate -------------------------------------------------------------------------------
def test_validate_a_good_environment_with_smoke_calls(api: httpx.Client, counter_source: str) -> None:
    result = _ok(api.post("/v1/validate", json={
        "kind": "environment", "source_code": counter_source, "class_name": "Counter",
        "init_config": {"count": 1}, "smoke_calls": [{"name": "bump", "arguments": {"by": 2}},
                                                     {"name": "set_record", "arguments": {"key": "a", "value": "b"}}]}))
    assert result["verdict"] == "valid" and result["reasons"] == []
    assert {t["function"]["name"] for t in result["tools"]} >= {"bump", "set_record"}
    assert [s["status"] for s in result["smoke"]] == ["ok", "ok"]
    assert result["smoke"][0]["state_diff"]["count"] == {"changed": {"old": 1, "new": 3}}
    assert result["policy_report"]["passed"] is True


@pytest.mark.parametrize("source, expect", [
    ("raise RuntimeError('at import')\nclass Counter: pass\n", "loading Counter failed"),
    ("class Counter:\n    def __init__(self, init_config):\n        raise ValueError('nope')\n", "instantiating"),
    ("class Other:\n    pass\n", "loading Counter failed"),
    ("class Counter:\n    def __init__(self, c):\n        self.x = 1\n    def boom(self):\n        return 1 / 0\n",
     "smoke call 'boom': error"),
    ("class Counter:\n    def __init__(self, c):\n        self.x = ().__class__.__bases__[0].__subclasses__()\n",
     "dunder"),
])
def test_validate_bad_environments_are_invalid_with_reasons(api: httpx.Client, source: str, expect: str) -> None:
    result = _ok(api.post("/v1/validate", json={"kind": "environment", "source_code": source,
                                                "class_name": "Counter", "smoke_calls": [{"name": "boom"}]
                                                if "boom" in source else []}))
    assert result["verdict"] == "invalid"
    assert any(expect in reason for reason in result["reasons"]), result["reasons"]


def test_validate_check_functions(api: httpx.Client) -> None:
    case = {"initial_state": {"count": 1}, "final_state": {"count": 3}}
    verdicts = {}
    for label, source in {
        "passes": _check("return final_state['count'] == initial_state['count'] + 2"),
        "fails": _check("return final_state['count'] == 0"),
        "raises": _check("return final_state['missing']"),
        "non_bool": _check("return 1"),
        "loops": _check("while True:\n    pass"),
        "mutates": _check("final_state['count'] = 99\ninitial_state.clear()\nreturn True"),
        "no_func": "x = 1\n",
    }.items():
        result = _ok(api.post("/v1/validate", json={"kind": "check_function", "source_code": source,
                                                    "cases": [case, case]}))
        verdicts[label] = (result["verdict"], [c["passed"] for c in result["cases"]])
    assert verdicts["passes"] == ("valid", [True, True])
    assert verdicts["fails"] == ("valid", [False, False])  # a check may be false; it ran fine
    assert verdicts["raises"][0] == verdicts["non_bool"][0] == verdicts["loops"][0] == "invalid"
    assert verdicts["mutates"] == ("valid", [True, True])  # each case got its own copy
    assert verdicts["no_func"][0] == "invalid"
    no_cases = api.post("/v1/validate", json={"kind": "check_function", "source_code": "x = 1"})
    assert no_cases.status_code == 422 and no_cases.json()["error"]["field"] == "cases"


def test_validate_snippet_is_static_only(api: httpx.Client) -> None:
    clean = _ok(api.post("/v1/validate", json={"kind": "snippet", "source_code": "print(sum(range(10)))"}))
    assert clean["verdict"] == "valid" and clean["tools"] is None
    dirty = _ok(api.post("/v1/validate", json={"kind": "snippet", "source_code": "().__class__.__subclasses__()"}))
    assert dirty["verdict"] == "invalid" and dirty["policy_report"]["errors"] >= 1
    warned = _ok(api.post("/v1/validate", json={"kind": "snippet", "source_code": "eval('1+1')"}))
    assert warned["verdict"] == "valid" and warned["policy_report"]["warnings"] >= 1
    strict = _ok(api.post("/v1/validate", json={"kind": "snippet", "source_code": "import subprocess",
                                                "policy": "strict"}))
    standard = _ok(api.post("/v1/validate", json={"kind": "snippet", "source_code": "import subprocess"}))
    assert strict["verdict"] == "invalid" and standard["verdict"] == "valid"
    assert api.post("/v1/validate", json={"kind": "nope", "source_code": "x"}).status_code == 422
    assert api.post("/v1/validate", json={"kind": "snippet", "source_code": "x", "policy": "lax"}).status_code == 422


def test_registration_applies_the_policy(api: httpx.Client) -> None:
    escape = "class C:\n    def f(self):\n        return ().__class__.__bases__[0].__subclasses__()\n"
    refused = api.post("/v1/environments", json={"source_code": escape, "class_name": "C"})
    assert refused.status_code == 422 and "static policy" in refused.json()["error"]["message"]
    strict = api.post("/v1/environments", json={
        "source_code": "class C:\n    def f(self):\n        return eval('1')\n", "class_name": "C", "policy": "strict"})
    assert strict.status_code == 422 and "dynamic-eval" in strict.json()["error"]["message"]
    audited = _ok(api.post("/v1/environments", json={"source_code": escape, "class_name": "C", "policy": "audit"}),
                  201)
    assert audited["policy"] == "audit" and audited["policy_report"]["warnings"] >= 1
    assert api.delete(f"/v1/environments/{audited['id']}").status_code == 204


# -- scenarios and rewards --------------------------------------------------------------------
def test_scenario_env_and_evaluate_give_the_envscaler_reward(api: httpx.Client, counter_env_id: str) -> None:
    checks = [
        {"check_item": "count went up by 3", "check_func": _check(
            "return final_state['count'] == initial_state['count'] + 3")},
        {"check_item": "a record exists", "check_func": _check("return 'a' in final_state['records']")},
        {"check_item": "errors count as failed", "check_func": _check("return final_state['nope']")},
        {"check_item": "non-bool counts as failed", "check_func": _check("return 'yes'")},
    ]
    scenario = _ok(api.post("/v1/scenarios", json={
        "environment_id": counter_env_id, "task": "Bump by 3 and store record a.", "init_config": {"count": 10},
        "checklist": [c["check_item"] for c in checks], "checklist_with_func": checks}), 201)
    assert _ok(api.get(f"/v1/scenarios/{scenario['id']}"))["task"].startswith("Bump")
    env = _ok(api.post("/v1/envs", json={"scenario_id": scenario["id"]}), 201)
    assert env["scenario_id"] == scenario["id"]
    before = _ok(api.post(f"/v1/envs/{env['id']}/evaluate", json={}))
    assert (before["passed"], before["total"], before["reward"]) == (0, 4, 0.0)
    api.post(f"/v1/envs/{env['id']}/step", json={"name": "bump", "arguments": {"by": 3}})
    api.post(f"/v1/envs/{env['id']}/step", json={"name": "set_record", "arguments": {"key": "a", "value": "x"}})
    after = _ok(api.post(f"/v1/envs/{env['id']}/evaluate"))
    assert (after["passed"], after["total"], after["reward"]) == (2, 4, 0.5)
    by_item = {r["check_item"]: r for r in after["results"]}
    assert "KeyError" in by_item["errors count as failed"]["error"]
    assert "bool" in by_item["non-bool counts as failed"]["error"]

    tamper = [{"check_item": "tries to change the env", "check_func": _check(
        "final_state['count'] = -1\nimport os\nreturn True")}]
    assert _ok(api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": tamper}))["reward"] == 1.0
    assert _ok(api.get(f"/v1/envs/{env['id']}/state"))["state"]["count"] == 13  # untouched
    assert api.delete(f"/v1/scenarios/{scenario['id']}").status_code == 204
    assert api.get(f"/v1/scenarios/{scenario['id']}").status_code == 404
    assert api.post(f"/v1/envs/{env['id']}/evaluate").status_code == 409  # no scenario any more
    assert api.delete(f"/v1/envs/{env['id']}").status_code == 204


def test_hostile_scenarios_and_evaluations(api: httpx.Client, counter_env_id: str) -> None:
    assert api.post("/v1/scenarios", json={"environment_id": "envr_nope", "task": "x"}).status_code == 404
    bad = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "x", "checklist_with_func": [
        {"check_item": "escape", "check_func": _check("return ().__class__.__bases__[0].__subclasses__() != []")}]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "checklist_with_func.0.check_func"
    assert api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "x",
                                           "checklist_with_func": [{"check_item": "x"}] * 300}).status_code == 422
    assert api.post("/v1/envs", json={"scenario_id": "scn_nope"}).status_code == 404
    assert api.post("/v1/envs/env_nope/evaluate", json={}).status_code == 404


# -- execute ------------------------------------------------------------------------------------
def test_execute_snippets(api: httpx.Client) -> None:
    hello = _ok(api.post("/v1/execute", json={"code": "import sys\nprint('hi')\nprint('err', file=sys.stderr)"}))
    assert (hello["status"], hello["exit_code"], hello["stdout"], hello["stderr"]) == ("ok", 0, "hi\n", "err\n")
    failing = _ok(api.post("/v1/execute", json={"code": "raise SystemExit(3)"}))
    assert (failing["status"], failing["exit_code"]) == ("error", 3)
    raised = _ok(api.post("/v1/execute", json={"code": "1 / 0"}))
    assert raised["status"] == "error" and "ZeroDivisionError" in raised["stderr"]
    echoed = _ok(api.post("/v1/execute", json={"code": "import sys\nprint(sys.stdin.read().upper())",
                                               "stdin": "abc"}))
    assert echoed["stdout"] == "ABC\n"
    with_files = _ok(api.post("/v1/execute", json={"code": "print(open('data/x.txt').read())",
                                                   "files": {"data/x.txt": "payload"}}))
    assert with_files["stdout"] == "payload\n"
    flood = _ok(api.post("/v1/execute", json={"code": "print('x' * 10_000_000)"}))
    assert flood["stdout_truncated"] and len(flood["stdout"]) < 2_000_000
    slow = _ok(api.post("/v1/execute", json={"code": "while True:\n    pass", "timeout_s": 1}))
    assert slow["status"] == "timeout"
    hungry = _ok(api.post("/v1/execute", json={"code": "x = bytearray(10**10)", "memory_mb": 64}))
    assert hungry["status"] in ("oom", "error")
    batch = _ok(api.post("/v1/execute/batch", json={"snippets": [{"code": f"print({i})"} for i in range(6)],
                                                    "concurrency": 3}))
    assert [r["stdout"] for r in batch["results"]] == [f"{i}\n" for i in range(6)]


@pytest.mark.parametrize("body", [
    {"code": "print(1)", "timeout_s": 10_000},
    {"code": "print(1)", "timeout_s": 60},
    {"code": "print(1)", "memory_mb": 10**7},
    {"code": "print(1)", "files": {"../escape.txt": "x"}},
    {"code": "print(1)", "files": {"/etc/passwd": "x"}},
    {"code": ""},
    {"code": "print(1)", "stdin": 5},
    {"snippets": []},
])
def test_hostile_execute_requests_are_4xx(api: httpx.Client, body: dict) -> None:
    path = "/v1/execute/batch" if "snippets" in body else "/v1/execute"
    response = api.post(path, json=body)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)


# -- EnvScaler import ---------------------------------------------------------------------------
def test_envscaler_import_reports_every_item(server) -> None:
    completed = subprocess.run(
        [sys.executable, "-c", "from sandpit.cli import app; app()", "import", "envscaler",
         "--envs", str(FIXTURES / "environments.json"), "--scenarios", str(FIXTURES / "scenarios.json"),
         "--url", server.url, "--api-key", server.api_key], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    output = completed.stdout + completed.stderr
    assert "environments: 1 imported, 0 reused, 2 refused" in output, output
    assert "scenarios: 1 imported, 0 reused, 3 refused" in output, output
    with server.client(timeout=60) as api:
        names = [e["name"] for e in api.get("/v1/environments", params={"limit": 1000}).json()["data"]]
        assert "envscaler:library_system_001" in names and "envscaler:sneaky_env_002" not in names
        scenarios = api.get("/v1/scenarios").json()["data"]
        assert [s["external_id"] for s in scenarios] == ["t1"]
    assert json.loads((FIXTURES / "scenarios.json").read_text())[0]["task_id"] == "t1"
    again = subprocess.run(completed.args, capture_output=True, text=True, timeout=300)  # idempotent rerun
    assert again.returncode == 0, again.stderr
    assert "environments: 0 imported, 1 reused, 2 refused" in again.stdout + again.stderr, again.stderr
    assert "scenarios: 0 imported, 1 reused, 3 refused" in again.stdout + again.stderr, again.stderr
    with server.client(timeout=60) as api:
        assert [s["external_id"] for s in api.get("/v1/scenarios").json()["data"]] == ["t1"]
        names = [e["name"] for e in api.get("/v1/environments", params={"limit": 1000}).json()["data"]]
        assert names.count("envscaler:library_system_001") == 1
