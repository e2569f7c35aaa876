"""Prometheus metrics of one app instance (its own registry, so several apps can run in
one process, e.g. in tests).

``sandpit_step_seconds`` histogram by status · ``sandpit_live_envs`` envs in sandboxes ·
``sandpit_pool_sandboxes`` by state (idle/active/starting) · ``sandpit_reaped_sandboxes_total``
containers of dead owners the executor removed (start-up reap and periodic sweeps) · with a multi-host executor
``sandpit_host_sandboxes`` by host and state, ``sandpit_host_sessions`` by host and, for the
Ray backend's host links, ``sandpit_host_link_calls`` (calls being dispatched now) and
``sandpit_host_link_refused_total`` (calls refused for a missing or wrong token) by host · ``sandpit_sandbox_failures_total``
by status (timeout/oom/crashed) · ``sandpit_snapshot_bytes_total`` compressed state bytes
offered for storage · ``sandpit_call_queue_seconds`` fair-scheduler wait ·
``sandpit_quota_rejections_total`` 429s by limit · ``sandpit_env_construction_total`` env
instances made at create and reset by ``path`` (``template``/``constructed``) and ``reason``
(``EnvConstruction``'s bounded classes, ``none`` for a template; never text from
environment code) · ``sandpit_evaluation_episodes_total`` ·
``sandpit_step_phase_cpu_seconds_total`` / ``sandpit_step_phase_wall_seconds_total`` by
phase (``parse``, ``auth``, ``sandbox``, ``persist``, ``serialize``, ``other``: where the
request thread of ``POST /step`` spent its CPU and wall time) with
``sandpit_step_phase_steps_total`` steps timed, so a benchmark divides one by the other
for a per-step budget. ``python_gc_collections_total`` (and collected/uncollectable
objects) by generation: prometheus_client's collector of the process's garbage collector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

STEP_PHASES = ("parse", "auth", "sandbox", "persist", "serialize", "other")
"""Phases of a step request timed by :class:`StepClock`."""
STEP_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _PoolCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            stats = self.stats()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the pool is closing
            return
        family = GaugeMetricFamily("sandpit_pool_sandboxes", "Sandbox containers by state", labels=["state"])
        for state in ("idle", "active", "starting"):
            family.add_metric([state], float(stats.get(state, 0)))
        yield family
        yield GaugeMetricFamily("sandpit_pool_sessions", "Sessions placed in sandboxes",
                                value=float(stats.get("sessions", 0)))
        yield CounterMetricFamily("sandpit_reaped_sandboxes", "Sandbox containers of dead owners removed "
                                  "(start-up reap and periodic sweeps of the engine)",
                                  value=float(stats.get("reaped", 0)))
        hosts = stats.get("hosts")
        if hosts:  # a multi-host executor (Ray backend): the same per host
            per_host = GaugeMetricFamily("sandpit_host_sandboxes", "Sandbox containers by host and state",
                                         labels=["host", "state"])
            sessions = GaugeMetricFamily("sandpit_host_sessions", "Sessions placed on each host", labels=["host"])
            links = GaugeMetricFamily("sandpit_host_link_calls",
                                      "Host link calls each host is dispatching now", labels=["host"])
            refused = CounterMetricFamily("sandpit_host_link_refused",
                                          "Host link calls a host refused for a missing or wrong token",
                                          labels=["host"])
            for info in hosts:
                host_stats = info.get("stats", {})
                for state in ("idle", "active", "starting"):
                    per_host.add_metric([info["host"], state], float(host_stats.get(state, 0)))
                sessions.add_metric([info["host"]], float(host_stats.get("sessions", 0)))
                if "link_calls" in info:
                    links.add_metric([info["host"]], float(info["link_calls"]))
                    refused.add_metric([info["host"]], float(info.get("links_refused", 0)))
            yield per_host
            yield sessions
            yield links
            yield refused


class Metrics:
    """The app's metrics; ``render()`` gives the exposition text for ``/metrics``."""

    def __init__(self, pool_stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.step_seconds = Histogram("sandpit_step_seconds", "Step latency through the API, seconds",
                                      ["status"], buckets=STEP_BUCKETS, registry=self.registry)
        self.live_envs = Gauge("sandpit_live_envs", "Envs currently placed in a sandbox", registry=self.registry)
        self.failures = Counter("sandpit_sandbox_failures_total", "Tool calls that ended in a sandbox failure",
                                ["status"], registry=self.registry)
        self.snapshot_bytes = Counter("sandpit_snapshot_bytes_total",
                                      "Compressed state bytes offered for storage (before de-duplication)",
                                      registry=self.registry)
        self.queue_seconds = Histogram("sandpit_call_queue_seconds",
                                       "Time calls waited for an execution slot of the fair scheduler, seconds",
                                       buckets=STEP_BUCKETS, registry=self.registry)
        self.quota_rejections = Counter("sandpit_quota_rejections_total", "Requests answered 429, by limit",
                                        ["limit"], registry=self.registry)
        self.constructions = Counter("sandpit_env_construction_total",
                                     "Env instances made at create and reset, by path (template: forked from a "
                                     "config template; constructed) and reason (why constructed; none for template)",
                                     ["path", "reason"], registry=self.registry)
        texts = Counter("sandpit_check_state_texts_total",
                        "Stored states sent to check functions, by whether their text was kept by root hash "
                        "(kept) or loaded from the store or the live head and encoded (made)",
                        ["result"], registry=self.registry)
        self.check_state_texts = {result: texts.labels(result) for result in ("kept", "made")}
        """``sandpit_check_state_texts_total`` by ``result`` (:mod:`sandpit.api.services.checks`)."""
        self.evaluation_episodes = Counter("sandpit_evaluation_episodes_total",
                                           "Evaluation episodes finished, by mode and status",
                                           ["mode", "status"], registry=self.registry)
        cpu = Counter("sandpit_step_phase_cpu_seconds_total", "CPU seconds of step requests' own thread, by phase",
                      ["phase"], registry=self.registry)
        wall = Counter("sandpit_step_phase_wall_seconds_total", "Wall-clock seconds of step requests, by phase",
                       ["phase"], registry=self.registry)
        self.step_phases = Counter("sandpit_step_phase_steps_total", "Step requests timed by phase",
                                   registry=self.registry)
        runs = Counter("sandpit_step_runs_total", "Step requests by where they ran: event_loop (all of it), "
                       "handed_off (started on the event loop, went on on a worker thread where it had to wait), "
                       "worker_thread", ["where"], registry=self.registry)
        self.step_runs = {where: runs.labels(where) for where in ("event_loop", "handed_off", "worker_thread")}
        """``sandpit_step_runs_total`` by ``where`` (``step_inline_wait_s``)."""
        spins = Counter("sandpit_step_spins_total", "Steps run on the event loop by how their wait for the tool "
                        "call's reply began: caught (the reply came while the event loop polled without sleeping), "
                        "missed (the poll ended first), no_spare_cpu (no poll: the host's CPUs were busy)",
                        ["outcome"], registry=self.registry)
        self.step_spins = {outcome: spins.labels(outcome) for outcome in ("caught", "missed", "no_spare_cpu")}
        """``sandpit_step_spins_total`` by ``outcome`` (``step_inline_spin_s``, :mod:`sandpit.api.http.spare_cpu`)."""
        self._phase_cpu = {phase: cpu.labels(phase) for phase in STEP_PHASES}
        self._phase_wall = {phase: wall.labels(phase) for phase in STEP_PHASES}
        self.registry.register(_PoolCollector(pool_stats))
        GCCollector(registry=self.registry)  # the process's collections: a full one pauses every thread

    def observe_phases(self, cpu: dict[str, float], wall: dict[str, float]) -> None:
        """Add one step's per-phase CPU and wall seconds (phases of :data:`STEP_PHASES`;
        others are ignored)."""
        for phase, seconds in cpu.items():
            counter = self._phase_cpu.get(phase)
            if counter is not None:
                counter.inc(max(0.0, seconds))
        for phase, seconds in wall.items():
            counter = self._phase_wall.get(phase)
            if counter is not None:
                counter.inc(max(0.0, seconds))
        self.step_phases.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class StepClock:
    """Per-phase CPU (``time.thread_time``) and wall (``time.perf_counter``) seconds of
    one step request, added to the metrics' phase counters by :meth:`flush`. Phases
    (:data:`STEP_PHASES`): ``parse`` (body and action), ``auth`` (API key, quotas),
    ``sandbox`` (the tool call, slot included), ``persist`` (state encoding and the
    commit), ``serialize`` (the JSON reply), ``other`` (the rest of the step: locks,
    episode bookkeeping, metrics). The HTTP step door makes one per request; the step
    (:mod:`sandpit.api.envs.steps`) laps the phases it runs."""

    __slots__ = ("cpu", "wall", "_cpu", "_wall", "_carried")

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()
        self._carried = 0.0

    def leave(self) -> None:
        """The step goes on on another thread (its CPU clock is another): keep the CPU
        since the last lap, on this thread, for the next lap; call :meth:`arrive` there."""
        self._carried = time.thread_time() - self._cpu

    def arrive(self) -> None:
        """On the thread the step went on to (after :meth:`leave`): the next lap adds
        this thread's CPU from now to what was carried."""
        self._cpu = time.thread_time() - self._carried

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or creation) to ``phase``."""
        cpu, wall = time.thread_time(), time.perf_counter()
        self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu - self._cpu
        self.wall[phase] = self.wall.get(phase, 0.0) + wall - self._wall
        self._cpu, self._wall = cpu, wall

    def flush(self, metrics: Metrics) -> None:
        """Add the laps to ``metrics`` (one step counted)."""
        metrics.observe_phases(self.cpu, self.wall)

    def server_timing(self, total_s: float) -> bytes:
        """The laps as the value of a ``Server-Timing`` response header
        (:func:`server_timing`): each lapped phase's wall-clock time in the order first
        lapped, then ``total`` (``total_s`` seconds), e.g. ``auth;dur=0.021,
        sandbox;dur=0.512, persist;dur=0.241, serialize;dur=0.015, total;dur=0.902``.
        ``total`` is more than the phases' sum by what the step spent outside them (the
        hop to a worker thread, waiting for the GIL)."""
        return server_timing(self.wall, total_s)


def server_timing(phases_s: dict[str, float], total_s: float) -> bytes:
    """A ``Server-Timing`` response header value (W3C Server Timing): each of ``phases_s``
    (name: seconds; names are metric tokens) as ``name;dur=<milliseconds>``, then
    ``total;dur=<total_s as milliseconds>``, three decimals, comma-separated, ASCII."""
    parts = [f"{phase};dur={seconds * 1000:.3f}" for phase, seconds in phases_s.items()]
    parts.append(f"total;dur={total_s * 1000:.3f}")
    return ", ".join(parts).encode("ascii")
