"""The FastAPI application: ``create_app(settings)`` wires database, executor pool and
service in the lifespan (nothing is created at import time).

Every route but ``/healthz``, ``/readyz`` (and ``/metrics`` unless
``metrics_require_auth``) needs ``Authorization: Bearer <key>``: a tenant's API key, or the
operator key for ``/v1/admin``. Start-up refuses an unmigrated database (:class:`DatabaseNotMigrated`: run
``sandpit db upgrade``), reaps sandboxes left by dead API processes, starts the warm pool
and the janitor. Shutdown closes every session and sandbox; the state of every env stays
in the database and resumes on the next start.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from sandpit.executor.pool import SandboxPool
from sandpit.executor.settings import ExecutorSettings, get_settings

from . import openapi
from .body_timeout import BodyReadTimeout
from .db import make_engine, make_sessionmaker, require_current
from .errors import register_handlers
from .evaluation import EvaluationService
from .evaluations import EvaluationJobs
from .metrics import Metrics
from .quotas import QuotaService
from .routes import admin, environments, envs, evaluations, health, scenarios, validation
from .service import EnvService
from .settings import ApiSettings, get_api_settings
from .tenancy import TenantService


def create_app(settings: ApiSettings | None = None, executor_settings: ExecutorSettings | None = None) -> FastAPI:
    """Build the app. Raises :class:`DatabaseNotMigrated` at start-up (lifespan) when
    the database is behind."""
    settings = settings or get_api_settings()
    executor_settings = executor_settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.resolved_database_url())
        try:
            require_current(engine)
            sessions = make_sessionmaker(engine)
            pool = SandboxPool(executor_settings).start()
            try:
                anyio.to_thread.current_default_thread_limiter().total_tokens = settings.http_threads
                metrics = Metrics(pool.stats)
                service = EnvService(settings, sessions, pool, metrics,
                                     running_limit=lambda tenant: tenants.quotas(tenant).max_running_calls)
                tenants = TenantService(settings, service._db, service._write)
                service.bind_tenants(tenants)
                app.state.sessions, app.state.pool, app.state.metrics, app.state.service = sessions, pool, metrics, service
                app.state.tenants = tenants
                app.state.quotas = QuotaService(service.count_open_envs, settings)
                app.state.evaluation = EvaluationService(service)
                app.state.evaluations = EvaluationJobs(service, app.state.evaluation, tenants)
                service.start()
                app.state.evaluations.start()  # resumes unfinished evaluations
                if settings.warm_on_start and executor_settings.pool_size:
                    threading.Thread(target=pool.warm, args=(settings.tenant,), daemon=True,
                                     name="sandpit-warm").start()
                try:
                    yield
                finally:
                    app.state.evaluations.close()
                    service.close()
            finally:
                pool.close()
        finally:
            engine.dispose()

    app = FastAPI(title="Sandpit", version="0.1.0", lifespan=lifespan,
                  summary="Sandboxed execution of LLM-synthesized tool environments")
    app.state.settings = settings
    register_handlers(app, settings.capacity_retry_after_s)
    app.add_middleware(BodyReadTimeout, timeout_s=settings.body_read_timeout_s)
    routers = [health.router, environments.router, envs.router, scenarios.router, validation.router,
               evaluations.router, admin.router, admin.tenant_router]
    for router in routers:
        app.include_router(router)
    app.state.api_routes = [route for router in routers for route in router.routes]  # for 405's Allow
    openapi.install(app, routers)
    return app
