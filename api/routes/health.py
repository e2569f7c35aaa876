"""``/healthz`` (process up), ``/readyz`` (DB, Docker Engine, warm pool) and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from ..schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> Response:
    """Ready when the database answers, the Docker Engine answers and the pool is warm (503 otherwise)."""
    state = request.app.state
    checks: dict[str, str] = {}
    try:
        with state.sessions() as db:
            db.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        state.pool.client.ping()
        checks["docker"] = "ok"
    except Exception as exc:  # noqa: BLE001
        checks["docker"] = f"error: {type(exc).__name__}"
    stats = state.pool.stats()
    want = state.pool.settings.pool_size if state.settings.warm_on_start else 0
    checks["pool"] = "ok" if stats["idle"] + stats["active"] >= want else f"warming ({stats['idle']}/{want} idle)"
    ready = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ready else "not_ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(request: Request) -> Response:
    """Prometheus exposition: step latency, live envs, pool sandboxes, sandbox failures,
    queue waits, quota rejections. Needs the operator key when ``metrics_require_auth``."""
    if request.app.state.settings.metrics_require_auth:
        request.app.state.tenants.require_operator(request.headers.get("authorization"))
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
