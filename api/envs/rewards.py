"""Rule-based rewards: EnvScaler's ``calculate_reward`` over the results of check
functions (EnvScaler ``checklist_with_func``) run in sandboxes on an episode's initial
and final state (:mod:`sandpit.api.services.checks`: where and how checks run, and why
no environment code takes part in a verdict).

:meth:`Rewards.score` gives an episode its reward when it ends (the step that ends it
carries it); :meth:`Rewards.evaluate` (``POST /v1/envs/{id}/evaluate``) runs the
scenario's checks, or given ones, on the env's current state at any time and records the
outcome.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Literal

from cachetools import LRUCache

from ..db import models
from ..db.database import Database
from ..db.store import StateCache, load_state
from ..errors import Conflict, InvalidRequest, NotFound
from ..schemas.evaluations import EvaluateRequest, EvaluationPublic
from ..schemas.scenarios import CheckOutcome, CheckSpec
from ..services.checks import Checks
from ..services.common import new_id, owned, utcnow
from ..services.quotas import QuotaService, TenantContext
from ..services.scenarios import check_policy, checks_size
from ..services.tenants import audit_event
from .failures import episode_failure, masked
from .live import LiveEnvs

POLICY_MEMO = 4096
"""Check sources remembered as passing the static policy (by SHA-256)."""


def episode_reward(passed: list[bool]) -> float:
    """EnvScaler ``calculate_reward``: the mean of the checks' results (True = 1; False,
    errors and non-bool results = 0) rounded to 4 places; 0.0 with no checks (EnvScaler
    divides by zero there)."""
    if not passed:
        return 0.0
    return round(sum(1 for p in passed if p) / len(passed), 4)


class Rewards:
    """Episode rewards and env evaluations (see the module docstring)."""

    def __init__(self, db: Database, checks: Checks, live: LiveEnvs, quotas: QuotaService) -> None:
        self.db = db
        self.checks = checks
        self.live = live
        self.quotas = quotas
        self._policy_passed: LRUCache[str, bool] = LRUCache(POLICY_MEMO)
        self._lock = threading.Lock()

    def score(self, tenant: str, scenario_id: str | None, environment_id: str, initial_root: str | None,
              final: StateCache) -> tuple[float, list[CheckOutcome] | None]:
        """An episode's reward at its end: the scenario's checks on its initial state
        (``initial_root``) and ``final`` state. ``(0.0, None)`` without a scenario;
        ``(0.0, [])`` when the scenario has no checks. Raises InvalidRequest (a check over
        the sandbox's caps), NoCapacity, QuotaExceeded (no execution slot)."""
        if scenario_id is None:
            return 0.0, None
        with self.db.read() as db:
            scenario = db.get(models.Scenario, scenario_id)
            environment = db.get(models.Environment, environment_id)
            if scenario is None or environment is None or not initial_root or not scenario.checklist_with_func:
                return 0.0, [] if scenario is not None else None
            initial = self.checks.prepared(initial_root, lambda: load_state(db, initial_root))
        outcomes = self.checks.on_states(tenant, list(scenario.checklist_with_func), initial, final,
                                         environment.source_code, objects=scenario.check_objects)
        return episode_reward([o.passed for o in outcomes]), outcomes

    def evaluate(self, ctx: TenantContext, env_id: str, body: EvaluateRequest | None) -> EvaluationPublic:
        """``POST /v1/envs/{id}/evaluate``: run check functions (``body.checks``, else the
        env's scenario's) on the env's initial and current state, restored in a sandbox
        (objects of the environment's classes as stand-ins unless ``check_objects``,
        default: the scenario's, is ``environment``); store and return the outcome. The
        checks' sources together count against the tenant's ``max_code_bytes``; the run
        holds one of its concurrent calls; audited (``env.evaluate``, in the same
        transaction as the outcome).

        Raises NotFound, Conflict (no checks given and no scenario), InvalidRequest (a
        check over the caps or refused by the static policy), QuotaExceeded, NoCapacity
        (503 + Retry-After)."""
        checks = body.checks if body is not None else None
        if checks is not None:
            self.quotas.check_size(ctx, "max_code_bytes", checks_size(checks), "checks")
        with self.quotas.call(ctx):
            return self._evaluate(ctx, env_id, checks, body.check_objects if body is not None else None)

    def _evaluate(self, ctx: TenantContext, env_id: str, checks: list[CheckSpec] | None,
                  check_objects: str | None) -> EvaluationPublic:
        if checks is not None:
            self._check_policy(checks)
        with self.live.lock(env_id), self.db.read() as db:
            row = owned(db, models.Env, env_id, ctx.tenant, "env")
            scenario = db.get(models.Scenario, row.scenario_id) if row.scenario_id else None
            if checks is None:
                if scenario is None:
                    raise Conflict(f"env {env_id!r} has no scenario: give `checks`")
                specs = list(scenario.checklist_with_func)
            else:
                specs = [c.model_dump() for c in checks]
            if check_objects is None:
                check_objects = scenario.check_objects if scenario is not None else None
            first = db.get(models.Step, (row.id, row.episode, 0))
            head = db.get(models.Step, (row.id, row.episode, row.step))
            environment = db.get(models.Environment, row.environment_id)
            if first is None or head is None or environment is None:
                raise NotFound(f"env {env_id!r} has no stored state")
            episode, step = row.episode, row.step
            results: list[CheckOutcome] = []
            if specs:  # texts by root (Checks.prepared); the live head, when it is this one: no load
                initial = self.checks.prepared(first.state_root, lambda: load_state(db, first.state_root))
                entry = self.live.get(env_id)
                live_head = (entry is not None and entry.episode == row.episode and entry.step == row.step
                             and entry.cache.root == head.state_root)
                final = (entry.cache if live_head and entry is not None
                         else self.checks.prepared(head.state_root, lambda: load_state(db, head.state_root)))
        if specs:
            results = self.checks.on_states(ctx.tenant, specs, initial, final, environment.source_code,
                                            objects=check_objects)
        passed = sum(1 for r in results if r.passed)
        reward = episode_reward([r.passed for r in results])
        evaluation = models.Evaluation(id=new_id("evl"), env_id=env_id, episode=episode, step=step, reward=reward,
                                       results=[r.model_dump() for r in results], created_at=utcnow())
        with self.db.write() as db:
            db.add(evaluation)
            db.add(audit_event(ctx.tenant, ctx.actor, "env.evaluate", env_id,
                               {"reward": reward, "evaluation": evaluation.id}))
        failure: Literal["none", "verifier"] = (
            "verifier" if episode_failure((), [r.status for r in results]) == "verifier" else "none")
        return EvaluationPublic(id=evaluation.id, env_id=env_id, episode=episode, step=step, reward=reward,
                                passed=passed, total=len(results), results=results, created_at=evaluation.created_at,
                                failure=failure, mask=masked(failure))

    def _check_policy(self, checks: list[CheckSpec]) -> None:
        """:func:`~sandpit.api.services.scenarios.check_policy` (the ``standard`` static
        policy) for sources not seen passing before: a verdict is a pure function of the
        source, so passing sources are remembered by SHA-256 (the last
        :data:`POLICY_MEMO`, a ``cachetools.LRUCache`` behind a lock). A refused source is
        checked again with the whole list, so the error names its index. Raises
        InvalidRequest."""
        for check in checks:
            digest = hashlib.sha256(check.check_func.encode("utf-8", "surrogatepass")).hexdigest()
            with self._lock:
                known = self._policy_passed.get(digest, False)
            if known:
                continue
            try:
                check_policy([check], "checks")
            except InvalidRequest:
                check_policy(checks, "checks")
                raise
            with self._lock:
                self._policy_passed[digest] = True
