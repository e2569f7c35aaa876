"""How an env gets a sandbox session, and where every verb finds its live entry.

:meth:`Sessions.live_entry` is the one way a request reaches an env's session: a live env
of the caller's tenant that has not expired is used as it is (no database read);
otherwise the env is re-attached from its committed head (:meth:`Sessions.attach`: a new
session restored from that state). This is the one recovery path for every loss: an env
never opened in this process (a fork, an API restart, another replica's env), one whose
session was evicted, and one whose sandbox was lost (the executor's session is a handle
that closes with its sandbox; it keeps no state). The head comes from the live entry's
own :class:`StateCache` (the one host copy of the state) when it is the committed head,
else from the database. Opening a session evicts the least recently used idle env when no
sandbox is free (:meth:`Sessions.open`), and answers 503 with ``Retry-After`` when none
frees. A new episode's session (create, reset) comes from :meth:`Sessions.new_episode`,
which also encodes its initial state, reusing an identical one opened before
(:class:`InitialStates`, the one cache of initial states: a session forked from a config
template names its state by digest, and a known digest costs no transfer).

Callers hold the env's lock (:meth:`.live.LiveEnvs.lock`) around :meth:`live_entry` and
what they do with the entry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from cachetools import LRUCache
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import CanonicalConfig
from ..db.database import Database
from ..db.store import PendingBlobs, StateCache, encode_state, load_state
from ..errors import Conflict, InvalidRequest, ServiceUnavailable
from ..sandboxes import CodeFailed, SandboxCapacity, Sandboxes, SandboxSession, SharedConfig
from ..schemas.envs import EnvConstruction
from ..services.common import aware, clean_text, owned, utcnow
from ..settings import ApiSettings
from .actions import ToolSets
from .configs import EnvConfigs
from .live import LiveEnv, LiveEnvs
from .rulebook import EpisodeRun

CAPACITY_ATTEMPTS = 4
"""Sessions an open tries to make room for (evicting an idle env each time) before the 503."""
INITIAL_STATES = 16
"""Encoded initial states remembered by (tenant, digest) (:class:`InitialStates`)."""


class InitialStates:
    """Stored initial states by ``(tenant, digest)``: an env whose session opened with a
    state the runner gave the same digest as an earlier one (the same environment and
    config; sessions forked from a config template always do) reuses that state's
    :class:`StateCache` (same root: the store is content-addressed) instead of encoding
    megabytes again. In the env's transaction its blobs are written again unless its root
    is still stored (:meth:`PendingBlobs.write` with the root), so a collection that ran
    meanwhile loses nothing. Keyed by tenant: digests come from the tenant's own
    sandboxes. The last :data:`INITIAL_STATES` used are kept (a ``cachetools.LRUCache``
    behind a lock). Thread-safe; entries are never mutated."""

    def __init__(self, max_entries: int = INITIAL_STATES) -> None:
        self._entries: LRUCache[tuple[str, str], tuple[StateCache, PendingBlobs]] = LRUCache(max_entries)
        self._lock = threading.Lock()

    def get(self, tenant: str, digest: str) -> tuple[StateCache, PendingBlobs] | None:
        """The state and its blobs stored for ``(tenant, digest)``, or None."""
        with self._lock:
            return self._entries.get((tenant, digest))

    def put(self, tenant: str, digest: str, cache: StateCache, pending: PendingBlobs) -> None:
        """Remember ``cache`` (and the blobs that store it) as ``tenant``'s state of ``digest``."""
        with self._lock:
            self._entries[(tenant, digest)] = (cache, pending)


class Sessions:
    """Live entries of envs and the sessions behind them (see the module docstring).

    Args:
        settings: ``env_max_lifetime_s`` (the expiry message).
        db: the control database.
        sandboxes: where sessions open.
        live: the live-session cache.
        configs: the envs' configs.
        toolsets: compiled tools per environment.
    """

    def __init__(self, settings: ApiSettings, db: Database, sandboxes: Sandboxes, live: LiveEnvs,
                 configs: EnvConfigs, toolsets: ToolSets) -> None:
        self.settings = settings
        self.db = db
        self.sandboxes = sandboxes
        self.live = live
        self.configs = configs
        self.toolsets = toolsets
        self.initial_states = InitialStates()

    def usable(self, db: DbSession, tenant: str, env_id: str) -> models.Env:
        """The env row if ``tenant`` owns it and it has not expired. Raises NotFound,
        Conflict (expired: 409, delete it and create a new one)."""
        return self.usable_row(owned(db, models.Env, env_id, tenant, "env"))

    def usable_row(self, row: models.Env) -> models.Env:
        """:meth:`usable`'s expiry check of a row already read (and owned by the caller).
        Raises Conflict (expired)."""
        if row.closed or aware(row.expires_at) <= utcnow():
            raise Conflict(f"env {row.id!r} has expired (max lifetime {self.settings.env_max_lifetime_s:g} s); "
                           "delete it and create a new one")
        return row

    def open(self, env_id: str, tenant: str, environment: models.Environment, init_config: dict[str, Any],
             profile: dict[str, Any] | None, snapshot: dict[str, list[Any]] | None,
             seed: int | None = None) -> SandboxSession:
        """Open a session of ``environment`` for ``env_id`` (restoring ``snapshot`` when
        given; ``seed``: its ``random`` seeded before the constructor), evicting the least
        recently used idle env to make room, up to :data:`CAPACITY_ATTEMPTS` times.
        Raises SandboxCapacity when none frees (503 with Retry-After), CodeFailed,
        QuotaExceeded (no execution slot), a SandboxError."""
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
    def new_episode(self, env_id: str, tenant: str, environment: models.Environment, init_config: CanonicalConfig,
                    profile: dict[str, Any] | None,
                    seed: int | None = None,
                    ) -> Iterator[tuple[SandboxSession, StateCache, PendingBlobs, EnvConstruction | None]]:
        """Instantiate ``environment`` for ``env_id`` with ``init_config`` (``seed``:
        EnvScaler's reset seed) and encode its initial state; yields ``(session, state,
        blobs to write, how the instance was made)`` (the last None when the executor does
        not say) and counts it in ``sandpit_env_construction_total``. The session is closed
        if the block raises. Raises InvalidRequest (field ``init_config``) when the
        environment code fails, and what :meth:`open` raises."""
        cached = self.configs.parsed.cached(init_config.hash)  # one object per config: its wire bytes are computed once
        value = cached if isinstance(cached, SharedConfig) else SharedConfig(init_config.value)
        self.configs.parsed.put(replace(init_config, value=value), replace=value is not cached)
        try:
            session = self.open(env_id, tenant, environment, value, profile, None, seed)
        except CodeFailed as exc:
            raise InvalidRequest(f"instantiating {environment.class_name} failed ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}", field="init_config") from None
        try:
            opened = session.take_opened()
            construction = None if opened.construction is None else EnvConstruction.model_validate(
                opened.construction.model_dump())
            if construction is not None and self.live.metrics is not None:
                self.live.metrics.constructions.labels(construction.path, construction.reason or "none").inc()
            digest = opened.digest
            known = self.initial_states.get(tenant, digest) if digest is not None else None
            if known is not None:
                yield session, known[0], known[1], construction
            else:  # a template-forked state of an unknown digest is asked of the sandbox once
                attributes = opened.attributes if opened.attributes is not None else session.read_state()
                pending = PendingBlobs()
                cache = encode_state(attributes, pending)
                if digest is not None:
                    self.initial_states.put(tenant, digest, cache, pending)
                yield session, cache, pending, construction
        except BaseException:
            session.close()
            raise

    def attach(self, db: DbSession, row: models.Env, environment: models.Environment) -> tuple[LiveEnv, bool]:
        """The env's live entry, re-attached from its committed head when it has none or
        its session closed (evicted, its sandbox lost, another replica's since). The head
        is the live entry's own state when that is the committed head (same episode, step
        and root: the one host copy, no database read of the state), else the stored one.
        Returns ``(entry, attached_now)``. Raises ServiceUnavailable (no stored head, or the
        environment failed to restore: retry after 1 s), and what :meth:`open` raises."""
        entry = self.live.get(row.id)
        if entry is not None and not entry.session.closed:
            return entry, False
        head = db.get(models.Step, (row.id, row.episode, row.step))
        if head is None:
            raise ServiceUnavailable(f"env {row.id!r} has no stored head state", retry_after=1)
        if (entry is not None and entry.episode == row.episode and entry.step == row.step
                and entry.cache.root == head.state_root):
            cache = entry.cache
        else:
            cache = load_state(db, head.state_root)
        try:
            session = self.open(row.id, row.tenant, environment, self.configs.read(db, row), row.profile,
                                cache.encoded())
        except CodeFailed as exc:
            raise ServiceUnavailable(f"restoring env {row.id!r} failed ({exc.status}): "
                                     f"{clean_text(exc.observation)[:500]}", retry_after=1) from None
        entry = LiveEnv(session=session, cache=cache, episode=row.episode, step=row.step,
                        toolset=self.toolsets.of(environment), tenant=row.tenant, environment_id=row.environment_id,
                        expires_at=row.expires_at, run=EpisodeRun.of(db, row),
                        argument_checking=row.argument_checking or environment.argument_checking)
        self.live.put(row.id, entry)
        return entry, True

    def live_now(self, tenant: str, env_id: str) -> LiveEnv | None:
        """The live entry of ``env_id`` when :meth:`live_entry` would use it as it is (this
        tenant's, its session open, not expired), else None; never reads the database."""
        entry = self.live.get(env_id)
        if (entry is not None and not entry.session.closed and entry.tenant == tenant
                and aware(entry.expires_at) > utcnow()):
            return entry
        return None

    def live_entry(self, tenant: str, env_id: str) -> tuple[LiveEnv, bool]:
        """The live entry of ``env_id`` (re-attached when needed) and whether it was
        attached now; call it holding the env's lock. A live env of this tenant that has
        not expired is used without a database read. Raises NotFound, Conflict (expired),
        ServiceUnavailable (restoring failed), NoCapacity."""
        entry = self.live_now(tenant, env_id)
        if entry is not None:
            return entry, False
        with self.db.read() as db:
            row = self.usable(db, tenant, env_id)
            environment = db.get(models.Environment, row.environment_id)
            if environment is None:
                raise ServiceUnavailable(f"env {env_id!r} has no stored environment", retry_after=1)
            return self.attach(db, row, environment)
