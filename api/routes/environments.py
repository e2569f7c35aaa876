"""``/v1/environments``: register, read, list and delete environment code."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from ..deps import CallerDep, PageDep, QuotasDep, ServiceDep, TenantsDep
from ..schemas import EnvironmentCreate, EnvironmentPublic, EnvironmentsPublic
from ..strict_json import StrictJSONRoute
from ..tools import json_size, text_size

router = APIRouter(prefix="/v1/environments", tags=["environments"], route_class=StrictJSONRoute)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=EnvironmentPublic)
def create_environment(body: EnvironmentCreate, service: ServiceDep, caller: CallerDep, quotas: QuotasDep,
                       tenants: TenantsDep) -> EnvironmentPublic:
    """Register environment code: static policy, tools (OpenAI schemas) derived inside a
    sandbox, one instantiation there (``sample_init_config``). 422 when the policy rejects
    the code or it fails to load or instantiate; 429 over the tenant's ``max_code_bytes``,
    ``max_init_config_bytes`` or ``max_concurrent_calls``."""
    quotas.check_size(caller, "max_code_bytes", text_size(body.source_code), "source_code")
    if body.sample_init_config is not None:
        quotas.check_size(caller, "max_init_config_bytes", json_size(body.sample_init_config), "sample_init_config")
    with quotas.call(caller):
        row = service.create_environment(caller.tenant, name=body.name, source_code=body.source_code,
                                         class_name=body.class_name, description=body.description, policy=body.policy,
                                         introduction=body.introduction, rules=body.rules,
                                         argument_checking=body.argument_checking,
                                         sample_init_config=body.sample_init_config)
    tenants.audit(caller.tenant, caller.actor, "environment.create", row.id,
                  {"class_name": row.class_name, "code_sha256": row.code_sha256})
    return EnvironmentPublic.model_validate(row, from_attributes=True)


@router.get("/{environment_id}", response_model=EnvironmentPublic)
def get_environment(environment_id: str, service: ServiceDep, caller: CallerDep) -> EnvironmentPublic:
    """One environment (404 for unknown ids and other tenants' ids)."""
    return EnvironmentPublic.model_validate(service.get_environment(caller.tenant, environment_id),
                                            from_attributes=True)


@router.get("", response_model=EnvironmentsPublic)
def list_environments(page: PageDep, service: ServiceDep, caller: CallerDep) -> EnvironmentsPublic:
    """The tenant's registered environments, newest first (``limit``/``offset``)."""
    rows, total = service.list_environments(caller.tenant, page.limit, page.offset)
    return EnvironmentsPublic(data=[EnvironmentPublic.model_validate(r, from_attributes=True) for r in rows],
                              count=total)


@router.delete("/{environment_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_environment(environment_id: str, service: ServiceDep, caller: CallerDep, tenants: TenantsDep) -> Response:
    """Delete an environment (409 while envs or scenarios use it)."""
    service.delete_environment(caller.tenant, environment_id)
    tenants.audit(caller.tenant, caller.actor, "environment.delete", environment_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
