"""``/v1/evaluations``: batch evaluations (replay or rollout) — create, get with progress,
list, cancel, and results as JSON lines."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, status
from fastapi.responses import StreamingResponse

from ...schemas.common import list_pattern
from ...schemas.evaluations import (
    RESULT_INCLUDES,
    EvaluationCreate,
    EvaluationJobPublic,
    EvaluationJobsPublic,
)
from ..deps import METERED, CallerDep, JobsDep, PageDep, json_router

router = json_router(prefix="/v1/evaluations", tags=["evaluations"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EvaluationJobPublic, responses=METERED)
def create_evaluation(body: EvaluationCreate, jobs: JobsDep, caller: CallerDep) -> EvaluationJobPublic:
    """Start a replay or rollout evaluation (runs in the background). 404/422 naming the
    index for a bad scenario id (nothing is created); 429 over ``max_active_evaluations``
    or with ``concurrency`` above ``max_evaluation_concurrency``."""
    return jobs.start_evaluation(caller, body)


@router.get("/{evaluation_id}", response_model=EvaluationJobPublic)
def get_evaluation(evaluation_id: str, jobs: JobsDep, caller: CallerDep) -> EvaluationJobPublic:
    """Status and progress (``done/total``, rewards so far); ``summary`` once finished."""
    return jobs.get(caller.tenant, evaluation_id)


@router.get("", response_model=EvaluationJobsPublic)
def list_evaluations(page: PageDep, jobs: JobsDep, caller: CallerDep) -> EvaluationJobsPublic:
    """The tenant's evaluations, newest first, with progress (``limit``/``offset``)."""
    return jobs.page(caller, page.limit, page.offset)


@router.post("/{evaluation_id}/cancel", response_model=EvaluationJobPublic)
def cancel_evaluation(evaluation_id: str, jobs: JobsDep, caller: CallerDep) -> EvaluationJobPublic:
    """Cancel: pending episodes are dropped, running ones stop at their next step (409
    when already completed)."""
    return jobs.cancel_evaluation(caller, evaluation_id)


@router.get("/{evaluation_id}/results", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {}}}})
def evaluation_results(evaluation_id: str, jobs: JobsDep, caller: CallerDep,
                       include: Annotated[str | None, Query(max_length=100, json_schema_extra={
                           "pattern": list_pattern(RESULT_INCLUDES)})] = None) -> StreamingResponse:
    """One JSON line per finished episode in index order (reward, checks, status, error,
    steps, env_id, trajectory); ``?include=transcript`` adds each rollout transcript
    (other names: 422)."""
    lines = jobs.result_lines(caller, evaluation_id, include)
    return StreamingResponse(lines, media_type="application/x-ndjson")
