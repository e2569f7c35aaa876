"""The load generator's think times (``benchmarks/loadgen.py``: ``pauses``): fixed without
jitter, uniform within the jitter around the mean with it, the same draws for the same
seed, and a clear error for a jitter or think time that makes no sense."""

from __future__ import annotations

import itertools
import statistics

import pytest
from benchmark_modules import load

loadgen = load("loadgen")


def drawn(think_s: float, jitter: float, seed: int, n: int = 2000) -> list[float]:
    return list(itertools.islice(loadgen.pauses(think_s, jitter, seed), n))


def test_without_jitter_every_pause_is_the_think_time() -> None:
    assert set(drawn(2.0, 0.0, 7, 50)) == {2.0}


def test_jittered_pauses_stay_in_range_average_the_think_time_and_spread_out() -> None:
    pauses = drawn(2.0, 0.5, 3)
    assert min(pauses) >= 1.0 and max(pauses) <= 3.0
    assert statistics.fmean(pauses) == pytest.approx(2.0, abs=0.05)
    assert min(pauses) < 1.1 and max(pauses) > 2.9  # the whole range, not a constant
    assert len(set(pauses)) == len(pauses)


def test_a_seed_draws_the_same_pauses_and_clients_differ() -> None:
    assert drawn(2.0, 0.5, 11, 20) == drawn(2.0, 0.5, 11, 20)
    assert drawn(2.0, 0.5, 11, 20) != drawn(2.0, 0.5, 12, 20)


@pytest.mark.parametrize(("think_s", "jitter"), [(2.0, 1.0), (2.0, -0.1), (2.0, float("nan")), (-1.0, 0.0)])
def test_a_jitter_outside_zero_to_one_or_a_negative_think_time_is_refused(think_s: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="jitter"):
        next(loadgen.pauses(think_s, jitter, 0))
