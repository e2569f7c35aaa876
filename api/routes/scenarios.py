"""``/v1/scenarios``: EnvScaler scenarios (task, init_config, checklist, check functions)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from ..deps import CallerDep, EvaluationDep, PageDep, QuotasDep, TenantsDep
from ..models import Scenario
from ..schemas import ScenarioCreate, ScenarioPublic, ScenariosPublic
from ..strict_json import StrictJSONRoute
from ..tools import json_size, text_size

router = APIRouter(prefix="/v1/scenarios", tags=["scenarios"], route_class=StrictJSONRoute)


def _public(row: Scenario) -> ScenarioPublic:
    return ScenarioPublic.model_validate(row, from_attributes=True)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ScenarioPublic)
def create_scenario(body: ScenarioCreate, evaluation: EvaluationDep, caller: CallerDep, quotas: QuotasDep,
                    tenants: TenantsDep) -> ScenarioPublic:
    """Store a scenario of a registered environment (check functions pass the static
    policy). 429 over the tenant's ``max_init_config_bytes`` / ``max_code_bytes``."""
    quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
    for index, check in enumerate(body.checklist_with_func):
        quotas.check_size(caller, "max_code_bytes", text_size(check.check_func),
                          f"checklist_with_func.{index}.check_func")
    row = evaluation.create_scenario(caller.tenant, body)
    tenants.audit(caller.tenant, caller.actor, "scenario.create", row.id, {"environment_id": row.environment_id})
    return _public(row)


@router.get("/{scenario_id}", response_model=ScenarioPublic)
def get_scenario(scenario_id: str, evaluation: EvaluationDep, caller: CallerDep) -> ScenarioPublic:
    """One scenario (404 for unknown ids and other tenants' ids)."""
    return _public(evaluation.get_scenario(caller.tenant, scenario_id))


@router.get("", response_model=ScenariosPublic)
def list_scenarios(page: PageDep, evaluation: EvaluationDep, caller: CallerDep,
                   environment_id: Annotated[str | None, Query(max_length=64)] = None) -> ScenariosPublic:
    """The tenant's scenarios, newest first, optionally of one environment."""
    rows, total = evaluation.list_scenarios(caller.tenant, page.limit, page.offset, environment_id)
    return ScenariosPublic(data=[_public(r) for r in rows], count=total)


@router.delete("/{scenario_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_scenario(scenario_id: str, evaluation: EvaluationDep, caller: CallerDep, tenants: TenantsDep) -> Response:
    """Delete a scenario."""
    evaluation.delete_scenario(caller.tenant, scenario_id)
    tenants.audit(caller.tenant, caller.actor, "scenario.delete", scenario_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
