"""The parity run's host side without a server: reading a release directory (the demo's own
and hostile ones) and comparing two runs of an episode. Nothing here runs environment code:
the release is read as data."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from sandpit.importers.envscaler_files import RawRecord, scenario_record
from sandpit.importers.envscaler_parity import ReleaseError, Totals, compare, load_release
from sandpit.sandbox_images import DEFINITION_DIR

RELEASE = DEFINITION_DIR / "envscaler" / "release"


def test_the_demo_release_is_a_dozen_scenarios_over_three_environments() -> None:
    release = load_release(RELEASE)
    assert sorted(release.environments) == ["env_clinic_001", "env_library_002", "env_warehouse_003"]
    assert release.shape == "list" and len(release.scenarios) == len(release.episodes) == 12
    assert all(not e.record.problems and e.record.tools for e in release.environments.values())
    raw = json.loads((RELEASE / "environments.json").read_text())
    assert isinstance(raw[0]["tools"], str) and isinstance(raw[1]["constraints_rules"], str)  # JSON text fields
    assert release.environments["env_clinic_001"].raw_tools == json.loads(raw[0]["tools"])
    for episode in release.episodes:
        scenario = release.scenarios[episode.task_id]
        assert not scenario.problems and 2 <= len(scenario.checklist_with_func) <= 5
        environment, why = release.environment_of(scenario)
        assert environment is not None, why
        assert episode.seed == 20250310 and episode.note
    warehouse = [s for s in release.scenarios.values() if s.env_ref == 2]
    assert len(warehouse) == 2  # env_id as an index into the list, as EnvScaler's scenarios have it
    assert {release.environment_of(s)[0].record.class_name for s in warehouse  # type: ignore[union-attr]
            } == {"WarehouseInventorySystem"}
    assert sum(len(s.checklist_with_func) for s in release.scenarios.values()) == 32
    assert (RELEASE / "environments.json").stat().st_size + (RELEASE / "rl_scenarios.json").stat().st_size < 100_000


def test_an_env_id_out_of_range_is_a_reason() -> None:
    release = load_release(RELEASE)
    for ref, why in ((3, "env_id 3 matches no record"), ("env_nope", "env_id 'env_nope' matches no record"),
                     (True, "env_id must be text or an integer, got bool"), (1.5, "got float")):
        scenario = scenario_record(RawRecord(0, None, {"env_id": ref, "task": "t", "init_config": {}}))
        environment, reason = release.environment_of(scenario)
        assert environment is None and reason is not None and why in reason


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(RELEASE, tmp_path / "release")
    return tmp_path / "release"


@pytest.mark.parametrize(("line", "message"), [
    ("[1, 2]", "expected an object with task_id and outputs, got list"),
    ('{"task_id": "t", "outputs": []}', "outputs must be a non-empty list of strings"),
    ('{"task_id": "t", "outputs": "text"}', "outputs must be a non-empty list of strings"),
    ('{"task_id": " ", "outputs": ["a"]}', "task_id must be non-empty text"),
    ('{"task_id": "t", "outputs": ["a"], "seed": -1}', "seed must be an integer in [0, 2**64)"),
    ('{"task_id": "t", "outputs": ["a"], "seed": 18446744073709551616}', "seed must be an integer"),
    ('{"task_id": "t", "outputs": ["a"], "note": 3}', "note must be text"),
    ('{"task_id": "t", "outputs": ["a"]' + ', "x": [' * 100_000, "is not JSON"),
    ('{"task_id": "t", "outputs": [' + '"a", ' * 1000 + '"a"]}', "1001 outputs; at most 1000"),
])
def test_hostile_episode_lines_name_their_line(tmp_path: Path, line: str, message: str) -> None:
    release = _copy(tmp_path)
    first = (release / "episodes.jsonl").read_text().splitlines()[0]
    (release / "episodes.jsonl").write_text(first + "\n\n" + line + "\n")
    with pytest.raises(ReleaseError) as caught:
        load_release(release)
    assert "episodes.jsonl:3" in str(caught.value) and message in str(caught.value)


def test_undecodable_episodes_file(tmp_path: Path) -> None:
    release = _copy(tmp_path)
    (release / "episodes.jsonl").write_bytes(b'{"task_id": "\xff"}\n')
    with pytest.raises(ReleaseError, match="episodes.jsonl"):
        load_release(release)


def _run(*steps: tuple[str, str, bool, float]) -> dict[str, Any]:
    return {"introduction": "# Environment Information", "tools": [{"type": "function"}],
            "observation": {"type": "user", "content": "Do it."},
            "steps": [{"observation": o, "role": r, "terminated": t, "reward": w} for o, r, t, w in steps]}


def test_compare_names_the_first_difference() -> None:
    gem = _run(("{'success': True}", "tool", False, 0.0), ("Task finished", "user", True, 0.5))
    assert compare(gem, copy.deepcopy(gem)) == (None, 3 + 2 * 4)
    other = copy.deepcopy(gem)
    other["steps"][1]["reward"] = 0.6667
    assert compare(gem, other) == ("step 2 reward: GEM '0.5', reference '0.6667'", 3 + 4 + 3)
    other = copy.deepcopy(gem)
    other["steps"][0]["role"] = "user"
    assert compare(gem, other)[0] == "step 1 role: GEM 'tool', reference 'user'"
    other = copy.deepcopy(gem)
    other["introduction"] += "\n- a rule"
    assert str(compare(gem, other)[0]).startswith("introduction: GEM '# Environment Information', reference ")
    other = copy.deepcopy(gem)
    other["steps"].append({"observation": "x", "role": "tool", "terminated": False, "reward": 0.0})
    assert compare(gem, other) == ("steps: GEM ran 2, reference 3", 11)
    other = copy.deepcopy(gem)
    other["steps"][0]["observation"] = "y" * 200
    difference = compare(gem, other)[0]
    assert difference is not None and difference.endswith("...'") and len(difference) < 250


def test_totals() -> None:
    assert Totals.of([]).to_dict() == {"episodes": 0, "equal": 0, "rewards_equal": 0, "gem_steps": 0,
                                       "reference_steps": 0, "gem_mean_reward": None, "reference_mean_reward": None}
