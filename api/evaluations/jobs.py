"""Batch evaluations (``/v1/evaluations``): jobs, progress, summaries and results.

A job (``evaluations`` row) holds one episode row per scenario (``evaluation_episodes``,
index order = request order). Two modes:

* ``replay`` — each episode replays given tool calls in a fresh env of its scenario,
  then the scenario's check functions give the reward (a trainer scoring trajectories it
  produced elsewhere);
* ``rollout`` — Sandpit runs the EnvScaler agent loop itself against an OpenAI-compatible
  endpoint (:mod:`.rollout`), then the checks give the reward.

:class:`EvaluationJobs` validates and stores jobs and answers reads; the
:class:`~.runner.EvaluationRunner` it starts and stops runs episodes in the background and
resumes unfinished ones after a restart. Job statuses: ``queued`` -> ``running`` ->
``completed`` | ``cancelled`` | ``failed``; episode statuses: ``pending`` -> ``running``
-> ``done`` | ``error`` | ``cancelled``.

Quotas (429 naming the limit): ``max_active_evaluations`` (queued + running jobs of the
tenant) and ``max_evaluation_concurrency`` (a job's ``concurrency`` may not exceed it;
the runner also bounds the tenant's running episodes over all its jobs by it).
The model API key of a request is stored encrypted (:mod:`sandpit.api.secrets`) and never returned,
logged or audited.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, cast

from sqlalchemy import case, func, select, update
from sqlalchemy.orm import defer

from ..db import models
from ..db.database import Database
from ..db.models import EvaluationEpisode, EvaluationJob, table
from ..envs.failures import FAILURES, evaluation_failure, masked
from ..errors import Conflict, InvalidRequest, NotFound, QuotaExceeded
from ..sandboxes import Sandboxes
from ..schemas.evaluations import (
    RESULT_INCLUDES,
    EnvironmentBreakdown,
    EpisodeResult,
    EpisodeStatus,
    EvaluationCreate,
    EvaluationJobPublic,
    EvaluationJobsPublic,
    EvaluationProgress,
    EvaluationSummary,
    JobStatus,
    Mode,
    ScenarioBreakdown,
    check_base_url,
)
from ..services.common import new_id, owned
from ..services.common import utcnow as _now
from ..services.quotas import FIXED_RETRY_AFTER_S, QuotaService, TenantContext
from ..services.stats import StatsService
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .runner import EvaluationRunner

ACTIVE = ("queued", "running")
FINISHED_EPISODE = ("done", "error", "cancelled")
ACTIVE_RETRY_AFTER_S = 30
RESULTS_BATCH = 200
ID_CHUNK = 500


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


class EvaluationJobs:
    """Create, read, list and cancel evaluations; stream their results. ``start()`` /
    ``close()`` run the background runner (called from the app's lifespan)."""

    def __init__(self, settings: ApiSettings, db: Database, runner: EvaluationRunner, sandboxes: Sandboxes,
                 quotas: QuotaService, tenants: TenantService, stats: StatsService) -> None:
        self.settings = settings
        self.db = db
        self.runner = runner
        self.sandboxes = sandboxes
        self.quotas = quotas
        self.tenants = tenants
        self.stats = stats
        self._create_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        """Resume unfinished evaluations and start the runner (see the runner's docs)."""
        self.runner.start()

    def close(self) -> None:
        """Stop the runner: running episodes stop at their next step and go back to
        ``pending`` (they rerun from scratch on the next start)."""
        self.runner.close()

    # -- the HTTP contract -------------------------------------------------------------------
    def start_evaluation(self, caller: TenantContext, body: EvaluationCreate) -> EvaluationJobPublic:
        """``POST /v1/evaluations``: :meth:`create` with the tenant's default profile
        (capped by its ``max_profile``); audited (never the API key)."""
        profile = self.quotas.profile_overrides(caller, None, self.sandboxes.default_limits())
        row = self.create(caller, body, profile)
        self.tenants.audit(caller.tenant, caller.actor, "evaluation.create", row.id,
                           {"mode": row.mode, "total": row.total, "concurrency": row.concurrency,
                            "model": row.config.get("model"), "base_url": row.config.get("base_url"),
                            "api_key_source": row.config.get("api_key_source")})
        return self.get(caller.tenant, row.id)

    def cancel_evaluation(self, caller: TenantContext, evaluation_id: str) -> EvaluationJobPublic:
        """``POST /{id}/cancel``: :meth:`cancel`; audited."""
        result = self.cancel(caller.tenant, evaluation_id)
        self.tenants.audit(caller.tenant, caller.actor, "evaluation.cancel", evaluation_id,
                           {"done": result.progress.done, "total": result.total})
        return result

    def page(self, caller: TenantContext, limit: int, offset: int) -> EvaluationJobsPublic:
        """A page of the tenant's evaluations, newest first, with progress."""
        rows, total = self.list_jobs(caller.tenant, limit, offset)
        return EvaluationJobsPublic(data=rows, count=total)

    def result_lines(self, caller: TenantContext, evaluation_id: str, include: str | None) -> Iterator[bytes]:
        """``GET /{id}/results``: :meth:`results`, ``include`` naming at most
        ``transcript``. Raises InvalidRequest, NotFound (before streaming)."""
        wanted = set(filter(None, (include or "").split(",")))
        if not wanted <= RESULT_INCLUDES:
            raise InvalidRequest(f"include may name {sorted(RESULT_INCLUDES)}, got {sorted(wanted - RESULT_INCLUDES)}",
                                 field="include")
        return self.results(caller.tenant, evaluation_id, "transcript" in wanted)

    # -- create ------------------------------------------------------------------------
    def create(self, ctx: TenantContext, body: EvaluationCreate, profile: dict[str, Any] | None) -> models.EvaluationJob:
        """Validate and store a job with one ``pending`` episode per scenario.

        Raises QuotaExceeded (``max_evaluation_concurrency`` when ``concurrency`` is above
        it; ``max_active_evaluations`` when the tenant has that many queued/running
        jobs), NotFound (a scenario unknown or another tenant's; ``field`` names the
        index), InvalidRequest (no ``base_url`` given or stored for the tenant, a stored
        one that is not http(s)). Nothing is stored when it raises."""
        limit = ctx.quotas.max_evaluation_concurrency
        concurrency = body.concurrency or limit
        if concurrency > limit:
            raise QuotaExceeded(f"concurrency={concurrency} is above tenant {ctx.tenant!r}'s max_evaluation_concurrency="
                                f"{limit} (a fixed quota: waiting does not help)", limit="max_evaluation_concurrency",
                                retry_after=FIXED_RETRY_AFTER_S, field="concurrency", fixed=True)
        scenario_ids = body.scenario_list()
        environments = self._scenario_environments(ctx.tenant, body, scenario_ids)
        config: dict[str, Any] = {"keep_envs": body.keep_envs, "profile": profile}
        key_enc: bytes | None = None
        if body.mode == "rollout":
            tenant = self.tenants.get_tenant(ctx.tenant)
            base_url = body.base_url or tenant.model_base_url
            if not base_url:
                raise InvalidRequest("base_url is required: give one, or have the operator set the tenant's "
                                     "model_base_url", field="base_url")
            try:
                base_url = check_base_url(base_url)
            except ValueError as exc:
                raise InvalidRequest(f"the tenant's model_base_url is not usable: {exc}", field="base_url") from None
            allowed = self.settings.model_url_allow
            if body.base_url and allowed and not any(_same_url(base_url, p) or base_url.startswith(p.rstrip("/") + "/")
                                                     for p in allowed):
                raise InvalidRequest("base_url is not one of the operator's allowed model endpoints "
                                     "(SANDPIT_MODEL_URL_ALLOW)", field="base_url")
            if body.api_key is not None:
                key_enc = self.tenants.box.encrypt(body.api_key.get_secret_value())
            # the tenant's stored key is only ever sent to the tenant's stored endpoint: a
            # caller-chosen base_url must not be able to collect it
            own_endpoint = tenant.model_base_url is not None and _same_url(base_url, tenant.model_base_url)
            source = ("request" if body.api_key is not None
                      else "tenant" if tenant.model_api_key_enc and own_endpoint else "none")
            config.update(model=body.model, base_url=base_url, api_key_source=source, max_steps=body.max_steps,
                          temperature=body.temperature, max_tokens=body.max_tokens,
                          request_timeout_s=body.request_timeout_s, retries=body.retries,
                          retry_initial_s=body.retry_initial_s, retry_max_s=body.retry_max_s)
        now = _now()
        job = EvaluationJob(id=new_id("evj"), tenant=ctx.tenant, mode=body.mode, status="queued", config=config,
                  model_api_key_enc=key_enc, concurrency=concurrency, total=len(scenario_ids),
                  created_by=ctx.actor, created_at=now)
        episodes = [{"evaluation_id": job.id, "index": index, "scenario_id": sid, "environment_id": environments[sid],
                     "tool_calls": ([c.model_dump(exclude_none=True) for c in body.episodes[index].tool_calls]
                                    if body.episodes is not None else None),
                     "status": "pending", "attempt": 0, "steps": 0}
                    for index, sid in enumerate(scenario_ids)]
        with self._lock:
            lock = self._create_locks.setdefault(ctx.tenant, threading.Lock())
        with lock:  # count + insert atomically per tenant
            active = self._count_active(ctx.tenant)
            cap = ctx.quotas.max_active_evaluations
            if active >= cap:
                raise QuotaExceeded(f"tenant {ctx.tenant!r} has {active} queued or running evaluation(s); "
                                    f"max_active_evaluations is {cap} (wait for one to finish or cancel one)",
                                    limit="max_active_evaluations", retry_after=ACTIVE_RETRY_AFTER_S)
            with self.db.write() as db:
                db.add(job)
                db.flush()
                db.execute(table(EvaluationEpisode).insert(), episodes)
        self.runner.wake()
        return job

    def _scenario_environments(self, tenant: str, body: EvaluationCreate, ids: list[str]) -> dict[str, str]:
        """Scenario id -> environment id for every id, or NotFound naming the first bad index."""
        found: dict[str, str] = {}
        distinct = list(dict.fromkeys(ids))
        with self.db.read() as db:
            for start in range(0, len(distinct), ID_CHUNK):
                chunk = distinct[start:start + ID_CHUNK]
                rows = db.execute(select(models.Scenario.id, models.Scenario.environment_id).where(
                    models.Scenario.id.in_(chunk), models.Scenario.tenant == tenant)).all()
                found.update({r.id: r.environment_id for r in rows})
        for index, sid in enumerate(ids):
            if sid not in found:
                field = f"episodes.{index}.scenario_id" if body.mode == "replay" else f"scenario_ids.{index}"
                raise NotFound(f"{field}: scenario {sid[:64]!r} not found", field=field)
        return found

    def _count_active(self, tenant: str) -> int:
        with self.db.read() as db:
            return db.scalar(select(func.count()).select_from(EvaluationJob).where(
                EvaluationJob.tenant == tenant, EvaluationJob.status.in_(ACTIVE))) or 0

    # -- read ----------------------------------------------------------------------------
    def _job(self, tenant: str, evaluation_id: str) -> models.EvaluationJob:
        with self.db.read() as db:
            return owned(db, EvaluationJob, evaluation_id, tenant, "evaluation")

    def get(self, tenant: str, evaluation_id: str) -> EvaluationJobPublic:
        """The job with its progress (and summary once finished). Raises NotFound (also
        for another tenant's id)."""
        row = self._job(tenant, evaluation_id)
        return self._public(row, self._progress([row.id])[row.id])

    def list_jobs(self, tenant: str, limit: int, offset: int) -> tuple[list[EvaluationJobPublic], int]:
        """A page of the tenant's jobs, newest first, with progress; and the total."""
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(EvaluationJob)
                              .where(EvaluationJob.tenant == tenant)) or 0
            rows = db.scalars(select(EvaluationJob).where(EvaluationJob.tenant == tenant)
                              .order_by(EvaluationJob.created_at.desc(), EvaluationJob.id)
                              .limit(limit).offset(offset)).all()
        progress = self._progress([r.id for r in rows])
        return [self._public(r, progress[r.id], with_summary=False) for r in rows], total

    def _progress(self, job_ids: list[str]) -> dict[str, EvaluationProgress]:
        counts: dict[str, dict[str, tuple[int, float, int]]] = {j: {} for j in job_ids}
        if job_ids:
            with self.db.read() as db:
                by_status = (select(EvaluationEpisode.evaluation_id, EvaluationEpisode.status, func.count(),
                                    func.sum(func.coalesce(EvaluationEpisode.reward, 0.0)),
                                    func.sum(case((EvaluationEpisode.reward == 1.0, 1), else_=0)))
                             .where(EvaluationEpisode.evaluation_id.in_(job_ids))
                             .group_by(EvaluationEpisode.evaluation_id, EvaluationEpisode.status))
                rows = db.execute(by_status).all()
            for job_id, status, count, reward_sum, successes in rows:
                counts[job_id][status] = (int(count), float(reward_sum or 0.0), int(successes or 0))
        out = {}
        for job_id, by in counts.items():
            def n(status: str, by: dict[str, tuple[int, float, int]] = by) -> int:
                return by.get(status, (0, 0.0, 0))[0]
            finished = n("done") + n("error")
            reward = sum(by.get(s, (0, 0.0, 0))[1] for s in ("done", "error"))
            out[job_id] = EvaluationProgress(
                total=sum(v[0] for v in by.values()), done=n("done"), errors=n("error"), running=n("running"),
                pending=n("pending"), cancelled=n("cancelled"), mean_reward=reward / finished if finished else None,
                success=by.get("done", (0, 0.0, 0))[2])
        return out

    def _public(self, row: models.EvaluationJob, progress: EvaluationProgress,
                with_summary: bool = True) -> EvaluationJobPublic:
        summary = self.summary(row.id, row.tenant) if with_summary and row.status not in ACTIVE else None
        return EvaluationJobPublic(id=row.id, mode=cast(Mode, row.mode), status=cast(JobStatus, row.status),
                                   config=row.config,
                                   concurrency=row.concurrency, total=row.total, progress=progress, summary=summary,
                                   error=row.error, created_by=row.created_by, created_at=row.created_at,
                                   finished_at=row.finished_at)

    def summary(self, evaluation_id: str, tenant: str) -> EvaluationSummary:
        """Mean reward, success rate, per-environment and per-scenario breakdowns, errors
        by status, episodes by failure (:func:`~sandpit.api.envs.failures.evaluation_failure`)
        and token usage over the job's finished episodes (errored ones count
        reward 0.0); beside each scenario, its pass rate over all of ``tenant``'s
        episodes of it (:meth:`StatsService.pass_rates`)."""
        with self.db.read() as db:
            finished = (select(EvaluationEpisode.environment_id, EvaluationEpisode.status,
                               EvaluationEpisode.reward, EvaluationEpisode.error_status, EvaluationEpisode.usage,
                               EvaluationEpisode.scenario_id, EvaluationEpisode.trajectory, EvaluationEpisode.checks)
                        .where(EvaluationEpisode.evaluation_id == evaluation_id))
            rows = db.execute(finished).all()
            names = dict(db.execute(select(models.Environment.id, models.Environment.name).where(
                models.Environment.id.in_({r[0] for r in rows if r[0]}))).all())
        per_env: dict[str, list[float]] = {}
        per_scenario: dict[str, list[float]] = {}
        errors: dict[str, int] = {}
        usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0, "retries": 0}
        rewards: list[float] = []
        cancelled = scored = 0
        by_failure: dict[str, int] = dict.fromkeys(FAILURES, 0)
        for environment_id, status, reward, error_status, used, scenario_id, trajectory, checks in rows:
            for name, value in (used or {}).items():
                if isinstance(value, int) and name in usage:
                    usage[name] += value
            if status == "cancelled":
                cancelled += 1
            if status not in ("done", "error"):
                continue
            value = float(reward) if status == "done" and reward is not None else 0.0
            scored += status == "done"
            if status == "error":
                errors[error_status or "error"] = errors.get(error_status or "error", 0) + 1
            by_failure[evaluation_failure(status, error_status, trajectory, checks)] += 1
            rewards.append(value)
            per_env.setdefault(environment_id or "", []).append(value)
            per_scenario.setdefault(scenario_id, []).append(value)
        overall = self.stats.pass_rates(tenant, list(per_scenario))

        def mean(values: list[float]) -> float | None:
            return sum(values) / len(values) if values else None

        def success(values: list[float]) -> float | None:
            return sum(1 for v in values if v == 1.0) / len(values) if values else None

        return EvaluationSummary(
            episodes=len(rewards), scored=scored, mean_reward=mean(rewards), success_rate=success(rewards),
            by_environment={env: EnvironmentBreakdown(name=names.get(env), episodes=len(v), mean_reward=mean(v),
                                                      success_rate=success(v))
                            for env, v in sorted(per_env.items())},
            by_scenario={sid: ScenarioBreakdown(episodes=len(v), mean_reward=mean(v), success_rate=success(v),
                                                overall_pass_rate=overall.get(sid, (None, 0))[0],
                                                overall_finished=overall.get(sid, (None, 0))[1])
                         for sid, v in sorted(per_scenario.items())},
            errors_by_status=dict(sorted(errors.items())), by_failure=by_failure, cancelled=cancelled, usage=usage)

    # -- cancel --------------------------------------------------------------------------
    def cancel(self, tenant: str, evaluation_id: str) -> EvaluationJobPublic:
        """Cancel: pending episodes become ``cancelled`` at once, running ones stop at
        their next step (their env is deleted, status ``cancelled``); the job's status is
        ``cancelled``. Cancelling a cancelled job changes nothing. Raises NotFound,
        Conflict (already completed or failed)."""
        self._job(tenant, evaluation_id)
        now = _now()
        with self.db.write() as db:
            row = db.get(EvaluationJob, evaluation_id)
            assert row is not None
            if row.status in ("completed", "failed"):
                raise Conflict(f"evaluation {evaluation_id!r} already {row.status}")
            if row.status in ACTIVE:
                db.execute(update(EvaluationEpisode)
                           .where(EvaluationEpisode.evaluation_id == evaluation_id,
                                  EvaluationEpisode.status == "pending")
                           .values(status="cancelled", finished_at=now))
                db.execute(update(EvaluationJob)
                           .where(EvaluationJob.id == evaluation_id, EvaluationJob.status.in_(ACTIVE))
                           .values(status="cancelled", finished_at=now))
        self.runner.cancel(evaluation_id)
        return self.get(tenant, evaluation_id)

    # -- results -------------------------------------------------------------------------
    def results(self, tenant: str, evaluation_id: str, include_transcript: bool) -> Iterator[bytes]:
        """JSON lines (one :class:`EpisodeResult` per finished episode, index order),
        read in batches while the response streams. Raises NotFound before streaming."""
        self._job(tenant, evaluation_id)

        def lines() -> Iterator[bytes]:
            last = -1
            while True:
                query = (select(EvaluationEpisode)
                         .where(EvaluationEpisode.evaluation_id == evaluation_id,
                                EvaluationEpisode.index > last, EvaluationEpisode.status.in_(FINISHED_EPISODE))
                         .order_by(EvaluationEpisode.index).limit(RESULTS_BATCH))
                if not include_transcript:
                    query = query.options(defer(EvaluationEpisode.transcript))
                with self.db.read() as db:
                    rows = db.scalars(query).all()
                    batch = [self._result(r, include_transcript) for r in rows]
                yield from batch
                if len(rows) < RESULTS_BATCH:
                    return
                last = rows[-1].index

        return lines()

    @staticmethod
    def _result(row: models.EvaluationEpisode, include_transcript: bool) -> bytes:
        failure = evaluation_failure(row.status, row.error_status, row.trajectory, row.checks)
        result = EpisodeResult(index=row.index, scenario_id=row.scenario_id, environment_id=row.environment_id,
                               status=cast(EpisodeStatus, row.status), reward=row.reward, passed=row.passed,
                               checks_total=row.checks_total, checks=row.checks, steps=row.steps,
                               error_status=row.error_status, error=row.error, failure=failure,
                               mask=masked(failure), env_id=row.env_id,
                               attempt=row.attempt, trajectory=row.trajectory, usage=row.usage,
                               transcript=row.transcript if include_transcript else None,
                               started_at=row.started_at, finished_at=row.finished_at)
        data = result.model_dump(mode="json", exclude_none=False)
        if not include_transcript:
            data.pop("transcript", None)
        return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
