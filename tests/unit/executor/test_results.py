"""What a timed-out call's measurements say (:func:`sandpit.executor.results.starved`) and
how the session reads a runner's measurements (:func:`sandpit.executor.pool.session._measure`)."""

from __future__ import annotations

import math

import pytest
from sandpit.executor.pool.session import _measure
from sandpit.executor.results import CallResult, starved

LIMIT_S = 10.0


@pytest.mark.parametrize(("cpu_ms", "wait_ms", "cpus", "expected", "what"), [
    (9_900, 50, 1.0, False, "a loop with its CPU to itself"),
    (4_950, 5_000, 0.5, False, "a loop throttled by its own half-CPU quota"),
    (1_000, 9_000, 1.0, True, "runnable, the CPU taken by the host's other work"),
    (1_000, 7_900, 0.5, True, "starved beyond its own quota's throttling"),
    (2_000, 7_000, 0.5, False, "waits no more than its own quota explains"),
    (5, 10, 1.0, False, "a sleep: little CPU, no wait"),
    (5, 10, 0.25, False, "a sleep under a quarter-CPU quota"),
    (3_000, 7_000, 1.0, True, "under half its CPU, waited 70 % of the limit"),
    (5_100, 4_900, 1.0, False, "over half its CPU: it computed"),
    (100, 9_000, 4.0, True, "a quota above one CPU counts as one (a single-threaded process)"),
])
def test_starved(cpu_ms: float, wait_ms: float, cpus: float, expected: bool, what: str) -> None:
    assert starved(cpu_ms, wait_ms, LIMIT_S, cpus) is expected, what


def test_no_measurement_is_not_starvation() -> None:
    assert not starved(None, 9_000, LIMIT_S, 1.0)
    assert not starved(100, None, LIMIT_S, 1.0)
    assert not starved(100, 9_000, 0.0, 1.0)


@pytest.mark.parametrize("hostile", [math.nan, math.inf, -1, -0.5, True, "9000", None, [1], 86_400_000, 1e300])
def test_a_runners_measurement_out_of_range_is_dropped(hostile: object) -> None:
    assert _measure(hostile) is None


def test_a_runners_measurement_in_range_is_kept() -> None:
    assert _measure(0) == 0.0
    assert _measure(1234.5) == 1234.5


def test_a_call_result_defaults_to_no_platform_fault() -> None:
    result = CallResult(status="timeout", observation="Error: ...", duration_ms=10.0)
    assert (result.sandbox_lost, result.starved, result.cpu_ms, result.wait_ms) == (False, False, None, None)
