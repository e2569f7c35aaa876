"""``/v1/scenarios``: EnvScaler scenarios (task, init_config, checklist, check functions)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from ..deps import EvaluationDep, PageDep, TenantDep
from ..models import Scenario
from ..schemas import ScenarioCreate, ScenarioPublic, ScenariosPublic
from ..strict_json import StrictJSONRoute

router = APIRouter(prefix="/v1/scenarios", tags=["scenarios"], route_class=StrictJSONRoute)


def _public(row: Scenario) -> ScenarioPublic:
    return ScenarioPublic.model_validate(row, from_attributes=True)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ScenarioPublic)
def create_scenario(body: ScenarioCreate, evaluation: EvaluationDep, tenant: TenantDep) -> ScenarioPublic:
    """Store a scenario of a registered environment (check functions pass the static policy)."""
    return _public(evaluation.create_scenario(tenant, body))


@router.get("/{scenario_id}", response_model=ScenarioPublic)
def get_scenario(scenario_id: str, evaluation: EvaluationDep, tenant: TenantDep) -> ScenarioPublic:
    """One scenario (404 for unknown ids)."""
    return _public(evaluation.get_scenario(tenant, scenario_id))


@router.get("", response_model=ScenariosPublic)
def list_scenarios(page: PageDep, evaluation: EvaluationDep, tenant: TenantDep,
                   environment_id: Annotated[str | None, Query(max_length=64)] = None) -> ScenariosPublic:
    """Scenarios, newest first, optionally of one environment."""
    rows, total = evaluation.list_scenarios(tenant, page.limit, page.offset, environment_id)
    return ScenariosPublic(data=[_public(r) for r in rows], count=total)


@router.delete("/{scenario_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_scenario(scenario_id: str, evaluation: EvaluationDep, tenant: TenantDep) -> Response:
    """Delete a scenario."""
    evaluation.delete_scenario(tenant, scenario_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
