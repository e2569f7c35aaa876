"""Environment and env operations: the API's service layer.

:class:`EnvService` owns the mapping from envs (database rows) to executor sessions
(processes in sandboxes). Rules:

* Every acknowledged step is committed (action, observation, status, duration, reward,
  state root) before the call returns; state is stored incrementally (:mod:`.store`).
* A step is EnvScaler's ``step()`` (:mod:`.episodes`): a malformed action is a recorded
  ``rejected`` step, never an HTTP error; the episode ends by its termination action, its
  simulated user or ``max_steps``, and the step that ends it carries the reward from the
  scenario's checks (run in a sandbox on the episode's initial and final state).
* A live env holds an executor session plus its head :class:`~.store.StateCache` and its
  episode's bookkeeping. An env without one (new fork, evicted, after an API restart) is
  re-created from its head state in the database on its next request, transparently.
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
from typing import TYPE_CHECKING, Any, TypeVar

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
from .episodes import (
    CHAT_ACTION,
    OPEN_ENDED,
    STOP_TOKEN,
    TASK_FINISHED,
    EpisodeConfig,
    EpisodeRun,
    UserModel,
    UserSimulator,
    episode_reward,
    episode_tools,
    introduction_text,
)
from .errors import (
    Conflict,
    EpisodeEnded,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    ServiceUnavailable,
)
from .metrics import Metrics
from .policy_report import check_source, policy_summary
from .rollout import ModelError
from .schemas import CheckOutcome, EpisodeOptions
from .settings import ApiSettings
from .store import PendingBlobs, StateCache, apply_delta, encode_state, load_state, state_view, view_truncated
from .tools import INVALID_ACTION, Action, ToolSet, json_size, text_size

if TYPE_CHECKING:
    from .tenancy import TenantService

log = logging.getLogger("sandpit.api")
FAILURE_STATUSES = ("timeout", "oom", "crashed")
STEPS = models.Step.__table__
ENVS = models.Env.__table__
EPISODES = models.Episode.__table__
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


def _step_info(run: StepRun) -> dict[str, Any]:
    """The ``info`` stored with a step: its observation role and what explains it."""
    info: dict[str, Any] = {"observation_role": run.role}
    if run.error:
        info["error"] = run.error[:2000]
    if run.findings:
        info["argument_findings"] = run.findings
    result = run.result
    if result is not None:
        if result.traceback:
            info["traceback"] = clean_text(result.traceback)
        if result.observation_truncated:
            info["observation_truncated"] = True
    if run.end_reason:
        info["end_reason"] = run.end_reason
    return info


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
    run: EpisodeRun = field(default_factory=EpisodeRun)
    argument_checking: str = "off"


@dataclass
class StepRun:
    """What one action did (before it is committed): the step's record."""

    status: str
    observation: str
    role: str = "tool"
    """EnvScaler's observation type: ``tool`` or ``user``."""
    duration_ms: float = 0.0
    result: CallResult | None = None
    """The sandbox's result, when a tool ran."""
    error: str | None = None
    findings: list[str] | None = None
    terminated: bool = False
    end_reason: str | None = None
    """``action``, ``user`` or ``tool_error`` when ``terminated``."""
    user_messages: list[dict[str, Any]] | None = None


@dataclass
class StepOutcome:
    """What :meth:`EnvService.step` returns to the route."""

    env_id: str
    episode: int
    step: int
    action: dict[str, Any]
    run: StepRun
    recovered: bool
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    checks: list[CheckOutcome] | None = None
    state_before: dict[str, Any] | None = None
    state_after: dict[str, Any] | None = None

    @property
    def result(self) -> CallResult:
        """The step as an executor result (rejected and non-tool steps included)."""
        run = self.run
        if run.result is not None:
            return run.result
        return CallResult(status=run.status, observation=run.observation,  # type: ignore[arg-type]
                          duration_ms=run.duration_ms)


@dataclass
class EpisodeStart:
    """What a new episode needs: its environment, scenario and options."""

    environment: models.Environment
    scenario: models.Scenario | None
    init_config: dict[str, Any]
    config: EpisodeConfig
    user_key_enc: bytes | None = None


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
        self.tenants: TenantService | None = None  # type: ignore[assignment]
        """Set by :meth:`bind_tenants` (the app wires it after construction)."""

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
    def bind_tenants(self, tenants: TenantService) -> None:
        """Give the service the tenant registry (model endpoints and keys of simulated
        users); the app factory calls it once, before the first request."""
        self.tenants = tenants

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

    def _try_instantiate(self, tenant: str, source_code: str, class_name: str, init_config: dict[str, Any]) -> None:
        """Instantiate the class once in a sandbox and discard the instance (registration's
        check that ``__init__`` works). Raises InvalidRequest (``sample_init_config``)."""
        try:
            with self.slot(tenant):
                session = self.pool.open_session(tenant=tenant, source=source_code, class_name=class_name,
                                                 init_config=init_config)
        except SessionOpenError as exc:
            raise InvalidRequest(f"instantiating {class_name} with sample_init_config "
                                 f"{'{}' if not init_config else '(given)'} failed ({exc.status}): "
                                 f"{clean_text(exc.observation)[:2000]}; give a sample_init_config with what "
                                 "__init__ needs", field="sample_init_config") from None
        session.close()

    def create_environment(self, tenant: str, *, name: str | None, source_code: str, class_name: str,
                           description: str | None, inline: bool = False, policy: str = "standard",
                           introduction: str | None = None, rules: list[str] | None = None,
                           argument_checking: str = "off",
                           sample_init_config: dict[str, Any] | None = None) -> models.Environment:
        """Register code: the static ``policy`` must pass (errors reject, warnings are
        kept in the report), its tools are derived by introspecting the class in a
        sandbox, and (unless ``inline``) the class is instantiated once there with
        ``sample_init_config`` (``{}``). Raises PayloadTooLarge (code or config over cap),
        InvalidRequest (policy errors; the code fails to load, has no such class, or its
        ``__init__`` fails: the message carries the sandbox's observation), CapacityError
        (503 + Retry-After)."""
        self._check_code(source_code)
        report = check_source(source_code, policy)
        if not report.passed:
            raise InvalidRequest(f"static policy {policy!r} rejected the code: {policy_summary(report)}",
                                 field="source_code")
        tools = self._derive_tools(tenant, source_code, class_name)
        if not inline:
            config = sample_init_config or {}
            self._check_config(config, "sample_init_config")
            self._try_instantiate(tenant, source_code, class_name, config)
        row = models.Environment(
            id=new_id("envr"), tenant=tenant, name=name, class_name=class_name, source_code=source_code,
            code_sha256=hashlib.sha256(source_code.encode("utf-8", "surrogatepass")).hexdigest(),
            tools=tools, description=description, inline=inline, policy=policy,
            policy_report=report.to_dict(), introduction=introduction, rules=rules,
            argument_checking=argument_checking, created_at=utcnow())
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
            episodes = db.scalar(select(func.count()).select_from(models.Episode)
                                 .where(models.Episode.environment_id == row.id)) or 0
            scenarios = db.scalar(select(func.count()).select_from(models.Scenario)
                                  .where(models.Scenario.environment_id == row.id)) or 0
            if users or scenarios or episodes:
                raise Conflict(f"environment {environment_id!r} is used by {max(users, episodes and 1)} env(s) and "
                               f"{scenarios} scenario(s); delete them first")
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

    def _check_config(self, init_config: dict[str, Any], field: str = "init_config") -> None:
        size = json_size(init_config)
        if size > self.settings.max_init_config_bytes:
            raise PayloadTooLarge(f"{field} is {size} bytes, over {self.settings.max_init_config_bytes}",
                                  field=field)

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

    def _episode_config(self, tenant: str, options: EpisodeOptions | None, scenario: models.Scenario | None,
                        current: EpisodeConfig | None = None) -> tuple[EpisodeConfig, bytes | None]:
        """The options of a new episode and the simulated user's encrypted key: the
        given ``options``; else the current episode's (reset); else EnvScaler's defaults
        for a scenario (30 steps, ``chat_with_user`` ends it); else open-ended. Raises
        InvalidRequest (the user's endpoint, field ``episode.user.base_url``)."""
        if options is None:
            if current is not None:
                return current, None
            if scenario is None:
                return OPEN_ENDED, None
            options = EpisodeOptions()
        user, key_enc = None, None
        if options.user is not None:
            from .model_endpoints import resolve

            endpoint = resolve(self.tenants, self.settings, tenant, options.user.base_url, options.user.api_key,
                               field="episode.user.base_url")
            user = UserModel(model=options.user.model, base_url=endpoint.base_url,
                             temperature=options.user.temperature, request_timeout_s=options.user.request_timeout_s,
                             key_source=endpoint.key_source)
            key_enc = endpoint.key_enc
        return EpisodeConfig.from_options(options, user), key_enc

    def _user_simulator(self, tenant: str, run: EpisodeRun) -> UserSimulator:
        from .model_endpoints import SecretUnavailable, endpoint_key

        user = run.config.user
        if user is None:
            raise InvalidRequest("this episode has no simulated user", field="episode.user")
        try:
            key = endpoint_key(self.tenants, tenant, user.key_source, run.user_key_enc)
        except SecretUnavailable as exc:
            raise ServiceUnavailable(f"the simulated user's API key cannot be read: {exc}", retry_after=60) from None
        return UserSimulator(user, key, run.user_messages)

    def _first_observation(self, tenant: str, start: EpisodeStart, run: EpisodeRun) -> None:
        """EnvScaler ``get_initial_observation``: the task, or the simulated user's first
        message (which may take a model call). Raises ServiceUnavailable when the user's
        model cannot be reached."""
        task = start.scenario.task if start.scenario is not None else None
        run.task = task
        if start.config.conversational:
            simulator = self._user_simulator(tenant, run)
            try:
                run.observation = simulator.start(task or "")
            except ModelError as exc:
                raise ServiceUnavailable(f"the simulated user's model failed ({exc.status}): {exc.message}",
                                         retry_after=5) from None
            run.user_messages = simulator.messages
        else:
            run.observation = task or ""

    def _start(self, tenant: str, *, environment_id: str | None, source_code: str | None, class_name: str | None,
               scenario_id: str | None, init_config: dict[str, Any] | None, options: EpisodeOptions | None,
               current: models.Env | None = None, current_run: EpisodeRun | None = None) -> EpisodeStart:
        """Resolve what a new episode (create or reset) runs: environment, scenario,
        ``init_config`` (given > scenario's > the env's current) and options."""
        scenario = None
        if scenario_id is not None:
            with self._db() as db:
                scenario = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            environment_id = scenario.environment_id
            if init_config is None:
                init_config = scenario.init_config
        if init_config is None:
            init_config = current.init_config if current is not None else {}
        self._check_config(init_config)
        if environment_id is not None:
            environment = self.get_environment(tenant, environment_id)
        else:
            assert source_code is not None and class_name is not None
            environment = self._inline_environment(tenant, source_code, class_name)
        self._toolset(environment)
        keep = current_run.config if current_run is not None else None
        config, key_enc = self._episode_config(tenant, options, scenario, keep)
        if options is None and current_run is not None:
            key_enc = current_run.user_key_enc
        return EpisodeStart(environment, scenario, init_config, config, key_enc)

    def _episode_row(self, env_id: str, episode: int, start: EpisodeStart, run: EpisodeRun,
                     now: datetime) -> models.Episode:
        return models.Episode(env_id=env_id, episode=episode, environment_id=start.environment.id,
                              scenario_id=run.scenario_id, config=run.config.public(), user_key_enc=run.user_key_enc,
                              status="running", observation=run.observation, task=run.task,
                              user_messages=run.user_messages, started_at=now)

    def create_env(self, tenant: str, *, environment_id: str | None, source_code: str | None,
                   class_name: str | None, init_config: dict[str, Any] | None, profile: dict[str, Any] | None,
                   scenario_id: str | None = None, env_id: str | None = None, episode: EpisodeOptions | None = None,
                   argument_checking: str | None = None,
                   episode_config: EpisodeConfig | None = None) -> models.Env:
        """Instantiate an environment (registered, inline, or a scenario's with the
        scenario's ``init_config`` unless one is given) in a sandbox and commit step 0:
        the first episode, with ``episode`` options (or ``episode_config`` from an
        internal caller). ``env_id`` lets an internal caller (the evaluation runner)
        record the id before the env exists, so a crash in between leaves nothing it
        cannot find (default: a new id).

        Raises NotFound (environment, scenario), PayloadTooLarge, InvalidRequest
        (instantiation failed: the message carries the observation; policy errors in
        inline code; a profile above the operator's; an unusable user endpoint),
        CapacityError (503 + Retry-After), ServiceUnavailable (the simulated user's model)."""
        start = self._start(tenant, environment_id=environment_id, source_code=source_code, class_name=class_name,
                            scenario_id=scenario_id, init_config=init_config, options=episode)
        if episode_config is not None:
            start.config = episode_config
        env_id = env_id or new_id("env")
        environment = start.environment
        run = EpisodeRun(config=start.config, scenario_id=scenario_id, user_key_enc=start.user_key_enc)
        with self._new_episode(env_id, tenant, environment, start.init_config, profile) as (session, cache, pending):
            self._first_observation(tenant, start, run)
            run.initial_root = cache.root
            now = utcnow()
            row = models.Env(id=env_id, tenant=tenant, environment_id=environment.id, init_config=start.init_config,
                             profile=profile, episode=1, step=0, closed=False, created_at=now, last_used_at=now,
                             expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                             scenario_id=scenario_id, argument_checking=argument_checking)
            with self._write() as db:
                pending.write(db)
                db.add(row)
                db.flush()
                db.add(self._step_zero(env_id, 1, cache.root, now))
                db.add(self._episode_row(env_id, 1, start, run, now))
        self._set_live(env_id, LiveEnv(session, cache, 1, 0, tenant, environment.id, row.expires_at, run=run,
                                       argument_checking=argument_checking or environment.argument_checking))
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

    def env_view(self, row: models.Env, with_tools: bool = True) -> dict[str, Any]:
        """What ``EnvPublic`` shows of ``row`` beyond its columns: status, tools (with the
        episode's chat action), the current episode (status, observation, task, reward,
        options) and the environment's introduction. One database read."""
        with self._db() as db:
            environment = db.get(models.Environment, row.environment_id)
            episode = db.get(models.Episode, (row.id, row.episode))
        config = EpisodeConfig.from_stored(episode.config if episode is not None else None)
        view: dict[str, Any] = {"status": self.env_status(row), "episode_config": config.public()}
        if environment is not None:
            view["introduction"] = introduction_text(environment.introduction, environment.rules,
                                                     environment.description)
            view["argument_checking"] = row.argument_checking or environment.argument_checking
            if with_tools:
                view["tools"] = episode_tools(list(environment.tools), config)
        if episode is not None:
            view.update(episode_status=episode.status, observation=episode.observation, task=episode.task,
                        reward=episode.reward)
        return view

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
        """Delete an env: its session, episodes, steps and (via collection) unreferenced
        state blobs."""
        with self._env_lock(env_id):
            with self._write() as db:
                row = self.get_env(tenant, env_id, db)
                db.execute(delete(models.Step).where(models.Step.env_id == row.id))
                db.execute(delete(models.Episode).where(models.Episode.env_id == row.id))
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

    @staticmethod
    def _run_of(db: DbSession, row: models.Env) -> EpisodeRun:
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
        entry = LiveEnv(session, cache, row.episode, row.step, row.tenant, row.environment_id, row.expires_at,
                        run=self._run_of(db, row),
                        argument_checking=row.argument_checking or environment.argument_checking)
        self._set_live(row.id, entry)
        return entry, True

    # -- steps -------------------------------------------------------------------------
    def _live_entry(self, tenant: str, env_id: str) -> tuple[LiveEnv, bool]:
        """The live entry of ``env_id`` (restored when needed) and whether it was restored
        now. A live env of this tenant that has not expired is used without a database read."""
        entry = self._live.get(env_id)
        if (entry is not None and not entry.session.closed and entry.tenant == tenant
                and entry.expires_at is not None and aware(entry.expires_at) > utcnow()
                and entry.environment_id in self._toolsets):
            return entry, False
        with self._db() as db:
            row = self._usable(db, tenant, env_id)
            environment = db.get(models.Environment, row.environment_id)
            assert environment is not None
            self._toolset(environment)
            return self._ensure_live(db, row)

    def _act(self, tenant: str, env_id: str, entry: LiveEnv, action: Action) -> StepRun:
        """Carry out one action of the episode (module docstring of :mod:`.episodes`)."""
        run = entry.run
        config = run.config
        if action.problem is not None:
            return StepRun("rejected", action.problem, "user", error=action.error)
        name, arguments = action.name, action.arguments
        toolset = self._toolsets[entry.environment_id]
        chat_is_action = name == CHAT_ACTION and (config.conversational or config.termination_action == CHAT_ACTION)
        if chat_is_action and not isinstance(arguments.get("content"), str):
            return StepRun("rejected", INVALID_ACTION, "user", error="chat_with_user needs a string argument 'content'")
        if not config.conversational and config.termination_action is not None and name == config.termination_action:
            return StepRun("ok", TASK_FINISHED, "user", terminated=True, end_reason="action")
        if config.conversational and name == CHAT_ACTION:
            return self._chat(tenant, entry, arguments["content"])
        if name not in toolset:
            return StepRun("rejected", INVALID_ACTION, "user", error=toolset.unknown(name))
        call = action.call
        findings = toolset.findings(call) if entry.argument_checking != "off" else []
        if findings and entry.argument_checking == "strict":
            return StepRun("rejected", INVALID_ACTION, "user", findings=findings,
                           error="the arguments do not fit the tool's schema (argument_checking: strict)")
        try:
            with self.slot(tenant):
                result = entry.session.call(call.name, call.arguments)
        except SessionClosed:
            self._drop_live(env_id)
            raise ServiceUnavailable("the env's session closed during the call; retry", retry_after=1) from None
        except (SessionError, ExecutorError):
            self._drop_live(env_id)
            raise
        terminated = result.status == "error" and config.on_tool_error == "terminate"
        role = "user" if terminated else "tool"  # EnvScaler reports a tool's exception as a user message
        return StepRun(result.status, clean_text(result.observation), role, result.duration_ms, result,
                       findings=findings or None, terminated=terminated,
                       end_reason="tool_error" if terminated else None)

    def _chat(self, tenant: str, entry: LiveEnv, content: str) -> StepRun:
        """``chat_with_user`` in a conversational episode: the simulated user's reply."""
        started = time.perf_counter()
        simulator = self._user_simulator(tenant, entry.run)
        try:
            reply = simulator.reply(content)
        except ModelError as exc:
            raise ServiceUnavailable(f"the simulated user's model failed ({exc.status}): {exc.message}; "
                                     "the step was not recorded, retry it", retry_after=5) from None
        done = STOP_TOKEN in reply
        return StepRun("ok", reply, "user", (time.perf_counter() - started) * 1000.0, terminated=done,
                       end_reason="user" if done else None, user_messages=simulator.messages)

    def _score(self, tenant: str, entry: LiveEnv, final: StateCache) -> tuple[float, list[CheckOutcome] | None]:
        """The episode's reward at its end: the scenario's checks on its initial and final
        state (0.0 without a scenario or checks)."""
        run = entry.run
        if run.scenario_id is None:
            return 0.0, None
        with self._db() as db:
            scenario = db.get(models.Scenario, run.scenario_id)
            environment = db.get(models.Environment, entry.environment_id)
            initial = load_state(db, run.initial_root) if run.initial_root else None
        if scenario is None or environment is None or initial is None or not scenario.checklist_with_func:
            return 0.0, [] if scenario is not None else None
        outcomes = self.run_checks(tenant, list(scenario.checklist_with_func), initial, final, environment.source_code)
        return episode_reward([o.passed for o in outcomes]), outcomes

    def run_checks(self, tenant: str, checks: list[dict[str, Any]], initial: StateCache, final: StateCache,
                   source: str | None, profile: ResourceProfile | None = None) -> list[CheckOutcome]:
        """Run check functions (EnvScaler ``checklist_with_func`` items) on two stored
        states, restored as real objects in a sandbox, each check in a fresh process.
        Raises InvalidRequest (a check over the caps), CapacityError, QuotaExceeded."""
        if not checks:
            return []
        try:
            with self.slot(tenant):
                results = self.pool.run_checks(tenant=tenant, checks=checks, initial_state=initial.encoded(),
                                               final_state=final.encoded(), profile=profile, source=source)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="checks") from None
        return [CheckOutcome(check_item=r.check_item, passed=r.passed, error=r.error, status=r.status,
                             duration_ms=r.duration_ms) for r in results]

    def step(self, tenant: str, env_id: str, action: Action, *, want_diff: bool, want_state: bool) -> StepOutcome:
        """Run one action and commit it (EnvScaler ``step()``, see :mod:`.episodes`): a
        malformed action is recorded as ``rejected``; the step that ends the episode
        (termination action, simulated user, ``max_steps``) carries the reward.

        Raises NotFound, Conflict (expired), EpisodeEnded (409: reset first),
        CapacityError (503 + Retry-After), ServiceUnavailable (database, Docker Engine or
        the simulated user's model failed; the step is not acknowledged and the env
        resumes from its last committed state), QuotaExceeded (no execution slot)."""
        started = time.perf_counter()
        with self._env_lock(env_id):
            entry, restored = self._live_entry(tenant, env_id)
            run = entry.run
            if run.ended:
                raise EpisodeEnded(f"episode {entry.episode} of env {env_id!r} has {run.status} "
                                   f"(reward {run.reward}); reset the env to start the next one")
            before = entry.cache
            outcome_run = self._act(tenant, env_id, entry, action)
            result = outcome_run.result
            pending = PendingBlobs()
            after = before
            if result is not None and result.status in ("ok", "error"):
                after = apply_delta(before, result.delta.set, result.delta.deleted, pending)
            number = entry.step + 1
            terminated = outcome_run.terminated
            truncated = (not terminated and run.config.max_steps is not None and number >= run.config.max_steps)
            reward, checks = 0.0, None
            if terminated and outcome_run.end_reason != "tool_error" or truncated and run.config.score_truncated:
                reward, checks = self._score(tenant, entry, after)
            done = "terminated" if terminated else "truncated" if truncated else None
            info = _step_info(outcome_run)
            if outcome_run.user_messages is not None:
                info["user_turns"] = len(outcome_run.user_messages)
            try:
                now = utcnow()
                with self._write() as db:  # Core statements: no unit-of-work overhead
                    pending.write(db)
                    db.execute(STEPS.insert(), [{
                        "env_id": env_id, "episode": entry.episode, "step": number, "action": action.record(),
                        "observation": outcome_run.observation, "status": outcome_run.status,
                        "duration_ms": outcome_run.duration_ms, "state_root": after.root, "created_at": now,
                        "reward": reward, "done": done, "info": info or None}])
                    db.execute(ENVS.update().where(ENVS.c.id == env_id).values(step=number, last_used_at=now))
                    changes: dict[str, Any] = {}
                    if outcome_run.user_messages is not None:
                        changes["user_messages"] = outcome_run.user_messages
                    if done is not None:
                        changes.update(status=done, reward=reward, ended_at=now,
                                       checks=[c.model_dump() for c in checks] if checks is not None else None)
                    if changes:
                        db.execute(EPISODES.update().where(EPISODES.c.env_id == env_id,
                                                           EPISODES.c.episode == entry.episode).values(**changes))
            except BaseException:
                self._drop_live(env_id)  # the sandbox is ahead of the database: resync on next use
                raise
            entry.cache = after
            entry.step = number
            entry.last_used = time.monotonic()
            if outcome_run.user_messages is not None:
                run.user_messages = outcome_run.user_messages
            if done is not None:
                run.status, run.reward = done, reward
        self.metrics.step_seconds.labels(outcome_run.status).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.inc(pending.stored_bytes)
        if outcome_run.status in FAILURE_STATUSES:
            self.metrics.failures.labels(outcome_run.status).inc()
        recovered = restored or bool(result is not None and result.recovered)
        outcome = StepOutcome(env_id, entry.episode, number, action.record(), outcome_run, recovered, reward,
                              terminated, truncated, checks)
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

    def reset(self, tenant: str, env_id: str, init_config: dict[str, Any] | None,
              scenario_id: str | None = None, episode: EpisodeOptions | None = None) -> models.Env:
        """Start the next episode (EnvScaler ``reset()``): re-instantiate with
        ``init_config`` (given, else the scenario's, else the current one), bound to
        ``scenario_id`` (given, else the current one), with ``episode`` options (given,
        else the current ones), and commit its step 0. The previous episode stays
        readable (``?episode=``). Raises NotFound, Conflict, InvalidRequest,
        CapacityError (503 + Retry-After), ServiceUnavailable (the simulated user)."""
        if init_config is not None:
            self._check_config(init_config)
        with self._env_lock(env_id):
            with self._db() as db:
                row = self._usable(db, tenant, env_id)
                current_run = self._run_of(db, row)
            scenario = scenario_id if scenario_id is not None else row.scenario_id
            start = self._start(tenant, environment_id=row.environment_id if scenario is None else None,
                                source_code=None, class_name=None, scenario_id=scenario,
                                init_config=init_config if init_config is not None or scenario_id is not None else
                                (row.init_config if scenario is None else None),
                                options=episode, current=row, current_run=current_run)
            self._drop_live(env_id)
            number = row.episode + 1
            run = EpisodeRun(config=start.config, scenario_id=scenario, user_key_enc=start.user_key_enc)
            environment = start.environment
            with self._new_episode(env_id, tenant, environment, start.init_config, row.profile) as (session, cache,
                                                                                                  pending):
                self._first_observation(tenant, start, run)
                run.initial_root = cache.root
                now = utcnow()
                with self._write() as db:
                    pending.write(db)
                    db.add(self._step_zero(env_id, number, cache.root, now))
                    db.add(self._episode_row(env_id, number, start, run, now))
                    db.query(models.Env).filter(models.Env.id == env_id).update(
                        {models.Env.episode: number, models.Env.step: 0, models.Env.init_config: start.init_config,
                         models.Env.environment_id: environment.id, models.Env.scenario_id: scenario,
                         models.Env.last_used_at: now})
            self._set_live(env_id, LiveEnv(session, cache, number, 0, tenant, environment.id, row.expires_at,
                                           run=run,
                                           argument_checking=row.argument_checking or environment.argument_checking))
            return self.get_env(tenant, env_id)

    def _episode_number(self, db: DbSession, row: models.Env, episode: int | None) -> tuple[int, int]:
        """``(episode, head step)`` of ``episode`` (the current one when None). Raises
        NotFound for an episode the env never had."""
        if episode is None or episode == row.episode:
            return row.episode, row.step
        head = db.scalar(select(func.max(models.Step.step)).where(models.Step.env_id == row.id,
                                                                   models.Step.episode == episode))
        if head is None:
            raise NotFound(f"episode {episode} of env {row.id!r} not found (it has episodes 1..{row.episode})")
        return episode, head

    def state(self, tenant: str, env_id: str, step: int | None,
              episode: int | None = None) -> tuple[models.Env, int, int, dict[str, Any], bool]:
        """State at ``step`` of ``episode`` (head / current episode when None), as the one
        JSON view every reader gets (:func:`~.store.state_view`). Returns ``(row,
        episode, step, state, truncated)``. Raises NotFound (episode or step unknown),
        Conflict (step past the head of the current episode)."""
        with self._db() as db:
            row = self.get_env(tenant, env_id, db)
            number, head = self._episode_number(db, row, episode)
            at = head if step is None else step
            if at > head:
                if number == row.episode:
                    raise Conflict(f"step {at} is past the head ({head}) of episode {number}")
                raise NotFound(f"step {at} of episode {number} of env {env_id!r} not found (its last step is {head})")
            entry = self._live.get(env_id)
            if entry is not None and entry.episode == number and entry.step == at and not entry.session.closed:
                cache = entry.cache
            else:
                stored = db.get(models.Step, (env_id, number, at))
                if stored is None:
                    raise NotFound(f"step {at} of env {env_id!r} not found")
                cache = load_state(db, stored.state_root)
        return row, number, at, state_view(cache), view_truncated(cache)

    def trajectory(self, tenant: str, env_id: str, episode: int | None = None, limit: int | None = None,
                   offset: int = 0) -> tuple[models.Env, int, list[models.Step], int, models.Episode | None]:
        """Steps 1..head of ``episode`` (the current one when None), in order, a page at a
        time. Returns ``(row, episode, steps, total, episode row)``. Raises NotFound."""
        with self._db() as db:
            row = self.get_env(tenant, env_id, db)
            number, head = self._episode_number(db, row, episode)
            where = (models.Step.env_id == env_id, models.Step.episode == number, models.Step.step > 0,
                     models.Step.step <= head)
            query = select(models.Step).where(*where).order_by(models.Step.step).offset(offset)
            if limit is not None:
                query = query.limit(limit)
            steps = db.scalars(query).all()
            record = db.get(models.Episode, (env_id, number))
        return row, number, list(steps), head, record

    def episodes(self, tenant: str, env_id: str, limit: int, offset: int) -> tuple[list[tuple[models.Episode, int]], int]:
        """The env's episodes, oldest first, each with its step count, and the total."""
        with self._db() as db:
            row = self.get_env(tenant, env_id, db)
            total = db.scalar(select(func.count()).select_from(models.Episode)
                              .where(models.Episode.env_id == env_id)) or 0
            records = db.scalars(select(models.Episode).where(models.Episode.env_id == env_id)
                                 .order_by(models.Episode.episode).limit(limit).offset(offset)).all()
            heads = dict(db.execute(select(models.Step.episode, func.max(models.Step.step))
                                    .where(models.Step.env_id == env_id).group_by(models.Step.episode)).all())
        del row
        return [(r, int(heads.get(r.episode, 0))) for r in records], total

    def _rewind_run(self, db: DbSession, env_id: str, episode: int, step: int,
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
        with self._env_lock(env_id):
            with self._db() as db:
                row = self._usable(db, tenant, env_id)
                if step > row.step:
                    raise Conflict(f"cannot restore to step {step}: the episode's head is step {row.step}")
                target = db.get(models.Step, (env_id, row.episode, step))
                if target is None:
                    raise NotFound(f"step {step} of env {env_id!r} not found")
                cache = load_state(db, target.state_root)
                rewind = self._rewind_run(db, env_id, row.episode, step, db.get(models.Episode, (env_id, row.episode)))
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
                    if rewind:
                        db.execute(EPISODES.update().where(EPISODES.c.env_id == env_id,
                                                           EPISODES.c.episode == row.episode).values(**rewind))
            except BaseException:
                self._drop_live(env_id)
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
        with self._env_lock(env_id), self._db() as db, db.begin():
            row = self._usable(db, tenant, env_id)
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
                                init_config=row.init_config, profile=row.profile, episode=1, step=point,
                                closed=False, created_at=now, last_used_at=now,
                                expires_at=now + timedelta(seconds=self.settings.env_max_lifetime_s),
                                forked_from=env_id, forked_at_step=point, scenario_id=row.scenario_id,
                                argument_checking=row.argument_checking)
                     for _ in range(count)]
            db.add_all(forks)
            db.flush()
            db.execute(models.Step.__table__.insert(), [
                {"env_id": fork.id, "episode": 1, "step": s.step, "action": s.action, "observation": s.observation,
                 "status": s.status, "duration_ms": s.duration_ms, "state_root": s.state_root, "created_at": s.created_at,
                 "reward": s.reward, "done": s.done, "info": s.info}
                for fork in forks for s in history])
            if record is not None:
                db.execute(EPISODES.insert(), [
                    {"env_id": fork.id, "episode": 1, "environment_id": record.environment_id,
                     "scenario_id": record.scenario_id, "config": record.config, "user_key_enc": record.user_key_enc,
                     "status": rewind.get("status", "running"), "observation": record.observation,
                     "task": record.task, "reward": rewind.get("reward"),
                     "checks": record.checks if rewind.get("status", "running") != "running" else None,
                     "user_messages": rewind.get("user_messages", record.user_messages),
                     "started_at": record.started_at,
                     "ended_at": record.ended_at if rewind.get("status", "running") != "running" else None}
                    for fork in forks])
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
        with self._write() as db:
            if db.get_bind().dialect.name == "sqlite":
                db.execute(text("DELETE FROM blobs WHERE 0"))  # take the write lock before reading
            else:
                db.execute(text("LOCK TABLE blobs IN SHARE ROW EXCLUSIVE MODE"))
            roots = set(db.scalars(select(models.Step.state_root).distinct()))
            live: set[str] = set(roots)
            from .store import BlobReader, blob_references

            reader = BlobReader(db)
            for root in roots:
                manifest = reader.json(root)
                for entry in manifest.get("attrs", {}).values():
                    live.update(blob_references(entry, reader))
            stored = set(db.scalars(select(models.Blob.hash)))
            dead = list(stored - live)
            for start in range(0, len(dead), 500):
                db.execute(delete(models.Blob).where(models.Blob.hash.in_(dead[start:start + 500])))
        return len(dead)
