"""``/v1/evaluations``: batch evaluations (replay or rollout) — create, get with progress,
list, cancel, and results as JSON lines."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import StreamingResponse

from ..deps import CallerDep, PageDep, QuotasDep, ServiceDep, TenantsDep
from ..errors import InvalidRequest
from ..evaluation_schemas import EvaluationCreate, EvaluationJobPublic, EvaluationJobsPublic
from ..evaluations import EvaluationJobs
from ..strict_json import StrictJSONRoute

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"], route_class=StrictJSONRoute)


def get_jobs(request: Request) -> EvaluationJobs:
    """The app's :class:`EvaluationJobs` (created in the lifespan)."""
    return request.app.state.evaluations


JobsDep = Annotated[EvaluationJobs, Depends(get_jobs)]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EvaluationJobPublic)
def create_evaluation(body: EvaluationCreate, jobs: JobsDep, service: ServiceDep, caller: CallerDep,
                      quotas: QuotasDep, tenants: TenantsDep) -> EvaluationJobPublic:
    """Start a replay or rollout evaluation (runs in the background). 404/422 naming the
    index for a bad scenario id (nothing is created); 429 over ``max_active_evaluations``
    or with ``concurrency`` above ``max_evaluation_concurrency``."""
    default = service.pool.profile()
    profile = quotas.profile_overrides(caller, None, {"memory_mib": default.memory_mib, "cpus": default.cpus,
                                                      "call_timeout_s": default.call_timeout_s})
    row = jobs.create(caller, body, profile)
    tenants.audit(caller.tenant, caller.actor, "evaluation.create", row.id,
                  {"mode": row.mode, "total": row.total, "concurrency": row.concurrency,
                   "model": row.config.get("model"), "base_url": row.config.get("base_url"),
                   "api_key_source": row.config.get("api_key_source")})
    return jobs.get(caller.tenant, row.id)


@router.get("/{evaluation_id}", response_model=EvaluationJobPublic)
def get_evaluation(evaluation_id: str, jobs: JobsDep, caller: CallerDep) -> EvaluationJobPublic:
    """Status and progress (``done/total``, rewards so far); ``summary`` once finished."""
    return jobs.get(caller.tenant, evaluation_id)


@router.get("", response_model=EvaluationJobsPublic)
def list_evaluations(page: PageDep, jobs: JobsDep, caller: CallerDep) -> EvaluationJobsPublic:
    """The tenant's evaluations, newest first, with progress (``limit``/``offset``)."""
    rows, total = jobs.list(caller.tenant, page.limit, page.offset)
    return EvaluationJobsPublic(data=rows, count=total)


@router.post("/{evaluation_id}/cancel", response_model=EvaluationJobPublic)
def cancel_evaluation(evaluation_id: str, jobs: JobsDep, caller: CallerDep, tenants: TenantsDep) -> EvaluationJobPublic:
    """Cancel: pending episodes are dropped, running ones stop at their next step (409
    when already completed)."""
    result = jobs.cancel(caller.tenant, evaluation_id)
    tenants.audit(caller.tenant, caller.actor, "evaluation.cancel", evaluation_id,
                  {"done": result.progress.done, "total": result.total})
    return result


@router.get("/{evaluation_id}/results", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {}}}})
def evaluation_results(evaluation_id: str, jobs: JobsDep, caller: CallerDep,
                       include: Annotated[str | None, Query(max_length=100)] = None) -> StreamingResponse:
    """One JSON line per finished episode in index order (reward, checks, status, error,
    steps, env_id, trajectory); ``?include=transcript`` adds each rollout transcript."""
    wanted = set(filter(None, (include or "").split(",")))
    if not wanted <= {"transcript"}:
        raise InvalidRequest(f"include may name ['transcript'], got {sorted(wanted - {'transcript'})}",
                             field="include")
    lines = jobs.results(caller.tenant, evaluation_id, "transcript" in wanted)
    return StreamingResponse(lines, media_type="application/x-ndjson")
