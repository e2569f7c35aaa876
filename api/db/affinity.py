"""Env -> sandbox host affinity in the control database (table ``env_hosts``), for a
multi-host executor (the Ray backend's ``Affinity``): any API replica sharing the database
finds the host an env's live session is on."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, func, select

from . import models
from .database import Database

EnvHost = models.EnvHost


class DbAffinity:
    """``get``/``put`` of an env's host (the executor's ``Affinity`` protocol, structurally).
    Raises ServiceUnavailable when the database fails."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, session_id: str) -> str | None:
        """The host recorded for env ``session_id``, or None."""
        with self.db.read() as db:
            return db.scalar(select(EnvHost.host).where(EnvHost.env_id == session_id))

    def put(self, session_id: str, host: str) -> None:
        """Record (or move) env ``session_id`` on ``host`` (one row per env)."""
        with self.db.write() as db:
            row = db.get(EnvHost, session_id)
            if row is None:
                db.add(EnvHost(env_id=session_id, host=host, placed_at=datetime.now(UTC)))
            elif row.host != host:
                row.host, row.placed_at = host, datetime.now(UTC)

    def drop(self, session_id: str) -> None:
        """Forget env ``session_id``'s placement (the env was deleted)."""
        with self.db.write() as db:
            db.execute(delete(EnvHost).where(EnvHost.env_id == session_id))

    def counts(self) -> dict[str, int]:
        """Envs recorded per host."""
        with self.db.read() as db:
            return {host: int(n) for host, n in db.execute(
                select(EnvHost.host, func.count()).group_by(EnvHost.host)).all()}
