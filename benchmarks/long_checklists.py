"""Long checklists: what evaluating a release-sized scenario costs over real HTTP.

Starts its own ``sandpit serve`` (loopback, temporary SQLite file; the default runtime,
runc unless ``SANDPIT_EXECUTOR_RUNTIME`` says otherwise), registers a small environment
and, per kind of check, a scenario of ``--checks`` checks (70 % pass, 30 % fail: reward
0.7), then times ``POST /v1/envs/{id}/evaluate`` ``--runs`` times on a fresh env of it:

* ``read-only``: checks written as EnvScaler asks ("must not modify any input data":
  lookups, comparisons, comprehensions), which the sandbox proves read-only and runs in
  the batch's zygote itself;
* ``forked``: checks that change the state they are given (here ``final_state.setdefault``),
  which each run in a process forked for them.

The host runs them in sandbox jobs of 256 (``CHECKS_PER_JOB``). Prints p50/min/max wall
seconds per evaluation and per check, the sandbox containers' CPU per evaluation (their
cgroups, as ``benchmarks/api.py`` reads them: less sensitive to other load on the machine
than wall time), and saves JSON to
``benchmarks/results/long_checklists.json``.
Usage: ``python benchmarks/long_checklists.py [--checks 1000] [--runs 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).parent))
from api_server import ApiServer  # noqa: E402

from api import sandboxes_cpu_s  # noqa: E402 - the API benchmark's reader of the sandboxes' cgroup CPU

SOURCE = '''
class Inventory:
    """Items by id and a counter."""

    def __init__(self, init_config):
        self.items = init_config.get("items", {})
        self.count = init_config.get("count", 0)

    def bump(self, by: int = 1) -> int:
        """Add `by` to the counter."""
        self.count += by
        return self.count
'''

KINDS = {
    "read-only": "def check_func(final_state):\n    # {i}\n"
                 "    items = final_state.get('items', {{}})\n"
                 "    names = [v['name'] for v in items.values() if v.get('qty', 0) >= 0]\n"
                 "    return (len(names) == 20) {op} (final_state['count'] == 0)\n",
    "forked": "def check_func(final_state):\n    # {i}\n"
              "    final_state.setdefault('seen', []).append({i})\n"
              "    return (len(final_state['items']) == 20) {op} (final_state['count'] == 0)\n",
}


def checklist(kind: str, count: int) -> list[dict[str, str]]:
    """``count`` checks of ``kind``: the first 70 % pass (``and``), the rest fail (``!=`` of
    two true facts)."""
    passing = int(count * 0.7)
    return [{"check_item": f"{kind} {i}",
             "check_func": KINDS[kind].format(i=i, op="and" if i < passing else "!=")} for i in range(count)]


def run(checks: int, runs: int) -> dict[str, Any]:
    config = {"items": {f"i{n}": {"name": f"item {n}", "qty": n} for n in range(20)}, "count": 0}
    with tempfile.TemporaryDirectory() as data:
        server = ApiServer(Path(data)).start()
        try:
            with server.client(timeout=600) as api:
                environment = api.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Inventory",
                                                                 "sample_init_config": config}).json()
                results: dict[str, Any] = {}
                for kind in KINDS:
                    scenario = api.post("/v1/scenarios", json={
                        "environment_id": environment["id"], "task": kind, "init_config": config,
                        "checklist_with_func": checklist(kind, checks)})
                    assert scenario.status_code == 201, scenario.text
                    times, cpu = [], []
                    for _ in range(runs + 1):  # the first warms the sandbox and its jobs template
                        env = api.post("/v1/envs", json={"scenario_id": scenario.json()["id"]}).json()
                        assert server.process is not None
                        cpu_before = sandboxes_cpu_s(server.process.pid)
                        started = time.perf_counter()
                        evaluation = api.post(f"/v1/envs/{env['id']}/evaluate")
                        times.append(time.perf_counter() - started)
                        cpu.append(sandboxes_cpu_s(server.process.pid) - cpu_before)
                        assert evaluation.status_code == 200, evaluation.text
                        body = evaluation.json()
                        assert body["total"] == checks and body["reward"] == round(int(checks * 0.7) / checks, 4)
                        api.delete(f"/v1/envs/{env['id']}")
                    warm = times[1:]
                    results[kind] = {"p50_s": statistics.median(warm), "min_s": min(warm), "max_s": max(warm),
                                     "first_s": times[0], "per_check_ms": statistics.median(warm) / checks * 1000,
                                     "sandbox_cpu_p50_s": statistics.median(cpu[1:]), "runs": warm,
                                     "sandbox_cpu_s": cpu[1:]}
                return results
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results = run(args.checks, args.runs)
    report = {"checks": args.checks, "runs": args.runs, "runtime": os.environ.get("SANDPIT_EXECUTOR_RUNTIME", "runc"),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_1m": os.getloadavg()[0]}, "results": results}
    print(f"{args.checks} checks, {args.runs} runs after a warm-up, runtime {report['runtime']}, "
          f"load {report['machine']['load_1m']:.1f}")
    for kind, row in results.items():
        print(f"  {kind:10s} p50 {row['p50_s']:.2f} s  min {row['min_s']:.2f}  max {row['max_s']:.2f}  "
              f"({row['per_check_ms']:.2f} ms/check; first {row['first_s']:.2f} s); "
              f"sandbox CPU p50 {row['sandbox_cpu_p50_s']:.2f} s")
    out = Path(__file__).resolve().parent / "results" / "long_checklists.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
