"""``sandpit eval``'s summary table (cli/eval_cli.py ``print_summary``): the failure
taxonomy's counts beside the rewards, with the kinds a trainer drops marked as masked."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sandpit.client.models import EvaluationJob
from sandpit.eval_cli import print_summary


def job(by_failure: dict[str, int]) -> EvaluationJob:
    return EvaluationJob.model_validate({
        "id": "evj_1", "mode": "replay", "status": "completed", "concurrency": 2, "total": 6,
        "progress": {"total": 6, "done": 5, "errors": 1, "running": 0, "pending": 0, "cancelled": 0,
                     "success": 2},
        "summary": {"episodes": 6, "scored": 5, "mean_reward": 0.5, "success_rate": 0.4,
                    "errors_by_status": {"env_error": 1}, "by_failure": by_failure},
        "created_at": datetime(2026, 1, 1, tzinfo=UTC)})


def test_failures_are_counted_and_the_masked_kinds_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(job({"none": 2, "agent": 1, "environment": 1, "infrastructure": 1, "verifier": 1}))
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in lines if line.count("│") == 3}
    assert rows["failure: agent"] == rows["failure: environment"] == "1"
    assert rows["failure: infrastructure (masked)"] == rows["failure: verifier (masked)"] == "1"
    assert "failure: none" not in rows


def test_no_failure_rows_without_failures(capsys: pytest.CaptureFixture[str]) -> None:
    print_summary(job({"none": 5, "agent": 0, "environment": 0, "infrastructure": 0, "verifier": 0}))
    assert "failure:" not in capsys.readouterr().out
