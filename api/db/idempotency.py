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

A step claims its key later, in its own transaction (a *deferred* claim,
:class:`DeferredClaim`): before the step runs, the key's row is only read
(:func:`find_key`); the step's transaction then inserts the row with the response at once
(:func:`claim_with_response_core`), under the same primary key and the same takeover rules
as :func:`claim_key`. A row found there (another request with the key committed, or
claimed it, since the read) fails the step's transaction, so a step is still never
committed twice under one key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, delete, select, update
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import ReturningInsert

from ..errors import IdempotencyKeyInFlight, ServiceUnavailable
from .database import Database
from .models import IdempotencyKey, table


@dataclass(frozen=True)
class DeferredClaim:
    """What a deferred claim's row is written with (module docstring)."""

    digest: str
    """SHA-256 (hex) of the request."""
    ttl_s: float
    """The row expires this many seconds after the step's transaction (``idempotency_key_ttl_s``)."""
    lease_s: float
    """An in-flight claim older than this many seconds is taken over (``idempotency_lease_s``)."""


@dataclass(frozen=True)
class KeyClaim:
    """A request's hold on a key: ``token`` is what its response is stored under.
    ``deferred`` set: no row holds the key yet; the step's transaction claims it and
    stores the response in one go (:func:`claim_with_response_core`)."""

    tenant: str
    key: str
    token: str
    deferred: DeferredClaim | None = None


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
    expires ``ttl_s`` seconds after ``now``. One transaction (:func:`_claim_in`).
    Raises ServiceUnavailable (database)."""
    fresh: dict[str, object] = {"digest": digest, "claim": token, "status": None, "body": None,
                                "claimed_at": now, "expires_at": now + timedelta(seconds=ttl_s)}
    with db.write_connection() as conn:
        return _claim_in(conn, tenant, key, fresh, now, lease_s)


def claim_with_response_core(conn: Connection, claim: KeyClaim, now: datetime, status: int, body: bytes) -> None:
    """Take ``claim``'s key (a deferred claim: ``claim.deferred`` is set) and store the
    response ``status``/``body`` on it in ``conn``'s transaction, as :func:`claim_key`
    takes a key (a new row, or an expired or lapsed one taken over). Raises
    IdempotencyKeyInFlight when another request holds the key (it committed, or claimed
    the key, after this request read it): the caller's transaction must then roll back.
    Raises ServiceUnavailable (the row changed hands during the claim)."""
    terms = claim.deferred
    assert terms is not None, "a claim whose row exists stores with store_response_core"
    fresh: dict[str, object] = {"digest": terms.digest, "claim": claim.token, "status": status, "body": body,
                                "claimed_at": now, "expires_at": now + timedelta(seconds=terms.ttl_s)}
    if _claim_in(conn, claim.tenant, claim.key, fresh, now, terms.lease_s) is not None:
        raise IdempotencyKeyInFlight("another request with this idempotency key committed or started while this "
                                     "one ran; nothing was committed", retry_after=1)


def _claim_in(conn: Connection, tenant: str, key: str, fresh: dict[str, object], now: datetime,
              lease_s: float) -> StoredKey | None:
    """The claim in ``conn``'s transaction: an insert of ``fresh`` that does nothing when
    the key exists (the primary key decides between concurrent claims), then, only then,
    a read of the existing row and a takeover conditional on its claim token when it no
    longer holds the key (:func:`_holds`). None when the row is now ``fresh``, else the row
    found. Raises ServiceUnavailable (the row changed hands three times)."""
    keys = table(IdempotencyKey)
    row = {"tenant": tenant, "key": key, **fresh}
    for _ in range(3):
        if conn.execute(_insert_new(conn.dialect.name), row).first() is not None:
            return None
        found = conn.execute(_KEY_ROW, {"tenant": tenant, "key": key}).first()
        if found is None:  # deleted (expired, released) since the insert: insert again
            continue
        if _holds(found.status, found.claimed_at, found.expires_at, now, lease_s):
            return StoredKey(found.digest, found.status, found.body)
        taken = conn.execute(update(keys).where(keys.c.tenant == tenant, keys.c.key == key,
                                                keys.c.claim == found.claim).values(**fresh))
        if taken.rowcount == 1:
            return None
    raise ServiceUnavailable("the idempotency key changed hands during the claim; retry", retry_after=1)


_KEYS = table(IdempotencyKey)
_KEY_ROW = select(_KEYS.c.digest, _KEYS.c.claim, _KEYS.c.status, _KEYS.c.body, _KEYS.c.claimed_at,
                  _KEYS.c.expires_at).where(_KEYS.c.tenant == bindparam("tenant"), _KEYS.c.key == bindparam("key"))
"""The row of ``(:tenant, :key)`` as a claim (:func:`_claim_in`) and :func:`find_key` read
it (built once)."""


def _holds(status: int | None, claimed_at: datetime, expires_at: datetime, now: datetime, lease_s: float) -> bool:
    """Whether a key's row still holds the key at ``now``: not expired, and either its
    response stored or its claim younger than ``lease_s`` seconds."""
    lapsed = status is None and _aware(claimed_at) + timedelta(seconds=lease_s) <= now
    return not (_aware(expires_at) <= now or lapsed)


_INSERTS_NEW: dict[str, ReturningInsert[Any]] = {}
""":func:`_insert_new`'s statement per dialect, built once (its construction and cache key
cost more than the insert itself)."""


def _insert_new(dialect: str) -> ReturningInsert[Any]:
    """``INSERT`` of a key's row (every column a bind parameter of its name) that does
    nothing when (tenant, key) exists: it returns a row when it inserted."""
    built = _INSERTS_NEW.get(dialect)
    if built is None:
        keys = table(IdempotencyKey)
        values: dict[str, Any] = {column.name: bindparam(column.name) for column in keys.columns}
        statement: SqliteInsert | PgInsert
        if dialect == "sqlite":
            statement = sqlite_insert(keys)
        elif dialect == "postgresql":
            statement = pg_insert(keys)
        else:  # pragma: no cover - SQLite and PostgreSQL only
            raise NotImplementedError(f"idempotency keys on {dialect}")
        built = _INSERTS_NEW[dialect] = statement.values(values).on_conflict_do_nothing(
            index_elements=["tenant", "key"]).returning(keys.c.claim)
    return built


_STORE_RESPONSE = update(_KEYS).where(
    _KEYS.c.tenant == bindparam("of_tenant"), _KEYS.c.key == bindparam("of_key"),
    _KEYS.c.claim == bindparam("of_claim")).values(status=bindparam("to_status"), body=bindparam("to_body"))
"""The update that stores a response on a key's row while its claim token holds it (built
once: built per call, its construction and compilation cost 0.4 ms of CPU, more than the
update itself)."""


def store_response_core(conn: Connection, tenant: str, key: str, token: str, status: int, body: bytes) -> None:
    """Store a response on ``key``'s row in ``conn``'s transaction, if ``token`` still
    holds the key. Raises IdempotencyKeyInFlight when it does not (the claim lapsed and
    another request took the key over): the caller's transaction must then roll back."""
    done = conn.execute(_STORE_RESPONSE, {"of_tenant": tenant, "of_key": key, "of_claim": token,
                                          "to_status": status, "to_body": body})
    if done.rowcount != 1:
        raise IdempotencyKeyInFlight("the idempotency key was taken over by a retry while this request ran "
                                     "(its claim lapsed); nothing was committed", retry_after=1)


class ReplyOnKey:
    """Where a request's reply goes when the transaction that commits the request also
    stores it on the request's key: ``claim`` (a claim whose row exists, from
    :func:`claim_key`) and the reply's HTTP ``status``. The request's own write calls
    :meth:`store` with the reply's bytes before it commits, so the request is never
    committed without its reply on the key, nor the reply without the request; the
    bytes stored are kept in :attr:`body` for the caller to send."""

    def __init__(self, claim: KeyClaim, status: int) -> None:
        self.claim = claim
        self.status = status
        self.body: bytes | None = None
        """The reply stored by :meth:`store` (None before; set even when the
        transaction then rolls back, which the caller learns by its exception)."""

    def store(self, conn: Connection, body: bytes) -> None:
        """:func:`store_response_core` of ``body`` in ``conn``'s transaction. Raises
        IdempotencyKeyInFlight (the claim lapsed and a retry took the key over): the
        caller's transaction must then roll back."""
        claim = self.claim
        store_response_core(conn, claim.tenant, claim.key, claim.token, self.status, body)
        self.body = body


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


_KEY_EXISTS = "SELECT 1 FROM idempotency_keys WHERE tenant = ? AND key = ?"
"""Whether a key has a row, as SQLite's driver runs it (:func:`find_key`)."""


def find_key(db: Database, tenant: str, key: str, now: datetime, lease_s: float) -> StoredKey | None:
    """``key``'s row when it holds the key at ``now`` (not expired; its response stored or
    its claim younger than ``lease_s`` seconds), else None: what a deferred claim reads
    before its step runs (a read, no write)."""
    with db.read_connection() as conn:
        if conn.dialect.name == "sqlite":  # most keys are new: whether a row exists, straight from the driver
            driver = conn.connection.driver_connection
            if driver is not None and driver.execute(_KEY_EXISTS, (tenant, key)).fetchone() is None:
                return None
        row = conn.execute(_KEY_ROW, {"tenant": tenant, "key": key}).first()
    if row is None or not _holds(row.status, row.claimed_at, row.expires_at, now, lease_s):
        return None
    return StoredKey(row.digest, row.status, row.body)


def _aware(moment: datetime) -> datetime:
    """``moment`` with UTC attached when the database gave it without a zone (SQLite)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
