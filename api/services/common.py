"""Helpers every service uses: time, ids, tenant-scoped lookups, text from sandboxes."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..errors import NotFound


def utcnow() -> datetime:
    """The current time, timezone-aware (UTC); what every stored timestamp uses."""
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """``moment`` with UTC attached when the database returned it naive (SQLite)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def new_id(prefix: str) -> str:
    """A random id such as ``env_3f9c...`` (96 bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


Owned = TypeVar("Owned", models.Environment, models.Env, models.Scenario, models.EvaluationJob)


def owned(db: DbSession, model: type[Owned], object_id: str, tenant: str, what: str) -> Owned:
    """The ``model`` row ``object_id`` if ``tenant`` owns it. Raises NotFound, with the
    same message for an unknown id and another tenant's (multi-tenancy: ids never leak)."""
    return owned_row(db.get(model, object_id), object_id, tenant, what)


def owned_row(row: Owned | None, object_id: str, tenant: str, what: str) -> Owned:
    """``row`` (the ``what`` named ``object_id``, None when there is none) if ``tenant``
    owns it: :func:`owned`'s check, for a row read another way. Raises NotFound, the same
    for a missing row and another tenant's."""
    if row is None or row.tenant != tenant:
        raise NotFound(f"{what} {object_id[:64]!r} not found")
    return row


def clean_text(value: str) -> str:
    """Text from a sandbox made safe for JSON/UTF-8 (lone surrogates replaced)."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
