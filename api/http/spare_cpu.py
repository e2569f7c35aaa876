"""Whether the host has a CPU to spare for a step's spinning wait (``step_inline_spin_s``).

A step run on the event loop may poll its sandbox's socket without sleeping for the first
moments of its wait for the tool call's reply
(:meth:`sandpit.executor.pool.channel.PendingReply.answered`). That pays only while a
CPU would otherwise sit idle: a sleeping thread woken on an idle CPU of a virtual machine
costs more than the poll, but on a host whose CPUs are all busy no idle CPU needs waking,
and the polling thread takes CPU time from the sandbox that is to answer (measured in
``docs/performance.md``).

:class:`SpareCpu` reads the host's idle time (the ``idle`` and ``iowait`` columns of the
``cpu`` line of ``/proc/stat``, in clock ticks) at most once every ``sample_s`` seconds
and says whether at least ``min_idle_cpus`` CPUs' worth of it was idle over the last
interval. The time steps spent polling counts as idle (:meth:`SpareCpu.spun`): it is this
process's own, and counting it as busy would turn the polling off by its own cost. A host
without a readable ``/proc/stat`` never has a CPU to spare (no polling).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

SAMPLE_S = 0.25
"""Seconds between two reads of ``/proc/stat`` (the interval the idle time is measured over)."""
MIN_IDLE_CPUS = 0.5
"""CPUs' worth of idle time (idle seconds per second) the last interval must have had."""


class SpareCpu:
    """The host's idle CPU time, sampled (module docstring). Not thread-safe: one thread
    asks it (the event loop, which runs the steps that may poll)."""

    def __init__(self, path: str = "/proc/stat", sample_s: float = SAMPLE_S,
                 min_idle_cpus: float = MIN_IDLE_CPUS, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._sample_s = sample_s
        self._min_idle = min_idle_cpus
        self._clock = clock
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self._at = clock()
        self._idle = self._read()
        self._spun = 0.0
        self._spare = False  # until an interval has been measured

    def _read(self) -> float | None:
        """Seconds all CPUs spent idle (or waiting for I/O) since boot; None when
        ``/proc/stat`` cannot be read or its first line is not the ``cpu`` totals."""
        try:
            with open(self._path, "rb") as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if len(fields) < 6 or fields[0] != b"cpu":
            return None
        try:
            return (int(fields[4]) + int(fields[5])) * self._tick_s
        except ValueError:
            return None

    def spare(self) -> bool:
        """Whether the last measured interval (at least ``sample_s`` seconds, re-measured
        when the last one is older) had ``min_idle_cpus`` of idle CPU time, the time
        reported by :meth:`spun` included. False until one interval has passed."""
        now = self._clock()
        elapsed = now - self._at
        if elapsed >= self._sample_s:
            idle = self._read()
            self._spare = (idle is not None and self._idle is not None
                           and (idle - self._idle + self._spun) / elapsed >= self._min_idle)
            self._at, self._idle, self._spun = now, idle, 0.0
        return self._spare

    def spun(self, seconds: float) -> None:
        """Count ``seconds`` of polling by this process as idle time of the current interval."""
        self._spun += max(0.0, seconds)
