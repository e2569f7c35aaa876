""":class:`sandpit.api.http.spare_cpu.SpareCpu` on a ``/proc/stat`` written by the test and a
clock it moves: an interval's idle CPU time decides, the time steps spent polling counts
as idle, and what cannot be read or parsed never lets a step poll."""

from __future__ import annotations

import os
from pathlib import Path

from sandpit.api.http.spare_cpu import SpareCpu

HZ = os.sysconf("SC_CLK_TCK")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write_stat(path: Path, idle_s: float, iowait_s: float = 0.0) -> None:
    """A ``/proc/stat`` whose totals line says ``idle_s`` and ``iowait_s`` seconds."""
    path.write_text(f"cpu  4807753 24784 1480652 {round(idle_s * HZ)} {round(iowait_s * HZ)} 0 41942 276114 0 0\n"
                    "cpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2 3\n")


def test_an_interval_with_half_a_cpu_idle_or_more_has_one_to_spare(tmp_path: Path) -> None:
    stat, clock = tmp_path / "stat", Clock()
    write_stat(stat, 1000.0)
    cpu = SpareCpu(str(stat), sample_s=0.25, min_idle_cpus=0.5, clock=clock)
    assert not cpu.spare()  # nothing measured yet
    clock.now += 1.0
    write_stat(stat, 1000.6, 0.1)  # 0.7 CPU-seconds idle or waiting in 1 s
    assert cpu.spare()
    clock.now += 0.1  # within the interval: the last answer stands, nothing is read
    write_stat(stat, 1000.6, 0.1)
    assert cpu.spare()
    clock.now += 1.0
    write_stat(stat, 1000.9, 0.1)  # 0.3 in the next second
    assert not cpu.spare()


def test_time_spent_polling_counts_as_idle(tmp_path: Path) -> None:
    stat, clock = tmp_path / "stat", Clock()
    write_stat(stat, 50.0)
    cpu = SpareCpu(str(stat), sample_s=0.25, min_idle_cpus=0.5, clock=clock)
    clock.now += 1.0
    write_stat(stat, 50.2)
    cpu.spun(0.4)  # 0.2 idle + 0.4 of this process's own polling
    cpu.spun(-5.0)  # nonsense is not counted
    assert cpu.spare()
    clock.now += 1.0
    write_stat(stat, 50.4)  # the polling counted once: 0.2 this time
    assert not cpu.spare()


def test_what_cannot_be_read_never_has_a_cpu_to_spare(tmp_path: Path) -> None:
    clock = Clock()
    missing = SpareCpu(str(tmp_path / "absent"), clock=clock)
    clock.now += 10
    assert not missing.spare()
    for text in ("", "intr 1 2 3 4 5 6\n", "cpu 1 2 3\n", "cpu a b c d e f g\n", "\x00\xff garbage"):
        stat = tmp_path / "stat"
        write_stat(stat, 10.0)
        cpu = SpareCpu(str(stat), clock=clock)
        clock.now += 10
        stat.write_text(text)
        assert not cpu.spare(), text
        write_stat(stat, 100.0)  # readable again: measured from the next interval on
        clock.now += 10
        assert not cpu.spare()  # the interval before had no reading to start from
        clock.now += 10
        write_stat(stat, 200.0)
        assert cpu.spare()
