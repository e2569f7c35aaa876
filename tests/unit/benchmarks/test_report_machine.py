"""What ``benchmarks/report.py`` records of the machine in ``report.json``: the sitting's
record survives printing the table again without ``--run``; a run records the machine
now with its probes; a missing or malformed record gives the machine now."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmark_modules import load

report = load("report")

SITTING: dict[str, Any] = {
    "cpus": 2, "platform": "Linux-test", "python": "3.11.7", "python_mips": 18.7, "cpu_model": "sitting's CPU",
    "sustained": [{"before": "deltas", "sustained_mips_p50": 18.1, "sustained_mips_p10": 16.0}],
}
PROBES = [{"before": "api", "sustained_mips_p50": 10.5, "sustained_mips_p10": 9.8},
          {"before": None, "sustained_mips_p50": 11.0, "sustained_mips_p10": 10.1}]


@pytest.fixture
def results(tmp_path: Path) -> Iterator[Path]:
    """``report`` reading and writing its results in ``tmp_path``."""
    before, report.RESULTS = report.RESULTS, tmp_path
    try:
        yield tmp_path
    finally:
        report.RESULTS = before


def test_printing_again_keeps_the_sittings_record(results: Path) -> None:
    (results / "report.json").write_text(json.dumps({"machine": SITTING, "rows": []}))
    assert report.sitting_machine([]) == SITTING


def test_a_run_records_the_machine_now_with_its_probes(results: Path) -> None:
    (results / "report.json").write_text(json.dumps({"machine": SITTING, "rows": []}))
    machine = report.sitting_machine(PROBES)
    assert machine["sustained"] == PROBES
    assert machine["cpu_model"] != "sitting's CPU" and machine["python_mips"] > 0
    assert machine["platform"] != "Linux-test"


@pytest.mark.parametrize("saved", [None, "not JSON {", "[1, 2]", json.dumps({"rows": []}),
                                   json.dumps({"machine": "fast"}), json.dumps({"machine": {"cpus": 2}})],
                         ids=["missing", "not-json", "a-list", "no-machine", "machine-not-an-object",
                              "machine-without-speed"])
def test_without_a_usable_record_the_machine_now_is_recorded(saved: str | None, results: Path) -> None:
    if saved is not None:
        (results / "report.json").write_text(saved)
    machine = report.sitting_machine([])
    assert machine["python_mips"] > 0 and "sustained" not in machine
    assert machine["cpu_model"] != "sitting's CPU"
