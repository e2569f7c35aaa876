"""The benchmarks' steal sampler (``benchmarks/hoststat.py``): which windows count as the
VM's host taking the machine, which steps touch them, and that it reads this machine's
/proc/stat for real; the CPU speed probe (the best of its runs, this machine's model); the
sustained speed probe (every core loaded, in windows; its refusals and a worker that never
answers)."""

from __future__ import annotations

import os
import time

import pytest
from benchmark_modules import load

hoststat = load("hoststat")


def sampled(*windows: tuple[float, float, int, int]) -> object:
    sampler = hoststat.StealSampler()
    sampler.windows = list(windows)
    return sampler


def test_a_quarter_or_more_stolen_makes_a_steal_window() -> None:
    sampler = sampled((0.0, 0.1, 0, 20), (0.1, 0.2, 5, 20), (0.2, 0.3, 4, 20), (0.3, 0.4, 0, 0))
    assert sampler.steal_windows() == [(0.1, 0.2)]
    summary = sampler.summary()
    assert summary["steal_windows"] == 1 and summary["worst_window_pct"] == 25.0
    assert summary["steal_pct"] == round(100 * 9 / 60, 2)


def test_a_step_overlapping_any_part_of_a_steal_window_is_in_it() -> None:
    sampler = sampled((0.0, 0.1, 0, 20), (0.1, 0.2, 10, 20), (0.2, 0.3, 0, 20), (0.3, 0.4, 20, 20))
    assert sampler.overlaps(0.05, 0.1)  # ends where one starts
    assert sampler.overlaps(0.15, 0.16) and sampler.overlaps(0.0, 1.0)
    assert not sampler.overlaps(0.21, 0.29) and not sampler.overlaps(0.0, 0.09)
    assert sampler.overlaps(0.35, 0.5) and not sampler.overlaps(0.41, 0.5)


def test_no_windows_no_steal() -> None:
    sampler = sampled()
    assert not sampler.overlaps(0.0, 10.0)
    assert sampler.summary()["steal_pct"] is None


def test_it_samples_this_machine() -> None:
    sampler = hoststat.StealSampler(interval_s=0.02).start()
    time.sleep(0.2)
    sampler.stop()
    assert len(sampler.windows) >= 3
    assert all(total >= steal >= 0 and end > start for start, end, steal, total in sampler.windows)


def test_the_kernel_threads_are_found_by_name_among_kthreadd_children_only() -> None:
    softirq = hoststat.kernel_threads(("ksoftirqd",))
    assert sorted(softirq.values()) == sorted(f"ksoftirqd/{cpu}" for cpu in range(len(softirq)))
    assert len(softirq) >= 1
    assert hoststat.kernel_threads(("kthreadd",)) == {}  # pid 2 itself is no child of itself
    assert hoststat.kernel_threads(("python",)) == {}  # user processes never count


def test_kernel_thread_windows_count_as_busy_from_a_quarter_of_the_machine() -> None:
    sampler = hoststat.KernelThreadSampler(prefixes=("ksoftirqd",))
    sampler.windows = [(0.0, 0.1, 0, 20), (0.1, 0.2, 5, 20), (0.2, 0.3, 4, 20)]
    assert sampler.busy_windows() == [(0.1, 0.2)]
    assert sampler.overlaps(0.15, 0.16) and not sampler.overlaps(0.21, 0.29)
    summary = sampler.summary()
    assert summary["cpu_pct"] == 15.0 and summary["busy_windows"] == 1 and summary["worst_window_pct"] == 25.0


def test_the_kernel_thread_sampler_reads_this_machine() -> None:
    sampler = hoststat.KernelThreadSampler(prefixes=("ksoftirqd",), interval_s=0.02).start()
    time.sleep(0.2)
    sampler.stop()
    summary = sampler.summary()
    assert len(sampler.windows) >= 3 and summary["cpu_pct"] is not None
    assert set(summary["cpu_s_by_thread"]) == set(sampler.threads.values())
    assert all(seconds >= 0 for seconds in summary["cpu_s_by_thread"].values())
    assert all(state in ("on", "off") for state in summary["damon"])


def test_cpu_speed_is_the_best_of_its_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.05, 1.0, 1.02, 2.0, 2.04])  # three runs: 50, 20 and 40 ms
    monkeypatch.setattr(hoststat.time, "perf_counter", lambda: next(clock))
    speed = hoststat.cpu_speed(runs=3)
    assert speed["python_mips"] == round(hoststat.SPEED_LOOP / 0.02 / 1e6, 2)


def test_cpu_speed_of_this_machine() -> None:
    speed = hoststat.cpu_speed(runs=2)
    assert speed["python_mips"] > 0
    with open("/proc/cpuinfo") as handle:
        named = any(line.startswith("model name") for line in handle)
    assert (speed["cpu_model"] is not None) == named


def test_cpu_speed_needs_a_run() -> None:
    for runs in (0, -1):
        with pytest.raises(ValueError, match="runs"):
            hoststat.cpu_speed(runs=runs)


def test_sustained_speed_loads_every_worker_for_its_windows() -> None:
    speed = hoststat.sustained_speed(seconds=0.3, window_s=0.1, workers=2)
    assert speed["sustained_workers"] == 2 and speed["sustained_s"] == 0.3
    assert 4 <= speed["sustained_windows"] <= 8  # 3 windows per worker, the last one may spill over
    assert 0 < speed["sustained_mips_p10"] <= speed["sustained_mips_p50"]
    assert hoststat.sustained_speed(seconds=0.1, window_s=0.1)["sustained_workers"] == os.cpu_count()


def test_sustained_speed_refuses_what_it_cannot_time() -> None:
    for seconds, window_s, workers in ((0, 0.1, 1), (-1.0, 0.1, 1), (1.0, 0, 1), (0.1, 0.2, 1), (1.0, 0.1, 0),
                                       (float("nan"), 0.1, 1)):
        with pytest.raises(ValueError, match="sustained_speed"):
            hoststat.sustained_speed(seconds=seconds, window_s=window_s, workers=workers)


def test_sustained_speed_gives_up_on_a_worker_that_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(seconds: float, window_s: float) -> list[float]:
        raise SystemExit(3)  # a worker that ends without its windows (the fork inherits this patch)

    monkeypatch.setattr(hoststat, "_window_rates", dies)
    monkeypatch.setattr(hoststat, "SUSTAINED_GRACE_S", 0.5)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="sent nothing"):
        hoststat.sustained_speed(seconds=0.1, window_s=0.1, workers=2)
    assert time.monotonic() - started < 5
