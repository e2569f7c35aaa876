"""``sandpit scenarios stats`` and ``sandpit environments stats`` on a real server (real
sandboxes): a scenario with two one-step episodes of known rewards, then the figures as
JSON and as a table with full ids; bad options are usage errors (exit 2) and another
tenant's or an unknown id is the server's 404 (exit 1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cli_runs import run
from typer.testing import CliRunner

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n    return final_state['count'] == 3\n"}]


@pytest.fixture(scope="module")
def scenario_id(server: Any, counter_env_id: str) -> str:
    """A Counter scenario with two one-step episodes: rewards 1.0 (bump 2) then 0.0 (bump 1)."""
    with server.client() as api:
        response = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "Reach 3.",
                                                    "init_config": {"count": 1}, "checklist_with_func": CHECKS})
        assert response.status_code == 201, response.text
        sid = response.json()["id"]
        env = api.post("/v1/envs", json={"scenario_id": sid, "episode": {"max_steps": 1}}).json()
        for by, expected in ((2, 1.0), (1, 0.0)):
            if by == 1:
                assert api.post(f"/v1/envs/{env['id']}/reset", json={}).status_code == 200
            step = api.post(f"/v1/envs/{env['id']}/step", json={"name": "bump", "arguments": {"by": by}}).json()
            assert step["reward"] == expected, step
    return str(sid)


def test_scenario_stats_as_json_and_as_a_table(runner: CliRunner, scenario_id: str, counter_env_id: str) -> None:
    stats = json.loads(run(runner, "scenarios", "stats", scenario_id, "--json").stdout)
    assert (stats["attempts"], stats["finished"], stats["passed"], stats["pass_rate"]) == (2, 2, 1, 0.5)
    assert [r["reward"] for r in stats["recent"]] == [0.0, 1.0]
    table = run(runner, "scenarios", "stats", scenario_id, "--recent", "1", "--kind", "training").stdout
    assert scenario_id in table and "0.5" in table and "training episodes" in table
    since = json.loads(run(runner, "scenarios", "stats", scenario_id, "--since", "2999-01-01", "--json").stdout)
    assert since["attempts"] == 0 and since["since"].startswith("2999-01-01T00:00:00")


def test_environment_stats_lists_every_scenario_with_full_ids(runner: CliRunner, scenario_id: str,
                                                              counter_env_id: str) -> None:
    stats = json.loads(run(runner, "environments", "stats", counter_env_id, "--json").stdout)
    assert scenario_id in [row["scenario_id"] for row in stats["data"]] and stats["totals"]["finished"] >= 2
    narrow = CliRunner(env={**runner.env, "COLUMNS": "40"})  # ids are never cut, however narrow the terminal
    table = run(narrow, "environments", "stats", counter_env_id).stdout
    assert scenario_id in table and "all " in table


@pytest.mark.parametrize("args", [["--recent", "101"], ["--recent", "-1"], ["--since", "yesterday"],
                                  ["--kind", "bogus"]])
def test_bad_options_are_usage_errors(runner: CliRunner, scenario_id: str, args: list[str]) -> None:
    result = run(runner, "scenarios", "stats", scenario_id, *args, code=2)
    assert args[0] in result.output


def test_unknown_and_foreign_ids_are_refused(runner: CliRunner, server: Any, scenario_id: str) -> None:
    for args in (["scenarios", "stats", "scn_nope"], ["environments", "stats", "envr_nope"]):
        result = run(runner, *args, code=1)
        assert result.stderr.startswith("error: ") and "404" in result.stderr
    other = CliRunner(env={**runner.env, "SANDPIT_API_KEY": server.new_tenant("cli-stats-other")})
    assert "not found" in run(other, "scenarios", "stats", scenario_id, code=1).stderr
