"""Environment and env operations: the API's service layer.

:class:`EnvService` owns the mapping from envs (database rows) to executor sessions
(processes in sandboxes). Rules:

* Every acknowledged step is committed (action, observation, status, duration, state
  root) before the call returns; state is stored incrementally (:mod:`.store`).
* A live env holds an executor session plus its head :class:`~.store.StateCache`. An env
  without one (new fork, evicted, after an API restart) is re-created from its head state
  in the database on its next request, transparently.
* Requests on one env are serialized (a lock per env); different envs run concurrently.
* If the database write of a step fails after the sandbox ran it, the env's session is
  dropped, so the next request restores the last *committed* state.
* Idle envs leave their sandbox after ``env_idle_evict_s``; envs past their lifetime are
  closed (409 on use). When no sandbox is free, the least recently used idle env is
  evicted to make room, else the request gets 503 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sandpit.executor.errors import CapacityError, ExecutorError, SessionClosed, SessionError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.profiles import ProfileOverrides, ResourceProfile
from sandpit.executor.results import CallResult, Snapshot
from sandpit.executor.scheduler import FairScheduler, SchedulerBusy
from sandpit.executor.session import Session, SessionOpenError
from sqlalchemy import delete, func, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from . import models
from .diff import state_diff
from .errors import Conflict, InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded, ServiceUnavailable
from .metrics import Metrics
from .policy_report import check_source, policy_summary
from .settings import ApiSettings
from .store import PendingBlobs, StateCache, apply_delta, encode_state, load_state, state_view
from .tools import ToolCall, ToolSet, json_size, text_size

log = logging.getLogger("sandpit.api")
FAILURE_STATUSES = ("timeout", "oom", "crashed")
STEPS = models.Step.__table__
ENVS = models.Env.__table__
CAPACITY_ATTEMPTS = 4


def utcnow() -> datetime:
    """The current time, timezone-aware (UTC); what every stored timestamp uses."""
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """``moment`` with UTC attached when the database returned it naive (SQLite)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


Owned = TypeVar("Owned", models.Environment, models.Env, models.Scenario, models.EvaluationJob)


def owned(db: DbSession, model: type[Owned], object_id: str, tenant: str, what: str) -> Owned:
    """The ``model`` row ``object_id`` if ``tenant`` owns it. Raises NotFound, with the
    same message for an unknown id and another tenant's (multi-tenancy: ids never leak)."""
    row = db.get(model, object_id)
    if row is None or row.tenant != tenant:
        raise NotFound(f"{what} {object_id[:64]!r} not found")
    return row


def new_id(prefix: str) -> str:
    """A random id such as ``env_3f9c...`` (96 bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def clean_text(value: str) -> str:
    """Text from a sandbox made safe for JSON/UTF-8 (lone surrogates replaced)."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")


@dataclass
class LiveEnv:
    """An env placed in a sandbox: its session and head state, plus what a step needs
    from the database rows (so a step on a live env reads nothing from the database)."""

    session: Session
    cache: StateCache
    episode: int
    step: int
    tenant: str = ""
    environment_id: str = ""
    expires_at: datetime | None = None
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class StepOutcome:
    """What :meth:`EnvService.step` returns to the route."""

    env_id: str
    episode: int
    step: int
    result: CallResult
    recovered: bool
    state_before: dict[str, Any] | None = None
    state_after: dict[str, Any] | None = None


class EnvService:
    """Environments, envs and steps (see the module docstring for the rules)."""

    def __init__(self, settings: ApiSettings, sessions: sessionmaker, pool: SandboxPool, metrics: Metrics,
                 scheduler: FairScheduler | None = None, running_limit: Callable[[str], int] | None = None) -> None:
        self.settings = settings
        self.sessions = sessions
        self.pool = pool
        self.metrics = metrics
        self.scheduler = scheduler or FairScheduler(settings.resolved_call_slots())
        self._running_limit = running_limit or (lambda _tenant: settings.quotas.max_running_calls)
        self._live: dict[str, LiveEnv] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._registry = threading.Lock()
        self._toolsets: dict[str, ToolSet] = {}
        """Environment id -> its tools (environments are immutable once registered)."""
        self._stop = threading.Event()
        self._janitor: threading.Thread | None = None
        self._gc_wanted = threading.Event()
        self._write_lock = threading.Lock()
        self._serialize_writes = sessions.kw["bind"].dialect.name == "sqlite"

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the janitor thread (idle eviction, expiry, storage collection)."""
        self._janitor = threading.Thread(target=self._janitor_loop, name="sandpit-janitor", daemon=True)
        self._janitor.start()

    def close(self) -> None:
        """Stop the janitor and close every live session (state stays in the database)."""
        self._stop.set()
        if self._janitor is not None:
            self._janitor.join(timeout=10)
        with self._registry:
            live = list(self._live.values())
            self._live.clear()
        for entry in live:
            entry.session.close()
        self.metrics.live_envs.set(0)

    @contextmanager
    def _db(self) -> Iterator[DbSession]:
        try:
            with self.sessions() as db:
                yield db
        except SQLAlchemyError as exc:
            raise ServiceUnavailable(f"database error: {type(exc).__name__}", retry_after=1) from exc

    @contextmanager
    def _write(self) -> Iterator[DbSession]:
        """A write transaction. SQLite has one writer at a time and its busy handler
        sleeps in growing steps (up to 100 ms) when writers collide, so writers queue on
        an in-process lock instead (FIFO-ish, no sleeping); other databases go straight in."""
        if self._serialize_writes:
            with self._write_lock, self._db() as db, db.begin():
                yield db
        else:
            with self._db() as db, db.begin():
                yield db

    @contextmanager
    def slot(self, tenant: str) -> Iterator[None]:
        """Hold one execution slot of the fair scheduler for ``tenant`` (every run of
        untrusted code takes one). Raises QuotaExceeded (``max_running_calls``) when none
        frees within ``call_queue_timeout_s``."""
        limit = self._running_limit(tenant)
        try:
            with self.scheduler.slot(tenant, limit, self.settings.call_queue_timeout_s) as waited:
                if waited > 0.001:
                    self.metrics.queue_seconds.observe(waited)
                yield
        except SchedulerBusy as exc:
            raise QuotaExceeded(f"{exc}; tenant {tenant!r} may run max_running_calls={limit} at once",
                                limit="max_running_calls", retry_after=5) from None

    @contextmanager
    def _env_lock(self, env_id: str) -> Iterator[None]:
        with self._registry:
            lock = self._locks.setdefault(env_id, threading.Lock())
        with lock:
            yield

    # -- environments ------------------------------------------------------------------
    def _check_code(self, source_code: str) -> None:
        size = text_size(source_code)
        if size > self.settings.max_code_bytes:
            raise PayloadTooLarge(f"source_code is {size} bytes, over {self.settings.max_code_bytes}",
                                  field="source_code")
        if "\x00" in source_code:
            raise InvalidRequest("source_code contains a NUL byte", field="source_code")

    def _derive_tools(self, tenant: str, source_code: str, class_name: str) -> list[dict[str, Any]]:
        try:
            with self.slot(tenant):
                return self.pool.describe(tenant=tenant, source=source_code, class_name=class_name)
        except SessionOpenError as exc:
            raise InvalidRequest(f"environment code failed in the sandbox ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}", field="source_code") from None

    def create_environment(self, tenant: str, *, name: str | None, source_code: str, class_name: str,
                           description: str | None, inline: bool = False,
                           policy: str = "standard") -> models.Environment:
        """Register code: the static ``policy`` must pass (errors reject, warnings are
        kept in the report), then its tools are derived by introspecting the class in a
        sandbox. Raises PayloadTooLarge (code over cap), InvalidRequest (policy errors;
        or the code fails to load or has no such class: the message carries the
        sandbox's observation), CapacityError (503 + Retry-After)."""
        self._check_code(source_code)
        report = check_source(source_code, policy)
        if not report.passed:
            raise InvalidRequest(f"static policy {policy!r} rejected the code: {policy_summary(report)}",
                                 field="source_code")
        tools = self._derive_tools(tenant, source_code, class_name)
        row = models.Environment(
            id=new_id("envr"), tenant=tenant, name=name, class_name=class_name, source_code=source_code,
            code_sha256=hashlib.sha256(source_code.encode("utf-8", "surrogatepass")).hexdigest(),
            tools=tools, description=description, inline=inline, policy=policy,
            policy_report=report.to_dict(), created_at=utcnow())
        with self._write() as db:
            db.add(row)
        return row

    def get_environment(self, tenant: str, environment_id: str, db: DbSession | None = None) -> models.Environment:
        """The environment or :class:`NotFound` (also for another tenant's id)."""
        if db is None:
            with self._db() as own:
                return self.get_environment(tenant, environment_id, own)
        return owned(db, models.Environment, environment_id, tenant, "environment")

    def list_environments(self, tenant: str, limit: int, offset: int) -> tuple[list[models.Environment], int]:
        """A page of registered (non-inline) environments, newest first, and the total."""
        where = (models.Environment.tenant == tenant, models.Environment.inline.is_(False))
        with self._db() as db:
            total = db.scalar(select(func.count()).select_from(models.Environment).where(*where)) or 0
            rows = db.scalars(select(models.Environment).where(*where)
                              .order_by(models.Environment.created_at.desc(), models.Environment.id)
                              .limit(limit).offset(offset)).all()
        return list(rows), total

    def delete_environment(self, tenant: str, environment_id: str) -> None:
        """Delete an environment. Raises NotFound, or Conflict while envs use it."""
        with self._write() as db:
            row = self.get_environment(tenant, environment_id, db)
            users = db.scalar(select(func.count()).select_from(models.Env)
                              .where(models.Env.environment_id == row.id)) or 0
            scenarios = db.scalar(select(func.count()).select_from(models.Scenario)
                                  .where(models.Scenario.environment_id == row.id)) or 0
            if users or scenarios:
                raise Conflict(f"environment {environment_id!r} is used by {users} env(s) and {scenarios} "
                               "scenario(s); delete them first")
            db.delete(row)
        self._toolsets.pop(environment_id, None)

    def _toolset(self, environment: models.Environment) -> ToolSet:
        toolset = self._toolsets.get(environment.id)
        if toolset is None:
            toolset = self._toolsets[environment.id] = ToolSet(environment.tools)
        return toolset

    # -- envs --------------------------------------------------------------------------
    def _profile(self, overrides: dict[str, Any] | None) -> ResourceProfile:
        return self.pool.profile(overrides=ProfileOverrides(**overrides) if overrides else None)

    def _check_config(self, init_config: dict[str, Any]) -> None:
        size = json_size(init_config)
        if size > self.settings.max_init_config_bytes:
            raise PayloadTooLarge(f"init_config is {size} bytes, over {self.settings.max_init_config_bytes}",
                                  field="init_config")

    def _open(self, env_id: str, tenant: str, environment: models.Environment, init_config: dict[str, Any],
              profile: dict[str, Any] | None, snapshot: dict[str, list[Any]] | None) -> Session:
        """Open a session, evicting idle envs to make room. Raises CapacityError when none
        frees (the app answers 503 with Retry-After), SessionOpenError."""
        resolved = self._profile(profile)
        for attempt in range(CAPACITY_ATTEMPTS):
            try:
                with self.slot(tenant):
                    return self.pool.open_session(tenant=tenant, source=environment.source_code,
                                                  class_name=environment.class_name, init_config=init_config,
                                                  profile=resolved, snapshot=snapshot)
            except CapacityError:
                if attempt == CAPACITY_ATTEMPTS - 1 or not self._evict_lru(exclude=env_id):
                    raise  # translated to 503 + Retry-After by the app's ExecutorError handler
        raise AssertionError("unreachable")

    @contextmanager
    def _new_episode(self, env_id: str, tenant: str, environment: models.Environment, init_config: dict[str, Any],
                     profile: dict[str, Any] | None) -> Iterator[tuple[Session, StateCache, PendingBlobs]]:
        """Instantiate ``environment`` for ``env_id`` and encode its initial state; yields
        ``(session, state, blobs to write)``. The session is closed if the block raises.
        Raises InvalidRequest (field ``init_config``) when the environment code fails."""
        try:
            session = self._open(env_id, tenant, environment, init_config, profile, None)
        except SessionOpenError as exc:
            raise InvalidRequest(f"instantiating {environment.class_name} failed ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}", field="init_config") from None
        try:
            pending = PendingBlobs()
            yield session, encode_state(session.snapshot().attributes, pending), pending
        except BaseException:
            session.close()
            raise

    @staticmethod
    def _step_zero(env_id: str, episode: int, root: str, now: datetime) -> models.Step:
        """The row of an episode's step 0 (the state right after instantiation)."""
        return models.Step(env_id=env_id, episode=episode, step=0, action=None, observation="", status="ok",
                           duration_ms=0.0, state_root=root, created_at=now)

    def create_env(self, tenant: str, *, environment_id: str | None, source_code: str | None,
                   class_name: str | None, init_config: dict[str, Any] | None, profile: dict[str, Any] | None,
                   scenario_id: str | None = None, env_id: str | None = None) -> models.Env:
        """Instantiate an environment (registered, inline, or a scenario's with the
        scenario's ``init_config`` unless one is given) in a sandbox and commit step 0.
        ``env_id`` lets an internal caller (the evaluation runner) record the id before the
        env exists, so a crash in between leaves nothing it cannot find (default: a new id).

        Raises NotFound (environment, scenario), PayloadTooLarge, InvalidRequest
        (instantiation failed: the message carries the observation; policy errors in
        inline code; a profile above the operator's), CapacityError (503 + Retry-After)."""
        if scenario_id is not None:
            with self._db() as db:
                scenario = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            environment_id = scenario.environment_id
            if init_config is None:
                init_config = scenario.init_config
        init_config = {} if init_config is None else init_config
        self._check_config(init_config)
        if environment_id is not None:
            environment = self.get_environment(tenant, environment_id)
        else:
            assert source_code is not None and class_name is not None
            environment = self._inline_environment(tenant, source_code, class_name)
        self._toolset(environment)
        env_id = env_id or new_id("env")
        with self._new_episode(env_id, tenant, environment, init_config, profile) as (session, cache, pending):
            now = utcnow()
            row = models.Env(id=env_id, tenant=tenant, environment_id=environment.id, init_config=init_config,
                             profile=profile, episode=1, step=0, closed=False, created_at=now, last_used_at=now,
                             expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                             scenario_id=scenario_id)
            with self._write() as db:
                pending.write(db)
                db.add(row)
                db.flush()
                db.add(self._step_zero(env_id, 1, cache.root, now))
        self._set_live(env_id, LiveEnv(session, cache, 1, 0, tenant, environment.id, row.expires_at))
        return row

    def _inline_environment(self, tenant: str, source_code: str, class_name: str) -> models.Environment:
        self._check_code(source_code)
        digest = hashlib.sha256(source_code.encode("utf-8", "surrogatepass")).hexdigest()
        with self._db() as db:
            existing = db.scalars(select(models.Environment).where(
                models.Environment.tenant == tenant, models.Environment.code_sha256 == digest,
                models.Environment.class_name == class_name, models.Environment.inline.is_(True)).limit(1)).first()
        if existing is not None:
            return existing
        return self.create_environment(tenant, name=None, source_code=source_code, class_name=class_name,
                                       description=None, inline=True)

    def get_env(self, tenant: str, env_id: str, db: DbSession | None = None) -> models.Env:
        """The env row or NotFound."""
        if db is None:
            with self._db() as own:
                return self.get_env(tenant, env_id, own)
        return owned(db, models.Env, env_id, tenant, "env")

    def env_status(self, row: models.Env) -> str:
        """``live`` (in a sandbox), ``evicted`` (state in the DB only) or ``closed``."""
        if row.closed or aware(row.expires_at) <= utcnow():
            return "closed"
        return "live" if row.id in self._live else "evicted"

    def tools_of(self, row: models.Env) -> list[dict[str, Any]]:
        with self._db() as db:
            environment = db.get(models.Environment, row.environment_id)
        return list(environment.tools) if environment is not None else []

    def list_envs(self, tenant: str, limit: int, offset: int) -> tuple[list[models.Env], int]:
        """A page of the tenant's envs, newest first, and the total."""
        with self._db() as db:
            total = db.scalar(select(func.count()).select_from(models.Env).where(models.Env.tenant == tenant)) or 0
            rows = db.scalars(select(models.Env).where(models.Env.tenant == tenant)
                              .order_by(models.Env.created_at.desc(), models.Env.id).limit(limit).offset(offset)).all()
        return list(rows), total

    def count_open_envs(self, tenant: str) -> int:
        """Envs of ``tenant`` that are neither deleted nor closed/expired (what the
        ``max_live_envs`` quota counts)."""
        with self._db() as db:
            return db.scalar(select(func.count()).select_from(models.Env).where(
                models.Env.tenant == tenant, models.Env.closed.is_(False), models.Env.expires_at > utcnow())) or 0

    def delete_env(self, tenant: str, env_id: str) -> None:
        """Delete an env: its session, steps and (via collection) unreferenced state blobs."""
        with self._env_lock(env_id):
            with self._write() as db:
                row = self.get_env(tenant, env_id, db)
                db.execute(delete(models.Step).where(models.Step.env_id == row.id))
                db.delete(row)
            self._drop_live(env_id)
        with self._registry:
            self._locks.pop(env_id, None)
        self._gc_wanted.set()

    # -- live sessions -------------------------------------------------------------------
    def _set_live(self, env_id: str, entry: LiveEnv) -> None:
        with self._registry:
            self._live[env_id] = entry
            self.metrics.live_envs.set(len(self._live))

    def _drop_live(self, env_id: str) -> None:
        with self._registry:
            entry = self._live.pop(env_id, None)
            self.metrics.live_envs.set(len(self._live))
        if entry is not None:
            entry.session.close()

    def _evict_lru(self, exclude: str) -> bool:
        """Evict the least recently used env that is not busy; True if one was evicted."""
        with self._registry:
            candidates = sorted(((e.last_used, env_id) for env_id, e in self._live.items() if env_id != exclude))
        for _, env_id in candidates:
            with self._registry:
                lock = self._locks.setdefault(env_id, threading.Lock())
            if not lock.acquire(blocking=False):
                continue
            try:
                self._drop_live(env_id)
                return True
            finally:
                lock.release()
        return False

    def _usable(self, db: DbSession, tenant: str, env_id: str) -> models.Env:
        row = self.get_env(tenant, env_id, db)
        if row.closed or aware(row.expires_at) <= utcnow():
            raise Conflict(f"env {env_id!r} has expired (max lifetime {self.settings.env_max_lifetime_s:g} s); "
                           "delete it and create a new one")
        return row

    def _ensure_live(self, db: DbSession, row: models.Env) -> tuple[LiveEnv, bool]:
        """The env's live entry, restoring it from its head state when needed.
        Returns ``(entry, restored_now)``."""
        entry = self._live.get(row.id)
        if entry is not None and not entry.session.closed:
            return entry, False
        environment = db.get(models.Environment, row.environment_id)
        head = db.get(models.Step, (row.id, row.episode, row.step))
        if environment is None or head is None:
            raise ServiceUnavailable(f"env {row.id!r} has no stored head state", retry_after=1)
        cache = load_state(db, head.state_root)
        try:
            session = self._open(row.id, row.tenant, environment, row.init_config, row.profile, cache.encoded())
        except SessionOpenError as exc:
            raise ServiceUnavailable(f"restoring env {row.id!r} failed ({exc.status}): "
                                     f"{clean_text(exc.observation)[:500]}", retry_after=1) from None
        entry = LiveEnv(session, cache, row.episode, row.step, row.tenant, row.environment_id, row.expires_at)
        self._set_live(row.id, entry)
        return entry, True

    # -- steps -------------------------------------------------------------------------
    def step(self, tenant: str, env_id: str, call: ToolCall, *, want_diff: bool, want_state: bool) -> StepOutcome:
        """Run one tool call and commit it (EnvScaler step: ``getattr(env, name)(**args)``).

        Raises NotFound, Conflict (expired), UnknownTool/InvalidRequest (422, nothing
        runs), CapacityError (503 + Retry-After), ServiceUnavailable (database or Docker Engine failure; the
        step is not acknowledged and the env resumes from its last committed state)."""
        started = time.perf_counter()
        with self._env_lock(env_id):
            entry = self._live.get(env_id)
            restored = False
            if (entry is not None and not entry.session.closed and entry.tenant == tenant
                    and entry.expires_at is not None and aware(entry.expires_at) > utcnow()
                    and entry.environment_id in self._toolsets):
                self._toolsets[entry.environment_id].check(call)  # fast path: nothing read
            else:
                with self._db() as db:
                    row = self._usable(db, tenant, env_id)
                    environment = db.get(models.Environment, row.environment_id)
                    assert environment is not None
                    self._toolset(environment).check(call)
                    entry, restored = self._ensure_live(db, row)
            before = entry.cache
            try:
                with self.slot(tenant):
                    result = entry.session.call(call.name, call.arguments)
            except SessionClosed:
                self._drop_live(env_id)
                raise ServiceUnavailable("the env's session closed during the call; retry", retry_after=1) from None
            except (SessionError, ExecutorError):
                self._drop_live(env_id)
                raise
            pending = PendingBlobs()
            after = before
            if result.status in ("ok", "error"):
                after = apply_delta(before, result.delta.set, result.delta.deleted, pending)
            number = entry.step + 1
            observation = clean_text(result.observation)
            try:
                now = utcnow()
                with self._write() as db:  # Core statements: no unit-of-work overhead
                    pending.write(db)
                    db.execute(STEPS.insert(), [{
                        "env_id": env_id, "episode": entry.episode, "step": number,
                        "action": {"name": call.name, "arguments": call.arguments}, "observation": observation,
                        "status": result.status, "duration_ms": result.duration_ms, "state_root": after.root,
                        "created_at": now}])
                    db.execute(ENVS.update().where(ENVS.c.id == env_id).values(step=number, last_used_at=now))
            except BaseException:
                self._drop_live(env_id)  # the sandbox is ahead of the database: resync on next use
                raise
            entry.cache = after
            entry.step = number
            entry.last_used = time.monotonic()
        self.metrics.step_seconds.labels(result.status).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.inc(pending.stored_bytes)
        if result.status in FAILURE_STATUSES:
            self.metrics.failures.labels(result.status).inc()
        result = result.model_copy(update={"observation": observation, "stdout": clean_text(result.stdout),
                                           "stderr": clean_text(result.stderr)})
        outcome = StepOutcome(env_id, entry.episode, number, result, restored or result.recovered)
        if want_diff or want_state:
            outcome.state_after = state_view(after)
            if want_diff:
                outcome.state_before = state_view(before)
        return outcome

    @staticmethod
    def diff(outcome: StepOutcome) -> dict[str, Any] | None:
        if outcome.state_before is None or outcome.state_after is None:
            return None
        return state_diff(outcome.state_before, outcome.state_after)

    def reset(self, tenant: str, env_id: str, init_config: dict[str, Any] | None) -> models.Env:
        """Start the next episode: re-instantiate (with a new ``init_config`` if given)
        and commit its step 0. Raises NotFound, Conflict, InvalidRequest, CapacityError (503 + Retry-After)."""
        if init_config is not None:
            self._check_config(init_config)
        with self._env_lock(env_id):
            with self._db() as db:
                row = self._usable(db, tenant, env_id)
                environment = db.get(models.Environment, row.environment_id)
            assert environment is not None
            config = row.init_config if init_config is None else init_config
            self._drop_live(env_id)
            episode = row.episode + 1
            with self._new_episode(env_id, tenant, environment, config, row.profile) as (session, cache, pending):
                now = utcnow()
                with self._write() as db:
                    pending.write(db)
                    db.add(self._step_zero(env_id, episode, cache.root, now))
                    db.query(models.Env).filter(models.Env.id == env_id).update(
                        {models.Env.episode: episode, models.Env.step: 0, models.Env.init_config: config,
                         models.Env.last_used_at: now})
            self._set_live(env_id, LiveEnv(session, cache, episode, 0, tenant, environment.id, row.expires_at))
            return self.get_env(tenant, env_id)

    def state(self, tenant: str, env_id: str, step: int | None) -> tuple[models.Env, int, dict[str, Any]]:
        """State at ``step`` of the current episode (head when None). The head of a live
        env is rendered inside its sandbox (opaque values included); stored states show
        opaque values as placeholders. Raises NotFound, Conflict (step past the head)."""
        with self._env_lock(env_id):
            with self._db() as db:
                row = self.get_env(tenant, env_id, db)
                number = row.step if step is None else step
                if number > row.step:
                    raise Conflict(f"step {number} is past the head ({row.step}) of episode {row.episode}")
                entry = self._live.get(env_id)
                if number == row.step and entry is not None and not entry.session.closed:
                    try:
                        return row, number, entry.session.state()
                    except (SessionError, ExecutorError):
                        self._drop_live(env_id)
                stored = db.get(models.Step, (env_id, row.episode, number))
                if stored is None:
                    raise NotFound(f"step {number} of env {env_id!r} not found")
                return row, number, state_view(load_state(db, stored.state_root))

    def trajectory(self, tenant: str, env_id: str) -> tuple[models.Env, list[models.Step]]:
        """Steps 1..head of the current episode, in order."""
        with self._db() as db:
            row = self.get_env(tenant, env_id, db)
            steps = db.scalars(select(models.Step).where(
                models.Step.env_id == env_id, models.Step.episode == row.episode, models.Step.step > 0,
                models.Step.step <= row.step).order_by(models.Step.step)).all()
        return row, list(steps)

    def restore(self, tenant: str, env_id: str, step: int) -> models.Env:
        """Put the env back to ``step`` of its episode; later steps are discarded.
        Raises NotFound, Conflict (past the head or expired)."""
        with self._env_lock(env_id):
            with self._db() as db:
                row = self._usable(db, tenant, env_id)
                if step > row.step:
                    raise Conflict(f"cannot restore to step {step}: the episode's head is step {row.step}")
                target = db.get(models.Step, (env_id, row.episode, step))
                if target is None:
                    raise NotFound(f"step {step} of env {env_id!r} not found")
                cache = load_state(db, target.state_root)
            entry = self._live.get(env_id)
            if entry is not None:
                try:
                    entry.session.restore(Snapshot(attributes=cache.encoded()))
                except (SessionError, ExecutorError):
                    self._drop_live(env_id)
                    entry = None
            try:
                with self._write() as db:
                    db.execute(delete(models.Step).where(models.Step.env_id == env_id,
                                                         models.Step.episode == row.episode, models.Step.step > step))
                    db.query(models.Env).filter(models.Env.id == env_id).update(
                        {models.Env.step: step, models.Env.last_used_at: utcnow()})
            except BaseException:
                self._drop_live(env_id)
                raise
            if entry is not None:
                entry.cache, entry.step, entry.last_used = cache, step, time.monotonic()
            self._gc_wanted.set()
            return self.get_env(tenant, env_id)

    def fork(self, tenant: str, env_id: str, step: int | None, count: int) -> list[models.Env]:
        """``count`` new envs whose history is this env's current episode up to ``step``
        (head when None). Their stored states are shared (content-addressed), their
        sessions start on first use. Raises NotFound, Conflict, InvalidRequest (count)."""
        if count > self.settings.max_fork_count:
            raise InvalidRequest(f"count {count} is over the maximum {self.settings.max_fork_count}", field="count")
        with self._env_lock(env_id), self._db() as db, db.begin():
            row = self._usable(db, tenant, env_id)
            point = row.step if step is None else step
            if point > row.step:
                raise Conflict(f"cannot fork at step {point}: the episode's head is step {row.step}")
            history = db.scalars(select(models.Step).where(
                models.Step.env_id == env_id, models.Step.episode == row.episode,
                models.Step.step <= point).order_by(models.Step.step)).all()
            now = utcnow()
            forks = [models.Env(id=new_id("env"), tenant=tenant, environment_id=row.environment_id,
                                init_config=row.init_config, profile=row.profile, episode=1, step=point,
                                closed=False, created_at=now, last_used_at=now,
                                expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                                forked_from=env_id, forked_at_step=point, scenario_id=row.scenario_id)
                     for _ in range(count)]
            db.add_all(forks)
            db.flush()
            db.execute(models.Step.__table__.insert(), [
                {"env_id": fork.id, "episode": 1, "step": s.step, "action": s.action, "observation": s.observation,
                 "status": s.status, "duration_ms": s.duration_ms, "state_root": s.state_root, "created_at": s.created_at}
                for fork in forks for s in history])
        return forks

    # -- janitor -----------------------------------------------------------------------
    def _janitor_loop(self) -> None:
        while not self._stop.wait(self.settings.janitor_interval_s):
            try:
                self.evict_idle()
                self.close_expired()
                if self._gc_wanted.is_set():
                    self._gc_wanted.clear()
                    self.collect_garbage()
            except Exception:  # noqa: BLE001 - the janitor must keep running; logged
                log.exception("janitor pass failed")

    def evict_idle(self, idle_s: float | None = None) -> int:
        """Close the sessions of envs idle for ``idle_s`` (default ``env_idle_evict_s``);
        their state stays in the database. Returns how many were evicted."""
        limit = self.settings.env_idle_evict_s if idle_s is None else idle_s
        cutoff = time.monotonic() - limit
        with self._registry:
            idle = [env_id for env_id, e in self._live.items() if e.last_used <= cutoff]
        evicted = 0
        for env_id in idle:
            with self._registry:
                lock = self._locks.setdefault(env_id, threading.Lock())
            if not lock.acquire(blocking=False):
                continue
            try:
                entry = self._live.get(env_id)
                if entry is not None and entry.last_used <= cutoff:
                    self._drop_live(env_id)
                    evicted += 1
            finally:
                lock.release()
        return evicted

    def close_expired(self) -> int:
        """Mark envs past their lifetime closed and free their sessions."""
        now = utcnow()
        with self._write() as db:
            expired = db.scalars(select(models.Env.id).where(models.Env.closed.is_(False),
                                                             models.Env.expires_at <= now)).all()
            if expired:
                db.query(models.Env).filter(models.Env.id.in_(expired)).update(
                    {models.Env.closed: True}, synchronize_session=False)
        for env_id in expired:
            self._drop_live(env_id)
        return len(expired)

    def collect_garbage(self) -> int:
        """Delete state blobs no step references any more (after env deletes and
        restores). Runs in one write transaction that takes the write lock first, so no
        step can commit a reference to a blob while it is being judged unreferenced.
        Returns the number of blobs deleted."""
        import json

        with self._write() as db:
            if db.get_bind().dialect.name == "sqlite":
                db.execute(text("DELETE FROM blobs WHERE 0"))  # take the write lock before reading
            else:
                db.execute(text("LOCK TABLE blobs IN SHARE ROW EXCLUSIVE MODE"))
            roots = set(db.scalars(select(models.Step.state_root).distinct()))
            live: set[str] = set(roots)
            from .store import BlobReader

            reader = BlobReader(db)
            for root in roots:
                manifest = reader.json(root)
                for entry in manifest.get("attrs", {}).values():
                    kind = entry[0]
                    if kind in ("jb", "p"):
                        live.add(entry[1])
                    elif kind == "jd":
                        live.update((entry[1], entry[2]))
                        live.update(json.loads(reader.get(entry[1])))
            stored = set(db.scalars(select(models.Blob.hash)))
            dead = list(stored - live)
            for start in range(0, len(dead), 500):
                db.execute(delete(models.Blob).where(models.Blob.hash.in_(dead[start:start + 500])))
        return len(dead)
