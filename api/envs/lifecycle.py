"""Envs: instances of environments in sandboxes (``/v1/envs``) and their lifecycle.

:class:`EnvService` owns the mapping from envs (database rows) to sandbox sessions
(through the live-session cache, :mod:`.live`). Rules:

* Every acknowledged step is committed (action, observation, status, duration, reward,
  state root) before the call returns (:mod:`.steps`); state is stored incrementally
  (:mod:`sandpit.api.db.store`).
* An env without a live session (new fork, evicted, after an API restart) is re-created
  from its head state in the database on its next request, transparently.
* Requests on one env are serialized (a lock per env); different envs run concurrently.
* Idle envs leave their sandbox after ``env_idle_evict_s``; envs past their lifetime are
  closed (409 on use). When no sandbox is free, the least recently used idle env is
  evicted to make room, else the request gets 503 with ``Retry-After``.
* ``reset`` starts the next episode (the previous one stays readable: :mod:`.history`),
  ``restore`` goes back to a step of the current episode, ``fork`` copies its history into
  new envs (stored states are shared: content-addressed).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

import orjson
from sqlalchemy import Table, delete, func, select
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import (
    CanonicalConfig,
    ConfigCache,
    MissingConfig,
    canonical,
    collect_configs,
    compressed,
    env_config,
    store_config,
)
from ..db.database import Database
from ..db.store import PendingBlobs, StateCache, collect_garbage, encode_state, load_state
from ..errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded, ServiceUnavailable
from ..json_rules import text_size
from ..sandboxes import CodeFailed, SandboxCapacity, SandboxError, Sandboxes, SandboxSession, SharedConfig
from ..schemas.envs import (
    EnvCreate,
    EnvPublic,
    EnvsPublic,
    EpisodeOptions,
    ForkRequest,
    ResetRequest,
    RestoreRequest,
)
from ..schemas.evaluations import EvaluateRequest, EvaluationPublic
from ..schemas.scenarios import CheckSpec
from ..services.checks import Checks
from ..services.common import aware, clean_text, new_id, owned, utcnow
from ..services.declared_tools import agent_tools
from ..services.environments import EnvironmentService
from ..services.quotas import QuotaService, TenantContext
from ..services.scenarios import check_policy, checks_size
from ..services.tenants import TenantService, audit_event
from ..settings import ApiSettings
from . import envscaler
from .live import LiveEnv, LiveEnvs
from .rewards import episode_reward
from .rulebook import EpisodeConfig, EpisodeRun, EpisodeService, episode_tools, introduction_text

EPISODES = cast(Table, models.Episode.__table__)
STEPS = cast(Table, models.Step.__table__)
CAPACITY_ATTEMPTS = 4
POLICY_MEMO = 4096
"""Check sources remembered as passing the static policy (by SHA-256)."""
INITIAL_STATES = 16
"""Encoded initial states remembered by (tenant, digest) (:class:`InitialStates`)."""


class InitialStates:
    """Stored initial states by ``(tenant, digest)``: an env whose session opened with a
    state the runner gave the same digest as an earlier one (the same environment and
    config; sessions forked from a config template always do) reuses that state's
    :class:`StateCache` (same root: the store is content-addressed) instead of encoding
    megabytes again. In the env's transaction its blobs are written again unless its root
    is still stored (:meth:`PendingBlobs.write` with the root), so a collection that ran
    meanwhile loses nothing. Keyed by tenant: digests
    come from the tenant's own sandboxes. Thread-safe; entries are never mutated."""

    def __init__(self, max_entries: int = INITIAL_STATES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], tuple[StateCache, PendingBlobs]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, digest: str) -> tuple[StateCache, PendingBlobs] | None:
        with self._lock:
            found = self._entries.get((tenant, digest))
            if found is not None:
                self._entries.move_to_end((tenant, digest))
            return found

    def put(self, tenant: str, digest: str, cache: StateCache, pending: PendingBlobs) -> None:
        with self._lock:
            self._entries[(tenant, digest)] = (cache, pending)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)


@dataclass
class EpisodeStart:
    """What a new episode needs: its environment, scenario and options."""

    environment: models.Environment
    scenario: models.Scenario | None
    init_config: CanonicalConfig
    """The config with its canonical bytes and hash (stored once: :mod:`sandpit.api.db.configs`)."""
    config: EpisodeConfig
    user_key_enc: bytes | None = None


def count_open_envs(db: Database, tenant: str) -> int:
    """Envs of ``tenant`` that are neither deleted nor closed/expired (what the
    ``max_live_envs`` quota counts)."""
    with db.read() as s:
        return s.scalar(select(func.count()).select_from(models.Env).where(
            models.Env.tenant == tenant, models.Env.closed.is_(False), models.Env.expires_at > utcnow())) or 0


class EnvService:
    """Envs: create, read, list, delete, reset, restore, fork and evaluate (see the module
    docstring)."""

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, environments: EnvironmentService,
                 episodes: EpisodeService, checks: Checks, live: LiveEnvs, quotas: QuotaService,
                 tenants: TenantService) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.environments = environments
        self.episodes = episodes
        self.checks = checks
        self.live = live
        self.quotas = quotas
        self.tenants = tenants
        self.configs = ConfigCache()
        self.initial_states = InitialStates()
        self._compressed_configs: OrderedDict[str, bytes] = OrderedDict()
        self._policy_passed: OrderedDict[str, None] = OrderedDict()
        self._memo_lock = threading.Lock()
        self._gc_wanted = threading.Event()

    # -- the HTTP contract -------------------------------------------------------------------
    def create(self, caller: TenantContext, body: EnvCreate) -> EnvPublic:
        """``POST /v1/envs``: the tenant's size and profile quotas, a reservation of
        ``max_live_envs`` and a concurrent call, then :meth:`create_env`; audited."""
        return self._create_public(caller, body)[0]

    def create_json(self, caller: TenantContext, body: EnvCreate) -> bytes:
        """:meth:`create`'s reply as JSON bytes, the ``EnvPublic`` of ``model_dump_json``
        with ``init_config`` spliced in as the canonical bytes computed for the request
        (:func:`~sandpit.api.db.configs.canonical`) instead of encoding the config again:
        a 3 MB config took ~19 ms to encode for the echo. Same errors as :meth:`create`."""
        public, config = self._create_public(caller, body)
        if config is None:
            return public.model_dump_json().encode("utf-8")
        fields = public.model_dump(mode="json", exclude={"init_config"})
        ordered = {name: orjson.Fragment(config.data) if name == "init_config" else fields[name]
                   for name in EnvPublic.model_fields if name == "init_config" or name in fields}
        return orjson.dumps(ordered)

    def _create_public(self, caller: TenantContext, body: EnvCreate) -> tuple[EnvPublic, CanonicalConfig | None]:
        if body.source_code is not None:
            self.quotas.check_size(caller, "max_code_bytes", text_size(body.source_code), "source_code")
        config = canonical(body.init_config) if body.init_config is not None else None
        if config is not None:  # measured once: the same bytes are hashed and stored
            self.quotas.check_size(caller, "max_init_config_bytes", config.size, "init_config")
        requested = body.profile.model_dump(exclude_none=True) if body.profile else None
        if requested:  # above the operator's profile is a bad request (422) whatever the tenant's quota
            self.sandboxes.profile(requested)
        profile = self.quotas.profile_overrides(caller, requested, self.sandboxes.default_limits())
        with self.quotas.reserve_envs(caller), self.quotas.call(caller):
            row, environment, episode = self._create(
                caller.tenant, environment_id=body.environment_id, source_code=body.source_code,
                class_name=body.class_name, init_config=config, scenario_id=body.scenario_id, profile=profile,
                episode=body.episode, argument_checking=body.argument_checking, audit_actor=caller.actor,
                seed=body.seed)
        # the rows just committed (objects stay usable): no second read for the reply
        public = EnvPublic(id=row.id, environment_id=row.environment_id, episode=row.episode, step=row.step,
                           init_config=self.config_of(row), created_at=row.created_at, expires_at=row.expires_at,
                           forked_from=row.forked_from, forked_at_step=row.forked_at_step,
                           scenario_id=row.scenario_id, **self._view(row, environment, episode, with_tools=True))
        return public, config if config is not None and row.init_config_hash == config.hash else None

    def read(self, caller: TenantContext, env_id: str) -> EnvPublic:
        """One env with its tools and current episode. Raises NotFound."""
        return self.public(self.get_env(caller.tenant, env_id))

    def page(self, caller: TenantContext, limit: int, offset: int) -> EnvsPublic:
        """A page of the tenant's envs, newest first (without tools)."""
        rows, total = self.list_envs(caller.tenant, limit, offset)
        return EnvsPublic(data=[self.public(r, tools=False) for r in rows], count=total)

    def delete(self, caller: TenantContext, env_id: str) -> None:
        """Delete an env; audited. Raises NotFound."""
        self.delete_env(caller.tenant, env_id)
        self.tenants.audit(caller.tenant, caller.actor, "env.delete", env_id)

    def reset_env(self, caller: TenantContext, env_id: str, body: ResetRequest | None) -> EnvPublic:
        """``POST /reset``: the size quota, a concurrent call, then :meth:`reset`."""
        config = canonical(body.init_config) if body is not None and body.init_config is not None else None
        if config is not None:
            self.quotas.check_size(caller, "max_init_config_bytes", config.size, "init_config")
        with self.quotas.call(caller):
            row = self.reset(caller.tenant, env_id, config,
                             scenario_id=body.scenario_id if body else None, episode=body.episode if body else None,
                             seed=body.seed if body else None)
        return self.public(row)

    def restore_env(self, caller: TenantContext, env_id: str, body: RestoreRequest) -> EnvPublic:
        """``POST /restore``: :meth:`restore`."""
        return self.public(self.restore(caller.tenant, env_id, body.step))

    def fork_env(self, caller: TenantContext, env_id: str, body: ForkRequest) -> EnvsPublic:
        """``POST /fork``: the count cap (422) before the ``max_live_envs`` reservation,
        then :meth:`fork`; audited."""
        if body.count > self.settings.max_fork_count:  # a bad request (422) before any quota question
            raise InvalidRequest(f"count {body.count} is over the maximum {self.settings.max_fork_count}",
                                 field="count")
        with self.quotas.reserve_envs(caller, body.count):
            rows = self.fork(caller.tenant, env_id, body.step, body.count)
        self.tenants.audit(caller.tenant, caller.actor, "env.fork", env_id, {"forks": [r.id for r in rows]})
        return EnvsPublic(data=[self.public(r, tools=False) for r in rows], count=len(rows))

    def evaluate_env(self, caller: TenantContext, env_id: str, body: EvaluateRequest | None) -> EvaluationPublic:
        """``POST /evaluate``: the checks' sources together within ``max_code_bytes``, then
        :meth:`evaluate` in a concurrent call; audited."""
        if body is not None and body.checks is not None:
            self.quotas.check_size(caller, "max_code_bytes", checks_size(body.checks), "checks")
        with self.quotas.call(caller):
            return self.evaluate(caller.tenant, env_id, body.checks if body else None, audit_actor=caller.actor,
                                 check_objects=body.check_objects if body else None)

    def public(self, row: models.Env, tools: bool = True) -> EnvPublic:
        """``row`` as the API shows it (:meth:`env_view` adds status, tools, episode)."""
        return EnvPublic(id=row.id, environment_id=row.environment_id, episode=row.episode, step=row.step,
                         init_config=self.config_of(row), created_at=row.created_at, expires_at=row.expires_at,
                         forked_from=row.forked_from, forked_at_step=row.forked_at_step, scenario_id=row.scenario_id,
                         **self.env_view(row, with_tools=tools))

    def config_of(self, row: models.Env) -> dict[str, Any]:
        """``row``'s ``init_config`` (shared: do not mutate), read only when it is not in
        memory. Raises ServiceUnavailable when the stored config is missing."""
        if row.init_config_hash is None:
            return row.init_config
        cached = self.configs.cached(row.init_config_hash)
        if cached is not None:
            return cached
        with self.db.read() as db:
            return self._config(db, row)

    def _config(self, db: DbSession, row: models.Env) -> dict[str, Any]:
        try:
            return env_config(db, row, self.configs)
        except MissingConfig as exc:
            raise ServiceUnavailable(f"env {row.id!r}: {exc}", retry_after=1) from None

    def _compressed(self, config: CanonicalConfig) -> bytes:
        """:func:`~sandpit.api.db.configs.compressed` of ``config``, remembered for the
        last few hashes (a repeated 3 MB config is not compressed again on every create)."""
        with self._memo_lock:
            data = self._compressed_configs.get(config.hash)
            if data is not None:
                self._compressed_configs.move_to_end(config.hash)
                return data
        data = compressed(config)
        with self._memo_lock:
            self._compressed_configs[config.hash] = data
            while len(self._compressed_configs) > INITIAL_STATES:
                self._compressed_configs.popitem(last=False)
        return data

    def _check_config(self, config: CanonicalConfig) -> None:
        """The server-wide cap (``max_init_config_bytes``): raises PayloadTooLarge."""
        limit = self.settings.max_init_config_bytes
        if config.size > limit:
            raise PayloadTooLarge(f"init_config is {config.size} bytes, over {limit}", field="init_config")

    # -- lifecycle ----------------------------------------------------------------------------
    def janitor_tasks(self) -> list[Callable[[], object]]:
        """What the janitor runs each pass: idle eviction, expiry, storage collection."""
        return [lambda: self.live.evict_idle(self.settings.env_idle_evict_s), self.close_expired,
                self.collect_garbage_if_wanted]

    def close(self) -> None:
        """Close every live session (state stays in the database)."""
        self.live.close()

    def open_session(self, env_id: str, tenant: str, environment: models.Environment, init_config: dict[str, Any],
                     profile: dict[str, Any] | None, snapshot: dict[str, list[Any]] | None,
                     seed: int | None = None) -> SandboxSession:
        """Open a session (``seed``: its ``random`` seeded before the constructor), evicting
        idle envs to make room. Raises SandboxCapacity when none frees (503 with
        Retry-After), CodeFailed."""
        resolved = self.sandboxes.profile(profile)
        for attempt in range(CAPACITY_ATTEMPTS):
            try:
                return self.sandboxes.open_session(tenant=tenant, source=environment.source_code,
                                                   class_name=environment.class_name, init_config=init_config,
                                                   profile=resolved, snapshot=snapshot, env_id=env_id, seed=seed)
            except SandboxCapacity:
                if attempt == CAPACITY_ATTEMPTS - 1 or not self.live.evict_lru(exclude=env_id):
                    raise
        raise AssertionError("unreachable")

    @contextmanager
    def _new_episode(self, env_id: str, tenant: str, environment: models.Environment,
                     init_config: CanonicalConfig, profile: dict[str, Any] | None,
                     seed: int | None = None) -> Iterator[tuple[SandboxSession, StateCache, PendingBlobs]]:
        """Instantiate ``environment`` for ``env_id`` (``seed``: EnvScaler's reset seed) and
        encode its initial state; yields ``(session, state, blobs to write)``. The session is closed if the block raises.
        Raises InvalidRequest (field ``init_config``) when the environment code fails."""
        cached = self.configs.cached(init_config.hash)  # one object per config: its wire bytes are computed once
        value = cached if isinstance(cached, SharedConfig) else SharedConfig(init_config.value)
        self.configs.put(replace(init_config, value=value), replace=value is not cached)
        try:
            session = self.open_session(env_id, tenant, environment, value, profile, None, seed)
        except CodeFailed as exc:
            raise InvalidRequest(f"instantiating {environment.class_name} failed ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}", field="init_config") from None
        try:
            attributes, digest = session.opened_state()
            known = self.initial_states.get(tenant, digest) if digest is not None else None
            if known is not None and digest is not None:
                session.share_opened_state(known[0].encoded(), digest)
                yield session, known[0], known[1]
            else:
                pending = PendingBlobs()
                cache = encode_state(attributes, pending)
                if digest is not None:
                    self.initial_states.put(tenant, digest, cache, pending)
                yield session, cache, pending
        except BaseException:
            session.close()
            raise

    @staticmethod
    def _step_zero(env_id: str, episode: int, root: str, now: datetime) -> models.Step:
        """The row of an episode's step 0 (the state right after instantiation)."""
        return models.Step(env_id=env_id, episode=episode, step=0, action=None, observation="", status="ok",
                           duration_ms=0.0, state_root=root, created_at=now)

    def _start(self, tenant: str, *, environment_id: str | None, source_code: str | None, class_name: str | None,
               scenario_id: str | None, init_config: dict[str, Any] | CanonicalConfig | None,
               options: EpisodeOptions | None,
               current: models.Env | None = None, current_run: EpisodeRun | None = None) -> EpisodeStart:
        """Resolve what a new episode (create or reset) runs: environment, scenario,
        ``init_config`` (given > scenario's > the env's current) and options."""
        scenario = None
        if scenario_id is not None:
            with self.db.read() as db:
                scenario = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            environment_id = scenario.environment_id
            if init_config is None:
                init_config = scenario.init_config
        if init_config is None:
            init_config = self.config_of(current) if current is not None else {}
        config = init_config if isinstance(init_config, CanonicalConfig) else canonical(init_config)
        self._check_config(config)
        if environment_id is not None:
            environment = self.environments.get_environment(tenant, environment_id)
        else:
            assert source_code is not None and class_name is not None
            environment = self.environments.inline_environment(tenant, source_code, class_name)
        self.environments.toolset(environment)
        keep = current_run.config if current_run is not None else None
        episode_config, key_enc = self.episodes.config_for(tenant, options, scenario is not None, keep,
                                                           scenario.episode_profile if scenario is not None else None)
        if options is None and current_run is not None:
            key_enc = current_run.user_key_enc
        return EpisodeStart(environment, scenario, config, episode_config, key_enc)

    @staticmethod
    def _episode_row(env_id: str, episode: int, start: EpisodeStart, run: EpisodeRun,
                     now: datetime) -> models.Episode:
        return models.Episode(env_id=env_id, episode=episode, environment_id=start.environment.id,
                              scenario_id=run.scenario_id, config=run.config.public(), user_key_enc=run.user_key_enc,
                              status="running", observation=run.observation, task=run.task,
                              user_messages=run.user_messages, started_at=now)

    def create_env(self, tenant: str, *, environment_id: str | None, source_code: str | None,
                   class_name: str | None, init_config: dict[str, Any] | CanonicalConfig | None,
                   profile: dict[str, Any] | None,
                   scenario_id: str | None = None, env_id: str | None = None, episode: EpisodeOptions | None = None,
                   argument_checking: str | None = None,
                   episode_config: EpisodeConfig | None = None, seed: int | None = None) -> models.Env:
        """Instantiate an environment (registered, inline, or a scenario's with the
        scenario's ``init_config`` unless one is given) in a sandbox and commit step 0:
        the first episode, with ``episode`` options (or ``episode_config`` from an
        internal caller). ``env_id`` lets an internal caller (the evaluation runner)
        record the id before the env exists, so a crash in between leaves nothing it
        cannot find (default: a new id).

        Raises NotFound (environment, scenario), PayloadTooLarge, InvalidRequest
        (instantiation failed: the message carries the observation; policy errors in
        inline code; a profile above the operator's; an unusable user endpoint),
        NoCapacity (503 + Retry-After), ServiceUnavailable (the simulated user's model)."""
        return self._create(tenant, environment_id=environment_id, source_code=source_code, class_name=class_name,
                            init_config=init_config, profile=profile, scenario_id=scenario_id, env_id=env_id,
                            episode=episode, argument_checking=argument_checking,
                            episode_config=episode_config, seed=seed)[0]

    def _create(self, tenant: str, *, environment_id: str | None, source_code: str | None,
                class_name: str | None, init_config: dict[str, Any] | CanonicalConfig | None,
                profile: dict[str, Any] | None, scenario_id: str | None = None, env_id: str | None = None,
                episode: EpisodeOptions | None = None, argument_checking: str | None = None,
                episode_config: EpisodeConfig | None = None,
                audit_actor: str | None = None, seed: int | None = None
                ) -> tuple[models.Env, models.Environment, models.Episode]:
        """:meth:`create_env`, returning the env row with the environment and episode rows
        it committed; with ``audit_actor``, the ``env.create`` audit event is committed in
        the same transaction (one database round trip fewer than a separate audit)."""
        start = self._start(tenant, environment_id=environment_id, source_code=source_code, class_name=class_name,
                            scenario_id=scenario_id, init_config=init_config, options=episode)
        if episode_config is not None:
            start.config = episode_config
        env_id = env_id or new_id("env")
        environment = start.environment
        run = EpisodeRun(config=start.config, scenario_id=scenario_id, user_key_enc=start.user_key_enc)
        with self._new_episode(env_id, tenant, environment, start.init_config, profile, seed) as (session, cache,
                                                                                                  pending):
            self.episodes.first_observation(tenant, start.scenario.task if start.scenario else None, run)
            run.initial_root = cache.root
            now = utcnow()
            row = models.Env(id=env_id, tenant=tenant, environment_id=environment.id, init_config={},
                             init_config_hash=start.init_config.hash, profile=profile, episode=1, step=0,
                             closed=False, created_at=now, last_used_at=now,
                             expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                             scenario_id=scenario_id, argument_checking=argument_checking)
            self.configs.put(start.init_config)
            episode_row = self._episode_row(env_id, 1, start, run, now)
            with self.db.write() as db:
                store_config(db, start.init_config, self._compressed(start.init_config))
                pending.write(db, cache.root)
                db.add(row)
                db.flush()
                db.add(self._step_zero(env_id, 1, cache.root, now))
                db.add(episode_row)
                if audit_actor is not None:
                    db.add(audit_event(tenant, audit_actor, "env.create", env_id,
                                       {"environment_id": environment.id, "scenario_id": scenario_id}))
        self.live.put(env_id, LiveEnv(session, cache, 1, 0, tenant, environment.id, row.expires_at, run=run,
                                      argument_checking=argument_checking or environment.argument_checking))
        return row, environment, episode_row

    def get_env(self, tenant: str, env_id: str) -> models.Env:
        """The env row or NotFound (also for another tenant's id)."""
        with self.db.read() as db:
            return owned(db, models.Env, env_id, tenant, "env")

    def env_status(self, row: models.Env) -> str:
        """``live`` (in a sandbox), ``evicted`` (state in the DB only) or ``closed``."""
        if row.closed or aware(row.expires_at) <= utcnow():
            return "closed"
        return "live" if row.id in self.live else "evicted"

    def env_view(self, row: models.Env, with_tools: bool = True) -> dict[str, Any]:
        """What ``EnvPublic`` shows of ``row`` beyond its columns: status, tools (with the
        episode's chat action), the current episode (status, observation, task, reward,
        options) and the environment's introduction. One database read."""
        with self.db.read() as db:
            environment = db.get(models.Environment, row.environment_id)
            episode = db.get(models.Episode, (row.id, row.episode))
        return self._view(row, environment, episode, with_tools)

    def _view(self, row: models.Env, environment: models.Environment | None, episode: models.Episode | None,
              with_tools: bool) -> dict[str, Any]:
        """:meth:`env_view` of rows already at hand (no database read)."""
        config = EpisodeConfig.from_stored(episode.config if episode is not None else None)
        view: dict[str, Any] = {"status": self.env_status(row), "episode_config": config.public()}
        if environment is not None:
            if config.envscaler:  # EnvScaler's reset(): its introduction, the record's tools as they are
                view["introduction"] = envscaler.introduction_text(environment.introduction, environment.rules)
            else:
                view["introduction"] = introduction_text(environment.introduction, environment.rules,
                                                         environment.description)
            view["argument_checking"] = row.argument_checking or environment.argument_checking
            if with_tools:
                tools = agent_tools(environment)
                view["tools"] = list(tools) if config.envscaler else episode_tools(tools, config)
        if episode is not None:
            view.update(episode_status=episode.status, observation=episode.observation, task=episode.task,
                        reward=episode.reward)
        return view

    def list_envs(self, tenant: str, limit: int, offset: int) -> tuple[list[models.Env], int]:
        """A page of the tenant's envs, newest first, and the total."""
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(models.Env).where(models.Env.tenant == tenant)) or 0
            rows = db.scalars(select(models.Env).where(models.Env.tenant == tenant)
                              .order_by(models.Env.created_at.desc(), models.Env.id).limit(limit).offset(offset)).all()
        return list(rows), total

    def count_open_envs(self, tenant: str) -> int:
        """:func:`count_open_envs` of this service's database."""
        return count_open_envs(self.db, tenant)

    def delete_env(self, tenant: str, env_id: str) -> None:
        """Delete an env: its session, episodes, steps, host affinity (``env_hosts``) and
        (via collection) unreferenced state blobs. Raises NotFound."""
        with self.live.lock(env_id):
            with self.db.read() as db:
                owned(db, models.Env, env_id, tenant, "env")  # NotFound before touching a session
            self.live.drop(env_id)
            self.sandboxes.discard(env_id)  # on its host, even if another replica stepped it last
            with self.db.write() as db:
                row = owned(db, models.Env, env_id, tenant, "env")
                db.execute(delete(models.Step).where(models.Step.env_id == row.id))
                db.execute(delete(models.Episode).where(models.Episode.env_id == row.id))
                db.execute(delete(models.EnvHost).where(models.EnvHost.env_id == row.id))  # its host affinity
                db.delete(row)
        self.live.forget(env_id)
        self._gc_wanted.set()

    def close_expired(self) -> int:
        """Mark envs past their lifetime closed and free their sessions."""
        now = utcnow()
        with self.db.write() as db:
            expired = db.scalars(select(models.Env.id).where(models.Env.closed.is_(False),
                                                             models.Env.expires_at <= now)).all()
            if expired:
                db.query(models.Env).filter(models.Env.id.in_(expired)).update(
                    {models.Env.closed: True}, synchronize_session=False)
        for env_id in expired:
            self.live.drop(env_id)
        return len(expired)

    def collect_garbage(self) -> int:
        """Delete state blobs no step references any more (one write transaction, see
        :func:`~sandpit.api.db.store.collect_garbage`). Returns how many."""
        with self.db.write() as db:
            return collect_garbage(db) + collect_configs(db)

    def collect_garbage_if_wanted(self) -> int:
        """:meth:`collect_garbage` when an env was deleted or restored since the last one."""
        if not self._gc_wanted.is_set():
            return 0
        self._gc_wanted.clear()
        return self.collect_garbage()

    # -- live sessions ------------------------------------------------------------------------
    def usable(self, db: DbSession, tenant: str, env_id: str) -> models.Env:
        """The env row if it has not expired. Raises NotFound, Conflict (expired)."""
        row = owned(db, models.Env, env_id, tenant, "env")
        if row.closed or aware(row.expires_at) <= utcnow():
            raise Conflict(f"env {env_id!r} has expired (max lifetime {self.settings.env_max_lifetime_s:g} s); "
                           "delete it and create a new one")
        return row

    @staticmethod
    def run_of(db: DbSession, row: models.Env) -> EpisodeRun:
        """The bookkeeping of ``row``'s current episode, read from its ``episodes`` row
        (an open-ended running episode when there is none)."""
        episode = db.get(models.Episode, (row.id, row.episode))
        first = db.get(models.Step, (row.id, row.episode, 0))
        if episode is None:
            return EpisodeRun(scenario_id=row.scenario_id, initial_root=first.state_root if first else None)
        return EpisodeRun(config=EpisodeConfig.from_stored(episode.config), scenario_id=episode.scenario_id,
                          status=episode.status, reward=episode.reward, observation=episode.observation,
                          task=episode.task, user_messages=episode.user_messages, user_key_enc=episode.user_key_enc,
                          initial_root=first.state_root if first else None)

    def _ensure_live(self, db: DbSession, row: models.Env) -> tuple[LiveEnv, bool]:
        """The env's live entry, restoring it from its head state when needed.
        Returns ``(entry, restored_now)``."""
        entry = self.live.get(row.id)
        if entry is not None and not entry.session.closed:
            return entry, False
        environment = db.get(models.Environment, row.environment_id)
        head = db.get(models.Step, (row.id, row.episode, row.step))
        if environment is None or head is None:
            raise ServiceUnavailable(f"env {row.id!r} has no stored head state", retry_after=1)
        cache = load_state(db, head.state_root)
        try:
            session = self.open_session(row.id, row.tenant, environment, self._config(db, row), row.profile,
                                        cache.encoded())
        except CodeFailed as exc:
            raise ServiceUnavailable(f"restoring env {row.id!r} failed ({exc.status}): "
                                     f"{clean_text(exc.observation)[:500]}", retry_after=1) from None
        entry = LiveEnv(session, cache, row.episode, row.step, row.tenant, row.environment_id, row.expires_at,
                        run=self.run_of(db, row),
                        argument_checking=row.argument_checking or environment.argument_checking)
        self.live.put(row.id, entry)
        return entry, True

    def live_entry(self, tenant: str, env_id: str) -> tuple[LiveEnv, bool]:
        """The live entry of ``env_id`` (restored when needed) and whether it was restored
        now; call it holding the env's lock. A live env of this tenant that has not
        expired is used without a database read. Raises NotFound, Conflict (expired),
        ServiceUnavailable (restoring failed), NoCapacity."""
        entry = self.live.get(env_id)
        if (entry is not None and not entry.session.closed and entry.tenant == tenant
                and entry.expires_at is not None and aware(entry.expires_at) > utcnow()
                and self.environments.cached_toolset(entry.environment_id) is not None):
            return entry, False
        with self.db.read() as db:
            row = self.usable(db, tenant, env_id)
            environment = db.get(models.Environment, row.environment_id)
            assert environment is not None
            self.environments.toolset(environment)
            return self._ensure_live(db, row)

    # -- episodes -----------------------------------------------------------------------------
    def reset(self, tenant: str, env_id: str, init_config: dict[str, Any] | CanonicalConfig | None,
              scenario_id: str | None = None, episode: EpisodeOptions | None = None,
              seed: int | None = None) -> models.Env:
        """Start the next episode (EnvScaler ``reset()``): re-instantiate with
        ``init_config`` (given, else the scenario's, else the current one), bound to
        ``scenario_id`` (given, else the current one), with ``episode`` options (given,
        else the current ones), and commit its step 0. The previous episode stays
        readable (``?episode=``). Raises NotFound, Conflict, InvalidRequest,
        NoCapacity (503 + Retry-After), ServiceUnavailable (the simulated user)."""
        if init_config is not None:
            init_config = init_config if isinstance(init_config, CanonicalConfig) else canonical(init_config)
            self._check_config(init_config)
        with self.live.lock(env_id):
            with self.db.read() as db:
                row = self.usable(db, tenant, env_id)
                current_run = self.run_of(db, row)
            scenario = scenario_id if scenario_id is not None else row.scenario_id
            start = self._start(tenant, environment_id=row.environment_id if scenario is None else None,
                                source_code=None, class_name=None, scenario_id=scenario,
                                init_config=init_config if init_config is not None or scenario_id is not None else
                                (self.config_of(row) if scenario is None else None),
                                options=episode, current=row, current_run=current_run)
            self.live.drop(env_id)
            number = row.episode + 1
            run = EpisodeRun(config=start.config, scenario_id=scenario, user_key_enc=start.user_key_enc)
            environment = start.environment
            with self._new_episode(env_id, tenant, environment, start.init_config, row.profile, seed) as (
                    session, cache, pending):
                self.episodes.first_observation(tenant, start.scenario.task if start.scenario else None, run)
                run.initial_root = cache.root
                now = utcnow()
                self.configs.put(start.init_config)
                with self.db.write() as db:
                    store_config(db, start.init_config, self._compressed(start.init_config))
                    pending.write(db, cache.root)
                    db.add(self._step_zero(env_id, number, cache.root, now))
                    db.add(self._episode_row(env_id, number, start, run, now))
                    db.query(models.Env).filter(models.Env.id == env_id).update(
                        {models.Env.episode: number, models.Env.step: 0, models.Env.init_config: {},
                         models.Env.init_config_hash: start.init_config.hash,
                         models.Env.environment_id: environment.id, models.Env.scenario_id: scenario,
                         models.Env.last_used_at: now})
            self.live.put(env_id, LiveEnv(session, cache, number, 0, tenant, environment.id, row.expires_at,
                                          run=run,
                                          argument_checking=row.argument_checking or environment.argument_checking))
            return self.get_env(tenant, env_id)

    # -- restore and fork ----------------------------------------------------------------------
    @staticmethod
    def _rewind_run(db: DbSession, env_id: str, episode: int, step: int,
                    record: models.Episode | None) -> dict[str, Any]:
        """The episode row's values after going back to ``step``: running again unless
        ``step`` itself ended it; the simulated user's chat cut to what it was then."""
        if record is None:
            return {}
        ending = db.get(models.Step, (env_id, episode, step))
        values: dict[str, Any] = {}
        if ending is not None and ending.done:
            values.update(status=ending.done, reward=ending.reward)
        else:
            values.update(status="running", reward=None, checks=None, ended_at=None)
        if record.user_messages is not None:
            turns = db.scalars(select(models.Step.info).where(
                models.Step.env_id == env_id, models.Step.episode == episode, models.Step.step <= step,
                models.Step.step > 0)).all()
            counts = [t["user_turns"] for t in turns if isinstance(t, dict) and "user_turns" in t]
            keep = max(counts) if counts else 3
            values["user_messages"] = list(record.user_messages)[:keep]
        return values

    def restore(self, tenant: str, env_id: str, step: int) -> models.Env:
        """Put the env back to ``step`` of its episode; later steps are discarded (an
        ended episode runs again when ``step`` is before its end). Raises NotFound,
        Conflict (past the head or expired)."""
        with self.live.lock(env_id):
            with self.db.read() as db:
                row = self.usable(db, tenant, env_id)
                if step > row.step:
                    raise Conflict(f"cannot restore to step {step}: the episode's head is step {row.step}")
                target = db.get(models.Step, (env_id, row.episode, step))
                if target is None:
                    raise NotFound(f"step {step} of env {env_id!r} not found")
                cache = load_state(db, target.state_root)
                rewind = self._rewind_run(db, env_id, row.episode, step, db.get(models.Episode, (env_id, row.episode)))
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
                        db.execute(EPISODES.update().where(EPISODES.c.env_id == env_id,
                                                           EPISODES.c.episode == row.episode).values(**rewind))
            except BaseException:
                self.live.drop(env_id)
                raise
            if entry is not None:
                entry.cache, entry.step, entry.last_used = cache, step, time.monotonic()
                if rewind:
                    entry.run.status = rewind["status"]
                    entry.run.reward = rewind.get("reward")
                    if "user_messages" in rewind:
                        entry.run.user_messages = rewind["user_messages"]
            self._gc_wanted.set()
            return self.get_env(tenant, env_id)

    def fork(self, tenant: str, env_id: str, step: int | None, count: int) -> list[models.Env]:
        """``count`` new envs whose history is this env's current episode up to ``step``
        (head when None), as their episode 1 (same scenario, options and task). Their
        stored states are shared (content-addressed), their sessions start on first use.
        Raises NotFound, Conflict, InvalidRequest (count)."""
        if count > self.settings.max_fork_count:
            raise InvalidRequest(f"count {count} is over the maximum {self.settings.max_fork_count}", field="count")
        with self.live.lock(env_id), self.db.write() as db:
            row = self.usable(db, tenant, env_id)
            point = row.step if step is None else step
            if point > row.step:
                raise Conflict(f"cannot fork at step {point}: the episode's head is step {row.step}")
            history = db.scalars(select(models.Step).where(
                models.Step.env_id == env_id, models.Step.episode == row.episode,
                models.Step.step <= point).order_by(models.Step.step)).all()
            record = db.get(models.Episode, (env_id, row.episode))
            rewind = self._rewind_run(db, env_id, row.episode, point, record)
            now = utcnow()
            forks = [models.Env(id=new_id("env"), tenant=tenant, environment_id=row.environment_id,
                                init_config=row.init_config, init_config_hash=row.init_config_hash,
                                profile=row.profile, episode=1, step=point,
                                closed=False, created_at=now, last_used_at=now,
                                expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                                forked_from=env_id, forked_at_step=point, scenario_id=row.scenario_id,
                                argument_checking=row.argument_checking)
                     for _ in range(count)]
            db.add_all(forks)
            db.flush()
            db.execute(STEPS.insert(), [
                {"env_id": fork.id, "episode": 1, "step": s.step, "action": s.action, "observation": s.observation,
                 "status": s.status, "duration_ms": s.duration_ms, "state_root": s.state_root, "created_at": s.created_at,
                 "reward": s.reward, "done": s.done, "info": s.info}
                for fork in forks for s in history])
            if record is not None:
                ended = rewind.get("status", "running") != "running"
                db.execute(EPISODES.insert(), [
                    {"env_id": fork.id, "episode": 1, "environment_id": record.environment_id,
                     "scenario_id": record.scenario_id, "config": record.config, "user_key_enc": record.user_key_enc,
                     "status": rewind.get("status", "running"), "observation": record.observation,
                     "task": record.task, "reward": rewind.get("reward"),
                     "checks": record.checks if ended else None,
                     "user_messages": rewind.get("user_messages", record.user_messages),
                     "started_at": record.started_at,
                     "ended_at": record.ended_at if ended else None}
                    for fork in forks])
        return forks

    # -- evaluate ------------------------------------------------------------------------------
    def _check_policy(self, checks: list[CheckSpec]) -> None:
        """:func:`~.scenarios.check_policy` (the ``standard`` static policy) for sources not
        seen passing before: a verdict is a pure function of the source, so passing sources
        are remembered by SHA-256 (at most ``POLICY_MEMO``). A refused source is checked
        again with the whole list, so the error names its index as before. Raises
        InvalidRequest."""
        for check in checks:
            digest = hashlib.sha256(check.check_func.encode("utf-8", "surrogatepass")).hexdigest()
            with self._memo_lock:
                known = digest in self._policy_passed
                if known:
                    self._policy_passed.move_to_end(digest)
            if known:
                continue
            try:
                check_policy([check], "checks")
            except InvalidRequest:
                check_policy(checks, "checks")
                raise
            with self._memo_lock:
                self._policy_passed[digest] = None
                while len(self._policy_passed) > POLICY_MEMO:
                    self._policy_passed.popitem(last=False)

    def evaluate(self, tenant: str, env_id: str, checks: list[CheckSpec] | None,
                 audit_actor: str | None = None, check_objects: str | None = None) -> EvaluationPublic:
        """Run check functions on the env's initial and current state (restored in a
        sandbox; objects of the environment's classes as stand-ins unless
        ``check_objects`` (default: the scenario's) is ``environment``); store and return
        the outcome (with ``audit_actor``, the
        ``env.evaluate`` audit event commits in the same transaction). Raises NotFound,
        Conflict (no checks given and no scenario), InvalidRequest (a check over the caps or
        refused by the static policy), NoCapacity (503 + Retry-After)."""
        if checks is not None:
            self._check_policy(checks)
        with self.live.lock(env_id), self.db.read() as db:
            row = owned(db, models.Env, env_id, tenant, "env")
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
            initial = load_state(db, first.state_root)
            entry = self.live.get(env_id)  # the live head, when it is this one: no second load
            live_head = (entry is not None and entry.episode == row.episode and entry.step == row.step
                         and entry.cache.root == head.state_root)
            final = entry.cache if live_head and entry is not None else load_state(db, head.state_root)
            episode, step = row.episode, row.step
        results = self.checks.on_states(tenant, specs, initial, final, environment.source_code, objects=check_objects)
        passed = sum(1 for r in results if r.passed)
        reward = episode_reward([r.passed for r in results])
        evaluation = models.Evaluation(id=new_id("evl"), env_id=env_id, episode=episode, step=step, reward=reward,
                                       results=[r.model_dump() for r in results], created_at=utcnow())
        with self.db.write() as db:
            db.add(evaluation)
            if audit_actor is not None:
                db.add(audit_event(tenant, audit_actor, "env.evaluate", env_id,
                                   {"reward": reward, "evaluation": evaluation.id}))
        return EvaluationPublic(id=evaluation.id, env_id=env_id, episode=episode, step=step, reward=reward,
                                passed=passed, total=len(results), results=results, created_at=evaluation.created_at)

