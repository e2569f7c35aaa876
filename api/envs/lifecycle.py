"""Envs: instances of environments in sandboxes (``/v1/envs``), from creation to deletion.

:class:`EnvLifecycle` creates, reads, lists and deletes envs and closes the expired ones;
:class:`Collector` deletes the stored states no step refers to any more. The rules every
verb of :mod:`sandpit.api.envs` keeps:

* Every acknowledged step is committed (action, observation, status, duration, reward,
  state root) before the call returns (:mod:`.steps`); state is stored incrementally
  (:mod:`sandpit.api.db.store`).
* An env without a live session (new fork, evicted, after an API restart) is re-created
  from its head state in the database on its next request, transparently (:mod:`.sessions`).
* Requests on one env are serialized (a lock per env); different envs run concurrently.
* Idle envs leave their sandbox after ``env_idle_evict_s`` (only while the sandboxes are
  ``env_idle_evict_fullness`` full, when that is set); envs past their lifetime are
  closed (409 on use). When no sandbox is free, the least recently used idle env is
  evicted to make room, else the request gets 503 with ``Retry-After``.
* ``reset`` starts the next episode (the previous one stays readable: :mod:`.history`),
  ``restore`` goes back to a step of the current episode, ``fork`` copies its history into
  new envs (stored states are shared: content-addressed) (:mod:`.episodes`).

Every verb takes the caller's :class:`~sandpit.api.services.quotas.TenantContext`: the
tenant's quotas apply and the verb is audited under the caller's key, whoever calls it
(a route, or the evaluation runner on a job's behalf).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import cast

import orjson
from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import CanonicalConfig, canonical, collect_configs, store_config
from ..db.database import CoreSession, Database, insert_objects
from ..db.idempotency import ReplyOnKey
from ..db.store import collect_garbage
from ..errors import NotFound
from ..json_rules import text_size
from ..sandboxes import Sandboxes
from ..schemas.envs import EnvCreate, EnvPublic, EnvsPublic
from ..services.common import new_id, owned, utcnow
from ..services.quotas import QuotaService, TenantContext
from ..services.stats import keep_deleted_env_episodes
from ..services.tenants import TenantService, audit_event
from ..settings import ApiSettings
from .live import LiveEnv, LiveEnvs
from .rulebook import EpisodeConfig, EpisodeRun, EpisodeService, episode_row, step_zero
from .sessions import Sessions
from .views import EnvViews

OPEN_ENVS = select(func.count()).select_from(models.Env).where(
    models.Env.tenant == bindparam("tenant"), models.Env.closed.is_(False), models.Env.expires_at > bindparam("now"))
"""How many envs of ``:tenant`` are open at ``:now`` (built once: every create counts)."""


def count_open_envs(db: Database, tenant: str) -> int:
    """Envs of ``tenant`` that are neither deleted nor closed/expired (what the
    ``max_live_envs`` quota counts): one prebuilt query on a Core connection (0.05 ms
    alone on SQLite, against 0.3 ms built anew through an ORM session). Raises
    ServiceUnavailable (database)."""
    with db.read_connection() as conn:
        return int(conn.scalar(OPEN_ENVS, {"tenant": tenant, "now": utcnow()}) or 0)


@dataclass(frozen=True)
class CreatedEnv:
    """A new env as :meth:`EnvLifecycle.create` returns it: ``public`` (the
    :class:`EnvPublic`), and the request's ``config`` with its canonical bytes when that
    is the config stored (so the reply can splice them in instead of encoding it again)."""

    public: EnvPublic
    config: CanonicalConfig | None
    data: bytes | None = None
    """:meth:`json`'s bytes when they were made already (stored on the request's key)."""

    def json(self) -> bytes:
        """``public`` as JSON bytes: ``model_dump_json``'s document with ``init_config``
        spliced in as the canonical bytes computed for the request (a config of megabytes
        is not encoded a second time for the echo)."""
        if self.data is not None:
            return self.data
        if self.config is None:
            return self.public.model_dump_json().encode("utf-8")
        fields = self.public.model_dump(mode="json", exclude={"init_config"})
        ordered = {name: orjson.Fragment(self.config.data) if name == "init_config" else fields[name]
                   for name in EnvPublic.model_fields if name == "init_config" or name in fields}
        return orjson.dumps(ordered)


class Collector:
    """Deletes stored states no step refers to any more: on request (:meth:`collect`), or
    from the janitor when an env was deleted or restored since the last pass
    (:meth:`want`, :meth:`collect_if_wanted`)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._wanted = threading.Event()

    def want(self) -> None:
        """Note that states may have become unreferenced (a delete, a restore)."""
        self._wanted.set()

    def collect(self) -> int:
        """Delete unreferenced state blobs and configs in one write transaction
        (:func:`~sandpit.api.db.store.collect_garbage`,
        :func:`~sandpit.api.db.configs.collect_configs`). Returns how many rows were
        deleted. Raises ServiceUnavailable (database)."""
        with self.db.write() as db:
            return collect_garbage(db) + collect_configs(db)

    def collect_if_wanted(self) -> int:
        """:meth:`collect` when :meth:`want` was called since the last collection, else 0."""
        if not self._wanted.is_set():
            return 0
        self._wanted.clear()
        return self.collect()


class EnvLifecycle:
    """Create, read, list, delete and expire envs (see the module docstring).

    Args:
        settings: ``env_max_lifetime_s``.
        db: the control database.
        sandboxes: the operator's profile and the executor's sessions of deleted envs.
        sessions: live entries and new sessions.
        rulebook: what a new episode runs.
        views: envs as the API shows them.
        collector: storage collection after deletes.
        quotas: the tenant's quotas.
        tenants: the audit log.
    """

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, sessions: Sessions,
                 rulebook: EpisodeService, views: EnvViews, collector: Collector, quotas: QuotaService,
                 tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.sessions = sessions
        self.live: LiveEnvs = sessions.live
        self.rulebook = rulebook
        self.views = views
        self.collector = collector
        self.quotas = quotas
        self.tenants = tenants

    def create(self, ctx: TenantContext, body: EnvCreate, *, env_id: str | None = None,
               episode: EpisodeConfig | None = None, reply_on: ReplyOnKey | None = None) -> CreatedEnv:
        """``POST /v1/envs``: instantiate an environment (registered, inline, or a
        scenario's with the scenario's ``init_config`` unless one is given) in a sandbox
        and commit its step 0, the first episode (``body.episode`` options). Before
        anything runs: the tenant's size quotas (code, ``init_config``), the resource
        profile (above the operator's: 422; above the tenant's ``max_profile``: 429), a
        reservation of ``max_live_envs`` and a concurrent call. Audited (``env.create``,
        in the same transaction as the env).

        ``env_id`` lets an internal caller (the evaluation runner) record the id before
        the env exists, so a crash in between leaves nothing it cannot find (default: a
        new id); ``episode`` gives options a request cannot express (the runner's
        open-ended episodes), instead of ``body.episode``'s. ``reply_on`` (a keyed request's
        claimed key) has the reply's JSON stored on the key in the transaction that
        commits the env (:class:`~sandpit.api.db.idempotency.ReplyOnKey`).

        Raises NotFound (environment, scenario), PayloadTooLarge, QuotaExceeded,
        InvalidRequest (instantiation failed: the message carries the observation; policy
        errors in inline code; a profile above the operator's; an unusable user
        endpoint), NoCapacity (503 + Retry-After), ServiceUnavailable (the simulated
        user's model), IdempotencyKeyInFlight (``reply_on``'s claim was taken over:
        nothing is committed)."""
        if body.source_code is not None:
            self.quotas.check_size(ctx, "max_code_bytes", text_size(body.source_code), "source_code")
        config = canonical(body.init_config) if body.init_config is not None else None
        if config is not None:  # measured once: the same bytes are hashed and stored
            self.quotas.check_size(ctx, "max_init_config_bytes", config.size, "init_config")
        requested = body.profile.model_dump(exclude_none=True) if body.profile else None
        if requested:  # above the operator's profile is a bad request (422) whatever the tenant's quota
            self.sandboxes.profile(requested)
        profile = self.quotas.profile_overrides(ctx, requested, self.sandboxes.default_limits())
        with self.quotas.reserve_envs(ctx), self.quotas.call(ctx):
            start = self.rulebook.start(ctx.tenant, environment_id=body.environment_id, source_code=body.source_code,
                                        class_name=body.class_name, scenario_id=body.scenario_id, init_config=config,
                                        options=body.episode)
            if episode is not None:
                start.config = episode
            env_id = env_id or new_id("env")
            environment = start.environment
            run = EpisodeRun(config=start.config, scenario_id=body.scenario_id, user_key_enc=start.user_key_enc)
            with self.sessions.new_episode(env_id, ctx.tenant, environment, start.init_config, profile,
                                           body.seed) as (session, cache, pending, construction):
                self.rulebook.first_observation(ctx.tenant, start.scenario.task if start.scenario else None, run)
                run.initial_root = cache.root
                now = utcnow()
                row = models.Env(id=env_id, tenant=ctx.tenant, environment_id=environment.id, init_config={},
                                 init_config_hash=start.init_config.hash, profile=profile, episode=1, step=0,
                                 closed=False, created_at=now, last_used_at=now,
                                 expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                                 scenario_id=body.scenario_id, argument_checking=body.argument_checking)
                self.sessions.configs.parsed.put(start.init_config)
                first = episode_row(env_id, 1, start, run, now)
                # the rows about to be committed (objects stay usable), live once they are: no
                # second read for the reply
                public = self.views.of_rows(row, environment, first, live=True)
                public.construction = construction
                created = CreatedEnv(public, config if config is not None and row.init_config_hash == config.hash
                                     else None)
                if reply_on is not None:  # rendered before the write: the writer is not held for it
                    created = replace(created, data=created.json())
                with self.db.write_connection() as conn:  # only inserts: Core, not an ORM flush
                    db = cast(DbSession, CoreSession(conn))
                    store_config(db, start.init_config, self.sessions.configs.compressed(start.init_config))
                    pending.write(db, cache.root)
                    insert_objects(conn, row, step_zero(env_id, 1, cache.root, now), first,
                                   audit_event(ctx.tenant, ctx.actor, "env.create", env_id,
                                               {"environment_id": environment.id, "scenario_id": body.scenario_id}))
                    if reply_on is not None:
                        reply_on.store(conn, created.json())
            self.live.put(env_id, LiveEnv(
                session=session, cache=cache, episode=1, step=0, toolset=self.sessions.toolsets.of(environment),
                tenant=ctx.tenant, environment_id=environment.id, expires_at=row.expires_at, run=run,
                argument_checking=body.argument_checking or environment.argument_checking))
        return created

    def read(self, ctx: TenantContext, env_id: str) -> EnvPublic:
        """``GET /v1/envs/{id}``: one env with its tools and current episode. Raises
        NotFound (also for another tenant's id)."""
        with self.db.read() as db:
            row = owned(db, models.Env, env_id, ctx.tenant, "env")
        return self.views.public(row)

    def is_live_for(self, ctx: TenantContext, env_id: str) -> bool:
        """Whether ``env_id`` is live in this process for the caller's tenant (no database
        read: safe on an event loop). False says nothing: ask :meth:`scenario_of`."""
        entry = self.sessions.live.get(env_id)
        return entry is not None and entry.tenant == ctx.tenant

    def scenario_of(self, ctx: TenantContext, env_id: str) -> str | None:
        """The scenario id ``env_id`` was made from (None: none), once the caller is known
        to own it: the MCP endpoints' existence check, one indexed read of two columns.
        Raises NotFound (also for another tenant's id)."""
        with self.db.read() as db:
            found = db.execute(select(models.Env.tenant, models.Env.scenario_id)
                               .where(models.Env.id == env_id)).first()
        if found is None or found.tenant != ctx.tenant:
            raise NotFound(f"env {env_id[:64]!r} not found")
        scenario: str | None = found.scenario_id
        return scenario

    def page(self, ctx: TenantContext, limit: int, offset: int) -> EnvsPublic:
        """``GET /v1/envs``: a page of the tenant's envs, newest first (without tools)."""
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(models.Env).where(models.Env.tenant == ctx.tenant)) or 0
            rows = db.scalars(select(models.Env).where(models.Env.tenant == ctx.tenant)
                              .order_by(models.Env.created_at.desc(), models.Env.id).limit(limit).offset(offset)).all()
        return EnvsPublic(data=[self.views.public(r, tools=False) for r in rows], count=total)

    def delete(self, ctx: TenantContext, env_id: str) -> None:
        """``DELETE /v1/envs/{id}``: the env's session, episodes, steps, host affinity
        (``env_hosts``) and (via collection) its unreferenced state blobs; audited
        (``env.delete``). What scenario statistics count of its episodes is kept
        (:func:`~sandpit.api.services.stats.keep_deleted_env_episodes`). Raises NotFound."""
        with self.live.lock(env_id):
            with self.db.read() as db:
                owned(db, models.Env, env_id, ctx.tenant, "env")  # NotFound before touching a session
            self.live.drop(env_id)
            self.sandboxes.discard(env_id)  # on its host, even if another replica stepped it last
            with self.db.write() as db:
                row = owned(db, models.Env, env_id, ctx.tenant, "env")
                keep_deleted_env_episodes(db, row.id)  # its episodes keep counting in scenario statistics
                db.execute(delete(models.Step).where(models.Step.env_id == row.id))
                db.execute(delete(models.Episode).where(models.Episode.env_id == row.id))
                db.execute(delete(models.EnvHost).where(models.EnvHost.env_id == row.id))  # its host affinity
                db.delete(row)
        self.live.forget(env_id)
        self.collector.want()
        self.tenants.audit(ctx.tenant, ctx.actor, "env.delete", env_id)

    def close_expired(self) -> int:
        """Mark envs past their lifetime closed and free their sessions (the janitor's
        task). Returns how many were closed. The expired envs are looked up in a read
        transaction and a write transaction (on SQLite, this process's one writer at a
        time) is opened only when there are some: a pass that finds none, nearly every
        pass, never holds up the steps' commits."""
        now = utcnow()
        expired_now = (models.Env.closed.is_(False), models.Env.expires_at <= now)
        with self.db.read() as db:
            expired = db.scalars(select(models.Env.id).where(*expired_now)).all()
        if expired:
            with self.db.write() as db:
                db.query(models.Env).filter(models.Env.id.in_(expired), *expired_now).update(
                    {models.Env.closed: True}, synchronize_session=False)
        for env_id in expired:
            self.live.drop(env_id)
        return len(expired)

    def janitor_tasks(self) -> list[Callable[[], object]]:
        """What the janitor runs each pass: idle eviction (``env_idle_evict_s``), expiry,
        storage collection."""
        return [self.evict_idle, self.close_expired, self.collector.collect_if_wanted]

    def evict_idle(self) -> int:
        """Idle eviction: envs without a request for ``env_idle_evict_s`` leave their
        sandboxes (their state stays in the database), least recently used first, while
        the sandboxes are at least ``env_idle_evict_fullness`` full
        (:meth:`Sandboxes.fullness`, asked again before each one; every idle env when it
        is 0). Returns how many left."""
        threshold = self.settings.env_idle_evict_fullness
        if threshold <= 0:
            return self.live.evict_idle(self.settings.env_idle_evict_s)
        return self.live.evict_idle(self.settings.env_idle_evict_s,
                                    keep_going=lambda: self.sandboxes.fullness() >= threshold)

    def close(self) -> None:
        """Close every live session (state stays in the database)."""
        self.live.close()
