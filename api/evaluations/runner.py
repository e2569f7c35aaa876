"""The background runner of batch evaluations: claims episodes, runs them, records them.

Threads: one dispatcher and one thread per running episode. The dispatcher wakes on a
new job, a finished episode or a cancel (else every ``POLL_S``) and claims ``pending``
episodes, oldest job first within a tenant and round-robin across tenants, within three
bounds: ``settings.evaluation_workers`` episodes in the process, the tenant's
``max_evaluation_concurrency`` over all its jobs, and each job's ``concurrency``.

An episode is a client of :mod:`sandpit.api.envs` like a route: it calls the same verbs
(create, step, evaluate, delete) with a
:class:`~sandpit.api.services.quotas.TenantContext` of the job's tenant and the key that
created the job. So its envs count against the tenant's quotas (``max_live_envs``,
``max_concurrent_calls``, ``steps_per_minute``, the size quotas), its sandbox runs go
through the fair scheduler (``max_running_calls``), and what it does is audited under
that key. A dynamic quota or a capacity error is retried with backoff
(``TRANSIENT_ATTEMPTS``); a replayed call over a size quota is recorded ``rejected``.

Exactly-once episodes:

* claiming is ``pending -> running`` with ``attempt + 1``, guarded by ``status='pending'``
  (``SELECT ... FOR UPDATE SKIP LOCKED`` first on PostgreSQL, so replicas sharing the
  database never claim one episode twice nor wait on each other: :mod:`.claims`);
* an episode's end (``done``/``error``/``cancelled`` with reward, checks, trajectory,
  transcript, usage) is one UPDATE guarded by ``status='running' AND attempt=<this
  attempt>``, so a superseded run can never record a second result;
* start-up (:meth:`EvaluationRunner.recover`): episodes left ``running`` by a dead
  process have their half-run env deleted and go back to ``pending`` (``cancelled`` when
  their job was cancelled); they rerun from scratch in a fresh env. Finished episodes are
  never rerun. On a shared PostgreSQL database "dead" means the claiming replica stopped
  heart-beating (:mod:`.claims`), checked by every replica every few seconds.
* an episode's env id is written to its row *before* the env is created
  (``EnvLifecycle.create(..., env_id=...)``), so a process killed at any point leaves no env
  that recovery does not find and delete.

Episode failures are per-episode ``error`` statuses (``error_status``): ``model_error``,
``model_unavailable`` (see :mod:`.rollout`), ``no_capacity`` / ``unavailable`` (sandbox
capacity or backend still failing after ``TRANSIENT_ATTEMPTS`` tries with backoff),
``env_error`` (the scenario's env could not be created), ``env_lost`` (its env was
deleted or expired meanwhile), ``check_error``, ``scenario_not_found``,
``secret_unavailable`` (the stored model key cannot be decrypted), ``internal`` (a bug;
logged). A refused tool call (unknown tool, bad arguments) is a ``rejected`` step, not a
failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from pydantic import ValidationError
from sqlalchemy import CursorResult, func, select, update

from ..db.database import Database
from ..db.models import EvaluationEpisode, EvaluationJob
from ..envs.lifecycle import EnvLifecycle
from ..envs.rewards import Rewards
from ..envs.rulebook import OPEN_ENDED, introduction_text
from ..envs.steps import Steps
from ..errors import (
    ApiError,
    Conflict,
    InvalidRequest,
    NoCapacity,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    ServiceUnavailable,
)
from ..schemas.envs import EnvCreate, FunctionCall, ProfileRequest, StepRequest
from ..secrets import SecretUnavailable
from ..services.common import new_id
from ..services.common import utcnow as _now
from ..services.declared_tools import agent_tools
from ..services.environments import EnvironmentService
from ..services.quotas import TenantContext
from ..services.scenarios import ScenarioService
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .claims import HEARTBEAT_S, Replicas
from .rollout import (
    CHAT_COUNTERS,
    ModelClient,
    ModelError,
    ModelSettings,
    StepRecord,
    initial_messages,
    run_episode,
)

log = logging.getLogger("sandpit.api.evaluations")
POLL_S = 0.5
TRANSIENT_ATTEMPTS = 5
TRANSIENT_BACKOFF_S = 0.5
"""First wait between tries of a sandbox operation that hit a transient error (doubles)."""
CLOSE_WAIT_S = 15.0
T = TypeVar("T")


class _Interrupted(Exception):
    """The episode must stop now: ``reason`` is ``cancelled`` or ``shutdown``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EpisodeFailed(Exception):
    """The episode ends with ``status='error'``; ``status`` is its ``error_status``."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class _Job:
    """What a worker needs of its job row (read once per dispatch)."""

    id: str
    tenant: str
    mode: str
    config: dict[str, Any]
    key_enc: bytes | None
    concurrency: int
    created_at: datetime
    created_by: str
    """The API key that created the job: the actor of what its episodes do."""


@dataclass
class _Episode:
    """A running episode's mutable record (written at its end)."""

    job: _Job
    index: int
    attempt: int
    env_id: str | None = None
    trajectory: list[StepRecord] | None = None
    transcript: list[dict[str, Any]] | None = None
    usage: dict[str, int] | None = None


class EvaluationRunner:
    """Runs evaluation episodes in the background (see the module docstring)."""

    def __init__(self, settings: ApiSettings, db: Database, envs: EnvLifecycle, steps: Steps, rewards: Rewards,
                 environments: EnvironmentService, scenarios: ScenarioService, tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.envs = envs
        self.steps = steps
        self.rewards = rewards
        self.environments = environments
        self.scenarios = scenarios
        self.tenants = tenants
        self._lock = threading.Lock()
        self._running: dict[tuple[str, int], threading.Thread] = {}
        self._tenant_of: dict[str, str] = {}
        self._cancelled: set[str] = set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self.replicas = Replicas(db)
        self._next_beat = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Register this replica, recover episodes of dead ones, then start the dispatcher thread."""
        self.replicas.register()
        self._next_beat = time.monotonic() + HEARTBEAT_S
        self.recover(startup=True)
        self._dispatcher = threading.Thread(target=self._loop, name="sandpit-eval-dispatch", daemon=True)
        self._dispatcher.start()

    def close(self) -> None:
        """Stop claiming; running episodes stop at their next step and go back to
        ``pending``. Waits up to ``CLOSE_WAIT_S`` seconds for them; an episode still
        blocked after that (a model request in flight) stays ``running`` in the database
        and is recovered on the next start."""
        self._stop.set()
        self._wake.set()
        if self._dispatcher is not None:
            self._dispatcher.join(timeout=5)
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            try:
                self.replicas.unregister()
            except ApiError:
                log.warning("evaluations: could not remove replica %s; it expires by itself", self.replicas.id)

    def wake(self) -> None:
        """Look for work now (a job was created)."""
        self._wake.set()

    def cancel(self, job_id: str) -> None:
        """Make the job's running episodes stop at their next step."""
        with self._lock:
            self._cancelled.add(job_id)
        self._wake.set()

    def recover(self, startup: bool = False) -> int:
        """Episodes left ``running`` by a replica that died (:meth:`.claims.Replicas.orphans`):
        delete their env if it still exists, then mark them ``pending`` (``cancelled`` when
        their job no longer runs). Returns how many were reset."""
        rows = self.replicas.orphans(startup)
        for job_id, index, attempt, env_id, tenant, job_status, created_by in rows:
            if env_id:
                self._delete_env(self._context(tenant, created_by), env_id)
            active = job_status in ("queued", "running")
            values: dict[str, Any] = {"status": "pending", "env_id": None, "started_at": None} if active else {
                "status": "cancelled", "env_id": None, "finished_at": _now()}
            with self.db.write() as db:
                db.execute(update(EvaluationEpisode)
                           .where(EvaluationEpisode.evaluation_id == job_id, EvaluationEpisode.index == index,
                                  EvaluationEpisode.status == "running", EvaluationEpisode.attempt == attempt)
                           .values(claimed_by=None, **values))
        if rows:
            log.warning("evaluations: %d episode(s) interrupted by a restart will run again", len(rows))
        return len(rows)

    # -- dispatch ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if time.monotonic() >= self._next_beat:
                    self._next_beat = time.monotonic() + HEARTBEAT_S
                    self.replicas.heartbeat()
                    self.recover()
                self._dispatch()
            except Exception:  # noqa: BLE001 - the dispatcher must keep running; logged
                log.exception("evaluation dispatch failed")
            self._wake.wait(POLL_S)
            self._wake.clear()

    def _active_jobs(self) -> list[_Job]:
        with self.db.read() as db:
            rows = db.scalars(select(EvaluationJob).where(EvaluationJob.status.in_(("queued", "running")))
                              .order_by(EvaluationJob.created_at, EvaluationJob.id)).all()
        return [_Job(r.id, r.tenant, r.mode, dict(r.config or {}), r.model_api_key_enc, r.concurrency, r.created_at,
                     r.created_by) for r in rows]

    def _dispatch(self) -> None:
        """Claim and start as many episodes as the bounds allow (fair across tenants);
        mark jobs with nothing left ``completed``."""
        jobs = self._active_jobs()
        by_tenant: dict[str, list[_Job]] = {}
        for job in jobs:
            by_tenant.setdefault(job.tenant, []).append(job)
        exhausted: set[str] = set()
        progress = True
        while progress and not self._stop.is_set():
            progress = False
            for tenant in sorted(by_tenant, key=self._tenant_running):
                if self._total_running() >= self.settings.evaluation_workers:
                    return
                if self._tenant_running(tenant) >= self.tenants.quotas(tenant).max_evaluation_concurrency:
                    continue
                for job in by_tenant[tenant]:
                    if job.id in exhausted or self._job_running(job.id) >= job.concurrency:
                        continue
                    if self._claim_and_start(job):
                        progress = True
                        break
                    exhausted.add(job.id)
                    if not self._job_running(job.id):
                        self._finish_if_done(job.id)

    def _total_running(self) -> int:
        with self._lock:
            return len(self._running)

    def _job_running(self, job_id: str) -> int:
        with self._lock:
            return sum(1 for j, _ in self._running if j == job_id)

    def _tenant_running(self, tenant: str) -> int:
        with self._lock:
            return sum(1 for j, _ in self._running if self._tenant_of.get(j) == tenant)

    def _claim_and_start(self, job: _Job) -> bool:
        """Claim the job's first pending episode and start its thread; False when none is pending."""
        with self.db.read() as db:  # read first: most polls find nothing and need no write
            pending = db.execute(select(EvaluationEpisode.index)
                                 .where(EvaluationEpisode.evaluation_id == job.id, EvaluationEpisode.status == "pending")
                                 .limit(1)).first()
        if pending is None:
            return False
        claim = self.replicas.claim(job.id)
        if claim is None:
            return True  # cancelled or taken meanwhile: look again
        index, attempt = claim
        episode = _Episode(job, index, attempt)
        thread = threading.Thread(target=self._run, args=(episode,), daemon=True,
                                  name=f"sandpit-eval-{job.id[-6:]}-{index}")
        with self._lock:
            self._running[(job.id, index)] = thread
            self._tenant_of[job.id] = job.tenant
        thread.start()
        return True

    def _finish_if_done(self, job_id: str) -> bool:
        """Mark the job ``completed`` when no episode is pending or running; True if it
        has nothing left to claim."""
        with self.db.write() as db:
            left = db.scalar(select(func.count()).select_from(EvaluationEpisode).where(
                EvaluationEpisode.evaluation_id == job_id,
                EvaluationEpisode.status.in_(("pending", "running")))) or 0
            if left == 0:
                db.execute(update(EvaluationJob)
                           .where(EvaluationJob.id == job_id, EvaluationJob.status.in_(("queued", "running")))
                           .values(status="completed", finished_at=_now()))
                return True
        return False

    # -- one episode --------------------------------------------------------------------------
    def _run(self, episode: _Episode) -> None:
        job = episode.job
        try:
            self._episode(episode)
        except _Interrupted as stop:
            self._delete_env(self._job_context(job), episode.env_id)
            if stop.reason == "cancelled":
                self._complete(episode, status="cancelled")
            else:  # shutdown: run again from scratch on the next start
                self._guarded(episode, status="pending", env_id=None, started_at=None)
        except EpisodeFailed as failed:
            if not job.config.get("keep_envs"):
                self._delete_env(self._job_context(job), episode.env_id)
            self._complete(episode, status="error", error_status=failed.status, error=failed.message[:4000])
        except Exception:  # noqa: BLE001 - one episode's bug must not stop the job; logged
            log.exception("evaluation %s episode %d failed", job.id, episode.index)
            self._delete_env(self._job_context(job), episode.env_id)
            self._complete(episode, status="error", error_status="internal", error="internal error (logged)")
        finally:
            with self._lock:
                self._running.pop((job.id, episode.index), None)
            if not self._stop.is_set():
                try:
                    self._finish_if_done(job.id)
                except ApiError:
                    log.warning("evaluation %s: could not update its status; the dispatcher will", job.id)
            self._wake.set()

    def _episode(self, episode: _Episode) -> None:
        job = episode.job
        with self.db.read() as db:
            row = db.get(EvaluationEpisode, (job.id, episode.index))
        assert row is not None
        try:
            scenario = self.scenarios.get_scenario(job.tenant, row.scenario_id)
        except NotFound:
            raise EpisodeFailed("scenario_not_found", f"scenario {row.scenario_id!r} no longer exists") from None
        self._check_stop(job)
        env_id = new_id("env")  # recorded before the env exists: recovery deletes it whatever happens next
        episode.env_id = env_id
        if not self._guarded(episode, env_id=env_id):  # superseded (cannot happen in one process)
            return
        ctx = self._job_context(job)
        profile = job.config.get("profile")
        body = EnvCreate(scenario_id=scenario.id, profile=ProfileRequest.model_validate(profile) if profile else None)
        try:  # the job decides when the episode ends (open-ended); its checks run after
            self._transient(job, lambda: self.envs.create(ctx, body, env_id=env_id, episode=OPEN_ENDED))
        except (InvalidRequest, PayloadTooLarge, NotFound) as exc:
            raise EpisodeFailed("env_error", f"creating the scenario's env failed: {exc.message}") from None
        except QuotaExceeded as exc:  # a fixed quota (_transient retries the others)
            raise EpisodeFailed("env_error", f"creating the scenario's env failed: {exc.message}") from None
        episode.trajectory = []
        if job.mode == "replay":
            self._replay(episode, list(row.tool_calls or []))
        else:
            self._rollout(episode, scenario.environment_id, scenario.task)
        self._check_stop(job)
        try:
            outcome = self._transient(job, lambda: self.rewards.evaluate(ctx, env_id, None))
        except (InvalidRequest, Conflict) as exc:
            raise EpisodeFailed("check_error", f"running the checks failed: {exc.message}") from None
        except NotFound as exc:
            raise EpisodeFailed("env_lost", f"the episode's env is gone: {exc.message}") from None
        if not job.config.get("keep_envs"):
            self._delete_env(self._job_context(job), env_id)
        self._complete(episode, status="done", reward=outcome.reward, passed=outcome.passed,
                       checks_total=outcome.total, checks=[r.model_dump() for r in outcome.results])

    def _replay(self, episode: _Episode, calls: list[dict[str, Any]]) -> None:
        assert episode.trajectory is not None and episode.env_id is not None
        for number, raw in enumerate(calls, start=1):
            self._check_stop(episode.job)
            try:
                request = StepRequest.model_validate(raw)
            except ValidationError as exc:  # stored before a schema change: recorded, not run
                name, arguments = _raw_action(raw)
                episode.trajectory.append(StepRecord(number, {"name": name, "arguments": arguments},
                                                     f"Error: {str(exc)[:300]}", "rejected", failure="agent"))
                continue
            episode.trajectory.append(self._step(episode, number, request))

    def _rollout(self, episode: _Episode, environment_id: str, task: str) -> None:
        job = episode.job
        assert episode.trajectory is not None
        environment = self.environments.get_environment(job.tenant, environment_id)
        config = job.config
        key: str | None
        try:
            if job.key_enc:
                key = self.tenants.box.decrypt(job.key_enc)
            else:  # the tenant's key only ever goes to the tenant's own endpoint (checked at creation)
                key = self._tenant_key(job.tenant) if config.get("api_key_source") == "tenant" else None
        except SecretUnavailable as exc:
            raise EpisodeFailed("secret_unavailable", str(exc)) from None
        model = ModelClient(ModelSettings(
            base_url=config["base_url"], model=config["model"], temperature=config.get("temperature"),
            max_tokens=config.get("max_tokens"), request_timeout_s=config.get("request_timeout_s", 120.0),
            retries=config.get("retries", 4), retry_initial_s=config.get("retry_initial_s", 1.0),
            retry_max_s=config.get("retry_max_s", 30.0)), key)
        introduction = introduction_text(environment.introduction, environment.rules, environment.description)
        messages = initial_messages(environment.name, introduction, task)
        episode.transcript = messages
        try:
            result = run_episode(model, messages, agent_tools(environment),
                                 lambda number, name, arguments: self._step(
                                     episode, number, StepRequest(function=FunctionCall(name=name[:1024],
                                                                                        arguments=arguments))),
                                 max_steps=int(config.get("max_steps", 30)),
                                 should_stop=lambda: self._stop_reason(job) is not None)
        except ModelError as exc:
            if exc.result is not None:
                episode.trajectory[:] = exc.result.trajectory
                episode.usage = exc.result.usage.as_dict(CHAT_COUNTERS)
            raise EpisodeFailed(exc.status, exc.message) from None
        finally:
            model.close()
        episode.trajectory[:] = result.trajectory
        episode.usage = result.usage.as_dict(CHAT_COUNTERS)
        self._check_stop(job)

    def _tenant_key(self, tenant: str) -> str | None:
        try:
            return self.tenants.model_api_key(tenant)
        except NotFound:
            return None

    def _step(self, episode: _Episode, number: int, request: StepRequest) -> StepRecord:
        """Run one action in the episode's env; a malformed one is a ``rejected`` step
        recorded in the env, like any step (over the arguments cap: recorded here only)."""
        job = episode.job
        assert episode.env_id is not None
        self._check_stop(job)
        env_id, ctx = episode.env_id, self._job_context(job)
        try:
            outcome = self._transient(job, lambda: self.steps.step(ctx, env_id, request))
        except (PayloadTooLarge, QuotaExceeded) as exc:  # over a size cap (fixed: _transient retries the others)
            name, arguments = _raw_action(request.model_dump(exclude_none=True))
            return StepRecord(number, {"name": name, "arguments": "<over the size cap>"}, f"Error: {exc.message}",
                              "rejected", failure="agent")
        except (NotFound, Conflict) as exc:
            raise EpisodeFailed("env_lost", f"the episode's env is gone: {exc.message}") from None
        run = outcome.run
        observation = run.observation if run.error is None else f"{run.observation}: {run.error}"
        return StepRecord(number, outcome.action, observation, run.status, run.duration_ms, outcome.failure)

    # -- helpers ---------------------------------------------------------------------------
    def _stop_reason(self, job: _Job) -> str | None:
        if self._stop.is_set():
            return "shutdown"
        with self._lock:
            return "cancelled" if job.id in self._cancelled else None

    def _check_stop(self, job: _Job) -> None:
        reason = self._stop_reason(job)
        if reason is not None:
            raise _Interrupted(reason)

    def _transient(self, job: _Job, operation: Callable[[], T]) -> T:
        """``operation()``, retried on sandbox capacity / backend / scheduler-queue errors
        (``TRANSIENT_ATTEMPTS`` tries, backoff from ``TRANSIENT_BACKOFF_S``). Raises
        EpisodeFailed (``no_capacity`` or ``unavailable``) when they persist, _Interrupted
        when the job is cancelled or the server stops meanwhile."""
        wait = TRANSIENT_BACKOFF_S
        for attempt in range(TRANSIENT_ATTEMPTS):
            try:
                return operation()
            except (NoCapacity, QuotaExceeded, ServiceUnavailable) as exc:
                if isinstance(exc, QuotaExceeded) and exc.fixed:
                    raise  # waiting does not lift a fixed quota
                if attempt == TRANSIENT_ATTEMPTS - 1:
                    capacity = isinstance(exc, NoCapacity | QuotaExceeded)
                    message = exc.message
                    raise EpisodeFailed("no_capacity" if capacity else "unavailable",
                                        f"gave up after {TRANSIENT_ATTEMPTS} tries: {message}") from None
            if self._stop.wait(wait):
                raise _Interrupted("shutdown")
            self._check_stop(job)
            wait *= 2
        raise AssertionError("unreachable")

    def _guarded(self, episode: _Episode, **values: Any) -> bool:
        """Update the episode row only if this attempt still owns it (``running`` with
        this ``attempt``); True if it did."""
        with self.db.write() as db:
            owned = (update(EvaluationEpisode)
                     .where(EvaluationEpisode.evaluation_id == episode.job.id, EvaluationEpisode.index == episode.index,
                            EvaluationEpisode.status == "running", EvaluationEpisode.attempt == episode.attempt)
                     .values(**values))
            result = db.execute(owned)
            return cast(CursorResult[Any], result).rowcount == 1

    def _complete(self, episode: _Episode, **values: Any) -> bool:
        """Record the episode's end (one guarded transaction). False when a newer
        attempt owns it: this run's result is dropped."""
        trajectory = [r.as_dict() for r in episode.trajectory] if episode.trajectory is not None else None
        done = self._guarded(episode, env_id=episode.env_id, trajectory=trajectory,
                             steps=len(trajectory or []), transcript=episode.transcript, usage=episode.usage,
                             finished_at=_now(), **values)
        if not done:
            log.warning("evaluation %s episode %d attempt %d was superseded; its result is dropped",
                        episode.job.id, episode.index, episode.attempt)
        return done

    def _job_context(self, job: _Job) -> TenantContext:
        """The caller an episode of ``job`` acts as: the job's tenant (its quotas now) and
        the key that created the job."""
        return self._context(job.tenant, job.created_by)

    def _context(self, tenant: str, actor: str) -> TenantContext:
        return TenantContext(tenant=tenant, actor=actor, quotas=self.tenants.quotas(tenant))

    def _delete_env(self, ctx: TenantContext, env_id: str | None) -> None:
        if env_id is None:
            return
        try:
            self.envs.delete(ctx, env_id)
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("could not delete evaluation env %s: %s", env_id, exc.message)


def _raw_action(raw: Any) -> tuple[str, Any]:
    """Name and arguments of a replayed call as given (for a ``rejected`` record)."""
    if not isinstance(raw, dict):
        return "", raw
    function = raw.get("function")
    if isinstance(function, dict):
        return str(function.get("name", "")), function.get("arguments")
    return str(raw.get("name", "")), raw.get("arguments")
