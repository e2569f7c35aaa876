"""The viewer's environment pages: the tenant's environments with a search box, and one
environment: its source highlighted, its tools (what the agent sees, the derived ones and
where they differ), its policy report, its newest scenarios and its newest episodes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse

from ...envs.listings import EpisodeFilter
from .episodes import ROWS_PER_PAGE, Offset
from .highlight import python_html
from .web import TenantDep, UiRoute, ViewerDep, page

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
RECENT = 20
"""Scenarios and episodes shown on an environment's page."""


@router.get("/environments", response_class=HTMLResponse)
def environments(request: Request, ctx: TenantDep, viewer: ViewerDep,
                 q: Annotated[str, Query(max_length=200)] = "", offset: Offset = 0) -> Response:
    """The tenant's registered environments, newest first, whose name, class or id
    contains ``q``."""
    rows, total = viewer.listings.environments(ctx, q.strip() or None, ROWS_PER_PAGE, offset)
    return page(request, "environments.html", rows=rows, total=total, q=q, offset=offset, per_page=ROWS_PER_PAGE)


@router.get("/environments/{environment_id}", response_class=HTMLResponse)
def environment(request: Request, environment_id: str, ctx: TenantDep, viewer: ViewerDep) -> Response:
    """One environment (404 for another tenant's, as in the API)."""
    public = viewer.environments.read(ctx, environment_id)
    source = viewer.environments.get_environment(ctx.tenant, environment_id).source_code
    scenarios = viewer.listings.scenarios_of(ctx, environment_id, RECENT)
    episodes, count = viewer.listings.episodes(ctx, EpisodeFilter(environment_id=environment_id), RECENT, 0)
    return page(request, "environment.html", environment=public, code=python_html(source), scenarios=scenarios,
                differences=[d.model_dump(mode="json") for d in public.tool_differences],
                episodes=episodes, episode_count=count)
