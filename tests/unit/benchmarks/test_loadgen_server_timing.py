"""Reading a step reply's ``Server-Timing`` total (``benchmarks/loadgen.py``:
``server_total_ms``), the value a step's reply carries (``StepClock.server_timing``) and
headers that are missing, malformed or hostile."""

from __future__ import annotations

import pytest
from benchmark_modules import load
from sandpit.api.metrics import StepClock

loadgen = load("loadgen")


def test_a_step_clocks_value_reads_back_as_its_total() -> None:
    clock = StepClock()
    clock.wall = {"auth": 0.0000214, "sandbox": 0.0005123, "persist": 0.00024}
    value = clock.server_timing(0.0009016).decode("ascii")
    assert value == "auth;dur=0.021, sandbox;dur=0.512, persist;dur=0.240, total;dur=0.902"
    assert loadgen.server_total_ms(value) == pytest.approx(0.902)
    assert clock.server_timing(12.5).endswith(b"total;dur=12500.000")


@pytest.mark.parametrize(("value", "total"), [
    ("total;dur=3.5", 3.5),
    ("sandbox;dur=1, total;desc=\"all\";dur=2.25", 2.25),  # other parameters before dur
    ("  total ; dur=7 ", 7.0),
    (None, None),
    ("", None),
    ("sandbox;dur=1.0", None),  # no total
    ("total", None),  # no duration
    ("total;dur=", None),
    ("total;dur=fast", None),
    ("totally;dur=1", None),
    (",,,;;;==", None),
    ("total;dur=" + "9" * 400, float("9" * 400)),
])
def test_missing_malformed_and_hostile_values(value: str | None, total: float | None) -> None:
    assert loadgen.server_total_ms(value) == total
