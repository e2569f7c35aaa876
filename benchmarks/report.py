"""The performance table: every target beside its measured figure and its anchor.

Reads the JSON the benchmarks saved under ``benchmarks/results/`` (``deltas.json``,
``cold.json``, ``api.json``, ``density.json``, ``scale.json``; a missing file leaves its
rows out) and prints one table: target, measured, anchor from the same run, met or not.
Writes ``benchmarks/results/report.json`` and, with ``--markdown``, prints the table as
Markdown (what ``docs/performance.md`` holds). Nothing is measured here: re-run the
benchmarks first, on a quiet machine, then this.

Usage: ``python benchmarks/report.py [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).parent / "results"


def _steal_detail(steal: dict) -> str:
    """What the VM's host took during the run (``hoststat.StealSampler``), with the p99 of
    the steps outside its steal windows, or "" when not measured."""
    clear = steal.get("step_ms_outside_steal_windows")
    if steal.get("steal_pct") is None or not clear or "window_fraction" not in steal:
        return ""
    return (f"; host steal {steal['steal_pct']:.1f}% of CPU, {steal['steal_window_s']:.1f} s of windows over "
            f"{100 * steal['window_fraction']:.0f}% (worst {steal['worst_window_pct']:.0f}%): p99 of the "
            f"{clear['n']} steps outside them {clear['p99']:.1f} ms")


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


def collect() -> list[dict[str, Any]]:
    """Rows of the table from the saved results (see the module docstring)."""
    rows: list[dict[str, Any]] = []
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
        create = cold["create_warm_small_ms"]["p50"]
        _row(rows, "cold paths", "env create from the warm pool p50", "<= 25 ms", create, "ms", create <= 25)
        evaluate = cold["evaluate_8_checks_ms"]["p50"]
        _row(rows, "cold paths", "evaluate, 8 checks, p50", "<= 30 ms", evaluate, "ms", evaluate <= 30)
    if (api := _load("api")) is not None:
        runs = api.get("step_runs", {})
        anchor = f"sandbox call round trip {api['anchor_call_rtt_ms']['p50']:.2f} ms p50"
        one = runs.get("1 client (raw)") or runs.get("1 client (httpx)")
        if one:
            _row(rows, "step path", "step over HTTP, 1 client, p50", "<= 2 ms", one["latency_ms"]["p50"], "ms",
                 one["latency_ms"]["p50"] <= 2, anchor)
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
    if (density := _load("density")) is not None:
        memory = density.get("memory", {})
        forked = memory.get("forked_from_template", {}).get("per_extra_session_mib", {}).get("pss")
        spawned = memory.get("spawned_as_before", {}).get("per_extra_session_mib", {}).get("pss")
        if forked is not None:
            _row(rows, "density", "PSS of an extra session (template fork)", "<= 2 MiB", forked, "MiB",
                 forked <= 2, f"spawned session {spawned:.1f} MiB" if spawned is not None else "")
        run = density.get("api")
        if run and "step_ms" in run:
            _row(rows, "density", f"resident envs of {run['envs']} ({run.get('restores_during_run', 0)} restores)",
                 f"{run['envs']}", run["resident_after"], "envs", run["resident_after"] >= run["envs"]
                 and run.get("restores_during_run", 0) == 0)
            burst = run.get("burst") or {}
            _row(rows, "density", f"step p99, {run['stepping']} of them stepping", "<= 50 ms",
                 run["step_ms"]["p99"], "ms", run["step_ms"]["p99"] <= 50,
                 f"p50 {run['step_ms']['p50']:.1f} ms, {run['steps_per_s']} steps/s"
                 + (f"; all {burst['clients']} at once: p50 {burst['step_ms']['p50']:.0f} ms, "
                    f"max {burst['max_ms']:.0f} ms" if burst.get("step_ms") else "")
                 + _steal_detail(run.get("host_steal") or {}))
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


def _cell(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "no")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args()
    rows = collect()
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
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
                  title=f"Sandpit performance ({machine['cpus']} CPUs, {machine['platform']})")
    for r in rows:
        value = "-" if r["measured"] is None else f"{r['measured']:g} {r['unit']}"
        table.add_row(r["area"], r["measure"], r["target"], value, _cell(r["met"]), r["anchor"])
    Console().print(table)


if __name__ == "__main__":
    main()
