"""The unit of work (``sandpit.api.db.database``) on a real SQLite file: the connection
``write_connection`` keeps between transactions commits what a block wrote, rolls back
all of a block that raised (and is replaced by a fresh one), serializes writers from
many threads, and is returned by ``close``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from databases import opened
from sandpit.api.db.database import Database
from sandpit.api.errors import ServiceUnavailable
from sqlalchemy import text


def rows(db: Database) -> list[int]:
    with db.read() as session:
        return [r[0] for r in session.execute(text("SELECT n FROM t ORDER BY n"))]


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    with opened(f"sqlite:///{tmp_path / 'plain.db'}") as db:
        with db.write_connection() as conn:
            conn.execute(text("CREATE TABLE t (n INTEGER PRIMARY KEY)"))
        yield db


def test_the_kept_connection_serves_transaction_after_transaction(sqlite_db: Database) -> None:
    with sqlite_db.write_connection() as first:
        first.execute(text("INSERT INTO t VALUES (1)"))
    with sqlite_db.write_connection() as second:
        second.execute(text("INSERT INTO t VALUES (2)"))
        assert second is first  # kept: no pool check-out per transaction
    assert rows(sqlite_db) == [1, 2]  # committed: another connection reads them


def test_a_block_that_raises_commits_nothing_and_the_next_gets_a_fresh_connection(sqlite_db: Database) -> None:
    with sqlite_db.write_connection() as kept:
        kept.execute(text("INSERT INTO t VALUES (1)"))
    with pytest.raises(RuntimeError), sqlite_db.write_connection() as conn:
        conn.execute(text("INSERT INTO t VALUES (2)"))
        raise RuntimeError("the caller's own failure")
    with pytest.raises(ServiceUnavailable), sqlite_db.write_connection() as conn:
        conn.execute(text("INSERT INTO t VALUES (3)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))  # primary key taken: the driver fails the block
    with sqlite_db.write_connection() as fresh:
        assert fresh is not kept
        assert fresh.execute(text("SELECT count(*) FROM t")).scalar_one() == 1  # nothing of 2 or 3 is left
        fresh.execute(text("INSERT INTO t VALUES (4)"))
    assert rows(sqlite_db) == [1, 4]


def test_writers_on_many_threads_are_serialized_and_all_commit(sqlite_db: Database) -> None:
    errors: list[BaseException] = []

    def write(base: int) -> None:
        try:
            for i in range(25):
                with sqlite_db.write_connection() as conn:
                    count = conn.execute(text("SELECT count(*) FROM t")).scalar_one()
                    conn.execute(text("INSERT INTO t VALUES (:n)"), {"n": base + i})
                    assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == count + 1
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(k * 1000,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(rows(sqlite_db)) == 200


def test_close_returns_the_kept_connection_and_writes_go_on_after_it(sqlite_db: Database) -> None:
    pool = sqlite_db.engine.pool
    with sqlite_db.write_connection() as conn:
        conn.execute(text("INSERT INTO t VALUES (1)"))
    assert pool.checkedout() == 1  # type: ignore[attr-defined]
    sqlite_db.close()
    sqlite_db.close()
    assert pool.checkedout() == 0  # type: ignore[attr-defined]
    with sqlite_db.write_connection() as conn:
        conn.execute(text("INSERT INTO t VALUES (2)"))
    assert rows(sqlite_db) == [1, 2]
