"""Exactly-once claiming of evaluation episodes across API replicas sharing one database.

Each API process is a *replica* (``replicas`` row, random id) whose runner heart-beats
every ``HEARTBEAT_S`` seconds. Claiming an episode is one transaction::

    SELECT index, attempt FROM evaluation_episodes
     WHERE evaluation_id = :job AND status = 'pending'
     ORDER BY index LIMIT 1 FOR UPDATE SKIP LOCKED      -- PostgreSQL; SQLite: one writer
    UPDATE ... SET status='running', attempt=attempt+1, claimed_by=:replica
     WHERE ... AND status='pending' AND attempt=:attempt

so two replicas polling the same job never wait on each other's row (``SKIP LOCKED``
moves the second one to the next pending episode) and never both run one episode (the
guarded UPDATE is a compare-and-set on ``(status, attempt)``; SQLite serializes writers
and ignores ``FOR UPDATE``).

Recovery: an episode left ``running`` by a replica that is gone goes back to ``pending``.
On SQLite (one API process per database file, as documented for the quota counters)
every episode not claimed by this replica is reset at start-up. On other
databases only episodes of replicas whose heartbeat is older than ``LEASE_S`` seconds
(or whose row is missing: a clean shutdown deletes it) are, and live replicas check for
dead ones every ``HEARTBEAT_S`` seconds.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, or_, select, update

from ..db.database import Database
from ..db.models import EvaluationEpisode, EvaluationJob, Replica
from ..services.common import utcnow
from ..settings import LEASE_S

HEARTBEAT_S = 5.0
"""Seconds between a replica's heartbeats."""


class Replicas:
    """This process's replica row and the claim/recovery queries (module docstring)."""

    def __init__(self, db: Database, replica_id: str | None = None) -> None:
        self.db = db
        self.id = replica_id or f"rep_{secrets.token_hex(8)}"
        """``rep_<16 hex>``: this process's identity in ``claimed_by``."""

    def register(self) -> None:
        """Insert (or refresh) this replica's row."""
        now = utcnow()
        with self.db.write() as db:
            row = db.get(Replica, self.id)
            if row is None:
                db.add(Replica(id=self.id, started_at=now, heartbeat_at=now))
            else:
                row.heartbeat_at = now

    def heartbeat(self) -> None:
        """Refresh ``heartbeat_at`` (re-inserting the row if another replica removed it)."""
        with self.db.write() as db:
            done = db.execute(update(Replica).where(Replica.id == self.id).values(heartbeat_at=utcnow()))
            if cast(CursorResult[Any], done).rowcount == 1:
                return
        self.register()

    def unregister(self) -> None:
        """Delete this replica's row (clean shutdown: what it left running is recoverable at once)."""
        with self.db.write() as db:
            db.execute(delete(Replica).where(Replica.id == self.id))

    def claim(self, job_id: str) -> tuple[int, int] | None:
        """Claim the job's first pending episode that no other transaction holds.
        Returns ``(index, attempt)`` of the claim, or None when nothing is claimable now."""
        with self.db.write() as db:
            first = (select(EvaluationEpisode.index, EvaluationEpisode.attempt)
                     .where(EvaluationEpisode.evaluation_id == job_id, EvaluationEpisode.status == "pending")
                     .order_by(EvaluationEpisode.index).limit(1).with_for_update(skip_locked=True))
            row = db.execute(first).first()
            if row is None:
                return None
            index, previous = row
            claim = (update(EvaluationEpisode)
                     .where(EvaluationEpisode.evaluation_id == job_id, EvaluationEpisode.index == index,
                            EvaluationEpisode.status == "pending", EvaluationEpisode.attempt == previous)
                     .values(status="running", attempt=previous + 1, started_at=utcnow(), env_id=None,
                             claimed_by=self.id))
            claimed = db.execute(claim)
            if cast(CursorResult[Any], claimed).rowcount != 1:
                return None
            db.execute(update(EvaluationJob).where(EvaluationJob.id == job_id, EvaluationJob.status == "queued")
                       .values(status="running"))
        return index, previous + 1

    def orphans(self, startup: bool) -> list[tuple[str, int, int, str | None, str, str, str]]:
        """Running episodes whose replica is gone: ``(job_id, index, attempt, env_id, tenant,
        job_status, created_by)``. ``startup`` on SQLite: every running episode not claimed
        by this replica."""
        query = (select(EvaluationEpisode.evaluation_id, EvaluationEpisode.index, EvaluationEpisode.attempt,
                        EvaluationEpisode.env_id, EvaluationJob.tenant, EvaluationJob.status,
                        EvaluationJob.created_by)
                 .join(EvaluationJob, EvaluationJob.id == EvaluationEpisode.evaluation_id)
                 .where(EvaluationEpisode.status == "running"))
        if self.db.dialect == "sqlite":
            if not startup:
                return []
            query = query.where(or_(EvaluationEpisode.claimed_by.is_(None),
                                    EvaluationEpisode.claimed_by != self.id))
        else:
            alive = select(Replica.id).where(Replica.heartbeat_at >= utcnow() - timedelta(seconds=LEASE_S))
            query = query.where(or_(EvaluationEpisode.claimed_by.is_(None),
                                    EvaluationEpisode.claimed_by.not_in(alive)))
        with self.db.read() as db:
            return [tuple(r) for r in db.execute(query).all()]  # type: ignore[misc]

    def forget_dead(self) -> None:
        """Delete rows of replicas silent for 10 x ``LEASE_S`` (their episodes were reset)."""
        with self.db.write() as db:
            db.execute(delete(Replica).where(Replica.heartbeat_at < utcnow() - timedelta(seconds=10 * LEASE_S)))
