"""Rule-based rewards: EnvScaler's ``calculate_reward`` over the results of check
functions (EnvScaler ``checklist_with_func``) run in sandboxes on two states
(:mod:`sandpit.api.services.checks`).

Every check runs in a sandbox process that never ran environment code, on the states
restored there (stored states from the snapshot store, or plain JSON states whose ``$``
tags become objects). Nothing is decoded on the host. Objects of the environment's own
classes are rebuilt as stand-ins carrying their attributes, so no code of the environment
being judged runs where a verdict is computed; a scenario with ``check_objects:
environment`` opts in to loading the environment's module for its checks instead, and then
the environment's code takes part in the verdict (``child_oneshot.py``, README).

A checklist longer than one sandbox job takes (``CHECKS_PER_JOB``, 256) runs in
consecutive jobs of at most that many checks, each on the same two states, and the
results are concatenated in order: a check's verdict depends only on its source and the
states, so the reward is the one a single job would give. Each job holds its own slot
and has its own time budget (per-check timeout times its checks, plus slack).
"""

from __future__ import annotations

from ..db import models
from ..db.database import Database
from ..db.store import StateCache, load_state
from ..schemas.scenarios import CheckOutcome
from ..services.checks import Checks


def episode_reward(passed: list[bool]) -> float:
    """EnvScaler ``calculate_reward``: the mean of the checks' results (True = 1; False,
    errors and non-bool results = 0) rounded to 4 places; 0.0 with no checks (EnvScaler
    divides by zero there)."""
    if not passed:
        return 0.0
    return round(sum(1 for p in passed if p) / len(passed), 4)


class Rewards:
    """An episode's reward when it ends: the scenario's checks on its initial and final
    state (:class:`~sandpit.api.services.checks.Checks`), scored by :func:`episode_reward`."""

    def __init__(self, db: Database, checks: Checks) -> None:
        self.db = db
        self.checks = checks

    def score(self, tenant: str, scenario_id: str | None, environment_id: str, initial_root: str | None,
              final: StateCache) -> tuple[float, list[CheckOutcome] | None]:
        """An episode's reward at its end: the scenario's checks on its initial state
        (``initial_root``) and ``final`` state. ``(0.0, None)`` without a scenario;
        ``(0.0, [])`` when the scenario has no checks."""
        if scenario_id is None:
            return 0.0, None
        with self.db.read() as db:
            scenario = db.get(models.Scenario, scenario_id)
            environment = db.get(models.Environment, environment_id)
            initial = load_state(db, initial_root) if initial_root else None
        if scenario is None or environment is None or initial is None or not scenario.checklist_with_func:
            return 0.0, [] if scenario is not None else None
        outcomes = self.checks.on_states(tenant, list(scenario.checklist_with_func), initial, final, environment.source_code,
                                  objects=scenario.check_objects)
        return episode_reward([o.passed for o in outcomes]), outcomes
