"""Scenarios, validation of generated code, rule-based rewards and code execution.

* Scenarios are EnvScaler ScenGenerator records (task, ``init_config``, ``checklist``,
  ``checklist_with_func``) bound to a registered environment.
* ``validate``: the static policy report, then (``environment``) load + instantiate +
  derive tools + smoke calls in a sandbox, or (``check_function``) run the check against
  supplied state pairs in a sandbox; ``snippet`` is the static report only.
* ``evaluate``: every check function of an env (given, or its scenario's) runs against
  the env's initial state (step 0 of the episode) and current state, restored as real
  Python objects in a sandbox, each check in a fresh process of its own; reward = passed
  / total rounded to 4 places (EnvScaler ``calculate_reward``: errors and non-bool results
  do not pass). Checks given inline go through the same static policy as a scenario's.
* ``execute``: a snippet as a script in a fresh sandbox process.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandpit.executor.jobs import encode_json_state
from sandpit.executor.profiles import ProfileOverrides, ResourceProfile
from sandpit.executor.session import SessionOpenError
from sqlalchemy import func, select

from . import models
from .diff import state_diff
from .episodes import episode_reward
from .errors import Conflict, InvalidRequest, NotFound
from .policy_report import check_source
from .schemas import (
    CheckOutcome,
    CheckSpec,
    EvaluationPublic,
    ExecuteRequest,
    ExecuteResult,
    ScenarioCreate,
    SmokeResult,
    ValidateRequest,
    ValidateResult,
)
from .service import EnvService, clean_text, new_id, owned
from .service import utcnow as _now
from .store import load_state


class EvaluationService:
    """Scenarios, validate, evaluate and execute (the executor runs all untrusted code)."""

    def __init__(self, envs: EnvService) -> None:
        self.envs = envs
        self.pool = envs.pool
        self.settings = envs.settings

    # -- scenarios ---------------------------------------------------------------------
    @staticmethod
    def check_policy(checks: list[CheckSpec], field: str) -> None:
        """Every check function must pass the ``standard`` static policy (a scenario's, and
        checks given inline to ``evaluate``). Raises InvalidRequest naming the check."""
        for index, check in enumerate(checks):
            report = check_source(check.check_func, "standard", filename="<check_func>")
            if not report.passed:
                first = next(f for f in report.findings if f.severity == "error")
                raise InvalidRequest(f"{field}[{index}].check_func: line {first.line} {first.rule}: "
                                     f"{first.message}", field=f"{field}.{index}.check_func")

    def create_scenario(self, tenant: str, body: ScenarioCreate) -> models.Scenario:
        """Store a scenario of a registered environment. Raises NotFound (environment),
        PayloadTooLarge (init_config over cap), InvalidRequest (check_func policy errors)."""
        self.envs.get_environment(tenant, body.environment_id)
        self.envs._check_config(body.init_config)
        self.check_policy(body.checklist_with_func, "checklist_with_func")
        row = models.Scenario(id=new_id("scn"), tenant=tenant, environment_id=body.environment_id, task=body.task,
                              init_config=body.init_config, checklist=list(body.checklist),
                              checklist_with_func=[c.model_dump() for c in body.checklist_with_func],
                              external_id=body.external_id, created_at=_now())
        with self.envs._write() as db:
            db.add(row)
        return row

    def get_scenario(self, tenant: str, scenario_id: str) -> models.Scenario:
        """The scenario or NotFound (also for another tenant's)."""
        with self.envs._db() as db:
            return owned(db, models.Scenario, scenario_id, tenant, "scenario")

    def list_scenarios(self, tenant: str, limit: int, offset: int,
                       environment_id: str | None = None) -> tuple[list[models.Scenario], int]:
        """A page of scenarios (optionally of one environment), newest first, and the total."""
        where = [models.Scenario.tenant == tenant]
        if environment_id is not None:
            where.append(models.Scenario.environment_id == environment_id)
        with self.envs._db() as db:
            total = db.scalar(select(func.count()).select_from(models.Scenario).where(*where)) or 0
            rows = db.scalars(select(models.Scenario).where(*where)
                              .order_by(models.Scenario.created_at.desc(), models.Scenario.id)
                              .limit(limit).offset(offset)).all()
        return list(rows), total

    def delete_scenario(self, tenant: str, scenario_id: str) -> None:
        """Delete a scenario; envs created from it keep running (their link is cleared)."""
        with self.envs._write() as db:
            row = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            db.query(models.Env).filter(models.Env.scenario_id == scenario_id).update(
                {models.Env.scenario_id: None}, synchronize_session=False)
            db.delete(row)

    # -- checks --------------------------------------------------------------------------
    def _run_checks(self, tenant: str, checks: list[dict[str, Any]], initial: dict[str, Any],
                    final: dict[str, Any], profile: ResourceProfile | None = None) -> list[CheckOutcome]:
        """Checks on two plain JSON states (validation cases: ``$`` tags of the state
        rendering become real objects in the sandbox)."""
        if not checks:
            return []
        try:
            with self.envs.slot(tenant):
                results = self.pool.run_checks(tenant=tenant, checks=checks, initial_state=encode_json_state(initial),
                                               final_state=encode_json_state(final), profile=profile)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="checks") from None
        return [CheckOutcome(check_item=r.check_item, passed=r.passed, error=r.error, status=r.status,
                             duration_ms=r.duration_ms) for r in results]

    def evaluate(self, tenant: str, env_id: str, checks: list[CheckSpec] | None) -> EvaluationPublic:
        """Run check functions on the env's initial and current state (restored as real
        objects in a sandbox); store and return the outcome. Raises NotFound, Conflict (no
        checks given and no scenario), InvalidRequest (a check over the caps or refused
        by the static policy), CapacityError (503 + Retry-After)."""
        if checks is not None:
            self.check_policy(checks, "checks")
        with self.envs._env_lock(env_id), self.envs._db() as db:
            row = self.envs.get_env(tenant, env_id, db)
            if checks is None:
                scenario = db.get(models.Scenario, row.scenario_id) if row.scenario_id else None
                if scenario is None:
                    raise Conflict(f"env {env_id!r} has no scenario: give `checks`")
                specs = list(scenario.checklist_with_func)
            else:
                specs = [c.model_dump() for c in checks]
            first = db.get(models.Step, (row.id, row.episode, 0))
            head = db.get(models.Step, (row.id, row.episode, row.step))
            environment = db.get(models.Environment, row.environment_id)
            if first is None or head is None or environment is None:
                raise NotFound(f"env {env_id!r} has no stored state")
            initial = load_state(db, first.state_root)
            final = load_state(db, head.state_root)
            episode, step = row.episode, row.step
        results = self.envs.run_checks(tenant, specs, initial, final, environment.source_code)
        passed = sum(1 for r in results if r.passed)
        reward = episode_reward([r.passed for r in results])
        evaluation = models.Evaluation(id=new_id("evl"), env_id=env_id, episode=episode, step=step, reward=reward,
                                       results=[r.model_dump() for r in results], created_at=_now())
        with self.envs._write() as db:
            db.add(evaluation)
        return EvaluationPublic(id=evaluation.id, env_id=env_id, episode=episode, step=step, reward=reward,
                                passed=passed, total=len(results), results=results, created_at=evaluation.created_at)

    # -- validate ------------------------------------------------------------------------
    def validate(self, tenant: str, body: ValidateRequest) -> ValidateResult:
        """Static report plus, by kind, a sandbox run (see the module docstring). Code
        that fails is a verdict (``invalid`` with reasons), not an HTTP error."""
        self.envs._check_code(body.source_code)
        report = check_source(body.source_code, body.policy)
        reasons = [f"policy {body.policy!r}: line {f.line} {f.rule}: {f.message}"
                   for f in report.findings if f.severity == "error"]
        result = ValidateResult(kind=body.kind, verdict="valid", reasons=[], policy_report=report.to_dict())
        if body.kind == "environment" and not reasons:
            with self.envs.slot(tenant):
                reasons += self._validate_environment(tenant, body, result)
        elif body.kind == "check_function" and not reasons:
            reasons += self._validate_check(tenant, body, result)
        result.reasons = reasons
        result.verdict = "invalid" if reasons else "valid"
        return result

    def _validate_environment(self, tenant: str, body: ValidateRequest, result: ValidateResult) -> list[str]:
        if body.class_name is None:
            raise InvalidRequest("class_name is required for kind=environment", field="class_name")
        self.envs._check_config(body.init_config)
        try:
            result.tools = self.pool.describe(tenant=tenant, source=body.source_code, class_name=body.class_name)
        except SessionOpenError as exc:
            return [f"loading {body.class_name} failed ({exc.status}): {clean_text(exc.observation)[:2000]}"]
        try:
            session = self.pool.open_session(tenant=tenant, source=body.source_code, class_name=body.class_name,
                                             init_config=body.init_config)
        except SessionOpenError as exc:
            result.instantiation = {"status": exc.status, "observation": clean_text(exc.observation)[:4000]}
            return [f"instantiating {body.class_name} failed ({exc.status}): {clean_text(exc.observation)[:2000]}"]
        reasons: list[str] = []
        try:
            result.instantiation = {"status": "ok", "observation": ""}
            names = {t["function"]["name"] for t in result.tools}
            before = session.state()
            for call in body.smoke_calls:
                if call.name not in names:
                    result.smoke.append(SmokeResult(name=call.name, status="rejected",
                                                    observation=f"Error: {call.name!r} is not a tool"))
                    reasons.append(f"smoke call {call.name!r}: not a tool")
                    continue
                outcome = session.call(call.name, call.arguments)
                after = session.state()
                result.smoke.append(SmokeResult(name=call.name, status=outcome.status,
                                                observation=clean_text(outcome.observation),
                                                state_diff=state_diff(before, after)))
                before = after
                if outcome.status not in ("ok",):
                    reasons.append(f"smoke call {call.name!r}: {outcome.status}: {clean_text(outcome.observation)[:300]}")
        finally:
            session.close()
        return reasons

    def _validate_check(self, tenant: str, body: ValidateRequest, result: ValidateResult) -> list[str]:
        cases = body.cases or []
        if not cases:
            raise InvalidRequest("kind=check_function needs at least one case {initial_state, final_state}",
                                 field="cases")
        reasons = []
        for index, case in enumerate(cases):
            outcome = self._run_checks(tenant, [{"check_item": f"case {index}", "check_func": body.source_code}],
                                       case.initial_state, case.final_state)[0]
            result.cases.append(outcome)
            if outcome.error is not None:  # returning False is a valid outcome; errors are not
                reasons.append(f"case {index}: {outcome.error}")
        return reasons

    # -- execute ---------------------------------------------------------------------------
    def execute(self, tenant: str, body: ExecuteRequest) -> ExecuteResult:
        """Run a snippet as a script in a fresh sandbox process. Raises InvalidRequest
        (bad files, limits above the profile), PayloadTooLarge, CapacityError (503 + Retry-After)."""
        self.envs._check_code(body.code)
        overrides = ProfileOverrides(memory_mib=body.memory_mb) if body.memory_mb else None
        try:
            profile = self.pool.profile(overrides=overrides)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="memory_mb") from None
        if body.timeout_s is not None and body.timeout_s > profile.call_timeout_s:
            raise InvalidRequest(f"timeout_s {body.timeout_s:g} is above the profile's {profile.call_timeout_s:g} s",
                                 field="timeout_s")
        try:
            with self.envs.slot(tenant):
                out = self.pool.execute(tenant=tenant, code=body.code, stdin=body.stdin, files=body.files or None,
                                        timeout_s=body.timeout_s, profile=profile)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="files") from None
        return ExecuteResult(status=out.status, exit_code=out.exit_code, stdout=clean_text(out.stdout),
                             stderr=clean_text(out.stderr), stdout_truncated=out.stdout_truncated,
                             stderr_truncated=out.stderr_truncated, duration_ms=out.duration_ms)

    def execute_batch(self, tenant: str, snippets: list[ExecuteRequest], concurrency: int) -> list[ExecuteResult]:
        """Snippets run concurrently (at most ``concurrency`` at once); results in order."""
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sandpit-exec") as workers:
            return list(workers.map(lambda body: self.execute(tenant, body), snippets))

