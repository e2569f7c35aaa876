"""An env's episodes: ``reset`` starts the next one, ``restore`` goes back to a step of the
current one, ``fork`` copies its history into new envs.

``reset`` re-instantiates the environment (EnvScaler ``reset()``) with the given
``init_config`` (else the scenario's, else the current one), bound to the given scenario
(else the current one) and options (else the current ones), and commits its step 0; the
previous episode stays readable (``?episode=``). The previous episode's session is closed
once the next one's is placed, so the sandbox it leaves is not emptied (and recycled)
under it: the next episode of a repeated config is forked from the config's template there;
the close runs on a thread of its own (:meth:`.live.LiveEnvs.retire`), not in the request. ``restore`` deletes the steps after the
target and puts the live session (if any) into the target's state; an ended episode runs
again when the target is before its end, and a conversational episode's transcript is cut
to what it was then. ``fork`` writes new envs whose episode 1 is this env's current
episode up to a step: their steps point at the same stored states (content-addressed),
and their sessions start on first use.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import canonical, store_config
from ..db.database import CoreSession, Database, insert_objects, object_of
from ..db.idempotency import ReplyOnKey
from ..db.models import table
from ..db.store import load_state
from ..errors import Conflict, InvalidRequest, NotFound, QuotaExceeded
from ..sandboxes import SandboxError
from ..schemas.envs import EnvPublic, EnvsPublic, ForkRequest, ResetRequest, RestoreRequest
from ..services.common import new_id, owned, owned_row, utcnow
from ..services.quotas import QuotaService, TenantContext
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .failures import episode_failure
from .history import stored_step_failure
from .lifecycle import Collector
from .live import LiveEnv
from .rulebook import EpisodeRun, EpisodeService, episode_row, step_zero
from .sessions import Sessions
from .views import EnvViews


def rewound(db: DbSession, env_id: str, episode: int, step: int, record: models.Episode | None) -> dict[str, Any]:
    """The episode row's values after going back to ``step``: running again unless
    ``step`` itself ended it; its failure that of the steps kept (and of its checks when
    ``step`` ended it); the simulated user's chat cut to what it was then. ``{}`` when the
    env has no episode row."""
    if record is None:
        return {}
    ending = db.get(models.Step, (env_id, episode, step))
    values: dict[str, Any] = {}
    kept = db.execute(select(models.Step.status, models.Step.info).where(
        models.Step.env_id == env_id, models.Step.episode == episode, models.Step.step <= step,
        models.Step.step > 0)).all()
    failures = [stored_step_failure(status, info) for status, info in kept]
    if ending is not None and ending.done:
        values.update(status=ending.done, reward=ending.reward)
        checks = record.checks if isinstance(record.checks, list) else []
        values["failure"] = episode_failure(failures, [str(c.get("status", "ok")) for c in checks
                                                       if isinstance(c, dict)])
    else:
        values.update(status="running", reward=None, checks=None, ended_at=None, failure=episode_failure(failures))
    if record.user_messages is not None:
        turns = db.scalars(select(models.Step.info).where(
            models.Step.env_id == env_id, models.Step.episode == episode, models.Step.step <= step,
            models.Step.step > 0)).all()
        counts = [t["user_turns"] for t in turns if isinstance(t, dict) and "user_turns" in t]
        keep = max(counts) if counts else 3
        values["user_messages"] = list(record.user_messages)[:keep]
    return values


_ENVS, _EPISODES, _STEPS = table(models.Env), table(models.Episode), table(models.Step)
ENV_BY_ID = select(_ENVS).where(_ENVS.c.id == bindparam("env"))
"""The ``envs`` row ``:env`` (built once, as every prebuilt statement here: a reset reads
and writes through Core, as an env create does)."""
EPISODE_BY_KEY = select(_EPISODES).where(_EPISODES.c.env_id == bindparam("env"),
                                         _EPISODES.c.episode == bindparam("episode"))
"""The ``episodes`` row of ``(:env, :episode)``."""
FIRST_ROOT = select(_STEPS.c.state_root).where(_STEPS.c.env_id == bindparam("env"),
                                               _STEPS.c.episode == bindparam("episode"), _STEPS.c.step == 0)
"""The state root of step 0 of ``(:env, :episode)``."""
NEXT_EPISODE = update(_ENVS).where(_ENVS.c.id == bindparam("env")).values(
    episode=bindparam("next_episode"), step=bindparam("first_step"), init_config=bindparam("no_config"),
    init_config_hash=bindparam("config_hash"), environment_id=bindparam("to_environment"),
    scenario_id=bindparam("to_scenario"), last_used_at=bindparam("at"))
"""Move the env ``:env`` to its next episode's step 0 (a reset's one update)."""


class Episodes:
    """Reset, restore and fork (see the module docstring)."""

    def __init__(self, settings: ApiSettings, db: Database, sessions: Sessions, rulebook: EpisodeService,
                 views: EnvViews, collector: Collector, quotas: QuotaService, tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.sessions = sessions
        self.live = sessions.live
        self.rulebook = rulebook
        self.views = views
        self.collector = collector
        self.quotas = quotas
        self.tenants = tenants

    def reset(self, ctx: TenantContext, env_id: str, body: ResetRequest | None,
              reply_on: ReplyOnKey | None = None) -> EnvPublic:
        """``POST /v1/envs/{id}/reset``: start the next episode (module docstring), within
        the tenant's ``max_init_config_bytes`` and one of its concurrent calls. The reply
        is EnvScaler's ``reset()`` result (observation, tools, introduction). ``reply_on``
        (a keyed request's claimed key) has the reply's JSON (``model_dump_json``) stored
        on the key in the transaction that starts the episode
        (:class:`~sandpit.api.db.idempotency.ReplyOnKey`; its ``body`` is those bytes).

        Raises NotFound, Conflict (expired), PayloadTooLarge, QuotaExceeded,
        InvalidRequest (instantiation failed, an unusable user endpoint), NoCapacity (503
        + Retry-After), ServiceUnavailable (the simulated user), IdempotencyKeyInFlight
        (``reply_on``'s claim was taken over: nothing is committed)."""
        config = canonical(body.init_config) if body is not None and body.init_config is not None else None
        if config is not None:
            self.quotas.check_size(ctx, "max_init_config_bytes", config.size, "init_config")
            self.sessions.configs.check(config)
        scenario_id = body.scenario_id if body is not None else None
        with self.quotas.call(ctx), self.live.lock(env_id):
            row, current_run = self._current(ctx.tenant, env_id)
            scenario = scenario_id if scenario_id is not None else row.scenario_id
            start = self.rulebook.start(ctx.tenant, environment_id=row.environment_id if scenario is None else None,
                                        source_code=None, class_name=None, scenario_id=scenario, init_config=config,
                                        options=body.episode if body is not None else None, current=row,
                                        current_run=current_run)
            previous = self.live.detach(env_id)  # closed once the next episode's session is placed
            number = row.episode + 1
            run = EpisodeRun(config=start.config, scenario_id=scenario, user_key_enc=start.user_key_enc)
            environment = start.environment
            with ExitStack() as opened:
                try:
                    session, cache, pending, construction = opened.enter_context(self.sessions.new_episode(
                        env_id, ctx.tenant, environment, start.init_config, row.profile,
                        body.seed if body is not None else None))
                finally:
                    if previous is not None:  # its sandbox's reply is not waited for
                        self.live.retire(previous.session)
                self.rulebook.first_observation(ctx.tenant, start.scenario.task if start.scenario else None, run)
                run.initial_root = cache.root
                now = utcnow()
                self.sessions.configs.parsed.put(start.init_config)
                first = episode_row(env_id, number, start, run, now)
                new_config = start.init_config.hash != row.init_config_hash  # before the reply moves the row
                public = self._reply(row, number, start.init_config.hash, environment, scenario, now, first)
                public.construction = construction
                # rendered before the write: the writer is not held for it
                reply = public.model_dump_json().encode("utf-8") if reply_on is not None else b""
                with self.db.write_connection() as conn:  # inserts and one update: Core, not an ORM flush
                    db = cast(DbSession, CoreSession(conn))
                    if new_config:  # the row's own config is stored
                        store_config(db, start.init_config, self.sessions.configs.compressed(start.init_config))
                    pending.write(db, cache.root)
                    insert_objects(conn, step_zero(env_id, number, cache.root, now), first)
                    conn.execute(NEXT_EPISODE, {
                        "env": env_id, "next_episode": number, "first_step": 0, "no_config": {},
                        "config_hash": start.init_config.hash, "to_environment": environment.id,
                        "to_scenario": scenario, "at": now})
                    if reply_on is not None:
                        reply_on.store(conn, reply)
            self.live.put(env_id, LiveEnv(
                session=session, cache=cache, episode=number, step=0, toolset=self.sessions.toolsets.of(environment),
                tenant=ctx.tenant, environment_id=environment.id, expires_at=row.expires_at, run=run,
                argument_checking=row.argument_checking or environment.argument_checking))
        return public

    def _reply(self, row: models.Env, number: int, config_hash: str, environment: models.Environment,
               scenario: str | None, now: datetime, first: models.Episode) -> EnvPublic:
        """The reset's reply: ``row`` (a transient object) as the episode's update
        (``NEXT_EPISODE``) leaves it, with ``environment`` and the new episode's row
        ``first``, live (its session joins the live envs once the episode is committed);
        no second read."""
        row.episode, row.step, row.init_config, row.init_config_hash = number, 0, {}, config_hash
        row.environment_id, row.scenario_id, row.last_used_at = environment.id, scenario, now
        return self.views.of_rows(row, environment, first, live=True)

    def _current(self, tenant: str, env_id: str) -> tuple[models.Env, EpisodeRun]:
        """The env row (owned by ``tenant``, not expired) and its current episode's
        bookkeeping (:meth:`EpisodeRun.of`), read through Core in one transaction: the row
        is a transient object (:func:`~sandpit.api.db.database.object_of`). Raises
        NotFound, Conflict (expired), ServiceUnavailable (database)."""
        with self.db.read_connection() as conn:
            found = conn.execute(ENV_BY_ID, {"env": env_id}).mappings().first()
            row = self.sessions.usable_row(owned_row(None if found is None else object_of(models.Env, found),
                                                     env_id, tenant, "env"))
            keys = {"env": env_id, "episode": row.episode}
            episode = conn.execute(EPISODE_BY_KEY, keys).mappings().first()
            root = conn.scalar(FIRST_ROOT, keys)
        return row, EpisodeRun.of_rows(row, None if episode is None else object_of(models.Episode, episode), root)

    def restore(self, ctx: TenantContext, env_id: str, body: RestoreRequest) -> EnvPublic:
        """``POST /v1/envs/{id}/restore``: put the env back to ``body.step`` of its episode;
        later steps are discarded (an ended episode runs again when the step is before
        its end). A live session is restored at once; one that cannot be (no execution
        slot free, a sandbox failure) is dropped and the next request restores it.
        Raises NotFound (env or step), Conflict (past the head, or expired)."""
        step = body.step
        with self.live.lock(env_id):
            with self.db.read() as db:
                row = self.sessions.usable(db, ctx.tenant, env_id)
                if step > row.step:
                    raise Conflict(f"cannot restore to step {step}: the episode's head is step {row.step}")
                target = db.get(models.Step, (env_id, row.episode, step))
                if target is None:
                    raise NotFound(f"step {step} of env {env_id!r} not found")
                cache = load_state(db, target.state_root)
                rewind = rewound(db, env_id, row.episode, step, db.get(models.Episode, (env_id, row.episode)))
            entry = self.live.get(env_id)
            if entry is not None:
                try:
                    entry.session.restore(cache.encoded())
                except (SandboxError, QuotaExceeded):  # no slot free: the next request restores it
                    self.live.drop(env_id)
                    entry = None
            try:
                with self.db.write() as db:
                    db.execute(delete(models.Step).where(models.Step.env_id == env_id,
                                                         models.Step.episode == row.episode, models.Step.step > step))
                    db.query(models.Env).filter(models.Env.id == env_id).update(
                        {models.Env.step: step, models.Env.last_used_at: utcnow()})
                    if rewind:
                        episodes = table(models.Episode)
                        db.execute(episodes.update().where(episodes.c.env_id == env_id,
                                                           episodes.c.episode == row.episode).values(**rewind))
            except BaseException:
                self.live.drop(env_id)
                raise
            if entry is not None:
                entry.cache, entry.step, entry.last_used = cache, step, time.monotonic()
                if rewind:
                    entry.run.status = rewind["status"]
                    entry.run.reward = rewind.get("reward")
                    entry.run.failure = rewind["failure"]
                    if "user_messages" in rewind:
                        entry.run.user_messages = rewind["user_messages"]
            self.collector.want()
            with self.db.read() as db:
                fresh = owned(db, models.Env, env_id, ctx.tenant, "env")
        return self.views.public(fresh)

    def fork(self, ctx: TenantContext, env_id: str, body: ForkRequest) -> EnvsPublic:
        """``POST /v1/envs/{id}/fork``: ``body.count`` new envs whose episode 1 is this
        env's current episode up to ``body.step`` (the head when None), with its
        scenario, options and task; their stored states are shared (content-addressed)
        and their sessions start on first use. The count cap (``max_fork_count``, 422)
        comes before the tenant's ``max_live_envs`` reservation; audited (``env.fork``).
        Raises NotFound, Conflict (past the head, or expired), InvalidRequest (count),
        QuotaExceeded."""
        count, step = body.count, body.step
        if count > self.settings.max_fork_count:  # a bad request (422) before any quota question
            raise InvalidRequest(f"count {count} is over the maximum {self.settings.max_fork_count}", field="count")
        with self.quotas.reserve_envs(ctx, count), self.live.lock(env_id), self.db.write() as db:
            row = self.sessions.usable(db, ctx.tenant, env_id)
            point = row.step if step is None else step
            if point > row.step:
                raise Conflict(f"cannot fork at step {point}: the episode's head is step {row.step}")
            history = db.scalars(select(models.Step).where(
                models.Step.env_id == env_id, models.Step.episode == row.episode,
                models.Step.step <= point).order_by(models.Step.step)).all()
            record = db.get(models.Episode, (env_id, row.episode))
            rewind = rewound(db, env_id, row.episode, point, record)
            now = utcnow()
            forks = [models.Env(id=new_id("env"), tenant=ctx.tenant, environment_id=row.environment_id,
                                init_config=row.init_config, init_config_hash=row.init_config_hash,
                                profile=row.profile, episode=1, step=point,
                                closed=False, created_at=now, last_used_at=now,
                                expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                                forked_from=env_id, forked_at_step=point, scenario_id=row.scenario_id,
                                argument_checking=row.argument_checking)
                     for _ in range(count)]
            db.add_all(forks)
            db.flush()
            db.execute(table(models.Step).insert(), [
                {"env_id": fork.id, "episode": 1, "step": s.step, "action": s.action, "observation": s.observation,
                 "status": s.status, "duration_ms": s.duration_ms, "state_root": s.state_root, "created_at": s.created_at,
                 "reward": s.reward, "done": s.done, "info": s.info}
                for fork in forks for s in history])
            if record is not None:
                ended = rewind.get("status", "running") != "running"
                db.execute(table(models.Episode).insert(), [
                    {"env_id": fork.id, "episode": 1, "environment_id": record.environment_id,
                     "scenario_id": record.scenario_id, "config": record.config, "user_key_enc": record.user_key_enc,
                     "status": rewind.get("status", "running"), "observation": record.observation,
                     "task": record.task, "reward": rewind.get("reward"),
                     "checks": record.checks if ended else None,
                     "user_messages": rewind.get("user_messages", record.user_messages),
                     "started_at": record.started_at,
                     "ended_at": record.ended_at if ended else None, "failure": rewind.get("failure", "none")}
                    for fork in forks])
        self.tenants.audit(ctx.tenant, ctx.actor, "env.fork", env_id, {"forks": [r.id for r in forks]})
        return EnvsPublic(data=[self.views.public(r, tools=False) for r in forks], count=len(forks))
