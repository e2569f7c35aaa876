"""``/v1/admin/...`` (operator key): tenants, their keys and quotas, the whole audit log;
``/v1/tenant`` and ``/v1/audit`` (tenant key): the caller's own quotas, usage and events."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from ..deps import CallerDep, OperatorDep, PageDep, QuotasDep, ServiceDep, TenantsDep
from ..models import ApiKey, AuditEvent, Tenant
from ..schemas import (
    ApiKeyPublic,
    AuditEventPublic,
    AuditPublic,
    KeyCreate,
    KeysPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    TenantUsage,
)
from ..strict_json import StrictJSONRoute
from ..tenancy import TenantService

router = APIRouter(prefix="/v1/admin", tags=["admin"], route_class=StrictJSONRoute)
tenant_router = APIRouter(prefix="/v1", tags=["tenant"], route_class=StrictJSONRoute)


def _key(row: ApiKey, secret: str | None = None) -> ApiKeyPublic:
    return ApiKeyPublic(id=row.id, tenant=row.tenant, name=row.name, prefix=row.prefix, created_at=row.created_at,
                        expires_at=row.expires_at, revoked_at=row.revoked_at, key=secret)


def _tenant(tenants: TenantService, row: Tenant, active_keys: int | None = None) -> TenantPublic:
    return TenantPublic(id=row.id, display_name=row.display_name, quota_overrides=row.quotas or {},
                        quotas=tenants.settings.quotas.merged(row.quotas).model_dump(),
                        model_base_url=row.model_base_url, has_model_api_key=row.model_api_key_enc is not None,
                        created_at=row.created_at, active_keys=active_keys)


def _audit(rows: list[AuditEvent], total: int) -> AuditPublic:
    return AuditPublic(data=[AuditEventPublic.model_validate(r, from_attributes=True) for r in rows], count=total)


@router.post("/tenants", status_code=status.HTTP_201_CREATED, response_model=TenantPublic)
def create_tenant(body: TenantCreate, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """Create a tenant and its first API key (shown once, in ``api_key.key``).
    409 if the id exists; 422 for a bad id or unknown quota fields."""
    row = tenants.create_tenant(body.id, body.display_name, body.quotas)
    public = _tenant(tenants, row, 0)
    if body.create_key:
        key_row, secret = tenants.create_key(row.id, body.key_name, body.key_expires_in_s)
        public.api_key = _key(key_row, secret)
        public.active_keys = 1
    return public


@router.get("/tenants", response_model=TenantsPublic)
def list_tenants(_op: OperatorDep, tenants: TenantsDep) -> TenantsPublic:
    """Every tenant with its effective quotas and number of active keys."""
    rows = tenants.list_tenants()
    return TenantsPublic(data=[_tenant(tenants, t, n) for t, n in rows], count=len(rows))


@router.get("/tenants/{tenant_id}", response_model=TenantPublic)
def get_tenant(tenant_id: str, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """One tenant."""
    return _tenant(tenants, tenants.get_tenant(tenant_id))


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(tenant_id: str, body: TenantUpdate, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """Change quota overrides, display name or the rollout model defaults (the model API
    key is stored encrypted and never returned)."""
    return _tenant(tenants, tenants.update_tenant(tenant_id, display_name=body.display_name, quotas=body.quotas,
                                                  model_base_url=body.model_base_url,
                                                  model_api_key=body.model_api_key))


@router.post("/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=ApiKeyPublic)
def create_key(tenant_id: str, body: KeyCreate, _op: OperatorDep, tenants: TenantsDep) -> ApiKeyPublic:
    """A new key for the tenant; the response is the only place the key appears."""
    row, secret = tenants.create_key(tenant_id, body.name, body.expires_in_s)
    return _key(row, secret)


@router.get("/tenants/{tenant_id}/keys", response_model=KeysPublic)
def list_keys(tenant_id: str, _op: OperatorDep, tenants: TenantsDep) -> KeysPublic:
    """The tenant's keys (prefix, dates; never the key or its hash)."""
    rows = tenants.list_keys(tenant_id)
    return KeysPublic(data=[_key(r) for r in rows], count=len(rows))


@router.post("/keys/{key_id}/revoke", response_model=ApiKeyPublic)
def revoke_key(key_id: str, _op: OperatorDep, tenants: TenantsDep) -> ApiKeyPublic:
    """Revoke a key: requests with it get 401 from now on (idempotent)."""
    return _key(tenants.revoke_key(key_id))


@router.get("/audit", response_model=AuditPublic)
def admin_audit(_op: OperatorDep, tenants: TenantsDep, page: PageDep,
                tenant: Annotated[str | None, Query(max_length=64)] = None,
                action: Annotated[str | None, Query(max_length=64)] = None) -> AuditPublic:
    """The audit log of every tenant (or one), newest first."""
    return _audit(*tenants.list_audit(tenant, page.limit, page.offset, action))


@tenant_router.get("/tenant", response_model=TenantUsage)
def my_tenant(caller: CallerDep, service: ServiceDep, quotas: QuotasDep) -> TenantUsage:
    """The caller's tenant: effective quotas, open envs and calls in flight."""
    return TenantUsage(tenant=caller.tenant, key_id=caller.actor, quotas=caller.quotas.model_dump(),
                       live_envs=service.count_open_envs(caller.tenant), calls_in_flight=quotas.in_flight(caller.tenant))


@tenant_router.get("/audit", response_model=AuditPublic)
def my_audit(caller: CallerDep, tenants: TenantsDep, page: PageDep,
             action: Annotated[str | None, Query(max_length=64)] = None) -> AuditPublic:
    """The caller's tenant's audit events, newest first."""
    return _audit(*tenants.list_audit(caller.tenant, page.limit, page.offset, action))
