"""BFCL multi-turn base as a replay evaluation: episodes per minute (used by
``benchmarks/tenancy.py --eval``).

Registers BFCL's environments, makes one scenario per episode (ground truth replayed
through the API, state-equality checks: :mod:`sandpit.importers.bfcl.scenarios`), then times
one ``replay`` evaluation (``/v1/evaluations``) of every episode's ground-truth calls:
wall time from create to completed, episodes/min, mean reward (1.0 expected but for the
episode whose ground truth the tool schema refuses), and the summary.
"""

from __future__ import annotations

import time
from typing import Any

from sandpit.client import Client
from sandpit.importers.bfcl import fetch_wheel, load_suite
from sandpit.importers.bfcl.replay import register_environments
from sandpit.importers.bfcl.scenarios import make_scenarios, replay_items


def replay_throughput(server: Any, limit: int | None = None, concurrency: int = 8) -> dict[str, Any]:
    """Run the evaluation on ``server`` (``benchmarks/api.Server``) in a tenant whose
    ``max_evaluation_concurrency`` is ``concurrency``; returns the measurements."""
    key = server.new_tenant("evaluator", {"max_evaluation_concurrency": concurrency, "max_live_envs": 10_000,
                                          "max_running_calls": 4})
    suite = load_suite(fetch_wheel())
    with Client(server.url, api_key=key, timeout=300) as client:
        ids = register_environments(client, suite)
        started = time.monotonic()
        made = make_scenarios(client, suite, ids, limit=limit, concurrency=4)
        scenarios_s = time.monotonic() - started
        items = replay_items(made)
        started = time.monotonic()
        job = client.evaluations.replay(items, concurrency=concurrency)
        job = client.evaluations.wait(job.id, poll_s=0.25, timeout_s=3600)
        wall = time.monotonic() - started
        summary = job.summary.model_dump() if job.summary is not None else {}
    return {"episodes": len(items), "scenarios_failed": sum(1 for m in made if m.error), "scenario_build_s":
            round(scenarios_s, 1), "wall_s": round(wall, 2), "episodes_per_min": round(len(items) / wall * 60, 1),
            "concurrency": concurrency, "status": job.status, "mean_reward": summary.get("mean_reward") or 0.0,
            "success_rate": summary.get("success_rate"), "errors_by_status": summary.get("errors_by_status")}
