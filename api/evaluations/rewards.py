"""Rule-based rewards: check functions (EnvScaler ``checklist_with_func``) run in
sandboxes on two states, and EnvScaler's ``calculate_reward`` over their results.

Every check runs in a fresh sandbox process that never ran environment code, on the
states restored as real Python objects there (stored states from the snapshot store, or
plain JSON states whose ``$`` tags become objects). Nothing is decoded on the host.
"""

from __future__ import annotations

from typing import Any

from ..db import models
from ..db.database import Database
from ..db.store import StateCache, load_state
from ..errors import InvalidRequest
from ..sandboxes import CheckResult, ResourceProfile, Sandboxes, encode_json_state
from ..schemas.scenarios import CheckOutcome


def episode_reward(passed: list[bool]) -> float:
    """EnvScaler ``calculate_reward``: the mean of the checks' results (True = 1; False,
    errors and non-bool results = 0) rounded to 4 places; 0.0 with no checks (EnvScaler
    divides by zero there)."""
    if not passed:
        return 0.0
    return round(sum(1 for p in passed if p) / len(passed), 4)


def _outcomes(results: list[CheckResult]) -> list[CheckOutcome]:
    return [CheckOutcome(check_item=r.check_item, passed=r.passed, error=r.error, status=r.status,
                         duration_ms=r.duration_ms) for r in results]


class Checks:
    """Runs check functions through the sandboxes (each run holds a slot)."""

    def __init__(self, db: Database, sandboxes: Sandboxes) -> None:
        self.db = db
        self.sandboxes = sandboxes

    def on_states(self, tenant: str, checks: list[dict[str, Any]], initial: StateCache, final: StateCache,
                  source: str | None, profile: ResourceProfile | None = None) -> list[CheckOutcome]:
        """Checks on two stored states, restored as real objects in a sandbox (with the
        environment's ``source`` loaded, so its classes unpickle). Raises InvalidRequest
        (a check over the caps), NoCapacity, QuotaExceeded."""
        if not checks:
            return []
        try:
            results = self.sandboxes.run_checks(tenant=tenant, checks=checks, initial_state=initial.encoded(),
                                                final_state=final.encoded(), profile=profile, source=source)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="checks") from None
        return _outcomes(results)

    def on_json(self, tenant: str, checks: list[dict[str, Any]], initial: dict[str, Any],
                final: dict[str, Any]) -> list[CheckOutcome]:
        """Checks on two plain JSON states (validation cases: ``$`` tags of the state
        rendering become real objects in the sandbox). Raises as :meth:`on_states`."""
        if not checks:
            return []
        try:
            results = self.sandboxes.run_checks(tenant=tenant, checks=checks,
                                                initial_state=encode_json_state(initial),
                                                final_state=encode_json_state(final))
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="checks") from None
        return _outcomes(results)

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
        outcomes = self.on_states(tenant, list(scenario.checklist_with_func), initial, final, environment.source_code)
        return episode_reward([o.passed for o in outcomes]), outcomes
