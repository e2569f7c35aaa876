"""The FastAPI application: ``create_app(settings)`` wires database, executor and services
in the lifespan (nothing is created at import time).

Every route but ``/healthz``, ``/readyz`` (and ``/metrics`` unless
``metrics_require_auth``) needs ``Authorization: Bearer <key>``: a tenant's API key, or the
operator key for ``/v1/admin``. Start-up refuses an unmigrated database (:class:`DatabaseNotMigrated`: run
``sandpit db upgrade``), reaps sandboxes left by dead API processes, starts the warm pool
and the janitor (which also takes over the host drains of dead replicas). Shutdown closes
every session and sandbox; the state of every env stays in the database and resumes on
the next start.

This module and :mod:`.sandboxes` are the only ones that import ``sandpit.executor`` (its
package face): here the executor the environment configures is built
(:func:`~sandpit.executor.get_executor`, with the database's env -> host affinity for a
multi-host backend) and handed, as an :class:`~sandpit.executor.Executor`, to the adapter
every service uses (``executor_factory`` lets a caller give another).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sandpit.executor import (
    BackendName,
    Executor,
    ExecutorError,
    ExecutorSettings,
    configured,
    get_executor,
    get_settings,
    resolve_profile,
)
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from .db.affinity import DbAffinity
from .db.checkpoint import WalCheckpointer
from .db.database import Database
from .db.engine import make_engine, make_sessionmaker, require_current
from .envs.actions import ToolSets
from .envs.attempts import Attempts
from .envs.batch import BatchSteps
from .envs.configs import EnvConfigs
from .envs.episodes import Episodes
from .envs.history import EnvHistory
from .envs.lifecycle import Collector, EnvLifecycle, count_open_envs
from .envs.listings import Listings
from .envs.live import Janitor, LiveEnvs
from .envs.rewards import Rewards
from .envs.rulebook import EpisodeService
from .envs.sessions import Sessions
from .envs.steps import Steps
from .envs.views import EnvViews
from .errors import ApiError
from .evaluations.jobs import EvaluationJobs
from .evaluations.listings import EvaluationListings
from .evaluations.runner import EvaluationRunner
from .http import openapi, step
from .http.access_log import AccessLog
from .http.batch_step import BatchStepDoor
from .http.body_timeout import BodyReadTimeout
from .http.create_env import CreateDoor
from .http.handlers import error_response, register_handlers
from .http.mcp_door import ENV_TEMPLATE, SCENARIO_TEMPLATE, McpDoor, McpEndpoint, ServesMcp
from .http.openenv import OpenEnvServer
from .http.openenv import routes as openenv_routes
from .http.reset_env import ResetDoor
from .http.routes import admin, environments, envs, evaluations, health, scenarios, validation
from .http.step import StepDoor
from .http.ui import Viewer
from .http.ui import install as install_viewer
from .metrics import Metrics
from .sandboxes import Sandboxes, translate
from .services.checks import Checks
from .services.cluster import ClusterService
from .services.environments import EnvironmentService
from .services.execution import ExecutionService
from .services.health import HealthService
from .services.idempotency import Idempotency
from .services.quotas import QuotaService
from .services.scenarios import ScenarioService
from .services.stats import StatsService
from .services.tenants import TenantService
from .services.ui_sessions import UiSessions
from .settings import ApiSettings, get_api_settings

SERVED = ("metrics", "cluster", "tenants", "quotas", "environments", "envs", "episodes", "steps", "rewards", "history",
          "scenarios", "stats", "execution", "evaluations", "health", "idempotency",
          "attempts", "batch")
"""Services the routes reach through ``app.state`` (``metrics`` for the 429 counter)."""
ROUTERS = [health.router, environments.router, envs.router, step.router, scenarios.router, validation.router,
           evaluations.router, admin.router, admin.tenant_router]


def tune_gc(young_threshold: int, app: SandpitApp | None = None) -> None:
    """Process-wide collector settings for a serving process (``sandpit serve`` calls it
    before uvicorn starts; the app never does, it may share a process): the youngest
    generation's threshold (``young_threshold`` allocations; 0 keeps Python's) and
    ``gc.freeze()`` of everything alive now (modules, the app), so later collections do
    not walk it again; with ``app``, its lifespan freezes again once its start-up has
    built the services, pools and servers (:attr:`SandpitApp.freeze_after_start`). The
    older generations keep Python's thresholds. Why: parsing a multi-megabyte JSON body
    at the default threshold of 700 runs hundreds of collections over the growing heap,
    costing more than the parse itself (:attr:`ApiSettings.gc_young_threshold`)."""
    if young_threshold:
        _, middle, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, oldest)
    gc.freeze()
    if app is not None:
        app.freeze_after_start = True


class SandpitApp(FastAPI):
    """The FastAPI app with the step door in front of its middleware stack, and the access
    log in front of both.

    ``access`` (:class:`~.http.access_log.AccessLog`, set by :func:`create_app` unless
    ``ApiSettings.access_log`` is false) sees every HTTP request first and writes its
    line once it is answered, whichever path answered it. ``door``
    (:class:`~.http.step.StepDoor`) answers every ``POST /v1/envs/{env_id}/step`` and
    ``batch_door`` (:class:`~.http.batch_step.BatchStepDoor`) every ``POST
    /v1/envs:step``, ``create_door`` (:class:`~.http.create_env.CreateDoor`) every ``POST
    /v1/envs``, ``reset_door`` (:class:`~.http.reset_env.ResetDoor`) every ``POST
    /v1/envs/{env_id}/reset``; every other request goes to ``FastAPI.__call__`` (routing,
    middleware, handlers). The lifespan goes straight to FastAPI."""

    door: StepDoor | None = None
    batch_door: BatchStepDoor | None = None
    create_door: CreateDoor | None = None
    reset_door: ResetDoor | None = None
    access: AccessLog | None = None
    freeze_after_start: bool = False
    """Whether the lifespan calls ``gc.freeze()`` once its start-up is done, so that what
    it built (services, pools, servers) is out of the collector's reach (:func:`tune_gc`
    sets it; an app sharing its process with others, as in tests, leaves it off)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        access = self.access
        if access is not None and scope["type"] == "http":
            await access(scope, receive, send)
            return
        await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The step door for a step request, the batched step's door for a batch, the create's
        door for a create, the reset's door for a reset, else FastAPI."""
        door = self.door
        env_id = door.env_id(scope) if door is not None else None
        if door is not None and env_id is not None:
            scope["app"] = self  # what Starlette sets; the door reads the services on it
            await door(scope, receive, send, env_id)
            return
        batch_door = self.batch_door
        if batch_door is not None and batch_door.matches(scope):
            scope["app"] = self
            await batch_door(scope, receive, send)
            return
        create_door = self.create_door
        if create_door is not None and create_door.matches(scope):
            scope["app"] = self
            await create_door(scope, receive, send)
            return
        reset_door = self.reset_door
        reset_id = reset_door.env_id(scope) if reset_door is not None else None
        if reset_door is not None and reset_id is not None:
            scope["app"] = self
            await reset_door(scope, receive, send, reset_id)
            return
        await super().__call__(scope, receive, send)


def _default_limits(settings: ExecutorSettings) -> dict[str, float]:
    """``memory_mib``, ``cpus`` and ``call_timeout_s`` of the operator's default resource
    profile: the most a request may ask for (the OpenAPI document's maxima). Raises
    ProfileError for a profile configuration the executor would refuse too."""
    profile = resolve_profile(settings.profiles, settings.max_profile, settings.default_profile)
    return {"memory_mib": profile.memory_mib, "cpus": profile.cpus, "call_timeout_s": profile.call_timeout_s}


def create_app(settings: ApiSettings | None = None, executor_settings: ExecutorSettings | None = None,
               executor_factory: Callable[[ExecutorSettings], Executor] | None = None) -> SandpitApp:
    """Build the app. Raises :class:`DatabaseNotMigrated` at start-up (lifespan) when
    the database is behind. ``executor_factory`` builds (and starts) the executor in the
    lifespan (default: the backend the environment configures,
    :func:`sandpit.executor.configured`: the local Docker pool or the Ray backend); it is
    closed at shutdown. Raises pydantic's ValidationError when the environment names no
    known backend."""
    api_settings = settings or get_api_settings()
    pool_settings = executor_settings or get_settings()
    backend = configured()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        checkpoints = api_settings.sqlite_checkpoint_interval_s
        engine = make_engine(api_settings.resolved_database_url(), background_checkpoints=bool(checkpoints))
        checkpointer = WalCheckpointer(engine, checkpoints) if checkpoints else None
        try:
            require_current(engine)
            if checkpointer is not None:
                checkpointer.start()
            db = Database(make_sessionmaker(engine))
            if executor_factory is not None:
                executor = executor_factory(pool_settings)
            else:
                executor = get_executor(backend, pool_settings, affinity=DbAffinity(db))
            try:
                anyio.to_thread.current_default_thread_limiter().total_tokens = api_settings.http_threads
                services = build(api_settings, db, executor, warm_target=pool_settings.pool_size,
                                 backend=backend.type)
                for name in SERVED:  # what the routes' dependencies (deps.py) read
                    setattr(app.state, name, getattr(services, name))
                app.state.viewer = Viewer(  # the web viewer's pages (http/ui)
                    sessions=services.ui_sessions, listings=Listings(db),
                    evaluation_listings=EvaluationListings(db), tenants=services.tenants, history=services.history,
                    envs=services.envs, environments=services.environments, scenarios=services.scenarios,
                    jobs=services.evaluations)
                def build_mcp() -> ServesMcp:  # on the first MCP request (McpDoor)
                    from .http.mcp import McpServer

                    return McpServer(api_settings, services.tenants, services.envs, services.steps,
                                     services.history, translate=_translated, version=app.version,
                                     run_blocking=door.run)

                app.state.mcp = mcp = McpDoor(build_mcp)
                app.state.openenv = OpenEnvServer(api_settings, services.tenants, services.scenarios, services.envs,
                                                  services.episodes, services.steps, services.history,
                                                  translate=_translated)
                services.start()
                if api_settings.warm_on_start and pool_settings.pool_size:
                    threading.Thread(target=services.sandboxes.warm, args=(api_settings.tenant,), daemon=True,
                                     name="sandpit-warm").start()
                try:
                    async with mcp.run():
                        if getattr(app, "freeze_after_start", False):
                            gc.freeze()  # what start-up built lives as long as the process
                        yield
                finally:
                    door.close()
                    create_door.close()
                    services.close()
            finally:
                executor.close()
                db.close()
        finally:
            if checkpointer is not None:
                checkpointer.close()
            engine.dispose()

    app = SandpitApp(title="Sandpit", version="0.1.0", lifespan=lifespan,
                     summary="Sandboxed execution of LLM-synthesized tool environments")
    app.state.settings = api_settings
    register_handlers(app)

    @app.exception_handler(ExecutorError)
    async def _executor_error(_request: Request, exc: ExecutorError) -> JSONResponse:
        # the adapter translates every executor error it sees; this one catches any other
        return error_response(translate(exc, api_settings.capacity_retry_after_s))

    def _translated(exc: Exception) -> ApiError | None:
        return translate(exc, api_settings.capacity_retry_after_s) if isinstance(exc, ExecutorError) else None

    door = app.door = app.state.step_door = StepDoor(api_settings.body_read_timeout_s, api_settings.http_threads,
                                                     translate=_translated)
    app.batch_door = BatchStepDoor(door)
    create_door = app.create_door = CreateDoor(door, api_settings.http_threads)
    app.reset_door = ResetDoor(door, create_door.run)  # resets wait for sandboxes as creates do
    if api_settings.access_log:
        app.access = AccessLog(app.dispatch)
    app.add_middleware(BodyReadTimeout, timeout_s=api_settings.body_read_timeout_s)
    for router in ROUTERS:
        app.include_router(router)
    # MCP over Streamable HTTP: raw ASGI endpoints (every method; the SDK speaks the protocol)
    app.router.routes += [Route(ENV_TEMPLATE, McpEndpoint("env")), Route(SCENARIO_TEMPLATE, McpEndpoint("scenario"))]
    # OpenEnv's protocol (openenv-core's EnvClient): a WebSocket session and HTTP routes per scenario
    app.router.routes += openenv_routes()
    install_viewer(app)  # the web viewer under /ui (its own routes: not in the OpenAPI document)
    app.state.api_routes = [route for router in ROUTERS for route in router.routes]  # for 405's Allow
    openapi.install(app, ROUTERS, partial(_default_limits, pool_settings))
    return app


@dataclass
class Services:
    """Everything one app instance runs on (built by :func:`build`)."""

    db: Database
    metrics: Metrics
    sandboxes: Sandboxes
    tenants: TenantService
    quotas: QuotaService
    live: LiveEnvs
    checks: Checks
    environments: EnvironmentService
    sessions: Sessions
    rulebook: EpisodeService
    envs: EnvLifecycle
    episodes: Episodes
    steps: Steps
    rewards: Rewards
    history: EnvHistory
    collector: Collector
    scenarios: ScenarioService
    stats: StatsService
    execution: ExecutionService
    runner: EvaluationRunner
    evaluations: EvaluationJobs
    health: HealthService
    janitor: Janitor
    cluster: ClusterService
    idempotency: Idempotency
    attempts: Attempts
    batch: BatchSteps
    ui_sessions: UiSessions

    def start(self) -> None:
        """Start the janitor and the evaluation runner (which resumes unfinished evaluations)."""
        self.janitor.start()
        self.evaluations.start()

    def close(self) -> None:
        """Stop the runner and the janitor; close every live session (state stays stored)."""
        self.evaluations.close()
        self.janitor.close()
        self.batch.close()
        self.envs.close()


def build(settings: ApiSettings, db: Database, executor: Executor, warm_target: int = 0,
          backend: BackendName = "local") -> Services:
    """The services over ``db`` and ``executor``, wired (no thread started: see
    :meth:`Services.start`). ``/readyz`` wants ``warm_target`` sandboxes when
    ``warm_on_start``; ``backend`` names the executor's backend in the cluster view."""
    metrics = Metrics(lambda: sandboxes.stats())  # read at each scrape, once everything is built
    tenants = TenantService(settings, db)
    sandboxes = Sandboxes(executor, settings, metrics,
                          running_limit=lambda tenant: tenants.quotas(tenant).max_running_calls)
    quotas = QuotaService(partial(count_open_envs, db), settings)
    live = LiveEnvs(metrics)
    checks = Checks(sandboxes, metrics)
    environments = EnvironmentService(settings, db, sandboxes, quotas, tenants)
    configs, toolsets = EnvConfigs(settings, db), ToolSets()
    sessions = Sessions(settings, db, sandboxes, live, configs, toolsets)
    rulebook = EpisodeService(settings, db, tenants, environments, configs, toolsets)
    views = EnvViews(db, configs, live)
    collector = Collector(db)
    envs = EnvLifecycle(settings, db, sandboxes, sessions, rulebook, views, collector, quotas, tenants)
    episodes = Episodes(settings, db, sessions, rulebook, views, collector, quotas, tenants)
    rewards = Rewards(db, checks, live, quotas)
    steps = Steps(settings, db, sessions, rulebook, rewards, quotas, metrics)
    scenarios = ScenarioService(settings, db, environments, quotas, tenants)
    stats = StatsService(db)
    runner = EvaluationRunner(settings, db, envs, steps, rewards, environments, scenarios, tenants)
    cluster = ClusterService(settings, db, sandboxes, live.__len__, runner.replicas.id, backend)
    idempotency = Idempotency(settings, db)
    attempts = Attempts(db, sessions)
    ui_sessions = UiSessions(db, tenants)
    return Services(
        db=db, metrics=metrics, sandboxes=sandboxes, tenants=tenants, quotas=quotas, live=live, checks=checks,
        environments=environments, sessions=sessions, rulebook=rulebook, envs=envs, episodes=episodes, steps=steps,
        rewards=rewards, history=EnvHistory(db, live), collector=collector, scenarios=scenarios,
        stats=stats,
        execution=ExecutionService(settings, sandboxes, checks, quotas), runner=runner,
        evaluations=EvaluationJobs(settings, db, runner, sandboxes, quotas, tenants, stats),
        health=HealthService(settings, db, sandboxes, metrics, tenants, warm_target if settings.warm_on_start else 0),
        janitor=Janitor(settings.janitor_interval_s,
                        envs.janitor_tasks() + [cluster.take_over_drains, idempotency.expire, ui_sessions.expire]),
        cluster=cluster, idempotency=idempotency, attempts=attempts, ui_sessions=ui_sessions,
        batch=BatchSteps(steps, idempotency, settings.http_threads,
                         translate=lambda exc: translate(exc, settings.capacity_retry_after_s)
                         if isinstance(exc, ExecutorError) else None))
