"""The performance table's batched-step rows (``benchmarks/report.py``) from a saved
``batch_step.json``: the targets' verdicts, the CPU bound and how much of it the batches
reached, and files saved before those figures existed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmark_modules import load, report_rows

report = load("report")

SAVED: dict[str, Any] = {
    "machine": {"cpus": 2, "python_mips": 4.5},
    "envs": 32,
    "call_slots": 32,
    "env_steps_per_s": {"batched": 1745.0, "single": 530.0},
    "batched_vs_single": 3.29,
    "cpu_ms_per_env_step": {"batched": {"server": 0.4, "sandboxes": 0.45}, "single": {"server": 1.6, "sandboxes": 0.6}},
    "cpu_bound_env_steps_per_s": 2352.9,
    "of_cpu_bound": 0.742,
    "latency_ms": {"batch_of_n": {"p50": 18.3}, "single_step": {"p50": 55.1}},
}


def rows_of(saved: dict[str, Any], tmp_path: Path) -> list[dict[str, Any]]:
    return report_rows(report, tmp_path, "batch_step", saved, report._batch_rows)


def test_the_rate_row_names_the_cpu_bound_and_the_share_reached(tmp_path: Path) -> None:
    rate, ratio = rows_of(SAVED, tmp_path)
    assert (rate["measured"], rate["met"]) == (1745.0, False)
    assert "server 0.40 ms, sandboxes 0.45 ms" in rate["anchor"]
    assert "bounds the rate at 2353 env-steps/s (74% of it reached)" in rate["anchor"]
    assert "4.5 Python MIPS" in rate["anchor"]
    assert (ratio["measured"], ratio["met"]) == (3.29, True)


def test_a_file_saved_before_the_bound_existed_still_makes_its_rows(tmp_path: Path) -> None:
    old = {key: value for key, value in SAVED.items()
           if key not in ("cpu_bound_env_steps_per_s", "of_cpu_bound", "cpu_ms_per_env_step", "machine")}
    old["env_steps_per_s"] = {"batched": 3100.0, "single": 990.0}
    rate, ratio = rows_of(old, tmp_path)
    assert (rate["measured"], rate["met"]) == (3100.0, True)
    assert "bounds" not in rate["anchor"] and "MIPS" not in rate["anchor"]
    assert ratio["met"] is True
