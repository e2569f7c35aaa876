"""A batch of steps written in one transaction: the group commit's writer.

:func:`write_steps` writes what a batch of steps (:class:`StepWrite`, one per step of any
env) needs: the union of their new state blobs (identical blobs once), their ``steps``
rows and their envs' new heads (one ``executemany`` each; a head is moved only from the
step before, else :class:`~sandpit.api.errors.HeadMoved` fails the transaction: see
:func:`check_moved`), then each episode's changes
the attempt fences of steps that carry an attempt token
(:func:`~sandpit.api.db.attempts.fence_core`), and the stored responses of steps that
carry an ``Idempotency-Key``
(:func:`~sandpit.api.db.idempotency.store_response_core`; a deferred claim is taken
with its response there: :func:`~sandpit.api.db.idempotency.claim_with_response_core`; in
the same transaction, so a step is never committed without its key's response nor a
response without its step).
On SQLite the first three, and the row of a deferred claim whose key has none, go straight
to the driver connection (:class:`_SqliteSteps`), on other databases through SQLAlchemy
Core (:func:`write_steps_core`, the reference the driver path is tested against:
``tests/unit/api/db/test_step_writes.py``). The caller's
transaction (:class:`~sandpit.api.db.group_commit.GroupCommit`) commits them.
"""

from __future__ import annotations

import sqlite3
import weakref
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, bindparam
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..errors import HeadMoved, ServiceUnavailable
from .attempts import fence_core
from .database import CoreSession
from .idempotency import KeyClaim, claim_with_response_core, store_response_core
from .models import Env, Episode, IdempotencyKey, Step, table
from .store import PendingBlobs

MOVE_HEAD = table(Env).update().where(
    table(Env).c.id == bindparam("env"), table(Env).c.episode == bindparam("at_episode"),
    table(Env).c.step == bindparam("previous")).values(step=bindparam("head"), last_used_at=bindparam("used"))
"""Move an env's head from the step before (one ``executemany`` for a batch of steps);
an env whose head is elsewhere is not moved (:func:`check_moved`)."""


def check_moved(moved: int, writes: list[StepWrite]) -> None:
    """Raise HeadMoved unless all ``writes`` moved their env's head (``moved`` rows): a
    step is only committed on top of the head it started from, so a replica whose live
    view is stale (another replica or a reset moved the head since) never records a step
    into an old episode or a step number that exists."""
    if moved != len(writes):
        stale = writes[0].env_id if len(writes) == 1 else f"{len(writes) - moved} of {len(writes)} envs"
        raise HeadMoved(f"the head of {stale} moved since the step started; nothing was committed", retry_after=1)


@dataclass
class StepWrite:
    """One step's rows, as the group commit writes them (:func:`write_steps`)."""

    env_id: str
    episode: int
    row: dict[str, Any]
    """The ``steps`` row."""
    pending: PendingBlobs
    now: datetime
    episode_changes: dict[str, Any] = field(default_factory=dict)
    """Columns of the ``episodes`` row to update (user transcript, end of the episode)."""
    key: KeyClaim | None = None
    """The request's ``Idempotency-Key`` claim, when it has one: ``response`` is stored on it."""
    response: bytes = b""
    """The step's reply (JSON bytes of a 200) stored on ``key``."""
    attempt: str | None = None
    """The request's attempt token (``Sandpit-Attempt``), when it has one: the step commits
    only while it is the env's current one (:func:`~sandpit.api.db.attempts.fence_core`)."""


class _SqliteSteps:
    """The three statements of a step's write, run on SQLite's DB-API connection itself:
    prepared texts on the driver connection skip what SQLAlchemy Core does per
    ``execute`` (cache-key generation, compiled-statement look-up, result set-up), a
    large share of a step's server CPU. Values are converted by each column type's own
    ``bind_processor`` (JSON texts, SQLite's datetime strings), so the rows read back
    exactly as Core's. The connection is the one of the Core transaction, which commits
    it; a driver error is raised as SQLAlchemy's (``DBAPIError.instance``), which
    :meth:`Database.write_connection` turns into a 503."""

    def __init__(self, dialect: Any) -> None:
        compiled = table(Step).insert().compile(dialect=dialect)  # "INSERT INTO steps (...) VALUES (?, ...)"
        self.insert_steps = str(compiled)
        self.step_columns = list(compiled.positiontup or ())
        self.step_processors = [table(Step).c[name].type.dialect_impl(dialect).bind_processor(dialect)
                                for name in self.step_columns]
        self.used = table(Env).c.last_used_at.type.dialect_impl(dialect).bind_processor(dialect)
        self.insert_blobs = "INSERT INTO blobs (hash, data, size) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING"
        self.move_head = "UPDATE envs SET step = ?, last_used_at = ? WHERE id = ? AND episode = ? AND step = ?"
        self.insert_key = ("INSERT INTO idempotency_keys (tenant, key, digest, claim, status, body, claimed_at, "
                           "expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, key) DO NOTHING")
        self.key_time = table(IdempotencyKey).c.claimed_at.type.dialect_impl(dialect).bind_processor(dialect)

    def claimed(self, conn: Connection, write: StepWrite) -> bool:
        """Insert the row of ``write``'s deferred claim with the step's response when its
        key has no row; whether it did (False: a row exists, and
        :func:`~sandpit.api.db.idempotency.claim_with_response_core` decides)."""
        claim = write.key
        assert claim is not None and claim.deferred is not None
        driver = conn.connection.driver_connection
        if driver is None:  # pragma: no cover - a connection the pool invalidated
            raise ServiceUnavailable("database connection lost", retry_after=1)
        expires = write.now + timedelta(seconds=claim.deferred.ttl_s)
        at = self.key_time
        try:
            return bool(driver.execute(self.insert_key, (
                claim.tenant, claim.key, claim.deferred.digest, claim.token, 200, write.response,
                at(write.now) if at else write.now, at(expires) if at else expires)).rowcount == 1)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(self.insert_key, None, exc, sqlite3.Error) from exc

    def write(self, conn: Connection, blobs: PendingBlobs, writes: list[StepWrite]) -> None:
        """Move the heads (all from the step before, else HeadMoved), insert ``blobs``
        (those not stored yet) and the steps' rows."""
        driver = conn.connection.driver_connection
        if driver is None:  # pragma: no cover - a connection the pool invalidated
            raise ServiceUnavailable("database connection lost", retry_after=1)
        statement = self.move_head
        try:
            used = self.used
            moved = driver.executemany(statement, [(w.row["step"], used(w.now) if used else w.now, w.env_id,
                                                    w.episode, w.row["step"] - 1) for w in writes]).rowcount
            check_moved(moved, writes)
            statement = self.insert_blobs
            driver.executemany(statement, [(h, data, size) for h, (data, size) in blobs.blobs.items()])
            statement = self.insert_steps
            driver.executemany(statement, [self._row(write.row) for write in writes])
        except sqlite3.Error as exc:
            raise DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc

    def _row(self, row: dict[str, Any]) -> tuple[Any, ...]:
        values = []
        for name, process in zip(self.step_columns, self.step_processors, strict=True):
            value = row.get(name)
            values.append(process(value) if process is not None else value)
        return tuple(values)


def write_steps_core(conn: Connection, blobs: PendingBlobs, writes: list[StepWrite]) -> None:
    """:func:`write_steps`'s blobs, step rows and heads through SQLAlchemy Core (any
    database; the reference the SQLite driver path is tested against)."""
    moved = conn.execute(MOVE_HEAD, [{"env": w.env_id, "at_episode": w.episode, "previous": w.row["step"] - 1,
                                      "head": w.row["step"], "used": w.now} for w in writes]).rowcount
    check_moved(moved, writes)
    blobs.write(cast(Session, CoreSession(conn)))
    conn.execute(table(Step).insert(), [w.row for w in writes])


_SQLITE_WRITERS: weakref.WeakKeyDictionary[Any, _SqliteSteps] = weakref.WeakKeyDictionary()
"""One writer per SQLite dialect (an engine's), made on its first batch."""


def write_steps(conn: Connection, writes: list[StepWrite]) -> None:
    """Write a batch of steps into ``conn``'s transaction: their new blobs (one insert of
    the union: identical blobs once), step rows and env heads (one ``executemany``
    each), episode changes, idempotency keys' responses (a deferred claim's row with its
    response), attempt fences. The group commit commits it; IdempotencyKeyInFlight (a key
    whose claim was taken over, or that another request took since a deferred claim read
    it) and StaleAttempt (the env was resumed since) fail the transaction. On SQLite the
    first three and a new key's row go straight to the driver (:class:`_SqliteSteps`);
    elsewhere through SQLAlchemy Core."""
    blobs = writes[0].pending
    if len(writes) > 1:
        blobs = PendingBlobs()
        for write in writes:
            blobs.blobs.update(write.pending.blobs)
    writer = None
    if conn.dialect.name == "sqlite":
        writer = _SQLITE_WRITERS.get(conn.dialect)
        if writer is None:
            writer = _SQLITE_WRITERS[conn.dialect] = _SqliteSteps(conn.dialect)
        writer.write(conn, blobs, writes)
    else:
        write_steps_core(conn, blobs, writes)
    episodes = table(Episode)
    for write in writes:
        if write.episode_changes:
            conn.execute(episodes.update().where(episodes.c.env_id == write.env_id,
                                                 episodes.c.episode == write.episode).values(**write.episode_changes))
    for write in writes:
        if write.attempt is not None:
            fence_core(conn, write.env_id, write.attempt)
        if write.key is not None and write.key.deferred is not None:
            if writer is None or not writer.claimed(conn, write):
                claim_with_response_core(conn, write.key, write.now, 200, write.response)
        elif write.key is not None:
            store_response_core(conn, write.key.tenant, write.key.key, write.key.token, 200, write.response)
