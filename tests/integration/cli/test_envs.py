"""``sandpit environments|scenarios|envs`` on a real server (``sandpit serve`` subprocess,
real sandboxes), through the ``sandpit`` app as a user runs it: typer's CliRunner with
``SANDPIT_URL``/``SANDPIT_API_KEY`` in the environment (or ``--url``/``--api-key``).

Exit codes checked everywhere: 0 results (a rejected or failing step included), 1 the
server refused (its message, one line on stderr), 2 usage errors (bad JSON, missing files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_runs import run
from typer.testing import CliRunner

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n    return final_state['count'] == 3\n"},
          {"check_item": "record a stored",
           "check_func": "def check_func(final_state):\n    return 'a' in final_state['records']\n"}]


def run_json(runner: CliRunner, *args: str) -> Any:
    return json.loads(run(runner, *args, "--json").stdout)


def refused(runner: CliRunner, *args: str, code: int = 1) -> str:
    """Run a command that must fail; returns its stderr (one line for API errors)."""
    result = run(runner, *args, code=code)
    assert result.stdout == ""
    if code == 1:
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_environment_scenario_env_round_trip(runner: CliRunner, counter_source: str, tmp_path: Path) -> None:
    source = tmp_path / "counter.py"
    source.write_text(counter_source)
    (tmp_path / "rules.txt").write_text("Never bump by more than 10.\n\nKeep records short.\n")
    (tmp_path / "sample.json").write_text('{"count": 2}')
    environment = run_json(runner, "environments", "create", str(source), "--class-name", "Counter", "--name",
                           "cli-counter", "--introduction", "A counter.", "--rules-file", str(tmp_path / "rules.txt"),
                           "--sample-init-config", f"@{tmp_path / 'sample.json'}")
    eid = environment["id"]
    assert environment["rules"] == ["Never bump by more than 10.", "Keep records short."]
    assert {t["function"]["name"] for t in environment["tools"]} >= {"bump", "set_record", "fail"}
    shown = run(runner, "environments", "get", eid).stdout
    assert "set_record" in shown and "key*: string" in shown and "policy standard: passed" in shown
    assert eid in [e["id"] for e in run_json(runner, "environments", "list")["data"]]

    (tmp_path / "checks.json").write_text(json.dumps(CHECKS))
    scenario = run_json(runner, "scenarios", "create", "--environment-id", eid, "--task", "Bump to 3, store a.",
                        "--init-config", '{"count": 1}', "--checks", str(tmp_path / "checks.json"))
    sid = scenario["id"]
    assert scenario["init_config"] == {"count": 1} and len(scenario["checklist_with_func"]) == 2
    assert "Bump to 3, store a." in run(runner, "scenarios", "get", sid).stdout
    listed = run_json(runner, "scenarios", "list", "--environment-id", eid)
    assert listed["count"] == 1 and listed["data"][0]["id"] == sid

    created = run(runner, "envs", "create", "--scenario-id", sid).stdout
    assert "Bump to 3, store a." in created and "chat_with_user" in created and "A counter." in created
    env_id = created.split()[1]
    assert env_id.startswith("env_")

    step = run_json(runner, "envs", "step", env_id, "bump", "by=2")
    assert (step["status"], step["observation"], step["action"]) == ("ok", "3", {"name": "bump",
                                                                              "arguments": {"by": 2}})
    step = run_json(runner, "envs", "step", env_id, "set_record", "--args", '{"key": "a", "value": "x"}', "size=3",
                    "--include", "state_diff,state")
    assert step["status"] == "ok" and step["state"]["records"]["a"] == {"value": "x", "pad": "xxx"}
    assert step["state_diff"]["records"]["a"]["added"] == {"value": "x", "pad": "xxx"}
    shown = run(runner, "envs", "step", env_id, "set_record", "key=b", "value=007", "--include", "state_diff").stdout
    assert "step 3 of episode 1: ok" in shown and "terminated no" in shown and '"added"' in shown
    state = json.loads(run(runner, "envs", "state", env_id).stdout)  # human output: stdout is the state as JSON
    assert state["records"]["b"]["value"] == "007" and state["count"] == 3
    assert run_json(runner, "envs", "state", env_id, "--step", "1")["state"]["records"] == {}

    trajectory = run_json(runner, "envs", "trajectory", env_id)
    assert trajectory["count"] == 3 and [s["action"]["name"] for s in trajectory["steps"]] == [
        "bump", "set_record", "set_record"]
    assert [s["step"] for s in run_json(runner, "envs", "trajectory", env_id, "--limit", "1", "--offset", "1")[
        "steps"]] == [2]
    assert 'bump(by=2)' in run(runner, "envs", "trajectory", env_id).stdout

    done = run_json(runner, "envs", "step", env_id, "--text", "All done.")
    assert done["terminated"] is True and done["reward"] == 1.0 and done["action"]["name"] == "chat_with_user"
    assert [c["passed"] for c in done["checks"]] == [True, True]
    episodes = run_json(runner, "envs", "episodes", env_id)
    assert episodes["count"] == 1 and episodes["data"][0]["status"] == "terminated"
    assert "terminated" in run(runner, "envs", "episodes", env_id).stdout
    assert run_json(runner, "envs", "evaluate", env_id)["reward"] == 1.0
    assert "reward 1.0 (2/2 passed)" in run(runner, "envs", "evaluate", env_id).stdout
    ended = refused(runner, "envs", "step", env_id, "bump")
    assert "409" in ended and "reset" in ended

    reset = run_json(runner, "envs", "reset", env_id, "--init-config", '{"count": 10}')
    assert (reset["episode"], reset["step"], reset["init_config"]) == (2, 0, {"count": 10})
    assert run_json(runner, "envs", "step", env_id, "bump")["observation"] == "11"
    assert "restored to step 0" in run(runner, "envs", "restore", env_id, "0").stderr
    assert run_json(runner, "envs", "state", env_id)["state"]["count"] == 10
    assert run_json(runner, "envs", "state", env_id, "--episode", "1", "--step", "1")["state"]["count"] == 3
    reset = run_json(runner, "envs", "reset", env_id, "--scenario-id", sid)
    assert reset["init_config"] == {"count": 1} and reset["observation"] == "Bump to 3, store a."

    run_json(runner, "envs", "step", env_id, "bump", "by=5")
    forks = run(runner, "envs", "fork", env_id, "--step", "0", "--count", "2", "-q").stdout.split()
    assert len(forks) == 2 and all(f.startswith("env_") for f in forks)
    assert run_json(runner, "envs", "state", forks[0])["state"]["count"] == 1
    assert "1 fork(s)" in run(runner, "envs", "fork", forks[0]).stdout
    listed_envs = {e["id"] for e in run_json(runner, "envs", "list")["data"]}
    assert {env_id, *forks} <= listed_envs
    assert env_id in run(runner, "envs", "list").stdout

    for doomed in (env_id, *forks):
        assert f"deleted env {doomed}" in run(runner, "envs", "delete", doomed).stderr
    assert "not found" in refused(runner, "envs", "get", env_id)
    for other in listed_envs - {env_id, *forks}:  # the second fork's own fork
        if run_json(runner, "envs", "get", other)["environment_id"] == eid:
            run(runner, "envs", "delete", other)
    run(runner, "scenarios", "delete", sid)
    assert "not found" in refused(runner, "scenarios", "get", sid)
    run(runner, "environments", "delete", eid)
    assert "not found" in refused(runner, "environments", "get", eid)


def test_failing_and_malformed_steps_are_results(runner: CliRunner, counter_env_id: str) -> None:
    env_id = run(runner, "envs", "create", "--environment-id", counter_env_id, "-q").stdout.strip()
    failed = run(runner, "envs", "step", env_id, "fail", "message=boom").stdout
    assert "error" in failed and "Error: ValueError: boom" in failed and "Traceback" in failed

    unknown = run(runner, "envs", "step", env_id, "nope", "x=1").stdout
    assert "rejected" in unknown and "unknown tool 'nope'" in unknown and "Error: Invalid action" in unknown
    not_object = run_json(runner, "envs", "step", env_id, "bump", "--args", "[1, 2]")
    assert not_object["status"] == "rejected" and "object" in not_object["error"]
    private = run_json(runner, "envs", "step", env_id, "_secret")
    assert private["status"] == "rejected" and private["error"]
    garbled = run_json(runner, "envs", "step", env_id, "--text", '<tool_call>{"name": "bump", "arguments": </tool_call>')
    assert garbled["status"] == "rejected" and garbled["error"]

    trajectory = run_json(runner, "envs", "trajectory", env_id)
    assert [s["status"] for s in trajectory["steps"]] == ["error", "rejected", "rejected", "rejected", "rejected"]
    assert "rejected: unknown tool 'nope'" in run(runner, "envs", "trajectory", env_id).stdout
    assert run_json(runner, "envs", "step", env_id, "bump")["observation"] == "1"  # the episode went on
    run(runner, "envs", "delete", env_id)


def test_inline_source_env_with_max_steps(runner: CliRunner, counter_source: str, tmp_path: Path) -> None:
    source = tmp_path / "counter.py"
    source.write_text(counter_source)
    (tmp_path / "init.json").write_text('{"count": 40}')
    env = run_json(runner, "envs", "create", "--source", str(source), "--class-name", "Counter", "--init-config",
                   f"@{tmp_path / 'init.json'}", "--max-steps", "2")
    assert env["episode_config"]["max_steps"] == 2
    assert run_json(runner, "envs", "step", env["id"], "bump")["truncated"] is False
    last = run_json(runner, "envs", "step", env["id"], "bump")
    assert (last["observation"], last["truncated"]) == ("42", True)
    assert "409" in refused(runner, "envs", "step", env["id"], "bump")
    run(runner, "envs", "delete", env["id"])


def test_hostile_input(runner: CliRunner, server: Any, counter_env_id: str, counter_source: str,
                       tmp_path: Path) -> None:
    env_id = run(runner, "envs", "create", "--environment-id", counter_env_id, "-q").stdout.strip()
    # JSON that does not parse, values of the wrong type, missing files: usage errors (2), nothing sent
    assert "not valid JSON" in refused(runner, "envs", "step", env_id, "bump", "--args", "{by: 1", code=2)
    assert "NaN" in refused(runner, "envs", "step", env_id, "bump", "--args", '{"by": NaN}', code=2)
    assert "key=value" in refused(runner, "envs", "step", env_id, "bump", "by", code=2)
    assert "--text" in refused(runner, "envs", "step", env_id, code=2)
    refused(runner, "envs", "step", env_id, "bump", "--text", "x", code=2)
    refused(runner, "envs", "step", env_id, "bump", "--include", "everything", code=2)
    assert "not valid JSON" in refused(runner, "envs", "create", "--environment-id", counter_env_id,
                                       "--init-config", "{'count': 1}", code=2)
    assert "JSON object" in refused(runner, "envs", "create", "--environment-id", counter_env_id,
                                    "--init-config", "[1]", code=2)
    assert "cannot read" in refused(runner, "envs", "reset", env_id, "--init-config", f"@{tmp_path / 'nope.json'}",
                                    code=2)
    refused(runner, "envs", "create", code=2)
    refused(runner, "envs", "create", "--environment-id", counter_env_id, "--source", str(tmp_path), code=2)
    assert "does not exist" in refused(runner, "environments", "create", str(tmp_path / "missing.py"),
                                       "--class-name", "Counter", code=2)
    (tmp_path / "checks.json").write_text('{"check_item": "not a list"}')
    assert "JSON list" in refused(runner, "scenarios", "create", "--environment-id", counter_env_id, "--task", "t",
                                  "--checks", str(tmp_path / "checks.json"), code=2)
    assert run_json(runner, "envs", "trajectory", env_id)["count"] == 0  # none of that reached the env

    # what the server refuses: exit 1 with its message on one line
    for args in (("envs", "get", "env_nope"), ("envs", "step", "env_nope", "bump"), ("envs", "state", "env_nope"),
                 ("envs", "trajectory", "env_nope"), ("envs", "episodes", "env_nope"), ("envs", "delete", "env_nope"),
                 ("envs", "fork", "env_nope"), ("envs", "restore", "env_nope", "0"), ("envs", "evaluate", "env_nope"),
                 ("scenarios", "get", "scn_nope"), ("environments", "delete", "envr_nope")):
        message = refused(runner, *args)
        assert "HTTP 404" in message and "nope' not found" in message, args
    assert "scenario 'scn_nope' not found" in refused(runner, "envs", "create", "--scenario-id", "scn_nope")
    assert "head is step 0" in refused(runner, "envs", "restore", env_id, "7")
    assert "no scenario" in refused(runner, "envs", "evaluate", env_id).lower()
    (tmp_path / "bad_checks.json").write_text('[{"check_item": "x"}]')
    assert "checklist_with_func.0.check_func" in refused(
        runner, "scenarios", "create", "--environment-id", counter_env_id, "--task", "t", "--checks",
        str(tmp_path / "bad_checks.json"))
    (tmp_path / "evil.py").write_text("class Evil:\n    def run(self, code):\n        return eval(code)\n")
    assert "static policy 'strict'" in refused(runner, "environments", "create", str(tmp_path / "evil.py"),
                                                "--class-name", "Evil", "--policy", "strict")
    (tmp_path / "counter.py").write_text(counter_source)
    assert "Nope" in refused(runner, "environments", "create", str(tmp_path / "counter.py"), "--class-name", "Nope")
    assert "used by" in refused(runner, "environments", "delete", counter_env_id)
    assert "401" in refused(runner, "envs", "get", env_id, "--api-key", "sp_not_a_key")
    assert "could not connect" in refused(runner, "envs", "list", "--url", "http://127.0.0.1:9")
    # the flags win over the environment variables, and reach the same server
    plain = CliRunner(env={"SANDPIT_URL": "http://127.0.0.1:9", "SANDPIT_API_KEY": ""})
    assert run_json(plain, "envs", "get", env_id, "--url", server.url, "--api-key", server.api_key)["id"] == env_id
    run(runner, "envs", "delete", env_id)
