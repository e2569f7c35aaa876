"""Env -> sandbox host affinity in the control database (table ``env_hosts``), for a
multi-host executor (the Ray backend's ``Affinity``): any API replica sharing the database
finds the host an env's live session is on. Hosts being drained (table ``host_drains``)
are recorded here too, so every replica's executor stops placing envs on them, with the
replica running each drain (``owner``: a live replica takes over a dead owner's drain);
an undrain deletes the record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, or_, select, text, update

from . import models
from .database import Database

EnvHost = models.EnvHost
HostDrain = models.HostDrain
Replica = models.Replica


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

    # -- drains ---------------------------------------------------------------------------------
    def drains(self) -> dict[str, str]:
        """Host -> ``draining`` / ``drained`` for every recorded drain."""
        with self.db.read() as db:
            return {host: status for host, status in db.execute(select(HostDrain.host, HostDrain.status)).all()}

    def drain_record(self, host: str) -> HostDrain | None:
        """The drain row of ``host``, if it was ever drained."""
        with self.db.read() as db:
            return db.get(HostDrain, host)

    def start_drain(self, host: str, live_hosts: set[str], allow_last: bool,
                    owner: str | None = None) -> tuple[HostDrain | None, bool]:
        """Record ``host`` as draining unless it already is (idempotent), run by replica
        ``owner``. Refused (``(None, False)``) when no other host of ``live_hosts`` would be
        left to place envs on and ``allow_last`` is False. The check and the insert are one
        transaction, serialized across replicas (``LOCK TABLE`` on PostgreSQL; SQLite has
        one writer), so two concurrent drains of the last two hosts cannot both pass.
        Returns ``(row, created_now)``."""
        with self.db.write() as db:
            if self.db.dialect == "postgresql":
                db.execute(text("LOCK TABLE host_drains IN SHARE ROW EXCLUSIVE MODE"))
            row = db.get(HostDrain, host)
            if row is not None:
                return row, False
            drained = set(db.scalars(select(HostDrain.host)).all())
            if not allow_last and not (live_hosts - drained - {host}):
                return None, False
            row = HostDrain(host=host, status="draining", started_at=datetime.now(UTC), envs_moved=0, owner=owner)
            db.add(row)
            return row, True

    def envs_on(self, host: str) -> list[str]:
        """Env ids whose recorded host is ``host``."""
        with self.db.read() as db:
            return list(db.scalars(select(EnvHost.env_id).where(EnvHost.host == host)).all())

    def move(self, session_id: str, from_host: str, to_host: str | None) -> bool:
        """Move env ``session_id`` from ``from_host`` to ``to_host`` (None: forget its
        placement) if it is still recorded on ``from_host`` (compare-and-set: a replica
        may have placed it meanwhile). True if moved."""
        with self.db.write() as db:
            where = (EnvHost.env_id == session_id, EnvHost.host == from_host)
            result = db.execute(delete(EnvHost).where(*where)) if to_host is None else db.execute(
                update(EnvHost).where(*where).values(host=to_host, placed_at=datetime.now(UTC)))
            return cast(CursorResult[Any], result).rowcount == 1

    def finish_drain(self, host: str, moved: int) -> bool:
        """Mark ``host``'s drain done (``drained``, ``finished_at`` now), adding ``moved``
        to its count of moved envs. False (nothing written) when the drain is no longer
        recorded: an operator undrained the host meanwhile."""
        with self.db.write() as db:
            row = db.get(HostDrain, host)
            if row is None:
                return False
            row.envs_moved += moved
            if row.status != "drained":
                row.status, row.finished_at = "drained", datetime.now(UTC)
            return True

    def orphaned_drains(self, lease_s: float) -> list[tuple[str, str | None]]:
        """``(host, owner)`` of every ``draining`` row whose owner replica is dead: its
        ``replicas`` row is missing or its heartbeat is older than ``lease_s`` seconds (the
        evaluation runner's rule for a dead replica's episodes, ``settings.LEASE_S``), or it
        has no owner (recorded before migration 0008)."""
        alive = select(Replica.id).where(Replica.heartbeat_at >= datetime.now(UTC) - timedelta(seconds=lease_s))
        with self.db.read() as db:
            rows = db.execute(select(HostDrain.host, HostDrain.owner).where(
                HostDrain.status == "draining", or_(HostDrain.owner.is_(None), HostDrain.owner.not_in(alive)))).all()
        return [(host, owner) for host, owner in rows]

    def claim_drain(self, host: str, old_owner: str | None, new_owner: str | None) -> bool:
        """Make ``new_owner`` (None: nobody, so any live replica claims it next) the
        replica running ``host``'s drain if it is still
        ``draining`` and still owned by ``old_owner`` (None: no owner): one ``UPDATE ...
        WHERE owner = :old_owner``, a compare-and-set, so of replicas racing to take over
        the same dead owner's drain exactly one gets True (PostgreSQL re-checks the WHERE
        on the row another transaction just updated; SQLite has one writer)."""
        same = HostDrain.owner.is_(None) if old_owner is None else HostDrain.owner == old_owner
        with self.db.write() as db:
            result = db.execute(update(HostDrain).where(HostDrain.host == host, HostDrain.status == "draining", same)
                                .values(owner=new_owner))
            return cast(CursorResult[Any], result).rowcount == 1

    def undrain(self, host: str, status: str) -> bool:
        """Delete ``host``'s drain record if its status is still ``status`` (compare-and-
        delete: a drain finishing meanwhile turns ``draining`` into ``drained``, which the
        caller must then handle as such). True if deleted: every replica's executor places
        on the host again at its next refresh, and a drain thread stops at its next pass."""
        with self.db.write() as db:
            result = db.execute(delete(HostDrain).where(HostDrain.host == host, HostDrain.status == status))
            return cast(CursorResult[Any], result).rowcount == 1

