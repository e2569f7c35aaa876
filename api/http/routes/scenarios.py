"""``/v1/scenarios``: EnvScaler scenarios (task, init_config, checklist, check functions)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response, status

from ...schemas.scenarios import ScenarioCreate, ScenarioPublic, ScenariosPublic
from ...schemas.stats import ScenarioStats
from ..deps import METERED, CallerDep, PageDep, ScenariosDep, StatsDep, StatsQueryDep, json_router

router = json_router(prefix="/v1/scenarios", tags=["scenarios"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ScenarioPublic, responses=METERED)
def create_scenario(body: ScenarioCreate, scenarios: ScenariosDep, caller: CallerDep) -> ScenarioPublic:
    """Store a scenario of a registered environment (check functions pass the static
    policy). 429 over the tenant's ``max_init_config_bytes`` / ``max_code_bytes``."""
    return scenarios.create(caller, body)


@router.get("/{scenario_id}", response_model=ScenarioPublic)
def get_scenario(scenario_id: str, scenarios: ScenariosDep, caller: CallerDep) -> ScenarioPublic:
    """One scenario (404 for unknown ids and other tenants' ids)."""
    return scenarios.read(caller, scenario_id)


@router.get("/{scenario_id}/stats", response_model=ScenarioStats)
def get_scenario_stats(scenario_id: str, query: StatsQueryDep, stats: StatsDep, caller: CallerDep) -> ScenarioStats:
    """The scenario's statistics for curricula: episodes started (``attempts``) and
    finished, how many passed (reward exactly 1.0: every check passed), pass rate, mean
    reward and the newest ``recent`` rewards (newest first), over training episodes,
    evaluation episodes or both (``kind``), started at or after ``since``. 404 for
    unknown ids and other tenants' ids; 422 for a bad ``kind``, ``since`` or ``recent``."""
    return stats.scenario(caller, scenario_id, query)


@router.get("", response_model=ScenariosPublic)
def list_scenarios(page: PageDep, scenarios: ScenariosDep, caller: CallerDep,
                   environment_id: Annotated[str | None, Query(max_length=64)] = None) -> ScenariosPublic:
    """The tenant's scenarios, newest first, optionally of one environment."""
    return scenarios.page(caller, page.limit, page.offset, environment_id)


@router.delete("/{scenario_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_scenario(scenario_id: str, scenarios: ScenariosDep, caller: CallerDep) -> Response:
    """Delete a scenario."""
    scenarios.delete(caller, scenario_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
