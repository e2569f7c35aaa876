"""``/v1/admin/...`` (operator key): tenants, their keys and quotas, the whole audit log;
``/v1/tenant`` and ``/v1/audit`` (tenant key): the caller's own quotas, usage and events."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query, status

from ...schemas.cluster import ClusterStatus, HostDrainPublic, HostUndrainPublic
from ...schemas.tenants import (
    ApiKeyPublic,
    AuditPublic,
    KeyCreate,
    KeysPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    TenantUsage,
)
from ..deps import CallerDep, ClusterDep, OperatorDep, PageDep, QuotasDep, TenantsDep, json_router

router = json_router(prefix="/v1/admin", tags=["admin"])
tenant_router = json_router(prefix="/v1", tags=["tenant"])


@router.post("/tenants", status_code=status.HTTP_201_CREATED, response_model=TenantPublic)
def create_tenant(body: TenantCreate, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """Create a tenant and its first API key (shown once, in ``api_key.key``).
    409 if the id exists; 422 for a bad id or unknown quota fields."""
    return tenants.create(body)


@router.get("/tenants", response_model=TenantsPublic)
def list_tenants(_op: OperatorDep, tenants: TenantsDep) -> TenantsPublic:
    """Every tenant with its effective quotas and number of active keys."""
    return tenants.every()


@router.get("/tenants/{tenant_id}", response_model=TenantPublic)
def get_tenant(tenant_id: str, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """One tenant."""
    return tenants.read(tenant_id)


@router.patch("/tenants/{tenant_id}", response_model=TenantPublic)
def update_tenant(tenant_id: str, body: TenantUpdate, _op: OperatorDep, tenants: TenantsDep) -> TenantPublic:
    """Change quota overrides, display name or the rollout model defaults (the model API
    key is stored encrypted and never returned)."""
    return tenants.update(tenant_id, body)


@router.post("/tenants/{tenant_id}/keys", status_code=status.HTTP_201_CREATED, response_model=ApiKeyPublic)
def create_key(tenant_id: str, body: KeyCreate, _op: OperatorDep, tenants: TenantsDep) -> ApiKeyPublic:
    """A new key for the tenant; the response is the only place the key appears."""
    return tenants.new_key(tenant_id, body.name, body.expires_in_s)


@router.get("/tenants/{tenant_id}/keys", response_model=KeysPublic)
def list_keys(tenant_id: str, _op: OperatorDep, tenants: TenantsDep) -> KeysPublic:
    """The tenant's keys (prefix, dates; never the key or its hash)."""
    return tenants.keys(tenant_id)


@router.post("/keys/{key_id}/revoke", response_model=ApiKeyPublic)
def revoke_key(key_id: str, _op: OperatorDep, tenants: TenantsDep) -> ApiKeyPublic:
    """Revoke a key: requests with it get 401 from now on (idempotent)."""
    return tenants.revoke(key_id)


@router.get("/audit", response_model=AuditPublic)
def admin_audit(_op: OperatorDep, tenants: TenantsDep, page: PageDep,
                tenant: Annotated[str | None, Query(max_length=64)] = None,
                action: Annotated[str | None, Query(max_length=64)] = None) -> AuditPublic:
    """The audit log of every tenant (or one), newest first."""
    return tenants.audit_page(tenant, page.limit, page.offset, action)


@tenant_router.get("/tenant", response_model=TenantUsage)
def my_tenant(caller: CallerDep, quotas: QuotasDep) -> TenantUsage:
    """The caller's tenant: effective quotas, open envs and calls in flight."""
    return quotas.usage(caller)


@tenant_router.get("/audit", response_model=AuditPublic)
def my_audit(caller: CallerDep, tenants: TenantsDep, page: PageDep,
             action: Annotated[str | None, Query(max_length=64)] = None) -> AuditPublic:
    """The caller's tenant's audit events, newest first."""
    return tenants.audit_page(caller.tenant, page.limit, page.offset, action)


@router.get("/cluster", response_model=ClusterStatus)
def cluster_status(_op: OperatorDep, cluster: ClusterDep) -> ClusterStatus:
    """Nodes, sandbox hosts (per-host sandboxes, sessions, capacity, envs placed), the API
    replicas sharing the database, as the answering replica sees them."""
    return cluster.status()


@router.post("/cluster/hosts/{host}/drain", status_code=status.HTTP_202_ACCEPTED, response_model=HostDrainPublic)
def drain_host(host: Annotated[str, Path(max_length=1024)], _op: OperatorDep, cluster: ClusterDep,
               force: Annotated[bool, Query(description="Drain even the last host taking envs.")] = False
               ) -> HostDrainPublic:
    """Drain a sandbox host: nothing new is placed on it, its in-flight calls finish and are
    acknowledged, its envs move to other hosts (resuming from their last committed step on
    next use), then its pool shuts down. It runs in the answering replica (``owner``); if
    that replica dies, another takes it over. Idempotent; poll ``GET /v1/admin/cluster``
    until the host shows ``drained``. 404 unknown host; 409 last host (unless ``force``)."""
    return cluster.drain(host, force)


@router.post("/cluster/hosts/{host}/undrain", response_model=HostUndrainPublic)
def undrain_host(host: Annotated[str, Path(max_length=1024)], _op: OperatorDep, cluster: ClusterDep
                 ) -> HostUndrainPublic:
    """Let a draining or drained sandbox host take new envs again: a running drain stops
    where it is (envs it moved stay where they re-opened), a drained host's actor is
    re-created on its node with a new pool. A host never drained: a no-op (``previous``
    null). 404 unknown host; 409 a host whose Ray node is gone."""
    return cluster.undrain(host)

