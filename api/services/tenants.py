"""Tenants, API keys and the audit log.

* A tenant is a slug (``team-a``); every object's ``tenant`` column names one.
* API keys look like ``sp_<43 url-safe characters>`` (256 random bits). Only their
  SHA-256 is stored (random keys need no salt or slow hash); the key is returned once,
  at creation. Keys can expire (``expires_at``) and be revoked; both end in 401.
* :meth:`TenantService.authenticate` maps a bearer key to a :class:`TenantContext`
  (tenant, key id, effective quotas); verified keys are cached for
  ``auth_cache_ttl_s`` and dropped from the cache at once when revoked here.
* The operator key (``SANDPIT_OPERATOR_KEY``) is compared in constant time and only
  opens ``/v1/admin/...``.
* The audit log records who (key id or ``operator``) created, deleted, evaluated or
  administered what; never secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select

from ..db import models
from ..db.database import Database
from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from ..schemas.common import integral_numbers
from ..schemas.tenants import (
    TENANT_ID_PATTERN,
    ApiKeyPublic,
    AuditEventPublic,
    AuditPublic,
    KeysPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
)
from ..secrets import SecretBox
from ..settings import ApiSettings, ProfileCeiling, Quotas
from .common import aware
from .common import utcnow as _now
from .quotas import TenantContext

TENANT_ID = re.compile(TENANT_ID_PATTERN.removeprefix("^").removesuffix("$"))
"""The id rule (:data:`~sandpit.api.schemas.tenants.TENANT_ID_PATTERN`), for ``fullmatch``:
a ``$`` in ``re`` also matches before a final newline."""
KEY_PREFIX = "sp_"
OPERATOR = "operator"


def hash_key(key: str) -> str:
    """Hex SHA-256 of an API key (what ``api_keys.hash`` stores)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class TenantService:
    """Tenants, keys, authentication and the audit log over the control database."""

    def __init__(self, settings: ApiSettings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._cache: dict[str, tuple[float, TenantContext, datetime | None]] = {}
        """key hash -> (cached at, context, key expiry)."""
        self._quota_cache: dict[str, tuple[float, Quotas]] = {}
        self._lock = threading.Lock()
        self._box: SecretBox | None = None

    @property
    def box(self) -> SecretBox:
        """Encryption of stored model API keys (created on first use)."""
        if self._box is None:
            self._box = SecretBox(self.settings)
        return self._box

    # -- authentication ------------------------------------------------------------------
    @staticmethod
    def bearer(authorization: str | None) -> str:
        """The key of an ``Authorization: Bearer <key>`` header. Raises Unauthorized."""
        if not authorization:
            raise Unauthorized("missing `Authorization: Bearer <api key>` header")
        scheme, _, key = authorization.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("the Authorization header must be `Bearer <api key>`")
        if len(key) > 256:
            raise Unauthorized("invalid API key")
        return key

    def is_operator(self, key: str) -> bool:
        """Constant-time comparison with the operator key (False when none is configured)."""
        operator = self.settings.operator_key
        return operator is not None and hmac.compare_digest(key.encode("utf-8", "surrogatepass"),
                                                            operator.get_secret_value().encode("utf-8"))

    def require_operator(self, authorization: str | None) -> None:
        """Raises Unauthorized (no/invalid header) or Forbidden (not the operator key, or
        no operator key configured)."""
        key = self.bearer(authorization)
        if self.settings.operator_key is None:
            raise Forbidden("the admin API is disabled: set SANDPIT_OPERATOR_KEY")
        if not self.is_operator(key):
            raise Forbidden("the admin API needs the operator key")

    def authenticate_cached(self, authorization: str | None) -> TenantContext | None:
        """:meth:`authenticate` when the key was authenticated within
        ``auth_cache_ttl_s`` seconds (no database read: safe on an event loop), else
        None. Raises Unauthorized for a missing or malformed header or an expired key."""
        digest = hash_key(self.bearer(authorization))
        cached = self._cache.get(digest)
        if cached is None or time.monotonic() - cached[0] >= self.settings.auth_cache_ttl_s:
            return None
        expires = cached[2]
        if expires is not None and expires <= _now():
            self._cache.pop(digest, None)
            raise Unauthorized("API key expired")
        return cached[1]

    def authenticate(self, authorization: str | None) -> TenantContext:
        """The tenant of a bearer API key. Raises Unauthorized for a missing header or an
        unknown, revoked or expired key; Forbidden for the operator key (it is not a
        tenant's key)."""
        hit = self.authenticate_cached(authorization)
        if hit is not None:
            return hit
        key = self.bearer(authorization)
        digest = hash_key(key)
        now = time.monotonic()
        if self.is_operator(key):
            raise Forbidden("the operator key only opens /v1/admin; use a tenant's API key")
        with self.db.read() as db:
            row = db.scalars(select(models.ApiKey).where(models.ApiKey.hash == digest)).first()
            tenant = db.get(models.Tenant, row.tenant) if row is not None else None
        if row is None or tenant is None or not hmac.compare_digest(row.hash, digest):
            raise Unauthorized("invalid API key")
        if row.revoked_at is not None:
            raise Unauthorized("API key revoked")
        expires = aware(row.expires_at) if row.expires_at is not None else None
        if expires is not None and expires <= _now():
            raise Unauthorized("API key expired")
        ctx = TenantContext(tenant=tenant.id, actor=row.id, quotas=self._quotas_of(tenant))
        with self._lock:
            self._cache[digest] = (now, ctx, expires)
        return ctx

    def _quotas_of(self, tenant: models.Tenant) -> Quotas:
        try:
            return self.settings.quotas.merged(tenant.quotas)
        except ValidationError:  # stored overrides no longer valid for this version: defaults
            return self.settings.quotas

    def quotas(self, tenant: str) -> Quotas:
        """Effective quotas of ``tenant`` (cached like keys; defaults for unknown tenants)."""
        now = time.monotonic()
        cached = self._quota_cache.get(tenant)
        if cached is not None and now - cached[0] < max(self.settings.auth_cache_ttl_s, 1.0):
            return cached[1]
        with self.db.read() as db:
            row = db.get(models.Tenant, tenant)
        quotas = self._quotas_of(row) if row is not None else self.settings.quotas
        self._quota_cache[tenant] = (now, quotas)
        return quotas

    def _forget_tenant(self, tenant: str) -> None:
        with self._lock:
            self._quota_cache.pop(tenant, None)
            for digest, (_, ctx, _) in list(self._cache.items()):
                if ctx.tenant == tenant:
                    self._cache.pop(digest, None)

    # -- tenants -----------------------------------------------------------------------
    def create_tenant(self, tenant_id: str, display_name: str | None, quotas: dict[str, Any] | None) -> models.Tenant:
        """Create a tenant. Raises InvalidRequest (bad slug or quotas), Conflict (exists)."""
        if not TENANT_ID.fullmatch(tenant_id):
            raise InvalidRequest("tenant id must match [a-z0-9][a-z0-9_-]{0,63}", field="id")
        quotas = self.check_quotas(quotas)
        with self.db.write() as db:
            if db.get(models.Tenant, tenant_id) is not None:
                raise Conflict(f"tenant {tenant_id!r} already exists")
            row = models.Tenant(id=tenant_id, display_name=display_name, quotas=quotas or {}, created_at=_now())
            db.add(row)
        self.audit(tenant_id, OPERATOR, "tenant.create", tenant_id, {"quotas": quotas or {}})
        return row

    def check_quotas(self, quotas: dict[str, Any] | None) -> dict[str, Any] | None:
        """Quota overrides as stored: the fields of :class:`Quotas` (``max_profile`` may be
        partial), whole floats of integer fields (``5.0``) as ints. Strict, like request
        bodies: a string or boolean for a number is refused, as the OpenAPI document's
        ``QuotaOverrides`` says. Raises InvalidRequest naming the first bad field."""
        if quotas is None:
            return None
        quotas = integral_numbers(Quotas, quotas)
        profile = quotas.get("max_profile")
        if isinstance(profile, dict):
            quotas = {**quotas, "max_profile": integral_numbers(ProfileCeiling, profile)}
        try:
            self.settings.quotas.merged(quotas, strict=True)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise InvalidRequest(f"quotas.{where}: {first.get('msg')}", field=f"quotas.{where}") from None
        return quotas

    def update_tenant(self, tenant_id: str, *, display_name: str | None = None, quotas: dict[str, Any] | None = None,
                      model_base_url: str | None = None, model_api_key: str | None = None) -> models.Tenant:
        """Change a tenant's quota overrides (replacing them), name or rollout model
        defaults. Raises NotFound, InvalidRequest."""
        quotas = self.check_quotas(quotas)
        with self.db.write() as db:
            row = db.get(models.Tenant, tenant_id)
            if row is None:
                raise NotFound(f"tenant {tenant_id[:64]!r} not found")
            if display_name is not None:
                row.display_name = display_name
            if quotas is not None:
                row.quotas = quotas
            if model_base_url is not None:
                row.model_base_url = model_base_url or None
            if model_api_key is not None:
                row.model_api_key_enc = self.box.encrypt(model_api_key) if model_api_key else None
        self._forget_tenant(tenant_id)
        changed = [name for name, value in (("display_name", display_name), ("quotas", quotas),
                                            ("model_base_url", model_base_url), ("model_api_key", model_api_key))
                   if value is not None]
        self.audit(tenant_id, OPERATOR, "tenant.update", tenant_id, {"changed": changed})
        return self.get_tenant(tenant_id)

    def get_tenant(self, tenant_id: str) -> models.Tenant:
        """The tenant or NotFound."""
        with self.db.read() as db:
            row = db.get(models.Tenant, tenant_id)
        if row is None:
            raise NotFound(f"tenant {tenant_id[:64]!r} not found")
        return row

    def list_tenants(self) -> list[tuple[models.Tenant, int]]:
        """Every tenant with its number of active (unrevoked, unexpired) keys."""
        now = _now()
        with self.db.read() as db:
            tenants = db.scalars(select(models.Tenant).order_by(models.Tenant.id)).all()
            keys = db.scalars(select(models.ApiKey).where(models.ApiKey.revoked_at.is_(None))).all()
        active: dict[str, int] = {}
        for key in keys:
            expires = aware(key.expires_at) if key.expires_at is not None else None
            if expires is None or expires > now:
                active[key.tenant] = active.get(key.tenant, 0) + 1
        return [(t, active.get(t.id, 0)) for t in tenants]

    def model_api_key(self, tenant_id: str) -> str | None:
        """The tenant's stored default model API key (decrypted), if any."""
        row = self.get_tenant(tenant_id)
        return self.box.decrypt(row.model_api_key_enc) if row.model_api_key_enc else None

    # -- keys --------------------------------------------------------------------------
    def create_key(self, tenant_id: str, name: str | None, expires_in_s: float | None) -> tuple[models.ApiKey, str]:
        """A new key for ``tenant_id``; returns ``(row, key)`` — the only time the key is
        seen. Raises NotFound (tenant)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        now = _now()
        row = models.ApiKey(id=f"key_{secrets.token_hex(8)}", tenant=tenant_id, name=name, prefix=key[:10],
                            hash=hash_key(key), created_at=now,
                            expires_at=now + timedelta(seconds=expires_in_s) if expires_in_s else None)
        with self.db.write() as db:
            if db.get(models.Tenant, tenant_id) is None:
                raise NotFound(f"tenant {tenant_id[:64]!r} not found")
            db.add(row)
        self.audit(tenant_id, OPERATOR, "api_key.create", row.id, {"name": name, "expires_at":
                                                                     row.expires_at.isoformat() if row.expires_at else None})
        return row, key

    def list_keys(self, tenant_id: str) -> list[models.ApiKey]:
        """The tenant's keys (hash never exposed by the routes), newest first. Raises NotFound."""
        self.get_tenant(tenant_id)
        with self.db.read() as db:
            return list(db.scalars(select(models.ApiKey).where(models.ApiKey.tenant == tenant_id)
                                   .order_by(models.ApiKey.created_at.desc())).all())

    def revoke_key(self, key_id: str) -> models.ApiKey:
        """Revoke a key (idempotent; effective at once in this process). Raises NotFound."""
        with self.db.write() as db:
            row = db.get(models.ApiKey, key_id)
            if row is None:
                raise NotFound(f"API key {key_id[:64]!r} not found")
            if row.revoked_at is None:
                row.revoked_at = _now()
        with self._lock:
            for digest, (_, ctx, _) in list(self._cache.items()):
                if ctx.actor == key_id:
                    self._cache.pop(digest, None)
        self.audit(row.tenant, OPERATOR, "api_key.revoke", key_id, None)
        return row

    # -- audit -------------------------------------------------------------------------
    def audit(self, tenant: str, actor: str, action: str, resource_id: str | None,
              detail: dict[str, Any] | None = None) -> None:
        """Append one audit event (``action`` like ``env.create``; ``detail`` without secrets)."""
        with self.db.write() as db:
            db.add(audit_event(tenant, actor, action, resource_id, detail))

    def list_audit(self, tenant: str | None, limit: int, offset: int,
                   action: str | None = None) -> tuple[list[models.AuditEvent], int]:
        """Audit events, newest first (one tenant's, or all for ``None``), and the total."""
        where = []
        if tenant is not None:
            where.append(models.AuditEvent.tenant == tenant)
        if action is not None:
            where.append(models.AuditEvent.action == action)
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(models.AuditEvent).where(*where)) or 0
            rows = db.scalars(select(models.AuditEvent).where(*where).order_by(models.AuditEvent.id.desc())
                              .limit(limit).offset(offset)).all()
        return list(rows), total


    # -- the HTTP contract (``/v1/admin``) ------------------------------------------------
    def public(self, row: models.Tenant, active_keys: int | None = None) -> TenantPublic:
        """``row`` as the API shows it: effective quotas, never the model API key."""
        return TenantPublic(id=row.id, display_name=row.display_name, quota_overrides=row.quotas or {},
                            quotas=self.settings.quotas.merged(row.quotas).model_dump(),
                            model_base_url=row.model_base_url, has_model_api_key=row.model_api_key_enc is not None,
                            created_at=row.created_at, active_keys=active_keys)

    @staticmethod
    def key_public(row: models.ApiKey, secret: str | None = None) -> ApiKeyPublic:
        """A key's metadata (``key`` only in the creation response)."""
        return ApiKeyPublic(id=row.id, tenant=row.tenant, name=row.name, prefix=row.prefix, created_at=row.created_at,
                            expires_at=row.expires_at, revoked_at=row.revoked_at, key=secret)

    def create(self, body: TenantCreate) -> TenantPublic:
        """A tenant and (unless ``create_key`` is false) its first key, shown once.
        Raises InvalidRequest, Conflict."""
        row = self.create_tenant(body.id, body.display_name, body.quotas)
        public = self.public(row, 0)
        if body.create_key:
            key_row, secret = self.create_key(row.id, body.key_name, body.key_expires_in_s)
            public.api_key = self.key_public(key_row, secret)
            public.active_keys = 1
        return public

    def read(self, tenant_id: str) -> TenantPublic:
        """One tenant. Raises NotFound."""
        return self.public(self.get_tenant(tenant_id))

    def every(self) -> TenantsPublic:
        """Every tenant with its number of active keys."""
        rows = self.list_tenants()
        return TenantsPublic(data=[self.public(t, n) for t, n in rows], count=len(rows))

    def update(self, tenant_id: str, body: TenantUpdate) -> TenantPublic:
        """Apply a ``PATCH``. Raises NotFound, InvalidRequest."""
        return self.public(self.update_tenant(tenant_id, display_name=body.display_name, quotas=body.quotas,
                                              model_base_url=body.model_base_url, model_api_key=body.model_api_key))

    def new_key(self, tenant_id: str, name: str | None, expires_in_s: float | None) -> ApiKeyPublic:
        """A new key, with its secret (the only time it is shown). Raises NotFound."""
        row, secret = self.create_key(tenant_id, name, expires_in_s)
        return self.key_public(row, secret)

    def keys(self, tenant_id: str) -> KeysPublic:
        """The tenant's keys (never a key or its hash). Raises NotFound."""
        rows = self.list_keys(tenant_id)
        return KeysPublic(data=[self.key_public(r) for r in rows], count=len(rows))

    def revoke(self, key_id: str) -> ApiKeyPublic:
        """Revoke a key (idempotent). Raises NotFound."""
        return self.key_public(self.revoke_key(key_id))

    def audit_page(self, tenant: str | None, limit: int, offset: int, action: str | None = None) -> AuditPublic:
        """A page of audit events, newest first (one tenant's, or all for ``None``)."""
        rows, total = self.list_audit(tenant, limit, offset, action)
        return AuditPublic(data=[AuditEventPublic.model_validate(r, from_attributes=True) for r in rows], count=total)


def audit_event(tenant: str, actor: str, action: str, resource_id: str | None,
                detail: dict[str, Any] | None = None) -> models.AuditEvent:
    """One audit event row, stamped now, for a caller that adds it to its own write
    transaction (so the event commits with what it records, in one round trip)."""
    return models.AuditEvent(at=_now(), tenant=tenant, actor=actor, action=action, resource_id=resource_id,
                             detail=detail)
