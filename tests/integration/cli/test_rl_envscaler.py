"""``sandpit import envscaler`` and ``sandpit rl envscaler`` on the demo's release
(``sandbox_images/envscaler/release``) against a real server (``sandpit serve``, real
sandboxes), through the ``sandpit`` app as ``scripts/demo`` runs it.

The release imports with nothing refused; every recorded episode, run through the GEM env
under the ``envscaler`` profile and through EnvScaler's rules in a sandbox, agrees step by
step, with the rewards the episodes were written to earn; with another seed too. An
episode whose task has no scenario, or whose scenario changed since the import, is a row
with the reason and exit code 1; a release directory that cannot be read is exit code 2
naming the file (and line).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_runs import run
from sandpit.sandbox_images import DEFINITION_DIR
from typer.testing import CliRunner

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

RELEASE = DEFINITION_DIR / "envscaler" / "release"
REWARDS = {
    "clinic_book_cardiology": 1.0, "clinic_reschedule_and_book": 0.6667, "clinic_cancel_unknown": 0.0,
    "clinic_dermatology_after_parse_errors": 1.0, "library_return_pay_checkout": 1.0,
    "library_fine_and_renewal": 0.6667, "library_suspended_member": 0.0, "library_late_return_date": 0.0,
    "warehouse_ship_from_one_location": 1.0, "warehouse_consolidate_then_ship": 1.0,
    "warehouse_ship_and_stock_take": 0.5, "warehouse_stock_take_corrections": 1.0,
}
"""What each recorded episode was written to earn (the release's episodes.jsonl notes say why)."""


@pytest.fixture(scope="module")
def imported(runner: CliRunner, server: Any) -> dict[str, Any]:
    """The demo's import of the release (its --json report)."""
    result = run(runner, "import", "envscaler", "--url", server.url, "--envs", str(RELEASE / "environments.json"),
                 "--scenarios", str(RELEASE / "rl_scenarios.json"), "--json")
    return dict(json.loads(result.stdout))


def test_the_release_imports_with_nothing_refused(imported: dict[str, Any]) -> None:
    assert imported["counts"] == {"environment": {"imported": 3, "reused": 0, "refused": 0},
                                  "scenario": {"imported": 12, "reused": 0, "refused": 0}}
    assert imported["file_errors"] == []
    assert all(not item["reasons"] and not item["notes"] for item in imported["items"]), imported["items"]
    assert sorted(i["key"] for i in imported["items"] if i["kind"] == "scenario") == sorted(REWARDS)


def test_every_episode_agrees_with_envscalers_rules(runner: CliRunner, imported: dict[str, Any]) -> None:
    out = json.loads(run(runner, "rl", "envscaler", str(RELEASE), "--json").stdout)
    episodes = {e["task_id"]: e for e in out["episodes"]}
    assert [e["task_id"] for e in out["episodes"]] == list(REWARDS)
    for task_id, episode in episodes.items():
        assert episode["equal"] and episode["rewards_equal"], episode
        assert episode["gem_reward"] == episode["reference_reward"] == REWARDS[task_id], episode
        assert episode["gem_steps"] == episode["reference_steps"] == len(episode["steps"])
        assert episode["scenario_id"] in {i["sandpit_id"] for i in imported["items"]}
    assert out["totals"] == {"episodes": 12, "equal": 12, "rewards_equal": 12, "gem_steps": 42,
                             "reference_steps": 42, "gem_mean_reward": 0.6528, "reference_mean_reward": 0.6528}
    # what the episodes cover, as the agent saw it
    seen = [s["observation"] for e in out["episodes"] for s in e["steps"]]
    assert seen.count("Error: Failed to parse response to struct response") == 3
    assert seen.count("Error: Failed to parse response to action") == 1
    assert seen.count("Error: Invalid action") == 1
    assert seen.count("Task finished") == 9
    assert "4.5" in seen  # the private helper _compute_fine, called as a tool
    assert "Error: <Exception>\nTraceback (most recent call last):\nTypeError: 'dict' object is not callable\n" in seen
    raised = episodes["library_late_return_date"]["steps"][0]
    assert raised["terminated"] and raised["role"] == "user" and "in _compute_fine" in raised["observation"]
    assert raised["observation"].endswith("ValueError: time data 'March 14th, 2025' does not match format "
                                          "'%Y-%m-%d'\n")
    shipped = episodes["warehouse_ship_from_one_location"]["steps"][3]["observation"]
    assert "'shipment_id': 'SHP-46234'" in shipped  # the constructor's random draw after reset(seed=20250310)
    early = episodes["warehouse_ship_and_stock_take"]
    assert len(early["steps"]) == 2 and early["steps"][-1]["terminated"]  # the reply ended it; the last output unsent


def test_the_table_with_another_seed(runner: CliRunner, imported: dict[str, Any]) -> None:
    result = run(runner, "rl", "envscaler", str(RELEASE), "--seed", "7")
    assert "12 of 12 episodes equal" in result.stderr
    table = result.stdout
    assert "GEM env (envscaler profile) vs EnvScaler's rules in a sandbox" in table
    assert "warehouse_ship_from_one_location" in table and "12/12" in table and "mean 0.6528" in table


def _copy(tmp_path: Path) -> Path:
    release = tmp_path / "release"
    shutil.copytree(RELEASE, release)
    return release


def _lines(release: Path) -> dict[str, str]:
    return {json.loads(line)["task_id"]: line for line in (release / "episodes.jsonl").read_text().splitlines()}


def test_unknown_and_changed_tasks_are_reported(runner: CliRunner, imported: dict[str, Any], tmp_path: Path) -> None:
    release = _copy(tmp_path)
    scenarios = json.loads((release / "rl_scenarios.json").read_text())
    for scenario in scenarios:
        if scenario["task_id"] == "library_late_return_date":
            scenario["task"] += " Thanks!"  # no longer the imported scenario
    (release / "rl_scenarios.json").write_text(json.dumps(scenarios))
    lines = _lines(release)
    (release / "episodes.jsonl").write_text("\n".join([
        lines["clinic_cancel_unknown"], lines["library_late_return_date"],
        json.dumps({"task_id": "no_such_task", "outputs": ["Hello"]})]) + "\n")
    out = json.loads(run(runner, "rl", "envscaler", str(release), "--json", code=1).stdout)
    ok, changed, unknown = out["episodes"]
    assert ok["equal"] and ok["gem_reward"] == 0.0
    assert not changed["equal"] and changed["error"].startswith("not imported: no scenario of this task")
    assert changed["gem_steps"] == 0 and changed["gem_reward"] is None
    assert not unknown["equal"] and unknown["error"] == "no scenario with this task_id in rl_scenarios.json"
    assert out["totals"]["equal"] == 1 and out["totals"]["episodes"] == 3
    table = run(runner, "rl", "envscaler", str(release), code=1)
    assert "1 of 3 episodes equal" in table.stderr
    assert "no scenario with this task_id in" in table.stdout and "not imported" in table.stdout


def test_a_changed_environment_record_is_not_the_imported_one(runner: CliRunner, imported: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """An environment record that no longer matches what was imported (another rule) is
    not run against the old registration (comparisons: tests/unit/importers)."""
    release = _copy(tmp_path)
    environments = json.loads((release / "environments.json").read_text())
    environments[0]["constraints_rules"].append("One more rule.")  # the imported clinic has three rules
    (release / "environments.json").write_text(json.dumps(environments))
    lines = _lines(release)
    (release / "episodes.jsonl").write_text(lines["clinic_book_cardiology"] + "\n")
    out = json.loads(run(runner, "rl", "envscaler", str(release), "--json", code=1).stdout)
    assert out["episodes"][0]["error"].startswith("not imported")


def test_a_refused_api_key_is_exit_1(runner: CliRunner, imported: dict[str, Any]) -> None:
    result = run(runner, "rl", "envscaler", str(RELEASE), "--api-key", "sk-not-a-key", code=1)
    assert result.stderr.startswith("error: ") and result.stdout == ""


@pytest.mark.parametrize(("change", "message"), [
    ("no_dir", "is not a directory"),
    ("no_files", "has no environments.json, rl_scenarios.json, episodes.jsonl"),
    ("no_episodes", "has no episodes.jsonl"),
    ("not_json_line", "episodes.jsonl:2 is not JSON"),
    ("outputs_not_text", "episodes.jsonl:1: outputs must be a non-empty list of strings"),
    ("seed_not_int", "episodes.jsonl:1: seed must be an integer"),
    ("no_task_id", "episodes.jsonl:1: task_id must be non-empty text"),
    ("empty_episodes", "has no episodes"),
    ("environments_not_json", "environments.json: expected a JSON list of records"),
    ("scenarios_malformed", "rl_scenarios.json: not JSON"),
])
def test_a_release_that_cannot_be_read_is_exit_2(runner: CliRunner, tmp_path: Path, change: str, message: str) -> None:
    release = _copy(tmp_path)
    episodes = release / "episodes.jsonl"
    first = json.loads(episodes.read_text().splitlines()[0])
    if change == "no_dir":
        release = tmp_path / "nowhere"
    elif change == "no_files":
        release = tmp_path / "empty"
        release.mkdir()
    elif change == "no_episodes":
        episodes.unlink()
    elif change == "not_json_line":
        episodes.write_text(json.dumps(first) + "\n{not json\n")
    elif change == "outputs_not_text":
        episodes.write_text(json.dumps({**first, "outputs": [{"name": "get_patient_by_name"}]}) + "\n")
    elif change == "seed_not_int":
        episodes.write_text(json.dumps({**first, "seed": True}) + "\n")
    elif change == "no_task_id":
        episodes.write_text(json.dumps({"outputs": ["hi"]}) + "\n")
    elif change == "empty_episodes":
        episodes.write_text("\n\n")
    elif change == "environments_not_json":
        (release / "environments.json").write_text("env_id,env_class_name\n")
    elif change == "scenarios_malformed":
        (release / "rl_scenarios.json").write_text('[{"task_id": "t1", "env_id": ')
    result = run(runner, "rl", "envscaler", str(release), code=2)
    assert "Invalid value for RELEASE_DIR" in result.stderr
    assert message.replace(" ", "") in re.sub(r"[\s│]", "", result.stderr), result.stderr  # rich boxes and wraps it
