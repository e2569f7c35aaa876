"""The viewer's episode pages: the episode listing, one episode as a timeline, a step's
state diff (a page, or a fragment the timeline fetches when a diff is expanded), the state
at a step, and two episodes side by side.

Every read goes through the API's own env verbs (:class:`~sandpit.api.envs.history.EnvHistory`),
so another tenant's env is a 404 exactly as in the API. A timeline shows
:data:`STEPS_PER_PAGE` steps at a time and never loads a state; a diff loads two states;
the state page renders within :data:`~.render.DEFAULT_BUDGET` characters and links the
raw JSON for the rest.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import HTMLResponse

from ...envs.listings import EPISODE_STATUSES, EpisodeFilter
from ...errors import InvalidRequest, NotFound
from ...schemas.envs import EpisodePublic
from ...services.diff import state_diff
from ...services.quotas import TenantContext
from .render import Budget, diff_rows
from .viewer import Viewer
from .web import TenantDep, UiRoute, ViewerDep, page

router = APIRouter(prefix="/ui", route_class=UiRoute, include_in_schema=False)
STEPS_PER_PAGE = 50
"""Steps of a timeline (or a comparison) per page."""
ROWS_PER_PAGE = 50
"""Rows of a listing per page."""
MAX_DIFF_ROWS = 500
"""Rows of a diff shown; the rest are counted (the states' pages and raw JSON have them)."""
Offset = Annotated[int, Query(ge=0, le=10**9)]
Number = Annotated[int, Query(ge=1, le=10**9)]
Id = Annotated[str, Query(max_length=64)]
EpisodeNumber = Annotated[int, Path(ge=1, le=10**9)]
StepNumber = Annotated[int, Path(ge=0, le=10**9)]


def episode_record(viewer: Viewer, ctx: TenantContext, env_id: str, number: int) -> EpisodePublic:
    """Episode ``number`` of env ``env_id``. Raises NotFound (env, episode, other tenant's)."""
    found = viewer.history.episodes(ctx, env_id, 1, number - 1).data
    if not found or found[0].episode != number:
        raise NotFound(f"episode {number} of env {env_id[:64]!r} not found")
    return found[0]


def state_at(viewer: Viewer, ctx: TenantContext, env_id: str, number: int, step: int) -> dict[str, Any]:
    """The state view (``{"state", "truncated", ...}``) of ``step`` of episode ``number``.
    Raises NotFound, Conflict (past the head)."""
    view: dict[str, Any] = orjson.loads(viewer.history.state(ctx, env_id, step, number))
    return view


@router.get("/episodes", response_class=HTMLResponse)
def episodes(request: Request, ctx: TenantDep, viewer: ViewerDep, environment: Id = "", scenario: Id = "",
             status: Annotated[str, Query(max_length=16)] = "",
             reward_min: Annotated[float | None, Query(ge=-1e9, le=1e9)] = None,
             reward_max: Annotated[float | None, Query(ge=-1e9, le=1e9)] = None, offset: Offset = 0) -> Response:
    """The tenant's episodes, newest first, filtered by environment, scenario, status and
    reward range (a GET form: every filter is in the URL). 422 for an unknown status."""
    if status and status not in EPISODE_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(EPISODE_STATUSES)}", field="status")
    wanted = EpisodeFilter(environment_id=environment or None, scenario_id=scenario or None, status=status or None,
                           reward_min=reward_min, reward_max=reward_max)
    rows, total = viewer.listings.episodes(ctx, wanted, ROWS_PER_PAGE, offset)
    query = {"environment": environment, "scenario": scenario, "status": status,
             "reward_min": "" if reward_min is None else reward_min,
             "reward_max": "" if reward_max is None else reward_max}
    return page(request, "episodes.html", rows=rows, total=total, offset=offset, per_page=ROWS_PER_PAGE,
                query=query, statuses=EPISODE_STATUSES)


@router.get("/envs/{env_id}/episodes/{number}", response_class=HTMLResponse)
def episode(request: Request, env_id: str, number: EpisodeNumber, ctx: TenantDep, viewer: ViewerDep,
            offset: Offset = 0) -> Response:
    """One episode as a timeline: :data:`STEPS_PER_PAGE` steps from ``offset`` (action,
    status, observation, duration, reward, a lazily loaded diff, a link to the state),
    the episode's reward and checks, and the envs of its fork family to compare with."""
    record = episode_record(viewer, ctx, env_id, number)
    trajectory = viewer.history.trajectory(ctx, env_id, number, STEPS_PER_PAGE, offset)
    relatives = viewer.listings.relatives(ctx, env_id)
    return page(request, "episode.html", env_id=env_id, record=record, trajectory=trajectory, offset=offset,
                per_page=STEPS_PER_PAGE, relatives=relatives)


@router.get("/envs/{env_id}/episodes/{number}/steps/{step}/diff", response_class=HTMLResponse)
def diff(request: Request, env_id: str, number: EpisodeNumber, step: StepNumber, ctx: TenantDep,
         viewer: ViewerDep, fragment: bool = False) -> Response:
    """What step ``step`` changed in the state (added / removed / changed, each value
    expandable): a page, or with ``fragment=true`` the bare table the timeline inserts."""
    if step < 1:
        raise InvalidRequest("step 0 is the initial state: it has no diff", field="step")
    before = state_at(viewer, ctx, env_id, number, step - 1)
    after = state_at(viewer, ctx, env_id, number, step)
    rows = diff_rows(state_diff(before["state"], after["state"]), before["state"], after["state"])
    return page(request, "diff_fragment.html" if fragment else "diff.html", env_id=env_id, number=number, step=step,
                rows=rows[:MAX_DIFF_ROWS], more=max(0, len(rows) - MAX_DIFF_ROWS), budget=Budget())


@router.get("/envs/{env_id}/episodes/{number}/steps/{step}/state", response_class=HTMLResponse)
def state(request: Request, env_id: str, number: EpisodeNumber, step: StepNumber, ctx: TenantDep,
          viewer: ViewerDep) -> Response:
    """The full state at ``step``, each top-level attribute expandable; rendering stops at
    :data:`~.render.DEFAULT_BUDGET` characters (the raw JSON link has everything)."""
    view = state_at(viewer, ctx, env_id, number, step)
    return page(request, "state.html", env_id=env_id, number=number, step=step, view=view, budget=Budget())


@router.get("/envs/{env_id}/episodes/{number}/steps/{step}/state.json")
def state_json(env_id: str, number: EpisodeNumber, step: StepNumber, ctx: TenantDep, viewer: ViewerDep) -> Response:
    """The API's ``StateView`` JSON of that step (``GET /v1/envs/{id}/state``'s bytes),
    served as a download (``attachment``) so no browser renders it as a page."""
    body = viewer.history.state(ctx, env_id, step, number)
    return Response(body, media_type="application/json",
                    headers={"content-disposition": f'attachment; filename="state-{step}.json"'})


@router.get("/compare", response_class=HTMLResponse)
def compare(request: Request, ctx: TenantDep, viewer: ViewerDep, a: Id, b: Id, ea: Number = 1, eb: Number = 1,
            offset: Offset = 0) -> Response:
    """Episodes ``ea`` of env ``a`` and ``eb`` of env ``b`` side by side, step by step
    (:data:`STEPS_PER_PAGE` at a time), with their rewards and checks and the difference
    of their final states. 422 when they are episodes of different scenarios."""
    left, right = episode_record(viewer, ctx, a, ea), episode_record(viewer, ctx, b, eb)
    if left.scenario_id != right.scenario_id:
        raise InvalidRequest("these episodes are of different scenarios; compare episodes of one scenario",
                             field="b")
    steps_a = viewer.history.trajectory(ctx, a, ea, STEPS_PER_PAGE, offset)
    steps_b = viewer.history.trajectory(ctx, b, eb, STEPS_PER_PAGE, offset)
    first = state_at(viewer, ctx, a, ea, left.steps)["state"]
    second = state_at(viewer, ctx, b, eb, right.steps)["state"]
    final = diff_rows(state_diff(first, second), first, second)
    rows = [(steps_a.steps[i] if i < len(steps_a.steps) else None,
             steps_b.steps[i] if i < len(steps_b.steps) else None)
            for i in range(max(len(steps_a.steps), len(steps_b.steps)))]
    return page(request, "compare.html", a=a, b=b, ea=ea, eb=eb, left=left, right=right, rows=rows,
                final=final[:MAX_DIFF_ROWS], more=max(0, len(final) - MAX_DIFF_ROWS),
                offset=offset, per_page=STEPS_PER_PAGE, longest=max(steps_a.count, steps_b.count), budget=Budget())
