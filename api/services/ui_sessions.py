"""The web viewer's sign-in sessions, kept in the control database (``ui_sessions``) so
every API replica serves the same session.

* Signing in checks the key exactly as the API does (:meth:`TenantService.authenticate`
  on ``Bearer <key>``; the operator key through :meth:`TenantService.is_operator`), then
  stores a row holding the SHA-256 of a new random session token (256 bits), the tenant
  and the key *id* (never the key), a random form token (CSRF) and the expiry.
* The browser keeps the token in a cookie; each request looks its hash up
  (:meth:`UiSessions.lookup`). A session is dead when it expired, when the key that
  opened it was revoked or expired, when its tenant is gone, or (operator sessions) when
  the server no longer has an operator key: its row is then deleted.
* Signing out deletes the row; each sign-in and the API's janitor (every
  ``janitor_interval_s``) delete the rows that expired (:meth:`UiSessions.expire`, an
  indexed delete), so abandoned sessions do not pile up.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete

from ..db import models
from ..db.database import Database
from ..errors import Forbidden, Unauthorized
from .common import aware, utcnow
from .quotas import TenantContext
from .tenants import OPERATOR, TenantService

SESSION_TTL_S = 8 * 3600.0
"""How long a viewer session lasts after sign-in, seconds (then the key is asked again)."""


def token_hash(token: str) -> str:
    """Hex SHA-256 of a session token (what ``ui_sessions.token_hash`` stores)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class UiSession:
    """A live viewer session: who signed in and the form token its forms carry."""

    tenant: str | None
    """The tenant; None for the operator."""
    actor: str
    """The API key id, or ``operator``."""
    csrf: str
    """The form token (hex, 64 characters) every POST of this session must carry."""
    context: TenantContext | None
    """The tenant's context for the env verbs (None for the operator)."""

    @property
    def operator(self) -> bool:
        """True for the operator's session (tenants and quotas, read-only)."""
        return self.tenant is None


class UiSessions:
    """Creates, finds and ends viewer sessions (see the module docstring)."""

    def __init__(self, db: Database, tenants: TenantService, ttl_s: float = SESSION_TTL_S) -> None:
        self.db = db
        self.tenants = tenants
        self.ttl_s = ttl_s

    def sign_in(self, key: str) -> tuple[str, UiSession]:
        """A new session for API key ``key``: ``(token, session)``; the token goes in the
        cookie and is not kept anywhere. Raises Unauthorized (empty, unknown, revoked or
        expired key, or one over 256 characters)."""
        key = key.strip()
        if key and self.tenants.is_operator(key):
            tenant, actor, context = None, OPERATOR, None
        else:
            try:
                context = self.tenants.authenticate(f"Bearer {key}")
            except Forbidden:  # the operator key without an operator configured cannot reach here
                raise Unauthorized("invalid API key") from None
            tenant, actor = context.tenant, context.actor
        token, csrf, now = secrets.token_urlsafe(32), secrets.token_hex(32), utcnow()
        with self.db.write() as db:
            db.add(models.UiSession(token_hash=token_hash(token), tenant=tenant, actor=actor, csrf=csrf,
                                    created_at=now, expires_at=now + timedelta(seconds=self.ttl_s)))
        self.expire()
        return token, UiSession(tenant=tenant, actor=actor, csrf=csrf, context=context)

    def lookup(self, token: str | None) -> UiSession | None:
        """The live session of cookie value ``token``, or None (no token, unknown, expired,
        or its key revoked/expired or its tenant gone: such a row is deleted)."""
        if not token or len(token) > 128:
            return None
        digest = token_hash(token)
        with self.db.read() as db:
            row = db.get(models.UiSession, digest)
            key = db.get(models.ApiKey, row.actor) if row is not None and row.tenant is not None else None
        if row is None:
            return None
        now = utcnow()
        alive = aware(row.expires_at) > now
        if row.tenant is None:
            alive = alive and row.actor == OPERATOR and self.tenants.settings.operator_key is not None
        else:
            alive = alive and key is not None and key.tenant == row.tenant and key.revoked_at is None \
                and (key.expires_at is None or aware(key.expires_at) > now)
        if not alive:
            self.end(token)
            return None
        context = None if row.tenant is None else TenantContext(
            tenant=row.tenant, actor=row.actor, quotas=self.tenants.quotas(row.tenant))
        return UiSession(tenant=row.tenant, actor=row.actor, csrf=row.csrf, context=context)

    def end(self, token: str) -> None:
        """Delete the session of ``token`` (sign-out; nothing when there is none)."""
        with self.db.write() as db:
            db.execute(delete(models.UiSession).where(models.UiSession.token_hash == token_hash(token)))

    def expire(self) -> int:
        """Delete every expired session row (each sign-in and the janitor call it); returns
        how many (a write only when there are some: :meth:`Database.delete_found`)."""
        sessions = models.table(models.UiSession)
        return self.db.delete_found(sessions, sessions.c.expires_at <= utcnow())
