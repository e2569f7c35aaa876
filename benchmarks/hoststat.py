"""CPU time the hypervisor took from this machine (``steal`` in ``/proc/stat``) while a
benchmark ran, in windows, so a latency tail can be told apart from the VM's host
pausing the machine.

This project's machine is a Firecracker VM on a shared host. Sampled every 100 ms over
4 minutes of a density run, steal was 0.9% of the machine's CPU time overall, but came in
bursts: one second in which 40-45% of both cores was taken, a few single windows of
~25-30% elsewhere. One such second falls on ~190 steps of a 200-client run, more than the
~86 steps above its p99.

:class:`StealSampler` reads the first line of ``/proc/stat`` (``cpu  user nice system
idle iowait irq softirq steal ...``, in clock ticks) every ``interval_s`` in a thread of
its own and keeps, per window, the ticks stolen and the ticks elapsed (all CPUs).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from typing import Any

STEAL_WINDOW_FRACTION = 0.25
"""A window counts as a steal window when at least this fraction of the machine's CPU
time in it was stolen."""


def _read() -> tuple[int, int] | None:
    """(steal ticks, all ticks up to steal) of all CPUs, or None where there is no
    /proc/stat."""
    try:
        with open("/proc/stat") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(value) for value in fields[1:9]]
    return ticks[7], sum(ticks)


class StealSampler:
    """Samples steal in windows of ``interval_s`` seconds from :meth:`start` to :meth:`stop`
    (timestamps: ``time.perf_counter()`` seconds, the clock the benchmarks time steps with)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.windows: list[tuple[float, float, int, int]] = []
        """(start, end, steal ticks, all ticks) per window."""
        self._windows: list[tuple[float, float]] = []
        self._ends: list[float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)

    def start(self) -> StealSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        previous = _read()
        then = time.perf_counter()
        while previous is not None and not self._stop.wait(self.interval_s):
            current = _read()
            now = time.perf_counter()
            if current is None:
                return
            self.windows.append((then, now, current[0] - previous[0], current[1] - previous[1]))
            previous, then = current, now

    def steal_windows(self) -> list[tuple[float, float]]:
        """(start, end) of the windows in which at least STEAL_WINDOW_FRACTION of the
        machine's CPU time was stolen, in order."""
        return [(start, end) for start, end, steal, total in self.windows
                if total > 0 and steal >= STEAL_WINDOW_FRACTION * total]

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end] (perf_counter seconds) touches a steal window (call after
        :meth:`stop`: the windows are read once)."""
        if self._ends is None:
            self._windows = self.steal_windows()
            self._ends = [w_end for _, w_end in self._windows]
        index = bisect.bisect_left(self._ends, start)
        return index < len(self._windows) and self._windows[index][0] <= end

    def summary(self) -> dict[str, Any]:
        """``steal_pct``: stolen share of all CPU time (percent); ``steal_windows``: how many
        windows were steal windows; ``steal_window_s``: their total length (seconds);
        ``worst_window_pct``: the largest stolen share of one window; ``window_fraction``:
        STEAL_WINDOW_FRACTION."""
        steal = sum(w[2] for w in self.windows)
        total = sum(w[3] for w in self.windows)
        windows = self.steal_windows()
        worst = max((w[2] / w[3] for w in self.windows if w[3] > 0), default=0.0)
        return {"cpus": os.cpu_count(), "interval_s": self.interval_s, "windows": len(self.windows),
                "steal_pct": round(100 * steal / total, 2) if total else None,
                "steal_windows": len(windows), "steal_window_s": round(sum(e - s for s, e in windows), 2),
                "worst_window_pct": round(100 * worst, 1), "window_fraction": STEAL_WINDOW_FRACTION}
