"""The performance table: every target beside its measured figure and its anchor.

Reads the JSON the benchmarks saved under ``benchmarks/results/`` (a missing file leaves
its rows out) and prints one table: area, measure, target, measured, met or not, and the
anchor each benchmark measured in the same run (the synthetic environment beside the
real-shaped ones, single steps beside batched ones, runc beside runsc). Writes
``benchmarks/results/report.json`` and, with ``--markdown``, prints the table as Markdown
(what ``docs/performance.md`` holds). Printing the table again without ``--run`` keeps
the sitting's record of the machine in ``report.json`` (:func:`sitting_machine`).

With ``--run`` it first runs the benchmarks of :data:`SUITE` one after the other (each
starts its own server; about 8 minutes on a quiet 2-core machine), then prints the
table from what they saved; ``--run real_shapes,batch_step`` runs some of them. Before
each benchmark and after the last it loads every core for 3 s and records what they
delivered (``hoststat.sustained_speed``: ``machine.sustained`` in ``report.json``), since
this project's VM runs slower under load at some hours than at others. Run it on a quiet
machine: every figure is wall-clock time.

Usage: ``python benchmarks/report.py [--run [NAMES]] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from hoststat import cpu_speed, sustained_speed  # noqa: E402, I001 - benchmarks/ is not a package

RESULTS = HERE / "results"
SUITE: dict[str, list[str]] = {
    "deltas": ["deltas.py", "--episodes", "3"],
    "real_shapes": ["real_shapes.py"],
    "cold": ["cold.py", "--runs", "30"],
    "cold_runsc": ["cold_runsc.py", "--settings", "shared"],
    "api": ["api.py", "--steps", "2000", "--concurrent-steps", "2000"],
    "batch_step": ["batch_step.py"],
    "density": ["density.py"],
}
"""The benchmarks ``--run`` runs, in this order, by the name of the JSON each saves, with
the arguments the table's figures come from."""
DENSITY_ENVS, DENSITY_STEPPING = 10_000, 1_000
"""The density target: this many live envs resident with this many stepping (step p99
<= 50 ms, no restores); a smaller run's resident row says so and is not met, and its step
p99 is a detail without a verdict (:func:`_density_rows`)."""


def _server_detail(server: dict | None) -> str:
    """The server's own step time (``Server-Timing`` totals) beside what the clients
    measured, or "" when the run has none."""
    if not server:
        return ""
    return f"; the server's own time p50 {server['p50']:.1f} ms, p99 {server['p99']:.1f} ms"


def _steal_detail(steal: dict) -> str:
    """What the VM's host took during the run (``hoststat.StealSampler``), with the p99 of
    the steps outside its steal windows, or "" when not measured."""
    clear = steal.get("step_ms_outside_steal_windows")
    if steal.get("steal_pct") is None or not clear or "window_fraction" not in steal:
        return ""
    return (f"; host steal {steal['steal_pct']:.1f}% of CPU, {steal['steal_window_s']:.1f} s of windows over "
            f"{100 * steal['window_fraction']:.0f}% (worst {steal['worst_window_pct']:.0f}%): p99 of the "
            f"{clear['n']} steps outside them {clear['p99']:.1f} ms")


def _kernel_detail(kernel: dict) -> str:
    """What the kernel's memory-management threads used during the run
    (``hoststat.KernelThreadSampler``; DAMON's state), with the p99 of the steps outside
    their busy windows, or "" when not measured."""
    clear = kernel.get("step_ms_outside_busy_windows")
    if kernel.get("cpu_pct") is None or not clear:
        return ""
    busiest = max(kernel["cpu_s_by_thread"].items(), key=lambda item: item[1], default=None)
    damon = ", ".join(kernel.get("damon") or []) or "none"
    return (f"; kernel memory threads {kernel['cpu_pct']:.1f}% of CPU"
            + (f" ({busiest[0]} {busiest[1]:.1f} s)" if busiest else "")
            + f", DAMON {damon}, {kernel['busy_window_s']:.1f} s of windows over "
            f"{100 * kernel['window_fraction']:.0f}%: p99 of the {clear['n']} steps outside them "
            f"{clear['p99']:.1f} ms")


def _memory_detail(memory: dict) -> str:
    """The host's page cache and available memory before the run's creates, or "" when
    not measured (the kernel reclaims that cache as the sandboxes grow)."""
    if "page_cache" not in memory:
        return ""
    slab = (f", {memory['reclaimable_slab'] / 1024:.1f} GiB of reclaimable kernel caches"
            if "reclaimable_slab" in memory else "")
    return (f"; before the creates {memory['page_cache'] / 1024:.1f} GiB of page cache{slab}, "
            f"{memory['available'] / 1024:.1f} GiB available")


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _row(rows: list[dict[str, Any]], area: str, measure: str, target: str, value: float | None, unit: str,
         met: bool | None, anchor: str = "") -> None:
    rows.append({"area": area, "measure": measure, "target": target,
                 "measured": None if value is None else round(value, 2), "unit": unit,
                 "met": met, "anchor": anchor})


def _real_shapes_rows(rows: list[dict[str, Any]]) -> None:
    """Repeated same-config creates of each real-shaped environment (``real_shapes.json``),
    the synthetic retail environment of ``cold.py`` as the anchor of the same run; beside
    each, the same run's resets of one env that keep its config (a trainer's episode loop)
    and its evaluations of 2 checks on the env's state after one writing step."""
    if (data := _load("real_shapes")) is None:
        return
    shapes = data["shapes"]
    anchor = shapes.get("anchor_retail")
    anchor_text = (f"synthetic retail, same run: p50 {anchor['create_same_config_ms']['p50']:.1f} ms"
                   if anchor else "")
    for name, r in shapes.items():
        size = r.get("config_bytes") or data.get("config_bytes", {}).get(name)
        label = f"{name} ({size / 1e6:.1f} MB)" if size else name
        create = r["create_same_config_ms"]["p50"]
        construction = r.get("construction") or {}
        reset, evaluate = r.get("reset_same_config_ms"), r.get("evaluate_ms")
        same_run = (f"; reset of one env, config kept: p50 {reset['p50']:.1f} ms" if reset else "") \
            + (f"; evaluate, 2 checks: p50 {evaluate['p50']:.0f} ms" if evaluate else "")
        if r.get("deterministic"):
            _row(rows, "real-shaped envs", f"{label}: repeated create, same config, p50", "<= 50 ms", create, "ms",
                 bool(r.get("target_met")), (anchor_text if name != "anchor_retail" else
                                              f"first create of that config {r['create_first_ms']:.0f} ms")
                 + same_run)
        else:
            reason = construction.get("reason") or ""
            _row(rows, "real-shaped envs", f"{label}: fast path refused with a reason", "a reason", create, "ms",
                 construction.get("path") == "constructed" and bool(reason),
                 (f"reason: {reason}" if reason else "no reason given") + same_run)


def _batch_rows(rows: list[dict[str, Any]]) -> None:
    """Batched steps against single steps of the same envs, same run (``batch_step.json``)."""
    if (data := _load("batch_step")) is None:
        return
    rates, n = data["env_steps_per_s"], data.get("envs", 32)
    slots = data.get("call_slots")
    server = f"; server with SANDPIT_CALL_SLOTS={slots}" if slots else "; server's default call slots"
    cpu = data.get("cpu_ms_per_env_step", {}).get("batched")
    bound = (f"; CPU per batched env-step: server {cpu['server']:.2f} ms, sandboxes {cpu['sandboxes']:.2f} ms, "
             f"which bounds the rate at {data['cpu_bound_env_steps_per_s']:.0f} env-steps/s "
             f"({data['of_cpu_bound']:.0%} of it reached)" if cpu and "cpu_bound_env_steps_per_s" in data else "")
    speed = data.get("machine", {}).get("python_mips")
    _row(rows, "batched step", f"batched step, N={n}: env-steps/s", ">= 3000", rates["batched"], "env-steps/s",
         rates["batched"] >= 3000,
         f"{n} concurrent single requests, same run: {rates['single']:.0f} env-steps/s{server}{bound}"
         + (f"; one core's speed {speed:g} Python MIPS (`hoststat.cpu_speed`)" if speed else ""))
    ratio = data["batched_vs_single"]
    latency = data.get("latency_ms", {})
    detail = (f"batch of {n} p50 {latency['batch_of_n']['p50']:.1f} ms, single step under {n} clients p50 "
              f"{latency['single_step']['p50']:.1f} ms" if "batch_of_n" in latency else "")
    _row(rows, "batched step", "batched over single requests", ">= 3x", ratio, "x", ratio >= 3, detail)


def _cold_runtimes(rows: list[dict[str, Any]]) -> None:
    """Warm create and the 8-check evaluate under runc and runsc, same run
    (``cold_runsc.json``, its ``shared`` settings)."""
    if (data := _load("cold_runsc")) is None:
        return
    shared = data.get("shared") or {}
    runc, runsc = shared.get("runc") or {}, shared.get("runsc") or {}
    for key, client in (("create_warm_small_socket_ms", "socket client"), ("create_warm_small_ms", "httpx")):
        if key in runc:  # the two clients take turns; each one's own CPU is in its latency
            create = runc[key]["p50"]
            other = f"under runsc p50 {runsc[key]['p50']:.1f} ms" if key in runsc else ""
            _row(rows, "cold paths", f"env create from the warm pool p50 (runc, {client})", "<= 5 ms", create, "ms",
                 create <= 5, other)
    if "evaluate_8_checks_ms" in runsc:
        evaluate = runsc["evaluate_8_checks_ms"]["p50"]
        anchor = (f"runc, same run: p50 {runc['evaluate_8_checks_ms']['p50']:.1f} ms"
                  if "evaluate_8_checks_ms" in runc else "")
        _row(rows, "cold paths", "evaluate, 8 checks, under runsc, p50", "<= 100 ms", evaluate, "ms",
             evaluate <= 100, anchor)
    elif "skipped" in runsc:
        _row(rows, "cold paths", "evaluate, 8 checks, under runsc, p50", "<= 100 ms", None, "ms", None,
             f"not measured: {runsc['skipped']}")


def collect() -> list[dict[str, Any]]:
    """Rows of the table from the saved results (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    _real_shapes_rows(rows)
    if (deltas := _load("deltas")) is not None:
        for domain, d in deltas["domains"].items():
            step = d["sandpit_http_step_ms"]["p50"]
            anchor = d["anchor_envscaler_in_process_ms"]["p50"]
            ratio = anchor / step if step else 0.0
            size = f"{d['state_bytes'] / 1e6:.1f} MB"
            _row(rows, "deep deltas", f"{domain} ({size}) writing step p50", "<= 15 ms", step, "ms", step <= 15,
                 f"EnvScaler in-process recording {anchor:.0f} ms")
            _row(rows, "deep deltas", f"{domain} speed-up over EnvScaler recording", ">= 10x", ratio, "x",
                 ratio >= 10)
            stored = d["stored_bytes_per_writing_step"]["p50"]
            _row(rows, "deep deltas", f"{domain} stored bytes per writing step p50", "<= 20 KB", stored / 1000,
                 "KB", stored <= 20_000, f"state {size}")
    if (cold := _load("cold")) is not None:
        for domain in ("retail", "airline"):
            if domain not in cold:
                continue
            d = cold[domain]
            create = d["create_same_config_ms"]["p50"]
            _row(rows, "cold paths", f"env create, {d['config_bytes'] / 1e6:.1f} MB {domain} init_config, p50",
                 "<= 150 ms", create, "ms", create <= 150, f"first create of that config {d['create_first_ms']:.0f} ms")
            state = d["state_head_ms"]["p50"]
            _row(rows, "cold paths", f"GET /state, {d['state_response_bytes'] / 1e6:.1f} MB {domain}, p50",
                 "<= 50 ms", state, "ms", state <= 50)
        if "evaluate_8_checks_ms" in cold:
            evaluate = cold["evaluate_8_checks_ms"]["p50"]
            _row(rows, "cold paths", "evaluate, 8 checks, p50", "<= 30 ms", evaluate, "ms", evaluate <= 30)
    _cold_runtimes(rows)
    if (api := _load("api")) is not None:
        runs = api.get("step_runs", {})
        anchor = f"sandbox call round trip {api['anchor_call_rtt_ms']['p50']:.2f} ms p50"
        for kind, label in (("socket", "socket client"), ("raw", "http.client"), ("httpx", "httpx"),
                            ("SDK", "Python client, keyed")):
            run = runs.get(f"1 client ({kind})")
            if run is not None:  # each load generator's own CPU is in the latency it measures
                _row(rows, "step path", f"step over HTTP, 1 client ({label}), p50", "<= 1 ms",
                     run["latency_ms"]["p50"], "ms", run["latency_ms"]["p50"] <= 1.0,
                     f"{anchor}; client CPU {run['cpu_ms_per_step']['load_generator']:.2f} ms per step"
                     + (f"; the server's own time p50 {run['server_total_ms']['p50']:.2f} ms"
                        if run.get("server_total_ms") else ""))
        one = runs.get("1 client (socket)") or runs.get("1 client (raw)") or runs.get("1 client (httpx)")
        if one:
            _row(rows, "step path", "step over HTTP, 1 client, p99", "<= 8 ms", one["latency_ms"]["p99"], "ms",
                 one["latency_ms"]["p99"] <= 8)
            _row(rows, "step path", "server CPU per step", "(budget)", one["cpu_ms_per_step"]["server"], "ms", None,
                 ", ".join(f"{k} {v:.2f}" for k, v in one["cpu_ms_per_step"]["server_phases"].items()))
        many = [(name, run) for name, run in runs.items() if name.startswith("32 clients")]
        if many:
            name, best = max(many, key=lambda item: item[1]["steps_per_s"])
            _row(rows, "step path", f"{name}: steps/s", ">= 800", best["steps_per_s"], "steps/s",
                 best["steps_per_s"] >= 800)
            _row(rows, "step path", f"{name}: p99", "<= 100 ms", best["latency_ms"]["p99"], "ms",
                 best["latency_ms"]["p99"] <= 100)
    _batch_rows(rows)
    _density_rows(rows)
    if (scale := _load("scale")) is not None:
        hop = scale["ray_hop_ms"]["p50"]
        _row(rows, "scale-out", "Ray hop added to a call, p50", "<= 1 ms", hop, "ms", hop <= 1,
             f"local call {scale['local_call_ms']['p50']:.2f} ms"
             + (f"; through Ray actor calls {scale['ray_actor_hop_ms']['p50']:.2f} ms"
                if "ray_actor_hop_ms" in scale else ""))
        for key, label in (("steps_per_s_ray_1_node", "1 node"), ("steps_per_s_ray_2_nodes", "2 nodes")):
            if key in scale:
                _row(rows, "scale-out", f"steps/s on Ray, {label} (one machine)", "(overhead)",
                     scale[key]["steps_per_s"], "steps/s", None,
                     f"local {scale['steps_per_s_local']['steps_per_s']} steps/s")
    return rows


def _density_rows(rows: list[dict[str, Any]]) -> None:
    """The density rows from ``density.json``: the PSS of an extra session, then the API
    run's resident envs and step p99. Only a run of the target's shape
    (:data:`DENSITY_ENVS` envs, :data:`DENSITY_STEPPING` stepping) is judged against the
    target; a smaller run's resident row says the target's run is missing (not met), and
    its step p99 is a detail row (target ``(detail)``, no verdict), since a tail under
    fewer envs says nothing about the target's."""
    if (density := _load("density")) is None:
        return
    memory = density.get("memory", {})
    forked = memory.get("forked_from_template", {}).get("per_extra_session_mib", {}).get("pss")
    spawned = memory.get("spawned_as_before", {}).get("per_extra_session_mib", {}).get("pss")
    if forked is not None:
        _row(rows, "density", "PSS of an extra session (template fork)", "<= 2 MiB", forked, "MiB",
             forked <= 2, f"spawned session {spawned:.1f} MiB" if spawned is not None else "")
    run = density.get("api")
    if not run or "step_ms" not in run:
        return
    full = run["envs"] >= DENSITY_ENVS and run["stepping"] >= DENSITY_STEPPING
    scale = "" if full else (f" (a run of {run['envs']} envs, {run['stepping']} stepping: the target's run of"
                             f" {DENSITY_ENVS} with {DENSITY_STEPPING} stepping is missing)")
    _row(rows, "density", f"resident envs of {run['envs']} ({run.get('restores_during_run', 0)} restores)"
         + scale, f"{DENSITY_ENVS}", run["resident_after"], "envs", full and run["resident_after"] >= run["envs"]
         and run.get("restores_during_run", 0) == 0)
    burst = run.get("burst") or {}
    jitter = run.get("think_jitter", 0.0)  # files from before think times varied: 0
    think = (f"{run['think_s']:g} s think time, "
             + (f"drawn within {jitter:.0%} of it" if jitter else "every pause the same"))
    p99 = run["step_ms"]["p99"]
    _row(rows, "density", f"step p99, {run['stepping']} of {run['envs']} envs stepping ({think})",
         "<= 50 ms" if full else "(detail)", p99, "ms", (p99 <= 50) if full else None,
         f"p50 {run['step_ms']['p50']:.1f} ms, {run['steps_per_s']} steps/s"
         + _server_detail(run.get("server_step_ms"))
         + (f"; all {burst['clients']} at once: p50 {burst['step_ms']['p50']:.0f} ms, "
            f"max {burst['max_ms']:.0f} ms" if burst.get("step_ms") else "")
         + _steal_detail(run.get("host_steal") or {}) + _kernel_detail(run.get("host_kernel_threads") or {})
         + _memory_detail(run.get("host_memory_at_start_mib") or {})
         + ("; the host's caches dropped before the creates (--drop-caches)"
            if run.get("host_caches_dropped") else ""))


def _probe(before: str) -> dict[str, Any]:
    """The machine's speed under full load (:func:`hoststat.sustained_speed`, 3 s) before
    ``before`` (a benchmark's name, or "" for after the last), printed as it is taken."""
    speed = {"before": before or None, **sustained_speed()}
    print(f"== machine {'before ' + before if before else 'after the last'}: every core loaded for "
          f"{speed['sustained_s']:g} s ran p50 {speed['sustained_mips_p50']:g}, "
          f"p10 {speed['sustained_mips_p10']:g} Python MIPS", flush=True)
    return speed


def run_suite(names: list[str]) -> list[dict[str, Any]]:
    """Run the benchmarks ``names`` of :data:`SUITE` one after the other with this
    interpreter (each saves its JSON), the machine's speed under full load taken before
    each and after the last (:func:`_probe`, 3 s each); returns those probes in order.
    Exits with the first one's status that fails."""
    probes = []
    for name in names:
        script, *arguments = SUITE[name]
        probes.append(_probe(name))
        print(f"== {name}: {script} {' '.join(arguments)}", flush=True)
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(HERE / script), *arguments], check=False)
        if done.returncode != 0:
            sys.exit(f"{script} failed with status {done.returncode}")
        print(f"== {name}: {time.monotonic() - started:.0f} s", flush=True)
    probes.append(_probe(""))
    return probes


def sitting_machine(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``report.json`` says of the machine: after ``--run`` (``probes``, the speed
    under full load taken around each benchmark), the machine now with those probes
    (``machine.sustained``); without it, the record of the sitting that saved the
    figures, read from ``report.json`` as it is, since no benchmark ran now and the
    machine's speed at this hour says nothing of them. A missing, unreadable or
    malformed ``report.json`` gives the machine now, without probes."""
    if not probes:
        try:
            saved = json.loads((RESULTS / "report.json").read_text()).get("machine")
        except (OSError, ValueError, AttributeError):
            saved = None
        if isinstance(saved, dict) and "python_mips" in saved:
            return saved
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               **cpu_speed()}
    if probes:
        machine["sustained"] = probes
    return machine


def _cell(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "no")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--run", nargs="?", const=",".join(SUITE), default=None, metavar="NAMES",
                        help=f"run these benchmarks first (comma-separated, of {', '.join(SUITE)}; default all)")
    args = parser.parse_args()
    probes: list[dict[str, Any]] = []
    if args.run is not None:
        names = [name for name in args.run.split(",") if name]
        if not names or any(name not in SUITE for name in names):
            parser.error(f"--run takes names of {', '.join(SUITE)}")
        probes = run_suite(names)
    rows = collect()
    machine = sitting_machine(probes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "report.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    if args.markdown:
        print("| area | measure | target | measured | met | anchor / detail |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            value = "-" if r["measured"] is None else f"{r['measured']:g} {r['unit']}"
            print(f"| {r['area']} | {r['measure']} | {r['target']} | {value} | {_cell(r['met'])} | {r['anchor']} |")
        return
    table = Table("area", "measure", "target", "measured", "met", "anchor / detail",
                  title=f"Sandpit performance ({machine['cpus']} CPUs, {machine['platform']}, "
                        f"one core {machine['python_mips']:g} Python MIPS)")
    for r in rows:
        value = "-" if r["measured"] is None else f"{r['measured']:g} {r['unit']}"
        table.add_row(r["area"], r["measure"], r["target"], value, _cell(r["met"]), r["anchor"])
    Console().print(table)


if __name__ == "__main__":
    main()
