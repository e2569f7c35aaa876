"""Scenario and environment statistics over HTTP on real sandboxes
(``GET /v1/scenarios/{id}/stats``, ``GET /v1/environments/{id}/stats``), through the
Python client too, and beside an evaluation's own figures in its summary: a few training
episodes and a replay evaluation with known rewards, then exact figures; hostile input
(another tenant's ids, ``recent`` out of bounds, a malformed ``since``, unknown ids and
kinds) gets a clear 4xx, never a 500.

The Counter environment and the checks below are untrusted code: they only run inside
sandboxes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sandpit.client import Client, NotFound

pytestmark = pytest.mark.docker

CHECKS = [{"check_item": "count is 3", "check_func": "def check_func(final_state):\n    return final_state['count'] == 3\n"},
          {"check_item": "one bump", "check_func": "def check_func(final_state):\n    return len(final_state['log']) == 1\n"}]
BUMP = {"name": "bump", "arguments": {"by": 2}}  # count 1 -> 3, one bump: reward 1.0
HALF = {"name": "bump", "arguments": {"by": 1}}  # count 1 -> 2, one bump: reward 0.5


def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def _episode(api: httpx.Client, env_id: str, action: dict[str, Any]) -> float:
    """One step of a one-step episode (``max_steps`` 1 truncates and scores it); its reward."""
    result = _ok(api.post(f"/v1/envs/{env_id}/step", json=action))
    assert result["truncated"], result
    return float(result["reward"])


@pytest.fixture(scope="module")
def scenario_id(server: Any, counter_env_id: str) -> str:
    """A Counter scenario whose episodes are one step long: four training episodes (rewards
    1.0, 0.5, 1.0 and one still running), then a replay evaluation of two (1.0, 0.5)."""
    with server.client() as api:
        sid = _ok(api.post("/v1/scenarios", json={
            "environment_id": counter_env_id, "task": "Bring the counter to 3 in one bump.",
            "init_config": {"count": 1}, "checklist_with_func": CHECKS}), 201)["id"]
        env_id = _ok(api.post("/v1/envs", json={"scenario_id": sid, "episode": {"max_steps": 1}}), 201)["id"]
        rewards = [_episode(api, env_id, BUMP)]
        for action in (HALF, BUMP):
            _ok(api.post(f"/v1/envs/{env_id}/reset", json={}))
            rewards.append(_episode(api, env_id, action))
        _ok(api.post(f"/v1/envs/{env_id}/reset", json={}))  # the fourth episode: started, never finished
        assert rewards == [1.0, 0.5, 1.0]
        job = _ok(api.post("/v1/evaluations", json={"mode": "replay", "episodes": [
            {"scenario_id": sid, "tool_calls": [BUMP]}, {"scenario_id": sid, "tool_calls": [HALF]}]}), 201)
        deadline = time.monotonic() + 90
        while _ok(api.get(f"/v1/evaluations/{job['id']}"))["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, "the evaluation did not finish"
            time.sleep(0.2)
    return sid


def test_a_scenarios_figures_are_exact(api: httpx.Client, scenario_id: str, counter_env_id: str) -> None:
    stats = _ok(api.get(f"/v1/scenarios/{scenario_id}/stats"))
    assert (stats["scenario_id"], stats["environment_id"], stats["kind"]) == (scenario_id, counter_env_id, "all")
    assert (stats["attempts"], stats["finished"], stats["passed"]) == (6, 5, 3)
    assert (stats["pass_rate"], stats["mean_reward"]) == (0.6, 0.8)
    assert sorted(r["reward"] for r in stats["recent"]) == [0.5, 0.5, 1.0, 1.0, 1.0]
    ends = [r["ended_at"] for r in stats["recent"]]
    assert ends == sorted(ends, reverse=True) and stats["last_ended_at"] == ends[0]
    training = _ok(api.get(f"/v1/scenarios/{scenario_id}/stats", params={"kind": "training", "recent": 2}))
    assert (training["attempts"], training["finished"], training["passed"]) == (4, 3, 2)
    assert [r["reward"] for r in training["recent"]] == [1.0, 0.5]  # newest first
    evaluation = _ok(api.get(f"/v1/scenarios/{scenario_id}/stats", params={"kind": "evaluation", "recent": 0}))
    assert (evaluation["attempts"], evaluation["finished"], evaluation["pass_rate"], evaluation["recent"]) == (
        2, 2, 0.5, [])
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    empty = _ok(api.get(f"/v1/scenarios/{scenario_id}/stats", params={"since": later}))
    assert (empty["attempts"], empty["pass_rate"], empty["mean_reward"], empty["recent"]) == (0, None, None, [])


def test_an_environment_has_totals_and_a_row_per_scenario(api: httpx.Client, scenario_id: str,
                                                         counter_env_id: str) -> None:
    other = _ok(api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "Nothing was run.",
                                                "checklist_with_func": CHECKS}), 201)["id"]
    stats = _ok(api.get(f"/v1/environments/{counter_env_id}/stats"))
    rows = {row["scenario_id"]: row for row in stats["data"]}
    assert stats["count"] == len(stats["data"]) >= 2 and {scenario_id, other} <= set(rows)
    assert rows[other]["attempts"] == 0 and rows[other]["pass_rate"] is None
    assert rows[scenario_id]["finished"] == 5
    totals = stats["totals"]
    assert totals["scenarios"] == stats["count"] and totals["finished"] >= 5 and totals["attempts"] >= 6
    page = _ok(api.get(f"/v1/environments/{counter_env_id}/stats", params={"limit": 1, "offset": 0}))
    assert [r["scenario_id"] for r in page["data"]] == [other] and page["totals"] == totals  # newest first


def test_the_client_reads_the_same_figures(server: Any, scenario_id: str, counter_env_id: str) -> None:
    with Client(server.url, api_key=server.api_key) as client:
        stats = client.scenarios.stats(scenario_id, kind="training", since=datetime(2000, 1, 1), recent=5)
        assert (stats.attempts, stats.finished, stats.passed, stats.mean_reward) == (4, 3, 2, 0.8333)
        assert [r.kind for r in stats.recent] == ["training"] * 3
        whole = client.environments.stats(counter_env_id, limit=10)
        assert scenario_id in [row.scenario_id for row in whole.data]
        with pytest.raises(NotFound):
            client.scenarios.stats("scn_nope")


def test_the_evaluation_summary_shows_the_scenarios_overall_pass_rate(api: httpx.Client, scenario_id: str) -> None:
    jobs = _ok(api.get("/v1/evaluations"))["data"]
    job = _ok(api.get(f"/v1/evaluations/{jobs[0]['id']}"))
    row = job["summary"]["by_scenario"][scenario_id]
    assert (row["episodes"], row["success_rate"], row["mean_reward"]) == (2, 0.5, 0.75)
    assert (row["overall_pass_rate"], row["overall_finished"]) == (0.6, 5)


@pytest.mark.parametrize(("params", "field"), [
    ({"recent": 101}, "recent"), ({"recent": -1}, "recent"), ({"recent": "lots"}, "recent"),
    ({"since": "yesterday"}, "since"), ({"since": "0"}, "since"), ({"since": "0.5"}, "since"),
    ({"since": "nan"}, "since"), ({"since": "2026-13-45T99:00:00"}, "since"), ({"kind": "bogus"}, "kind"),
    ({"limit": 0}, "limit"),
])
def test_bad_query_parameters_are_422_naming_the_parameter(api: httpx.Client, scenario_id: str, counter_env_id: str,
                                                           params: dict[str, Any], field: str) -> None:
    paths = [f"/v1/environments/{counter_env_id}/stats"]
    if field != "limit":
        paths.append(f"/v1/scenarios/{scenario_id}/stats")
    for path in paths:
        response = api.get(path, params=params)
        assert response.status_code == 422, response.text
        assert field in response.text


def test_another_tenants_and_unknown_ids_are_404(server: Any, api: httpx.Client, scenario_id: str,
                                                 counter_env_id: str) -> None:
    key = server.new_tenant("stats-other")
    with server.client(api_key=key) as other:
        for path, unknown in ((f"/v1/scenarios/{scenario_id}/stats", "scn_000000000000000000000000"),
                              (f"/v1/environments/{counter_env_id}/stats", "envr_000000000000000000000000")):
            theirs = other.get(path)
            assert theirs.status_code == 404, theirs.text
            known = path.split("/")[3]
            missing = other.get(path.replace(known, unknown))
            assert theirs.text.replace(known, unknown) == missing.text  # the same answer: ids never leak
    for path in ("/v1/scenarios/scn_nope/stats", "/v1/environments/envr_nope/stats",
                 "/v1/scenarios/" + "x" * 5000 + "/stats"):
        response = api.get(path)
        assert response.status_code == 404, response.text


def test_a_deleted_envs_episodes_keep_counting(api: httpx.Client, counter_env_id: str) -> None:
    """Deleting an env (as an MCP or OpenEnv scenario session does when it ends) leaves the
    scenario's figures as they were."""
    sid = _ok(api.post("/v1/scenarios", json={
        "environment_id": counter_env_id, "task": "Bring the counter to 3 in one bump.",
        "init_config": {"count": 1}, "checklist_with_func": CHECKS}), 201)["id"]
    env_ids = []
    for action in (BUMP, HALF):
        env_ids.append(_ok(api.post("/v1/envs", json={"scenario_id": sid, "episode": {"max_steps": 1}}), 201)["id"])
        _episode(api, env_ids[-1], action)
    before = _ok(api.get(f"/v1/scenarios/{sid}/stats"))
    assert (before["attempts"], before["finished"], before["passed"], before["mean_reward"]) == (2, 2, 1, 0.75)
    for env_id in env_ids:
        assert api.delete(f"/v1/envs/{env_id}").status_code == 204
        assert api.get(f"/v1/envs/{env_id}").status_code == 404
    assert _ok(api.get(f"/v1/scenarios/{sid}/stats")) == before
