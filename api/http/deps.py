"""What routes depend on: typed dependency aliases (``EnvsDep``, ``CallerDep``,
``PageDep``, ...) over the services the app's lifespan creates, :func:`json_router`, and
the :data:`METERED` route marker.

A route whose service counts the call against the tenant's quotas (and may answer 429)
says so with ``responses=METERED``: the OpenAPI document then lists its 429
(:mod:`.openapi` reads the marker). The quotas themselves are enforced by the service.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BeforeValidator

from ..envs.attempts import Attempts
from ..envs.batch import BatchSteps
from ..envs.episodes import Episodes
from ..envs.history import EnvHistory
from ..envs.lifecycle import EnvLifecycle
from ..envs.rewards import Rewards
from ..evaluations.jobs import EvaluationJobs
from ..schemas.envs import ATTEMPT_PATTERN
from ..schemas.stats import RECENT_DEFAULT, RECENT_MAX, StatsKind
from ..services.cluster import ClusterService
from ..services.environments import EnvironmentService
from ..services.execution import ExecutionService
from ..services.health import HealthService
from ..services.idempotency import KEY_HEADER, KEY_MAX_CHARS, KEY_PATTERN, Idempotency, Replay, request_digest
from ..services.quotas import QuotaService, TenantContext
from ..services.scenarios import ScenarioService
from ..services.stats import StatsQuery, StatsService
from ..services.tenants import TenantService
from .access_log import note_tenant
from .strict_json import StrictJSONRoute

METERED: dict[int | str, dict[str, Any]] = {429: {"description": "A tenant quota was hit."}}
"""The marker of a route whose service counts the call against the tenant's quotas
(``@router.post(..., responses=METERED)``): the OpenAPI document lists the route's 429
with :class:`~sandpit.api.errors.ErrorBody` and ``Retry-After`` (:mod:`.openapi`
replaces this entry by the full response)."""


def json_router(prefix: str = "", tags: list[str] | None = None) -> APIRouter:
    """An ``APIRouter`` whose routes parse JSON bodies strictly (:mod:`.strict_json`)."""
    return APIRouter(prefix=prefix, tags=cast(list[Any], tags or []), route_class=StrictJSONRoute)


def _state(request: Request, name: str) -> Any:
    return getattr(request.app.state, name)


def get_environments(request: Request) -> EnvironmentService:
    """The app's :class:`EnvironmentService` (created in the lifespan)."""
    return cast(EnvironmentService, _state(request, "environments"))


def get_envs(request: Request) -> EnvLifecycle:
    """The app's :class:`EnvLifecycle` (create, read, list, delete envs)."""
    return cast(EnvLifecycle, _state(request, "envs"))


def get_episodes(request: Request) -> Episodes:
    """The app's :class:`Episodes` (reset, restore, fork)."""
    return cast(Episodes, _state(request, "episodes"))


def get_rewards(request: Request) -> Rewards:
    """The app's :class:`Rewards` (evaluate)."""
    return cast(Rewards, _state(request, "rewards"))


def get_batch(request: Request) -> BatchSteps:
    """The app's :class:`BatchSteps` (``POST /v1/envs:step``)."""
    return cast(BatchSteps, _state(request, "batch"))


def get_history(request: Request) -> EnvHistory:
    """The app's :class:`EnvHistory`."""
    return cast(EnvHistory, _state(request, "history"))


def get_scenarios(request: Request) -> ScenarioService:
    """The app's :class:`ScenarioService`."""
    return cast(ScenarioService, _state(request, "scenarios"))


def get_stats(request: Request) -> StatsService:
    """The app's :class:`StatsService` (scenario and environment statistics)."""
    return cast(StatsService, _state(request, "stats"))


def get_execution(request: Request) -> ExecutionService:
    """The app's :class:`ExecutionService`."""
    return cast(ExecutionService, _state(request, "execution"))


def get_jobs(request: Request) -> EvaluationJobs:
    """The app's :class:`EvaluationJobs`."""
    return cast(EvaluationJobs, _state(request, "evaluations"))


def get_tenants(request: Request) -> TenantService:
    """The app's :class:`TenantService`."""
    return cast(TenantService, _state(request, "tenants"))


def get_cluster(request: Request) -> ClusterService:
    """The app's :class:`ClusterService`."""
    return cast(ClusterService, _state(request, "cluster"))


def get_quotas(request: Request) -> QuotaService:
    """The app's :class:`QuotaService`."""
    return cast(QuotaService, _state(request, "quotas"))


def get_health(request: Request) -> HealthService:
    """The app's :class:`HealthService`."""
    return cast(HealthService, _state(request, "health"))


def get_caller(request: Request) -> TenantContext:
    """The tenant of the request's ``Authorization: Bearer <api key>`` (noted for the
    access log). Raises Unauthorized (401: missing, unknown, revoked or expired key),
    Forbidden (403: the operator key on a tenant route)."""
    caller = get_tenants(request).authenticate(request.headers.get("authorization"))
    note_tenant(request.scope, caller.tenant)
    return caller


def require_operator(request: Request) -> None:
    """Admin routes: the operator key. Raises Unauthorized (401) or Forbidden (403)."""
    get_tenants(request).require_operator(request.headers.get("authorization"))


def authorization(request: Request) -> str | None:
    """The request's ``Authorization`` header, as given (``/metrics`` checks it itself)."""
    return request.headers.get("authorization")


IdempotencyKeyHeader = Annotated[str | None, Header(
    alias=KEY_HEADER, min_length=1, max_length=KEY_MAX_CHARS, pattern=KEY_PATTERN,
    description=f"1 to {KEY_MAX_CHARS} printable ASCII characters naming this request: a retry with "
                "the same key and the same request gets the first response (status and body) "
                "without running anything again (`Idempotent-Replayed: true`); the same key with "
                "another request is 409 `idempotency_key_reused`; while the first still runs, 409 "
                "`idempotency_key_in_flight` with `Retry-After`. Kept `SANDPIT_IDEMPOTENCY_KEY_TTL_S`; "
                "errors are not stored (a retry runs again).")]
"""The ``Idempotency-Key`` request header (FastAPI answers 422 naming it when malformed)."""
ATTEMPT_HEADER = "Sandpit-Attempt"
"""The request header that carries an env's attempt token."""
AttemptHeader = Annotated[str | None, Header(
    alias=ATTEMPT_HEADER, min_length=1, max_length=64, pattern=ATTEMPT_PATTERN,
    description="The token of the env's attempt this call belongs to (`POST /v1/envs/{env_id}/attempts`): "
                "a token that is not the env's current attempt's is 409 `stale_attempt` and nothing is "
                "done. Without it the call is not fenced.")]
"""The ``Sandpit-Attempt`` request header (FastAPI answers 422 naming it when malformed)."""
REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header set to ``true`` on a replayed response."""


def replay_response(replay: Replay) -> Response:
    """The stored response of a key's first request, marked ``Idempotent-Replayed: true``."""
    return Response(replay.body, replay.status, headers={REPLAYED_HEADER: "true"}, media_type="application/json")


class Idempotent:
    """A request's ``Idempotency-Key`` (None: the request has none) and digest, and the
    service that claims it (:mod:`sandpit.api.services.idempotency`)."""

    def __init__(self, service: Idempotency, key: str | None, digest: str) -> None:
        self.service = service
        self.key = key
        self.digest = digest

    def respond(self, caller: TenantContext, status: int, produce: Callable[[], bytes]) -> Response:
        """``produce()``'s JSON bytes as a ``status`` response, run at most once per key:
        without a key it just runs; with one, a replay of the stored response, or the new
        response stored on the key (an error releases the key and propagates). Raises
        IdempotencyKeyReused, IdempotencyKeyInFlight (409), what ``produce`` raises."""
        if self.key is None:
            return Response(produce(), status, media_type="application/json")
        begun = self.service.begin(caller.tenant, self.key, self.digest)
        if isinstance(begun, Replay):
            return replay_response(begun)
        try:
            body = produce()
        except BaseException:
            self.service.release(begun)
            raise
        self.service.finish(begun, status, body)
        return Response(body, status, media_type="application/json")


async def idempotent(request: Request, key: IdempotencyKeyHeader = None) -> Idempotent:
    """The request's :class:`Idempotent` (its digest: method, route template, env id, query
    and body bytes; :func:`~sandpit.api.services.idempotency.request_digest`)."""
    body = await request.body() if key is not None else b""
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path)
    digest = request_digest(request.method, template, request.path_params.get("env_id"),
                            request.scope.get("query_string", b""), body) if key is not None else ""
    return Idempotent(_state(request, "idempotency"), key, digest)


def get_attempts(request: Request) -> Attempts:
    return cast(Attempts, _state(request, "attempts"))


def fence(request: Request, env_id: str, caller: CallerDep, attempt: AttemptHeader = None) -> None:
    """Refuse the call when its ``Sandpit-Attempt`` token is not the env's current
    attempt's (409 ``stale_attempt``); no header: no fence."""
    get_attempts(request).check(caller, env_id, attempt)


class Page:
    """``limit`` (1..max_list_limit) and ``offset`` query parameters."""

    def __init__(self, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                 offset: Annotated[int, Query(ge=0, le=10**9)] = 0) -> None:
        self.limit = limit
        self.offset = offset


def iso_time(value: object) -> object:
    """A query parameter's ISO 8601 date or date-time (``2026-11-28``,
    ``2026-11-28T10:00:00Z``, with or without a zone), as the OpenAPI document's
    ``format: date-time`` says: pydantic alone would also take a number as Unix seconds.
    Raises ValueError (a 422 naming the parameter) for anything else."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    raise ValueError("must be an ISO 8601 date or time, e.g. 2026-11-28T10:00:00Z")


def stats_query(kind: Annotated[StatsKind, Query(
                    description="Which episodes count: training (envs of /v1/envs), evaluation "
                                "(batch evaluations) or all.")] = "all",
                since: Annotated[datetime | None, BeforeValidator(iso_time), Query(
                    description="Count only episodes started at or after this ISO 8601 time "
                                "(UTC when it names no zone).")] = None,
                recent: Annotated[int, Query(ge=0, le=RECENT_MAX, description=(
                    "How many of the newest finished episodes' rewards to list per scenario "
                    "(newest first)."))] = RECENT_DEFAULT) -> StatsQuery:
    """The query parameters of the statistics routes (:class:`StatsQuery`); FastAPI
    answers 422 for an unknown ``kind``, a malformed ``since`` or ``recent`` out of
    0..:data:`~sandpit.api.schemas.stats.RECENT_MAX`."""
    return StatsQuery(kind=kind, since=since, recent=recent)


EnvironmentsDep = Annotated[EnvironmentService, Depends(get_environments)]
EnvsDep = Annotated[EnvLifecycle, Depends(get_envs)]
EpisodesDep = Annotated[Episodes, Depends(get_episodes)]
RewardsDep = Annotated[Rewards, Depends(get_rewards)]
HistoryDep = Annotated[EnvHistory, Depends(get_history)]
BatchDep = Annotated[BatchSteps, Depends(get_batch)]
ScenariosDep = Annotated[ScenarioService, Depends(get_scenarios)]
StatsDep = Annotated[StatsService, Depends(get_stats)]
ExecutionDep = Annotated[ExecutionService, Depends(get_execution)]
JobsDep = Annotated[EvaluationJobs, Depends(get_jobs)]
TenantsDep = Annotated[TenantService, Depends(get_tenants)]
QuotasDep = Annotated[QuotaService, Depends(get_quotas)]
ClusterDep = Annotated[ClusterService, Depends(get_cluster)]
HealthDep = Annotated[HealthService, Depends(get_health)]
CallerDep = Annotated[TenantContext, Depends(get_caller)]
IdempotentDep = Annotated[Idempotent, Depends(idempotent)]
AttemptsDep = Annotated[Attempts, Depends(get_attempts)]
FencedDep = Annotated[None, Depends(fence)]
OperatorDep = Annotated[None, Depends(require_operator)]
AuthorizationDep = Annotated[str | None, Depends(authorization)]
PageDep = Annotated[Page, Depends(Page)]
StatsQueryDep = Annotated[StatsQuery, Depends(stats_query)]
