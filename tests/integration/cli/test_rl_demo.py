"""``sandpit rl demo`` against a real server (``sandpit serve``, real sandboxes): the
scripted episodes through the gymnasium adapter, then the same scenarios through the MCP
door (the ``mcp`` SDK's client) and the OpenEnv door (``openenv-core``'s client), with
every door's reward printed beside the gymnasium run's and equal. The door runners record
a refused key or an unknown scenario as the run's error, never raise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_server import COUNTER_SOURCE
from cli_runs import run
from sandpit.rl_doors import mcp_episode, openenv_episode
from typer.testing import CliRunner
from waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n"
                                                     "    return final_state['count'] == 3\n"}]


@pytest.fixture(scope="module")
def scenarios(server: Any) -> list[str]:
    """Two scenarios of the counter: bring it to 3."""
    with server.client() as client:
        environment = client.post("/v1/environments", json={"name": "counter", "source_code": COUNTER_SOURCE,
                                                             "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        ids = []
        for start in (0, 1):
            scenario = client.post("/v1/scenarios", json={
                "environment_id": environment.json()["id"], "task": "Bring the counter to 3.",
                "init_config": {"count": start}, "checklist_with_func": CHECKS})
            assert scenario.status_code == 201, scenario.text
            ids.append(str(scenario.json()["id"]))
        return ids


def test_the_doors_earn_the_gymnasium_rewards(runner: CliRunner, scenarios: list[str], tmp_path: Path) -> None:
    replay = tmp_path / "replay.jsonl"
    bump = {"name": "bump", "arguments": {"by": 3}}
    replay.write_text("".join(json.dumps({"scenario_id": s, "tool_calls": [bump]}) + "\n" for s in scenarios))
    result = run(runner, "rl", "demo", str(replay), "--gem-episodes", "0", "--door-episodes", "2")
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:6]]
            for line in result.output.splitlines() if line.count("│") >= 6 and line.split("│")[1].strip() in scenarios}
    assert rows == {scenarios[0]: ["1.000", "1.000", "1.000", "yes"],  # 0 + 3
                    scenarios[1]: ["0.000", "0.000", "0.000", "yes"]}  # 1 + 3 is not 3


def test_a_door_records_its_failures(server: Any, scenarios: list[str]) -> None:
    action = [{"name": "bump", "arguments": {"by": 3}}]
    for episode in (mcp_episode, openenv_episode):
        refused = episode(server.url, "not-a-key", scenarios[0], action)
        unknown = episode(server.url, server.api_key, "scn-does-not-exist", action)
        for run_ in (refused, unknown):
            assert run_.error is not None and not run_.ended and run_.steps == 0, (episode.__name__, run_)
    with server.client() as client:  # no door leaves an env behind (an OpenEnv session's env goes when its socket does)
        wait_until(lambda: client.get("/v1/envs").json()["data"] == [], "every door's env deleted", timeout_s=30)
