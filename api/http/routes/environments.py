"""``/v1/environments``: register, read, list and delete environment code."""

from __future__ import annotations

from fastapi import Response, status

from ...schemas.environments import EnvironmentCreate, EnvironmentPublic, EnvironmentsPublic
from ...schemas.stats import EnvironmentStats
from ..deps import METERED, CallerDep, EnvironmentsDep, PageDep, StatsDep, StatsQueryDep, json_router

router = json_router(prefix="/v1/environments", tags=["environments"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EnvironmentPublic, responses=METERED)
def create_environment(body: EnvironmentCreate, environments: EnvironmentsDep, caller: CallerDep) -> EnvironmentPublic:
    """Register environment code: static policy, tools (OpenAI schemas) derived inside a
    sandbox, one instantiation there (``sample_init_config``). 422 when the policy rejects
    the code or it fails to load or instantiate; 429 over the tenant's ``max_code_bytes``,
    ``max_init_config_bytes`` or ``max_concurrent_calls``."""
    return environments.register(caller, body)


@router.get("/{environment_id}", response_model=EnvironmentPublic)
def get_environment(environment_id: str, environments: EnvironmentsDep, caller: CallerDep) -> EnvironmentPublic:
    """One environment (404 for unknown ids and other tenants' ids)."""
    return environments.read(caller, environment_id)


@router.get("/{environment_id}/stats", response_model=EnvironmentStats)
def get_environment_stats(environment_id: str, query: StatsQueryDep, page: PageDep, stats: StatsDep,
                          caller: CallerDep) -> EnvironmentStats:
    """Statistics of the environment's scenarios: totals over all of them and, per
    scenario of one page (``limit``/``offset``, newest scenario first), what
    ``GET /v1/scenarios/{id}/stats`` gives. 404 for unknown ids and other tenants' ids;
    422 for a bad ``kind``, ``since``, ``recent`` or page."""
    return stats.environment(caller, environment_id, query, page.limit, page.offset)


@router.get("", response_model=EnvironmentsPublic)
def list_environments(page: PageDep, environments: EnvironmentsDep, caller: CallerDep) -> EnvironmentsPublic:
    """The tenant's registered environments, newest first (``limit``/``offset``)."""
    return environments.page(caller, page.limit, page.offset)


@router.delete("/{environment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_environment(environment_id: str, environments: EnvironmentsDep, caller: CallerDep) -> Response:
    """Delete an environment (409 while envs or scenarios use it)."""
    environments.delete(caller, environment_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
