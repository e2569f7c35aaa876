"""What the machine did beside a benchmark while it ran, in windows, so a latency tail can
be told apart from time the benchmark's processes never had:

* :class:`StealSampler`: CPU time the hypervisor took from this machine (``steal`` in
  ``/proc/stat``). This project's machine is a Firecracker VM on a shared host. Sampled
  every 100 ms over 4 minutes of a density run, steal was 0.9% of the machine's CPU time
  overall, but came in bursts: one second in which 40-45% of both cores was taken, a few
  single windows of ~25-30% elsewhere. One such second falls on ~190 steps of a
  200-client run, more than the ~86 steps above its p99.
* :func:`cpu_speed`: how fast one core runs Python at the moment, so that sittings on
  different machines (or hours) of the same VM can be compared.
* :func:`sustained_speed`: what every core delivers over a few seconds of full load, in
  windows of 100 ms. On this project's VM the two disagree: :func:`cpu_speed` read 18.1
  and 18.0 Python MIPS 40 s apart just before a sitting whose API spent 1.8 times the
  CPU per step of the performance page's sitting, and minutes later it read 16.8 and
  17.7 where both cores loaded for 4 s ran at a median of 8.6 and 10.8.
* :class:`KernelThreadSampler`: CPU time of the kernel's memory-management threads
  (:data:`KERNEL_THREADS`: DAMON's ``kdamond``, ``kswapd``, ``kcompactd``,
  ``khugepaged``). DAMON's physical-address monitoring checks whether sampled pages
  were accessed by walking every mapping of each page, and a sandbox's sessions are
  forked from one template, so their shared pages are mapped by up to hundreds of
  processes each: with 10,000 sessions resident, ``kdamond`` runs in bursts of about
  0.1 to 0.2 s of one core.

Both read their counters every ``interval_s`` in a thread of their own and keep, per
window, the ticks of what they watch and the ticks elapsed on all CPUs (``/proc/stat``).
"""

from __future__ import annotations

import bisect
import glob
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Self

STEAL_WINDOW_FRACTION = 0.25
"""A window counts as a steal window (a busy window of the kernel's threads) when at least
this fraction of the machine's CPU time in it was stolen (went to those threads)."""
KERNEL_THREADS = ("kdamond", "kswapd", "kcompactd", "khugepaged")
"""Name prefixes of the kernel threads :class:`KernelThreadSampler` watches."""
_KTHREADD = 2
"""The kernel thread that starts every other one (their parent pid)."""
SPEED_LOOP = 200_000
"""Iterations of :func:`cpu_speed`'s loop (about 10 to 20 ms of one core of this project's VM)."""
SUSTAINED_CHUNK = 2_000
"""Iterations :func:`sustained_speed` runs between two reads of the clock (well under a
millisecond of this project's VM)."""
SUSTAINED_GRACE_S = 30.0
"""How long past its ``seconds`` :func:`sustained_speed` waits for a worker's windows."""


def _speed_loop(iterations: int) -> None:
    """The fixed pure-Python loop both speed probes time: ``iterations`` of an add, a
    modulo and (every seventh) a list append."""
    kept: list[int] = []
    total = 0
    for i in range(iterations):
        total += i
        if i % 7 == 0:
            kept.append(total)


def cpu_speed(runs: int = 7) -> dict[str, Any]:
    """One core's speed at Python now: ``python_mips``, millions of iterations per second
    of a fixed pure-Python loop (:data:`SPEED_LOOP` iterations of an add, a modulo and a
    list append), the best of ``runs`` timings (the best, because time taken from the
    process by the hypervisor or other processes only ever slows a run); ``cpu_model``,
    the first ``model name`` of ``/proc/cpuinfo`` (None where there is none). The same
    code spends CPU time in inverse proportion to it: a sitting whose probe is half
    another's finds about twice the CPU per step. Raises ValueError when ``runs`` < 1."""
    if runs < 1:
        raise ValueError(f"cpu_speed: runs must be at least 1, not {runs}")
    best = float("inf")
    for _ in range(runs):
        began = time.perf_counter()
        _speed_loop(SPEED_LOOP)
        best = min(best, time.perf_counter() - began)
    model = None
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), None)
    except OSError:
        pass
    return {"python_mips": round(SPEED_LOOP / best / 1e6, 2), "cpu_model": model}


def _window_rates(seconds: float, window_s: float) -> list[float]:
    """Python MIPS of :func:`cpu_speed`'s loop in each ``window_s`` window of ``seconds``
    of one core kept busy (a worker of :func:`sustained_speed`)."""
    rates: list[float] = []
    end = time.perf_counter() + seconds
    while (began := time.perf_counter()) < end:
        done = 0
        while (now := time.perf_counter()) - began < window_s:
            _speed_loop(SUSTAINED_CHUNK)
            done += SUSTAINED_CHUNK
        rates.append(done / (now - began) / 1e6)
    return rates


def sustained_speed(seconds: float = 3.0, window_s: float = 0.1, workers: int | None = None) -> dict[str, Any]:
    """What the machine's cores deliver under full load: ``workers`` processes (default:
    one per CPU, ``os.cpu_count()``), each running :func:`cpu_speed`'s loop for
    ``seconds`` and timing it in windows of ``window_s`` seconds. Returns
    ``sustained_mips_p50`` and ``sustained_mips_p10`` (Python MIPS per core, the median
    and the tenth percentile over all windows of all workers, lower is slower),
    ``sustained_windows``, ``sustained_workers`` and ``sustained_s``. Unlike
    :func:`cpu_speed`'s best timing, its median falls when the VM's host gives the
    machine less than its cores for seconds at a time, as it does under a benchmark's
    load. Forks its workers (Linux). Raises ValueError when ``seconds`` or ``window_s``
    is not positive, ``window_s`` exceeds ``seconds`` or ``workers`` < 1, and
    RuntimeError when a worker sends nothing within :data:`SUSTAINED_GRACE_S` of the end."""
    workers = (os.cpu_count() or 1) if workers is None else workers
    if not seconds > 0 or not window_s > 0 or window_s > seconds or workers < 1:
        raise ValueError(f"sustained_speed: needs 0 < window_s <= seconds and workers >= 1, "
                         f"not seconds={seconds}, window_s={window_s}, workers={workers}")
    context = multiprocessing.get_context("fork")  # a forked worker runs the loop as it is: nothing is pickled
    pipes = [context.Pipe(duplex=False) for _ in range(workers)]
    processes = [context.Process(target=lambda sender=sender: sender.send(_window_rates(seconds, window_s)),
                                 daemon=True) for _, sender in pipes]
    for process in processes:
        process.start()
    rates: list[float] = []
    try:
        for receiver, _ in pipes:
            if not receiver.poll(seconds + SUSTAINED_GRACE_S):
                raise RuntimeError(f"sustained_speed: a worker sent nothing within {seconds + SUSTAINED_GRACE_S:g} s")
            rates.extend(receiver.recv())
    finally:
        for process in processes:
            process.kill()
            process.join()
    rates.sort()
    return {"sustained_mips_p50": round(rates[len(rates) // 2], 2),
            "sustained_mips_p10": round(rates[len(rates) // 10], 2),
            "sustained_windows": len(rates), "sustained_workers": workers, "sustained_s": seconds}


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


class WindowSampler:
    """Samples ``read()`` (``(ticks of what is watched, all CPUs' ticks)``, or None when it
    cannot be read) in windows of ``interval_s`` seconds from :meth:`start` to :meth:`stop`
    (timestamps: ``time.perf_counter()`` seconds, the clock the benchmarks time steps with)."""

    def __init__(self, read: Callable[[], tuple[int, int] | None], interval_s: float = 0.1) -> None:
        self.read = read
        self.interval_s = interval_s
        self.windows: list[tuple[float, float, int, int]] = []
        """(start, end, watched ticks, all ticks) per window."""
        self._windows: list[tuple[float, float]] = []
        self._ends: list[float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{type(self).__name__}", daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        previous = self.read()
        then = time.perf_counter()
        while previous is not None and not self._stop.wait(self.interval_s):
            current = self.read()
            now = time.perf_counter()
            if current is None:
                return
            self.windows.append((then, now, current[0] - previous[0], current[1] - previous[1]))
            previous, then = current, now

    def busy_windows(self) -> list[tuple[float, float]]:
        """(start, end) of the windows in which what is watched had at least
        STEAL_WINDOW_FRACTION of the machine's CPU time, in order."""
        return [(start, end) for start, end, part, total in self.windows
                if total > 0 and part >= STEAL_WINDOW_FRACTION * total]

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end] (perf_counter seconds) touches a busy window (call after
        :meth:`stop`: the windows are read once)."""
        if self._ends is None:
            self._windows = self.busy_windows()
            self._ends = [w_end for _, w_end in self._windows]
        index = bisect.bisect_left(self._ends, start)
        return index < len(self._windows) and self._windows[index][0] <= end

    def _totals(self) -> tuple[int, int, float]:
        """(watched ticks, all ticks, the largest watched share of one window)."""
        worst = max((w[2] / w[3] for w in self.windows if w[3] > 0), default=0.0)
        return sum(w[2] for w in self.windows), sum(w[3] for w in self.windows), worst


class StealSampler(WindowSampler):
    """Steal (``/proc/stat``) in windows (module docstring)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        super().__init__(_read, interval_s)

    def steal_windows(self) -> list[tuple[float, float]]:
        """(start, end) of the windows in which at least STEAL_WINDOW_FRACTION of the
        machine's CPU time was stolen, in order."""
        return self.busy_windows()

    def summary(self) -> dict[str, Any]:
        """``steal_pct``: stolen share of all CPU time (percent); ``steal_windows``: how many
        windows were steal windows; ``steal_window_s``: their total length (seconds);
        ``worst_window_pct``: the largest stolen share of one window; ``window_fraction``:
        STEAL_WINDOW_FRACTION."""
        steal, total, worst = self._totals()
        windows = self.steal_windows()
        return {"cpus": os.cpu_count(), "interval_s": self.interval_s, "windows": len(self.windows),
                "steal_pct": round(100 * steal / total, 2) if total else None,
                "steal_windows": len(windows), "steal_window_s": round(sum(e - s for s, e in windows), 2),
                "worst_window_pct": round(100 * worst, 1), "window_fraction": STEAL_WINDOW_FRACTION}


def kernel_threads(prefixes: tuple[str, ...] = KERNEL_THREADS) -> dict[int, str]:
    """``{pid: name}`` of the kernel threads (children of ``kthreadd``) whose name starts
    with one of ``prefixes``; empty where /proc cannot be read."""
    found: dict[int, str] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return found
    for entry in entries:
        fields = _stat(int(entry))
        if fields is not None and fields[1] == _KTHREADD and fields[0].startswith(prefixes):
            found[int(entry)] = fields[0]
    return found


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(name, parent pid, user + system clock ticks) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return name, int(rest[1]), int(rest[11]) + int(rest[12])


def damon_states() -> list[str]:
    """The state (``on``/``off``) of each DAMON worker configured through sysfs, empty when
    the kernel has none."""
    states = []
    for path in sorted(glob.glob("/sys/kernel/mm/damon/admin/kdamonds/*/state")):
        try:
            with open(path) as handle:
                states.append(handle.read().strip())
        except OSError:
            pass
    return states


class KernelThreadSampler(WindowSampler):
    """CPU time of the kernel threads named by ``prefixes`` (found when it is made), in
    windows (module docstring)."""

    def __init__(self, prefixes: tuple[str, ...] = KERNEL_THREADS, interval_s: float = 0.1) -> None:
        self.threads = kernel_threads(prefixes)
        """``{pid: name}`` of the watched threads."""
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        super().__init__(self._read_threads, interval_s)

    def _read_threads(self) -> tuple[int, int] | None:
        machine = _read()
        if machine is None:
            return None
        for pid in self.threads:
            fields = _stat(pid)
            if fields is not None:
                self._first.setdefault(pid, fields[2])
                self._last[pid] = fields[2]
        return sum(self._last.values()), machine[1]

    def summary(self) -> dict[str, Any]:
        """``cpu_pct``: the watched threads' share of all CPU time (percent);
        ``cpu_s_by_thread``: each one's CPU seconds; ``busy_windows``/``busy_window_s``:
        the windows in which they had at least STEAL_WINDOW_FRACTION of the machine, how
        many and their total length (seconds); ``worst_window_pct``; ``window_fraction``;
        ``damon``: the DAMON workers' states."""
        used, total, worst = self._totals()
        windows = self.busy_windows()
        hertz = os.sysconf("SC_CLK_TCK")
        return {"cpus": os.cpu_count(), "interval_s": self.interval_s, "windows": len(self.windows),
                "cpu_pct": round(100 * used / total, 2) if total else None,
                "cpu_s_by_thread": {name: round((self._last[pid] - self._first[pid]) / hertz, 2)
                                    for pid, name in sorted(self.threads.items()) if pid in self._last},
                "busy_windows": len(windows), "busy_window_s": round(sum(e - s for s, e in windows), 2),
                "worst_window_pct": round(100 * worst, 1), "window_fraction": STEAL_WINDOW_FRACTION,
                "damon": damon_states()}
