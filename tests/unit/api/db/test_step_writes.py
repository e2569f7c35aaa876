"""A step's write (``step_writes.write_steps``) on a real database: on SQLite it goes straight to
the driver, and what it stores must be exactly what SQLAlchemy Core stored (column by
column, as the database holds it: JSON texts, datetime strings, NULLs); a bad row in a
group-commit batch fails alone, as a 503, and takes nothing else down."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from sandpit.api.db import models
from sandpit.api.db.attempts import check_attempt, new_attempt
from sandpit.api.db.database import Database
from sandpit.api.db.group_commit import GroupCommit
from sandpit.api.db.idempotency import (
    DeferredClaim,
    KeyClaim,
    StoredKey,
    claim_key,
    claim_with_response_core,
    read_key,
)
from sandpit.api.db.step_writes import StepWrite, write_steps, write_steps_core
from sandpit.api.db.store import PendingBlobs
from sandpit.api.errors import HeadMoved, IdempotencyKeyInFlight, ServiceUnavailable, StaleAttempt
from sqlalchemy import select, text

NOW = datetime(2026, 11, 25, 23, 30, 1, 123456, tzinfo=UTC)


def make_env(database: Database, env_id: str) -> None:
    """A tenant, an environment and the env ``env_id`` (foreign keys are on)."""
    rows: list[tuple[Any, dict[str, Any]]] = [
        (models.Tenant.__table__, {"id": "team-a", "quotas": {}, "created_at": NOW}),
        (models.Environment.__table__, {"id": "environment-1", "tenant": "team-a", "class_name": "Counter",
                                        "source_code": "class Counter: pass", "code_sha256": "0" * 64, "tools": [],
                                        "inline": False, "created_at": NOW}),
    ]
    with database.write_connection() as conn:
        for table, row in rows:
            if conn.execute(select(table.c.id).where(table.c.id == row["id"])).first() is None:
                conn.execute(table.insert(), [row])
        conn.execute(models.Env.__table__.insert(), [{
            "id": env_id, "tenant": "team-a", "environment_id": "environment-1", "init_config": {}, "episode": 1,
            "step": 0, "closed": False, "created_at": NOW, "last_used_at": NOW, "expires_at": NOW}])


def step(env_id: str, number: int, **row: Any) -> StepWrite:
    pending = PendingBlobs()
    root = pending.add(orjson.dumps({"count": number, "env": env_id}))
    pending.add(b'{"shared": true}')  # the same blob in every step of a batch: stored once
    values = {"env_id": env_id, "episode": 1, "step": number, "action": {"name": "bump", "arguments": {}},
              "observation": "ok", "status": "ok", "duration_ms": 0.25, "state_root": root, "created_at": NOW,
              "reward": 0.0, "done": None, "info": None}
    values.update(row)
    return StepWrite(env_id, 1, values, pending, NOW)


def stored(database: Database) -> list[list[tuple[Any, ...]]]:
    """Everything the writes touched, as the database holds it (types included)."""
    with database.read() as session:
        def rows(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(row) for row in session.execute(text(sql))]

        return [rows("SELECT env_id, episode, step, CAST(action AS TEXT), observation, status, duration_ms, "
                     "state_root, CAST(created_at AS TEXT), reward, done, CAST(info AS TEXT) FROM steps "
                     "ORDER BY env_id, step"),
                rows("SELECT hash, data, size FROM blobs ORDER BY hash"),
                rows("SELECT id, step, CAST(last_used_at AS TEXT) FROM envs ORDER BY id")]


def both_ways(database: Database, other: Database, envs: list[str],
              writes: list[StepWrite]) -> tuple[list[list[tuple[Any, ...]]], list[list[tuple[Any, ...]]]]:
    """``writes`` stored by ``write_steps`` in ``database`` and by ``write_steps_core`` in
    ``other`` (both given the ``envs`` first): what each then holds (:func:`stored`)."""
    for db in (database, other):
        for env_id in envs:
            make_env(db, env_id)
    with database.write_connection() as conn:
        write_steps(conn, writes)
    blobs = PendingBlobs()
    for write in writes:
        blobs.blobs.update(write.pending.blobs)
    with other.write_connection() as conn:
        write_steps_core(conn, blobs, writes)
    return stored(database), stored(other)


# hostile and corner values: non-ASCII, a line separator and escapes, floats that look
# like ints, -0.0, a NULL reward, a JSON null action, nested info, quotes
BATCH = [
    dict(action={"name": "set", "arguments": {"v": [1, 1.0, True, None, "é\u2028", {"k": -0.0}]}}),
    dict(action=None, reward=None, done="terminated", info={"user_turns": 2, "nested": {"a": [1]}}),
    dict(observation='{"quote": "\\"", "tab": "\t"}', status="error", duration_ms=1e-9),
]


def test_the_driver_path_stores_exactly_what_core_stored(database: Database, second_database: Database) -> None:
    """Same batch, two databases: ``write_steps`` (the driver path on SQLite) and
    ``write_steps_core``; every stored column is equal, byte for byte."""
    writes = [step("env-1", number, **row) for number, row in enumerate(BATCH, 1)]
    mine, core = both_ways(database, second_database, ["env-1"], writes)
    assert mine == core
    assert len(mine[0]) == 3 and mine[2] == [("env-1", 3, mine[2][0][2])]
    assert len(mine[1]) == 4  # three roots and one shared blob, stored once


@pytest.mark.parametrize("count", [1, 7, 300])
def test_batches_of_any_size_store_what_core_stored(database: Database, second_database: Database,
                                                    count: int) -> None:
    """Batches of any size, several steps of one env among them, store the same rows as
    Core, and each env's head is its last step."""
    envs = [f"env-{i}" for i in range(min(count, 5))]
    writes = [step(envs[i % len(envs)], i // len(envs) + 1, observation=f"obs {i} \u00e9") for i in range(count)]
    mine, core = both_ways(database, second_database, envs, writes)
    assert mine == core
    assert len(mine[0]) == count and len(mine[1]) == count + 1
    assert [(env_id, head) for env_id, head, _ in mine[2]] == [
        (env_id, max(w.row["step"] for w in writes if w.env_id == env_id)) for env_id in envs]


def test_a_bad_step_fails_alone_in_its_batch(database: Database) -> None:
    """Concurrent steps share a transaction; one that cannot be stored (its step number
    is taken: the env's head is past the step it started from) gets a 503 (HeadMoved)
    and the others of its batch are committed."""
    for env_id in ("env-1", "env-2", "env-3"):
        make_env(database, env_id)
    with database.write_connection() as conn:
        write_steps(conn, [step("env-2", 1)])
    commits: GroupCommit[StepWrite] = GroupCommit(database, write_steps)
    results: dict[str, BaseException | None] = {}
    start = threading.Barrier(3)

    def submit(write: StepWrite, name: str) -> None:
        start.wait()
        try:
            commits.submit(write)
            results[name] = None
        except BaseException as exc:  # noqa: BLE001 - checked below
            results[name] = exc

    threads = [threading.Thread(target=submit, args=(step(env_id, number), env_id))
               for env_id, number in (("env-1", 1), ("env-2", 1), ("env-3", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results["env-1"] is None and results["env-3"] is None
    assert isinstance(results["env-2"], HeadMoved)
    steps, _, heads = stored(database)
    assert [(row[0], row[2]) for row in steps] == [("env-1", 1), ("env-2", 1), ("env-3", 1)]
    assert [(row[0], row[1]) for row in heads] == [("env-1", 1), ("env-2", 1), ("env-3", 1)]


def write_core(conn: Any, writes: list[StepWrite]) -> None:
    """``write_steps_core`` given the union of ``writes``' blobs, as ``write_steps`` gives it."""
    blobs = PendingBlobs()
    for write in writes:
        blobs.blobs.update(write.pending.blobs)
    write_steps_core(conn, blobs, writes)


@pytest.mark.parametrize("writer", [write_steps, write_core], ids=["driver", "core"])
@pytest.mark.parametrize("stale", ["behind", "ahead", "old_episode"])
def test_a_step_from_a_head_that_moved_stores_nothing(database: Database, writer: Any, stale: str) -> None:
    """A step is committed only on top of the head it started from: a replica whose live
    view is behind (the head moved past it), ahead, or of an episode the env left (reset
    elsewhere) gets HeadMoved, and neither its row, its blobs nor a head move is stored;
    in a batch it takes nothing else down."""
    make_env(database, "env-1")
    make_env(database, "env-2")
    with database.write_connection() as conn:
        writer(conn, [step("env-1", 1), step("env-1", 2)])
    before = stored(database)
    write = {"behind": step("env-1", 2, observation="stale"), "ahead": step("env-1", 4),
             "old_episode": dataclasses.replace(step("env-1", 3), episode=0)}[stale]
    with pytest.raises(HeadMoved), database.write_connection() as conn:
        writer(conn, [step("env-2", 1), write])
    assert stored(database) == before
    with database.write_connection() as conn:
        writer(conn, [step("env-2", 1), step("env-1", 3)])
    assert [(row[0], row[1]) for row in stored(database)[2]] == [("env-1", 3), ("env-2", 1)]


def test_a_step_of_an_unknown_env_is_refused(database: Database) -> None:
    """The foreign key holds on the driver path too: a step of an env that does not
    exist is refused (503) and nothing of it is stored."""
    with pytest.raises(ServiceUnavailable), database.write_connection() as conn:
        write_steps(conn, [step("env-missing", 1)])
    assert stored(database) == [[], [], []]


def test_a_step_commits_its_key_response_and_only_under_the_current_attempt(database: Database) -> None:
    """The key's response and the attempt fence are part of the step's transaction: a
    stale attempt or a key taken over fails the step (nothing stored); a fitting one
    stores step and response together."""
    make_env(database, "env-1")
    _, token = new_attempt(database, "env-1")
    _, newer = new_attempt(database, "env-1")
    assert claim_key(database, "team-a", "k", "d", "claim-1", NOW, 600, 60) is None
    claim = KeyClaim("team-a", "k", "claim-1")
    with pytest.raises(StaleAttempt), database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 1), key=claim, response=b"{}", attempt=token)])
    with pytest.raises(IdempotencyKeyInFlight), database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 1), key=KeyClaim("team-a", "k", "other"),
                                               response=b"{}", attempt=newer)])
    assert stored(database)[0] == [] and read_key(database, "team-a", "k") == StoredKey("d", None, None)
    with database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 1), key=claim, response=b'{"step": 1}', attempt=newer)])
    assert [row[2] for row in stored(database)[0]] == [1]
    assert read_key(database, "team-a", "k") == StoredKey("d", 200, b'{"step": 1}')
    with pytest.raises(StaleAttempt):
        check_attempt(database, "team-a", "env-1", token)
    check_attempt(database, "team-a", "env-1", newer)
    check_attempt(database, "team-b", "env-1", token)  # not that tenant's env: the call itself answers 404


def test_a_step_with_a_deferred_claim_takes_its_key_in_its_own_transaction(database: Database) -> None:
    """A step's key claimed in its own transaction: the key's row appears with the step and
    its response; a second step under the same key (another request that ran at the same
    time) fails its whole transaction, its step included, and a group of steps is all or nothing."""
    make_env(database, "env-1")
    make_env(database, "env-2")
    first = KeyClaim("team-a", "k", "claim-1", DeferredClaim("d", 600, 60))
    with database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 1), key=first, response=b'{"step": 1}')])
    assert read_key(database, "team-a", "k") == StoredKey("d", 200, b'{"step": 1}')
    second = KeyClaim("team-a", "k", "claim-2", DeferredClaim("d", 600, 60))
    with pytest.raises(IdempotencyKeyInFlight), database.write_connection() as conn:
        write_steps(conn, [step("env-2", 1), dataclasses.replace(step("env-1", 2), key=second, response=b"{}")])
    assert sorted((row[0], row[2]) for row in stored(database)[0]) == [("env-1", 1)]
    assert read_key(database, "team-a", "k") == StoredKey("d", 200, b'{"step": 1}')


def _key_rows(database: Database) -> list[tuple[Any, ...]]:
    with database.read() as session:
        return [tuple(row) for row in session.execute(text(
            "SELECT tenant, key, digest, claim, status, body, CAST(claimed_at AS TEXT), CAST(expires_at AS TEXT) "
            "FROM idempotency_keys ORDER BY tenant, key"))]


def test_a_deferred_claims_row_is_what_core_writes_and_an_expired_key_is_taken_over(
        database: Database, second_database: Database) -> None:
    """The key's row the step's write inserts (straight from SQLite's driver when the key is
    new) is, column for column, the row Core's claim writes; a key whose row expired is
    taken over by the step's write."""
    claim = KeyClaim("team-a", "k", "claim-1", DeferredClaim("d", 600, 60))
    make_env(database, "env-1")
    with database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 1), key=claim, response=b'{"step": 1}')])
    with second_database.write_connection() as conn:
        claim_with_response_core(conn, claim, NOW, 200, b'{"step": 1}')
    assert _key_rows(database) == _key_rows(second_database) and len(_key_rows(database)) == 1
    later = NOW + timedelta(seconds=600)
    renewed = KeyClaim("team-a", "k", "claim-2", DeferredClaim("another request", 600, 60))
    with database.write_connection() as conn:
        write_steps(conn, [dataclasses.replace(step("env-1", 2), now=later, key=renewed, response=b'{"step": 2}')])
    assert read_key(database, "team-a", "k") == StoredKey("another request", 200, b'{"step": 2}')
    assert [row[2] for row in stored(database)[0]] == [1, 2]
