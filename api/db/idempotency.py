"""The ``idempotency_keys`` table: claims of ``Idempotency-Key`` values and their stored
responses.

A request with a key first *claims* it (:func:`claim_key`): a row (tenant, key) with the
request's digest, a claim token and no response yet. The table's primary key makes the
claim exclusive across replicas: of two concurrent first claims one insert does nothing
and that request reads the other's row. When the request ends its response is stored on the
row, but only while the row still carries the request's own claim token
(:func:`store_response`; the step's group commit runs the same update in the step's
transaction: :func:`store_response_core`), so a request whose claim lapsed and was
taken over can never store over its successor. A request that ends in an error
releases its claim (:func:`release_key`). Rows past ``expires_at`` are deleted by
:func:`delete_expired` and count as absent before that.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Table, delete, select, update
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..errors import IdempotencyKeyInFlight, ServiceUnavailable
from .database import Database
from .models import IdempotencyKey, table


@dataclass(frozen=True)
class KeyClaim:
    """A request's hold on a key: ``token`` is what its response is stored under."""

    tenant: str
    key: str
    token: str


@dataclass(frozen=True)
class StoredKey:
    """A key's row as another request found it."""

    digest: str
    """SHA-256 (hex) of the request that claimed it."""
    status: int | None
    """The stored response's HTTP status; None while that request is in flight."""
    body: bytes | None
    """The stored response's JSON body."""


def claim_key(db: Database, tenant: str, key: str, digest: str, token: str, now: datetime,
              ttl_s: float, lease_s: float) -> StoredKey | None:
    """Claim ``key`` of ``tenant`` for the request of ``digest`` under ``token``: None when
    the claim is this request's (a new row; or the key's row had expired; or its request
    was still in flight ``lease_s`` seconds after claiming it, so it is taken over), else
    the row as found (the caller compares the digest and replays or refuses). The row
    expires ``ttl_s`` seconds after ``now``. One transaction: an insert that does nothing
    when the key exists (the primary key decides between concurrent claims), then, only
    then, a read of the existing row and a takeover conditional on its claim token.
    Raises ServiceUnavailable (database)."""
    keys = table(IdempotencyKey)
    fresh = {"digest": digest, "claim": token, "status": None, "body": None, "claimed_at": now,
             "expires_at": now + timedelta(seconds=ttl_s)}
    with db.write_connection() as conn:
        for _ in range(3):
            inserted = conn.execute(_insert_new(conn.dialect.name, keys).values(tenant=tenant, key=key, **fresh)
                                    .returning(keys.c.claim)).first()
            if inserted is not None:
                return None
            found = conn.execute(select(keys.c.digest, keys.c.claim, keys.c.status, keys.c.body, keys.c.claimed_at,
                                        keys.c.expires_at).where(keys.c.tenant == tenant, keys.c.key == key)).first()
            if found is None:  # deleted (expired, released) since the insert: insert again
                continue
            lapsed = found.status is None and _aware(found.claimed_at) + timedelta(seconds=lease_s) <= now
            if not (_aware(found.expires_at) <= now or lapsed):
                return StoredKey(found.digest, found.status, found.body)
            taken = conn.execute(update(keys).where(keys.c.tenant == tenant, keys.c.key == key,
                                                    keys.c.claim == found.claim).values(**fresh))
            if taken.rowcount == 1:
                return None
    raise ServiceUnavailable("the idempotency key changed hands during the claim; retry", retry_after=1)


def _insert_new(dialect: str, keys: Table) -> SqliteInsert | PgInsert:
    """``INSERT`` of a key's row that does nothing when (tenant, key) exists."""
    if dialect == "sqlite":
        return sqlite_insert(keys).on_conflict_do_nothing(index_elements=["tenant", "key"])
    if dialect == "postgresql":
        return pg_insert(keys).on_conflict_do_nothing(index_elements=["tenant", "key"])
    raise NotImplementedError(f"idempotency keys on {dialect}")  # pragma: no cover - SQLite and PostgreSQL only


def store_response_core(conn: Connection, tenant: str, key: str, token: str, status: int, body: bytes) -> None:
    """Store a response on ``key``'s row in ``conn``'s transaction, if ``token`` still
    holds the key. Raises IdempotencyKeyInFlight when it does not (the claim lapsed and
    another request took the key over): the caller's transaction must then roll back."""
    keys = table(IdempotencyKey)
    done = conn.execute(update(keys).where(keys.c.tenant == tenant, keys.c.key == key, keys.c.claim == token)
                        .values(status=status, body=body))
    if done.rowcount != 1:
        raise IdempotencyKeyInFlight("the idempotency key was taken over by a retry while this request ran "
                                     "(its claim lapsed); nothing was committed", retry_after=1)


def store_response(db: Database, tenant: str, key: str, token: str, status: int, body: bytes) -> None:
    """:func:`store_response_core` in a transaction of its own. Raises
    IdempotencyKeyInFlight, ServiceUnavailable (database)."""
    with db.write_connection() as conn:
        store_response_core(conn, tenant, key, token, status, body)


def release_key(db: Database, tenant: str, key: str, token: str) -> None:
    """Forget ``key``'s claim by ``token`` if no response was stored (a request that ended
    in an error: a retry runs again). Raises ServiceUnavailable (database)."""
    keys = table(IdempotencyKey)
    with db.write_connection() as conn:
        conn.execute(delete(keys).where(keys.c.tenant == tenant, keys.c.key == key, keys.c.claim == token,
                                        keys.c.status.is_(None)))


def delete_expired(db: Database, now: datetime) -> int:
    """Delete the keys whose ``expires_at`` is at or before ``now``; returns how many (a
    write only when there are some: :meth:`Database.delete_found`)."""
    keys = table(IdempotencyKey)
    return db.delete_found(keys, keys.c.expires_at <= now)


def read_key(db: Database, tenant: str, key: str) -> StoredKey | None:
    """``key``'s row (expired or not), or None."""
    with db.read() as session:
        row = session.execute(select(IdempotencyKey.digest, IdempotencyKey.status, IdempotencyKey.body)
                              .where(IdempotencyKey.tenant == tenant, IdempotencyKey.key == key)).first()
    return StoredKey(row.digest, row.status, row.body) if row is not None else None


def _aware(moment: datetime) -> datetime:
    """``moment`` with UTC attached when the database gave it without a zone (SQLite)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
