"""The density benchmark's per-window tail (``benchmarks/density.py``: ``_by_window``): steps
grouped by the window of the run they started in, windows in order and named by their
start, empty windows left out, a step on a boundary in the later window; and the host's
memory it records before the creates (``host_memory_mib``), read from this machine, and a
refused ``--drop-caches``; and the
steps that touched a sampler's busy windows counted apart from the others (``_beside``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_modules import load

density = load("density")


def test_steps_fall_in_the_window_they_started_in() -> None:
    started = 100.0
    timed = [(100.0, 1.0), (109.9, 2.0), (110.0, 3.0), (135.5, 4.0), (101.0, 5.0)]
    assert density._by_window(timed, started, 10.0) == [(0.0, [1.0, 2.0, 5.0]), (10.0, [3.0]), (30.0, [4.0])]


def test_no_steps_no_windows() -> None:
    assert density._by_window([], 0.0, 10.0) == []


def test_the_hosts_memory_is_read_from_this_machine() -> None:
    memory = density.host_memory_mib()
    total = density.meminfo()["MemTotal"] / 2**20
    assert set(memory) == {"available", "free", "page_cache", "reclaimable_slab"}
    assert 0 < memory["free"] <= total and 0 < memory["available"] <= total and 0 <= memory["page_cache"] <= total
    assert 0 <= memory["reclaimable_slab"] <= total


def test_caches_that_cannot_be_dropped_stop_the_run(tmp_path: Path) -> None:
    """A control file that cannot be written (here a directory; without root, the
    kernel's) stops the run with a clear message before it starts anything."""
    with pytest.raises(SystemExit, match="--drop-caches could not write"):
        density.drop_caches(tmp_path)


def test_steps_that_touch_a_busy_window_are_counted_apart() -> None:
    sampler = density.StealSampler()  # never started: its windows are given here
    sampler.windows = [(0.0, 0.1, 30, 100), (0.1, 0.2, 1, 100)]  # the first one is a quarter stolen or more
    beside = density._beside(sampler, [(0.05, 10.0), (0.15, 2.0), (0.12, 3.0)], "steal")
    assert beside["steps_in_steal_windows"] == 1 and beside["steal_windows"] == 1
    assert beside["step_ms_outside_steal_windows"]["n"] == 2 and beside["step_ms_outside_steal_windows"]["p99"] <= 3.0
    assert density._beside(sampler, [(0.05, 10.0)], "busy")["step_ms_outside_busy_windows"] is None
