"""``/healthz`` (process up), ``/readyz`` (DB, sandbox backend, warm pool) and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ...schemas.health import Health
from ..deps import AuthorizationDep, HealthDep

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(health: HealthDep) -> Response:
    """Ready when the database answers, the Docker Engine answers and the pool is warm (503 otherwise)."""
    body = health.ready()
    return JSONResponse(body.model_dump(), status_code=200 if body.status == "ok" else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(health: HealthDep, authorization: AuthorizationDep) -> Response:
    """Prometheus exposition: step latency, live envs, pool sandboxes, sandbox failures,
    queue waits, quota rejections. Needs the operator key when ``metrics_require_auth``."""
    return Response(health.metrics_text(authorization), media_type=CONTENT_TYPE_LATEST)
