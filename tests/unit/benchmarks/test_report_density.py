"""The performance table's density rows (``benchmarks/report.py``) from a saved
``density.json``: only a run of the target's shape (10,000 envs, 1,000 stepping) is judged
against the target; a smaller run's resident row says the target's run is missing, and its
step p99 is a detail row without a verdict, however low it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchmark_modules import load, report_rows

report = load("report")


def saved(envs: int, stepping: int, p99: float) -> dict[str, Any]:
    """A ``density.json`` of an API run of ``envs`` envs, ``stepping`` of them stepping."""
    return {
        "memory": {"forked_from_template": {"per_extra_session_mib": {"pss": 1.37}},
                   "spawned_as_before": {"per_extra_session_mib": {"pss": 5.1}}},
        "api": {"envs": envs, "stepping": stepping, "think_s": 2.0, "think_jitter": 0.5,
                "resident_after": envs, "restores_during_run": 0, "steps_per_s": 466.9,
                "step_ms": {"n": 29274, "p50": 14.8, "p99": p99}},
    }


def rows_of(data: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    return report_rows(report, tmp_path, "density", data, report._density_rows)


@pytest.mark.parametrize(("p99", "met"), [(28.9, True), (128.75, False), (50.0, True)])
def test_a_run_of_the_targets_shape_is_judged(p99: float, met: bool, tmp_path: Path) -> None:
    pss, resident, tail = rows_of(saved(10_000, 1_000, p99), tmp_path)
    assert (pss["measured"], pss["met"]) == (1.37, True)
    assert (resident["measured"], resident["met"]) == (10_000, True)
    assert "missing" not in resident["measure"]
    assert (tail["target"], tail["measured"], tail["met"]) == ("<= 50 ms", p99, met)
    assert tail["measure"].startswith("step p99, 1000 of 10000 envs stepping")


@pytest.mark.parametrize(("envs", "stepping"), [(1_000, 200), (10_000, 200), (2_000, 1_000)])
def test_a_smaller_run_is_not_met_and_its_tail_has_no_verdict(envs: int, stepping: int, tmp_path: Path) -> None:
    _, resident, tail = rows_of(saved(envs, stepping, 9.28), tmp_path)
    assert resident["met"] is False
    assert f"a run of {envs} envs, {stepping} stepping: the target's run of 10000 with 1000 stepping is missing" \
        in resident["measure"]
    assert (tail["target"], tail["met"]) == ("(detail)", None)
    assert tail["measured"] == 9.28


def test_a_run_that_restored_envs_is_not_met(tmp_path: Path) -> None:
    data = saved(10_000, 1_000, 30.0)
    data["api"]["restores_during_run"] = 3
    _, resident, _ = rows_of(data, tmp_path)
    assert resident["met"] is False and "(3 restores)" in resident["measure"]


def test_a_file_without_an_api_run_gives_only_the_memory_row(tmp_path: Path) -> None:
    data = saved(10_000, 1_000, 30.0)
    del data["api"]
    assert [row["measure"] for row in rows_of(data, tmp_path)] == [
        "PSS of an extra session (template fork)"]
