"""Tenants, keys and the audit log: ``/v1/admin/...`` (operator) and ``/v1/tenant``,
``/v1/audit`` (a tenant's own)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from .common import Timestamp, _Request

TENANT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""A tenant id: lower-case letters, digits, ``_`` and ``-``, starting with a letter or
digit, at most 64 characters (it appears in container labels and paths)."""


class TenantCreate(_Request):
    """``POST /v1/admin/tenants``: a tenant and (unless ``create_key`` is false) its first key."""

    id: Annotated[str, Field(min_length=1, max_length=64, pattern=TENANT_ID_PATTERN)]
    display_name: Annotated[str | None, Field(max_length=200)] = None
    quotas: dict[str, Any] | None = None
    """Overrides of the default quotas (fields of ``Quotas``; ``max_profile`` may be partial).
    Checked by :meth:`~sandpit.api.services.tenants.TenantService.check_quotas`; the
    OpenAPI document gives their schema (``QuotaOverrides``, :mod:`sandpit.api.http.openapi`)."""
    create_key: bool = True
    key_name: Annotated[str | None, Field(max_length=200)] = None
    key_expires_in_s: Annotated[float | None, Field(gt=0, le=10 * 365 * 86400)] = None

class TenantUpdate(_Request):
    """``PATCH /v1/admin/tenants/{id}``: only the given fields change; ``quotas`` replaces
    the overrides; an empty ``model_api_key`` removes the stored one."""

    display_name: Annotated[str | None, Field(max_length=200)] = None
    quotas: dict[str, Any] | None = None
    """Replaces the overrides (as ``TenantCreate.quotas``)."""
    model_base_url: Annotated[str | None, Field(max_length=2000)] = None
    model_api_key: Annotated[str | None, Field(max_length=4096)] = None

class KeyCreate(_Request):
    name: Annotated[str | None, Field(max_length=200)] = None
    expires_in_s: Annotated[float | None, Field(gt=0, le=10 * 365 * 86400)] = None
    """Seconds until the key stops working (never, when absent)."""

class ApiKeyPublic(BaseModel):
    """A key's metadata (never its hash). ``key`` is only present in the creation response."""

    id: str
    tenant: str
    name: str | None
    prefix: str
    created_at: Timestamp
    expires_at: Timestamp | None
    revoked_at: Timestamp | None
    key: str | None = None

class TenantPublic(BaseModel):
    id: str
    display_name: str | None
    quota_overrides: dict[str, Any]
    quotas: dict[str, Any]
    """Effective quotas (defaults with the overrides applied)."""
    model_base_url: str | None
    has_model_api_key: bool
    created_at: Timestamp
    active_keys: int | None = None
    api_key: ApiKeyPublic | None = None
    """The first key, with its secret, in the creation response only."""

class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int

class KeysPublic(BaseModel):
    data: list[ApiKeyPublic]
    count: int

class TenantUsage(BaseModel):
    """``GET /v1/tenant``: the caller's tenant, quotas and current usage."""

    tenant: str
    key_id: str
    quotas: dict[str, Any]
    live_envs: int
    calls_in_flight: int

class AuditEventPublic(BaseModel):
    id: int
    at: Timestamp
    tenant: str
    actor: str
    action: str
    resource_id: str | None
    detail: dict[str, Any] | None

class AuditPublic(BaseModel):
    data: list[AuditEventPublic]
    count: int
