"""The ``idempotency_keys`` table (``sandpit.api.db.idempotency``) on a real database: a
key is claimed once across two connections, a lapsed claim is taken over and can no
longer store its response, expired keys count as absent and are deleted. A deferred claim
(a step's) reads the row first and takes the key with its response in the caller's
transaction, under the same rules, and fails that transaction when the key is held."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from databases import opened
from sandpit.api.db.database import Database
from sandpit.api.db.idempotency import (
    DeferredClaim,
    KeyClaim,
    StoredKey,
    claim_key,
    claim_with_response_core,
    delete_expired,
    find_key,
    read_key,
    release_key,
    store_response,
)
from sandpit.api.errors import IdempotencyKeyInFlight

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def test_first_claim_wins_then_the_row_is_found(database: Database) -> None:
    assert claim_key(database, "t", "k", "d1", "token1", NOW, 60, 30) is None
    found = claim_key(database, "t", "k", "d2", "token2", NOW, 60, 30)
    assert found is not None and (found.digest, found.status, found.body) == ("d1", None, None)
    store_response(database, "t", "k", "token1", 201, b'{"id": "x"}')
    found = claim_key(database, "t", "k", "d1", "token3", NOW, 60, 30)
    assert found is not None and (found.status, found.body) == (201, b'{"id": "x"}')


def test_tenants_do_not_share_keys(database: Database) -> None:
    assert claim_key(database, "a", "k", "d", "t1", NOW, 60, 30) is None
    assert claim_key(database, "b", "k", "d", "t2", NOW, 60, 30) is None


def _eight_at_once_on_two_engines(database: Database, act: Callable[[Database, int], None]) -> None:
    """``act(db, n)`` for n in 0..7, each on a thread of its own released at once, odd
    n on ``database`` and even n on a second engine of the same database (two replicas)."""
    barrier = threading.Barrier(8)
    with opened(database.engine.url.render_as_string(hide_password=False)) as other:

        def run(n: int) -> None:
            barrier.wait()
            act(database if n % 2 else other, n)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def test_concurrent_claims_of_one_key_give_exactly_one_owner(database: Database) -> None:
    """Two engines on one database (two replicas): the primary key decides, one claim wins."""
    owners: list[str] = []

    def claim(db: Database, n: int) -> None:
        if claim_key(db, "t", "same", "d", f"token{n}", NOW, 60, 30) is None:
            owners.append(f"token{n}")

    _eight_at_once_on_two_engines(database, claim)
    assert len(owners) == 1


def test_a_lapsed_claim_is_taken_over_and_cannot_store_afterwards(database: Database) -> None:
    assert claim_key(database, "t", "k", "d", "old", NOW, 600, 30) is None
    assert claim_key(database, "t", "k", "d", "new", NOW + timedelta(seconds=29), 600, 30) is not None
    assert claim_key(database, "t", "k", "d", "new", NOW + timedelta(seconds=30), 600, 30) is None
    with pytest.raises(IdempotencyKeyInFlight):
        store_response(database, "t", "k", "old", 200, b"{}")
    release_key(database, "t", "k", "old")  # not the holder: nothing happens
    store_response(database, "t", "k", "new", 200, b'{"step": 1}')
    stored = read_key(database, "t", "k")
    assert stored is not None and stored.body == b'{"step": 1}'


def test_a_stored_response_is_never_released(database: Database) -> None:
    assert claim_key(database, "t", "k", "d", "tok", NOW, 600, 30) is None
    store_response(database, "t", "k", "tok", 200, b"{}")
    release_key(database, "t", "k", "tok")
    assert read_key(database, "t", "k") is not None


def test_released_key_is_claimed_again(database: Database) -> None:
    assert claim_key(database, "t", "k", "d", "tok", NOW, 600, 30) is None
    release_key(database, "t", "k", "tok")
    assert read_key(database, "t", "k") is None
    assert claim_key(database, "t", "k", "other digest", "tok2", NOW, 600, 30) is None


def test_expired_keys_are_absent_and_collected(database: Database) -> None:
    assert claim_key(database, "t", "old", "d", "tok", NOW, 10, 30) is None
    store_response(database, "t", "old", "tok", 200, b"{}")
    assert claim_key(database, "t", "fresh", "d", "tok", NOW, 1000, 30) is None
    later = NOW + timedelta(seconds=10)
    assert claim_key(database, "t", "old", "another", "tok2", later, 10, 30) is None  # expired: a new request
    assert delete_expired(database, later + timedelta(seconds=10)) == 1
    assert read_key(database, "t", "old") is None and read_key(database, "t", "fresh") is not None


def test_key_claim_is_plain_data() -> None:
    assert KeyClaim("t", "k", "tok") == KeyClaim("t", "k", "tok")


def _deferred(token: str, digest: str = "d", ttl_s: float = 600, lease_s: float = 30) -> KeyClaim:
    return KeyClaim("t", "k", token, DeferredClaim(digest, ttl_s, lease_s))


def _take(database: Database, claim: KeyClaim, at: datetime, body: bytes) -> None:
    with database.write_connection() as conn:
        claim_with_response_core(conn, claim, at, 200, body)


def test_find_key_sees_only_rows_that_hold_the_key(database: Database) -> None:
    assert find_key(database, "t", "k", NOW, 30) is None
    assert claim_key(database, "t", "k", "d", "tok", NOW, 600, 30) is None
    assert find_key(database, "t", "k", NOW + timedelta(seconds=29), 30) == StoredKey("d", None, None)
    assert find_key(database, "t", "k", NOW + timedelta(seconds=30), 30) is None  # the claim lapsed
    store_response(database, "t", "k", "tok", 200, b"{}")
    assert find_key(database, "t", "k", NOW + timedelta(seconds=599), 30) == StoredKey("d", 200, b"{}")
    assert find_key(database, "t", "k", NOW + timedelta(seconds=600), 30) is None  # expired
    assert find_key(database, "other tenant", "k", NOW, 30) is None


def test_a_deferred_claim_takes_the_key_with_its_response_once(database: Database) -> None:
    _take(database, _deferred("first"), NOW, b'{"step": 1}')
    assert read_key(database, "t", "k") == StoredKey("d", 200, b'{"step": 1}')
    with pytest.raises(IdempotencyKeyInFlight), database.write_connection() as conn:
        claim_with_response_core(conn, _deferred("second"), NOW, 200, b'{"step": 2}')
    assert read_key(database, "t", "k") == StoredKey("d", 200, b'{"step": 1}')  # nothing of the second


def test_a_deferred_claim_refuses_a_live_claim_and_takes_over_a_lapsed_or_expired_one(database: Database) -> None:
    assert claim_key(database, "t", "k", "d", "begun", NOW, 600, 30) is None  # another route's claim, in flight
    with pytest.raises(IdempotencyKeyInFlight):
        _take(database, _deferred("step"), NOW + timedelta(seconds=29), b"{}")
    assert read_key(database, "t", "k") == StoredKey("d", None, None)
    _take(database, _deferred("step"), NOW + timedelta(seconds=30), b'{"taken": "over"}')
    assert read_key(database, "t", "k") == StoredKey("d", 200, b'{"taken": "over"}')
    with pytest.raises(IdempotencyKeyInFlight):  # the lapsed claim can no longer store its response
        store_response(database, "t", "k", "begun", 201, b"{}")
    expired = NOW + timedelta(seconds=30 + 600)
    _take(database, _deferred("later", digest="new request"), expired, b'{"new": true}')
    assert read_key(database, "t", "k") == StoredKey("new request", 200, b'{"new": true}')
    assert delete_expired(database, expired) == 0  # it expires 600 s after its own claim


def test_concurrent_deferred_claims_of_one_key_give_exactly_one_response(database: Database) -> None:
    """Two engines (two replicas), eight transactions at once: one stores its response,
    the other seven fail their transactions."""
    taken: list[str] = []
    refused: list[str] = []

    def take(db: Database, n: int) -> None:
        try:
            _take(db, _deferred(f"token{n}"), NOW, f'{{"n": {n}}}'.encode())
            taken.append(f"token{n}")
        except IdempotencyKeyInFlight:
            refused.append(f"token{n}")

    _eight_at_once_on_two_engines(database, take)
    assert len(taken) == 1 and len(refused) == 7
    stored = read_key(database, "t", "k")
    assert stored is not None and stored.body == f'{{"n": {taken[0][5:]}}}'.encode()
