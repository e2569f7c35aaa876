"""The viewer's evaluation pages: the tenant's evaluations; one evaluation with its
progress (``static/viewer.js`` polls :func:`progress` every 2 s while it runs and
reloads the page once it has finished), its summary, the reward histogram (CSS bars),
per-environment and per-scenario tables (with each scenario's pass rate over all the
tenant's episodes) and its episodes a page at a time; one episode's stored result."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import HTMLResponse

from ...errors import InvalidRequest
from .episodes import ROWS_PER_PAGE, Offset
from .render import action_text
from .web import TenantDep, UiRoute, ViewerDep, page

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
EPISODE_STATUSES = ("pending", "running", "done", "error", "cancelled")
"""The statuses an evaluation's episode filter may name."""


@router.get("/evaluations", response_class=HTMLResponse)
def evaluations(request: Request, ctx: TenantDep, viewer: ViewerDep, offset: Offset = 0) -> Response:
    """The tenant's evaluations, newest first, with their progress."""
    listing = viewer.jobs.page(ctx, ROWS_PER_PAGE, offset)
    return page(request, "evaluations.html", jobs=listing.data, total=listing.count, offset=offset,
                per_page=ROWS_PER_PAGE)


@router.get("/evaluations/{evaluation_id}", response_class=HTMLResponse)
def evaluation(request: Request, evaluation_id: str, ctx: TenantDep, viewer: ViewerDep,
               status: Annotated[str, Query(max_length=16)] = "", offset: Offset = 0) -> Response:
    """One evaluation (404 for another tenant's): progress, summary once finished,
    histogram, breakdowns and a page of its episodes (``status`` filters them)."""
    if status and status not in EPISODE_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(EPISODE_STATUSES)}", field="status")
    job = viewer.jobs.get(ctx.tenant, evaluation_id)
    rows, total = viewer.evaluation_listings.episodes(ctx, evaluation_id, status or None, ROWS_PER_PAGE, offset)
    histogram = viewer.evaluation_listings.histogram(ctx, evaluation_id)
    return page(request, "evaluation.html", job=job, rows=rows, total=total, offset=offset, per_page=ROWS_PER_PAGE,
                histogram=histogram, status=status, statuses=EPISODE_STATUSES)


@router.get("/evaluations/{evaluation_id}/progress.json")
def progress(evaluation_id: str, ctx: TenantDep, viewer: ViewerDep) -> Response:
    """``{"status", "finished", "progress": {total, done, errors, running, pending,
    cancelled, mean_reward, success}}`` of the evaluation, for the page's polling."""
    job = viewer.jobs.get(ctx.tenant, evaluation_id)
    finished = job.status not in ("queued", "running") and job.progress.running == 0
    body = {"status": job.status, "finished": finished, "progress": job.progress.model_dump(mode="json")}
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/evaluations/{evaluation_id}/episodes/{index}", response_class=HTMLResponse)
def evaluation_episode(request: Request, evaluation_id: str, index: Annotated[int, Path(ge=0, le=10**9)],
                       ctx: TenantDep, viewer: ViewerDep) -> Response:
    """One episode's stored result: status, reward, each check (item, verdict, error),
    its trajectory and, for rollouts, the transcript."""
    row = viewer.evaluation_listings.episode(ctx, evaluation_id, index)
    steps = [(step, *action_text(step.get("action"))) for step in (row.trajectory or []) if isinstance(step, dict)]
    return page(request, "evaluation_episode.html", evaluation_id=evaluation_id, row=row, steps=steps)
