"""``/v1/environments``: register, read, list and delete environment code."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from ..deps import PageDep, ServiceDep, TenantDep
from ..schemas import EnvironmentCreate, EnvironmentPublic, EnvironmentsPublic
from ..strict_json import StrictJSONRoute

router = APIRouter(prefix="/v1/environments", tags=["environments"], route_class=StrictJSONRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EnvironmentPublic)
def create_environment(body: EnvironmentCreate, service: ServiceDep, tenant: TenantDep) -> EnvironmentPublic:
    """Register environment code; its tools (OpenAI schemas) are derived inside a sandbox."""
    row = service.create_environment(tenant, name=body.name, source_code=body.source_code,
                                     class_name=body.class_name, description=body.description, policy=body.policy)
    return EnvironmentPublic.model_validate(row, from_attributes=True)


@router.get("/{environment_id}", response_model=EnvironmentPublic)
def get_environment(environment_id: str, service: ServiceDep, tenant: TenantDep) -> EnvironmentPublic:
    """One environment (404 for unknown ids)."""
    return EnvironmentPublic.model_validate(service.get_environment(tenant, environment_id), from_attributes=True)


@router.get("", response_model=EnvironmentsPublic)
def list_environments(page: PageDep, service: ServiceDep, tenant: TenantDep) -> EnvironmentsPublic:
    """Registered environments, newest first (``limit``/``offset``)."""
    rows, total = service.list_environments(tenant, page.limit, page.offset)
    return EnvironmentsPublic(data=[EnvironmentPublic.model_validate(r, from_attributes=True) for r in rows],
                              count=total)


@router.delete("/{environment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_environment(environment_id: str, service: ServiceDep, tenant: TenantDep) -> Response:
    """Delete an environment (409 while envs use it)."""
    service.delete_environment(tenant, environment_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
