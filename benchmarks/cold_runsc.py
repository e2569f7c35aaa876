"""Cold paths under runc and gVisor side by side (issue 29, cold-path targets): starts
``sandpit serve`` processes (loopback, a temporary SQLite file each, like
``benchmarks/api.py``), one per runtime (``runc``, ``runsc``) and executor setting, one
after the other in the same run, and measures on each over real HTTP:

* ``create_warm_small_ms``: ``POST /v1/envs`` from the warm pool with a small config
  (``{"count": 1}`` of ``api.SOURCE``), the env deleted after each create (not timed);
  target p50 <= 5 ms (``shared``, runc). Measured through httpx, and taking turns with it
  through the lean socket client of ``api.py`` (``create_warm_small_socket_ms``), as the
  1-client step is: each client's own CPU per request is in the latency it measures;
* ``evaluate_8_checks_ms``: ``POST /v1/envs/{id}/evaluate`` with the 8 check functions of
  ``cold.CHECKS`` on one env; target p50 <= 100 ms under runsc (``shared``), with runc as
  its anchor.

Executor settings: ``shared`` are ``cold.py``'s (2 warm sandboxes of 8 sessions each: a
check batch runs in the sandbox of the env it scores); ``default`` are the server's
defaults (one session per sandbox: a check batch runs in a sandbox of its own, recycled
after it).

JSON (``benchmarks/results/cold_runsc.json``)::

    {"machine": {...}, "targets_ms": {"create_warm_small": 5.0, "evaluate_8_checks_runsc": 100.0},
     "shared":  {"runc":  {"create_warm_small_ms": {"n", "p50", "p99", "mean"},
                           "create_warm_small_socket_ms": {...},
                           "evaluate_8_checks_ms": {...}, "server_rss_mib": float},
                 "runsc": {... the same keys ...} | {"skipped": "<why>"}},
     "default": {... the same shape ...}}

Every figure is milliseconds of wall clock, p50/p99/mean over ``--runs`` samples after a
few unrecorded ones. The runsc servers are skipped (and say why) when Docker has no
``runsc`` runtime. Usage: ``python benchmarks/cold_runsc.py [--runs 25]
[--runtimes runc,runsc] [--settings shared,default]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker

sys.path.insert(0, str(Path(__file__).parent))
from cold import CHECKS, bench_evaluate, bench_warm_clients  # noqa: E402 - benchmarks/ is not a package

from api import Server, SocketClient, machine, save  # noqa: E402

TARGETS_MS = {"create_warm_small": 5.0, "evaluate_8_checks_runsc": 100.0}
RUNTIMES = ("runc", "runsc")


def runsc_registered() -> bool:
    """Whether the local Docker Engine has a ``runsc`` runtime."""
    client = docker.from_env()
    try:
        return "runsc" in (client.info().get("Runtimes") or {})
    finally:
        client.close()


SETTINGS = {"shared": {"SANDPIT_EXECUTOR_POOL_SIZE": "2", "SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX": "8",
                       "SANDPIT_EXECUTOR_MAX_SANDBOXES": "8"},
            "default": {}}
"""Executor settings by name, as environment variables (module docstring)."""


def bench_runtime(runtime: str, runs: int, env: dict[str, str]) -> dict[str, Any]:
    """Warm create and 8-check evaluate on a server whose sandboxes use ``runtime`` and
    whose other executor settings are ``env`` (environment variables)."""
    with tempfile.TemporaryDirectory(prefix=f"sandpit-bench-{runtime}-") as tmp:
        server = Server(Path(tmp), SANDPIT_EXECUTOR_RUNTIME=runtime, **env)
        try:
            with server.client() as client:
                creates = bench_warm_clients(client, SocketClient(server.url, server.api_key), runs)
                out: dict[str, Any] = {"create_warm_small_ms": creates["httpx"],
                                       "create_warm_small_socket_ms": creates["socket"],
                                       "evaluate_8_checks_ms": bench_evaluate(client, runs)}
            out["server_rss_mib"] = round(server.rss_mib(), 1)
            return out
        finally:
            server.stop()


def table(results: dict[str, Any]) -> str:
    """The figures of both runtimes side by side, per executor setting (p50 / p99, ms)."""
    lines = [f"{'measure':44s} " + " ".join(f"{rt + ' p50':>10s} {rt + ' p99':>10s}" for rt in RUNTIMES)
             + f" {'target p50':>14s}"]
    goals = {("shared", "create_warm_small_ms"): "runc <= 5", ("shared", "create_warm_small_socket_ms"): "runc <= 5",
             ("shared", "evaluate_8_checks_ms"): "runsc <= 100"}
    for setting in SETTINGS:
        if setting not in results:
            continue
        for key, label in (("create_warm_small_ms", "env create, warm pool, small"),
                           ("create_warm_small_socket_ms", "the same, socket client"),
                           ("evaluate_8_checks_ms", f"evaluate, {len(CHECKS)} checks")):
            cells = []
            for runtime in RUNTIMES:
                stats = results[setting].get(runtime, {}).get(key)
                cells.append(f"{stats['p50']:10.1f} {stats['p99']:10.1f}" if stats else f"{'-':>10s} {'-':>10s}")
            lines.append(f"{label + ' (' + setting + ')':44s} " + " ".join(cells)
                         + f" {goals.get((setting, key), '-'):>14s}")
    return "\n".join(lines)


def main() -> None:
    """Run the measures (module docstring), print the table and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25, help="samples per measure")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help="comma-separated, of runc,runsc")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated, of shared,default")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "cold_runsc.json")
    args = parser.parse_args()
    runtimes = [r for r in args.runtimes.split(",") if r]
    settings = [s for s in args.settings.split(",") if s]
    if not runtimes or any(r not in RUNTIMES for r in runtimes):
        parser.error("--runtimes takes runc and/or runsc")
    if not settings or any(s not in SETTINGS for s in settings):
        parser.error("--settings takes shared and/or default")
    results: dict[str, Any] = {"machine": machine(), "targets_ms": TARGETS_MS}
    has_runsc = runsc_registered()
    for setting in settings:
        results[setting] = {}
        for runtime in runtimes:
            if runtime == "runsc" and not has_runsc:
                results[setting][runtime] = {"skipped": "Docker has no runsc runtime registered"}
                continue
            results[setting][runtime] = bench_runtime(runtime, args.runs, SETTINGS[setting])
    print(table(results))
    save(results, args.output)


if __name__ == "__main__":
    main()
