"""Group commit (``sandpit.api.db.group_commit``) on a real SQLite file: concurrent items
are all durable once ``submit`` returns, in submission order per caller; a failing batch
loses nothing it acknowledged and one bad item does not fail the others of its batch;
``submit_many`` reports each item's own outcome; ``try_submit`` commits only when it need
not wait (nobody commits, the database's writer is free; never on PostgreSQL) and
queues nothing when it refuses."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sandpit.api.db.database import Database
from sandpit.api.db.group_commit import GroupCommit
from sandpit.api.errors import ServiceUnavailable
from sqlalchemy import Connection, text

Row = tuple[str, int, int]
"""(key, writer, sequence number)"""


def make_table(database: Database) -> None:
    with database.write_connection() as conn:
        conn.execute(text("CREATE TABLE gc (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT UNIQUE NOT NULL, "
                          "writer INTEGER NOT NULL, seq INTEGER NOT NULL)"))


def insert(conn: Connection, rows: list[Row]) -> None:
    conn.execute(text("INSERT INTO gc (k, writer, seq) VALUES (:k, :writer, :seq)"),
                 [{"k": k, "writer": w, "seq": s} for k, w, s in rows])


def stored(database: Database) -> list[Row]:
    with database.read() as session:
        return [(r.k, r.writer, r.seq) for r in session.execute(text("SELECT k, writer, seq FROM gc ORDER BY id"))]


def test_concurrent_items_are_all_committed_in_order(database: Database) -> None:
    make_table(database)
    commits: GroupCommit[Row] = GroupCommit(database, insert)
    writers, per_writer = 16, 40
    acknowledged: list[set[str]] = [set() for _ in range(writers)]
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(writer: int) -> None:
        start.wait()
        try:
            for seq in range(per_writer):
                key = f"w{writer}-{seq}"
                commits.submit((key, writer, seq))
                acknowledged[writer].add(key)
                # acknowledged means committed: another connection sees it now
                with database.read() as session:
                    assert session.execute(text("SELECT 1 FROM gc WHERE k = :k"), {"k": key}).first() is not None
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    rows = stored(database)
    assert len(rows) == writers * per_writer == commits.items
    for writer in range(writers):
        assert [seq for _, w, seq in rows if w == writer] == list(range(per_writer))  # in order per writer
    assert commits.batches <= commits.items


def queue_behind_a_slow_leader(database: Database, commits: GroupCommit[Row], items: list[Row],
                               gate: threading.Event) -> dict[str, BaseException | None]:
    """Submit ``items[0]`` (its write waits for ``gate``), then the rest while it waits,
    so they share the next batch. Returns each key's outcome (None: committed)."""
    outcome: dict[str, BaseException | None] = {}
    lock = threading.Lock()

    def submit(item: Row) -> None:
        try:
            commits.submit(item)
            result: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            result = exc
        with lock:
            outcome[item[0]] = result

    first = threading.Thread(target=submit, args=(items[0],))
    first.start()
    followers = [threading.Thread(target=submit, args=(item,)) for item in items[1:]]
    for thread in followers:
        thread.start()
    deadline = threading.Event()
    while not deadline.wait(0.01):  # until every follower is queued
        with commits._lock:  # noqa: SLF001 - the test waits for the queue it built
            if len(commits._queue) == len(items) - 1:  # noqa: SLF001
                break
    gate.set()
    for thread in [first, *followers]:
        thread.join(timeout=60)
    return outcome


def test_one_bad_item_does_not_fail_its_batch(database: Database) -> None:
    make_table(database)
    gate = threading.Event()
    batches: list[list[str]] = []

    def write(conn: Connection, rows: list[Row]) -> None:
        if rows[0][0] == "first":
            gate.wait(30)
        batches.append([k for k, _, _ in rows])
        insert(conn, rows)

    commits: GroupCommit[Row] = GroupCommit(database, write)
    commits.submit(("taken", 0, 0))
    items = [("first", 1, 0), *[(f"ok{i}", 2, i) for i in range(5)], ("taken", 3, 0), *[(f"ok{i}", 2, i)
                                                                                         for i in range(5, 8)]]
    outcome = queue_behind_a_slow_leader(database, commits, items, gate)
    assert any(len(batch) > 1 for batch in batches)  # the followers did share a transaction
    assert isinstance(outcome["taken"], ServiceUnavailable)  # the duplicate key: only it fails
    assert all(outcome[k] is None for k in outcome if k != "taken")
    rows = stored(database)
    assert sorted(k for k, _, _ in rows) == sorted(["taken", "first", *[f"ok{i}" for i in range(8)]])
    assert [r for r in rows if r[0] == "taken"] == [("taken", 0, 0)]  # the failed one committed nothing
    assert [seq for _, w, seq in rows if w == 2] == list(range(8))


def test_a_failing_commit_loses_nothing_acknowledged(database: Database) -> None:
    make_table(database)
    gate = threading.Event()
    failures = {"left": 1}

    def write(conn: Connection, rows: list[Row]) -> None:
        if rows[0][0] == "first":
            gate.wait(30)
        insert(conn, rows)
        if len(rows) > 1 and failures["left"]:
            failures["left"] -= 1
            conn.execute(text("INSERT INTO gc (k, writer, seq) VALUES ('first', 9, 9)"))  # fails the batch

    commits: GroupCommit[Row] = GroupCommit(database, write)
    items = [("first", 1, 0), *[(f"k{i}", 2, i) for i in range(6)]]
    outcome = queue_behind_a_slow_leader(database, commits, items, gate)
    assert failures["left"] == 0  # the batch did fail once
    assert all(result is None for result in outcome.values()), outcome  # each retried alone: committed
    assert sorted(k for k, _, _ in stored(database)) == sorted(k for k, _, _ in items)


def test_a_database_that_fails_every_write_acknowledges_nothing(database: Database) -> None:
    commits: GroupCommit[Row] = GroupCommit(database, insert)  # no table: every write fails
    errors: list[Any] = []

    def submit(i: int) -> None:
        try:
            commits.submit((f"k{i}", 0, i))
        except ServiceUnavailable as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(errors) == 8 and commits.items == 0
    with pytest.raises(ValueError):
        GroupCommit(database, insert, max_batch=0)


def test_submit_many_commits_each_item_and_reports_each_failure(database: Database) -> None:
    make_table(database)
    commits: GroupCommit[Row] = GroupCommit(database, insert, max_batch=3)
    commits.submit(("taken", 0, 0))
    items = [(f"k{i}", 1, i) for i in range(4)] + [("taken", 1, 4)] + [(f"k{i}", 1, i) for i in range(5, 8)]
    errors = commits.submit_many(items)
    assert [e is None for e in errors] == [True] * 4 + [False] + [True] * 3
    assert isinstance(errors[4], ServiceUnavailable)  # the duplicate alone failed
    rows = stored(database)
    assert [seq for _, w, seq in rows if w == 1] == [0, 1, 2, 3, 5, 6, 7]  # in order, across max_batch batches
    assert commits.submit_many([]) == []


def test_submit_many_shares_the_lead_with_concurrent_callers(database: Database) -> None:
    make_table(database)
    commits: GroupCommit[Row] = GroupCommit(database, insert, max_batch=4)
    failures: list[Any] = []

    def caller(writer: int) -> None:
        for round_ in range(10):
            if writer % 2:
                errors = commits.submit_many([(f"w{writer}-{round_}-{i}", writer, round_ * 5 + i) for i in range(5)])
                failures.extend(e for e in errors if e is not None)
            else:
                commits.submit((f"w{writer}-{round_}", writer, round_))

    threads = [threading.Thread(target=caller, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures and not any(t.is_alive() for t in threads)
    rows = stored(database)
    assert len(rows) == 4 * 10 + 4 * 50
    for writer in range(8):
        seqs = [seq for _, w, seq in rows if w == writer]
        assert seqs == sorted(seqs)



def test_try_submit_commits_only_when_it_need_not_wait(database: Database) -> None:
    make_table(database)
    entered, release = threading.Event(), threading.Event()

    def write(conn: Connection, rows: list[Row]) -> None:
        insert(conn, rows)
        if rows[0][0].startswith("held"):
            entered.set()
            release.wait(30)

    commits: GroupCommit[Row] = GroupCommit(database, write)
    if database.dialect != "sqlite":  # a commit is a round trip to the server: never done where waiting is not allowed
        assert not database.write_free() and not commits.try_submit(("pg", 0, 0))
        assert stored(database) == []
        return
    assert database.write_free() and commits.try_submit(("a", 0, 0))
    assert stored(database) == [("a", 0, 0)]
    for number, holder in enumerate((GroupCommit(database, write), commits), start=1):  # another writer; its own lead
        entered.clear()
        release.clear()
        writer = threading.Thread(target=holder.submit, args=((f"held-{number}", 1, number),))
        writer.start()
        assert entered.wait(30)
        refused_at = time.monotonic()
        assert not database.write_free() and not commits.try_submit(("b", 0, number))
        assert time.monotonic() - refused_at < 0.5  # refused at once, not after the writer
        release.set()
        writer.join(30)
    assert [k for k, _, _ in stored(database)] == ["a", "held-1", "held-2"]  # "b" was never queued
    assert commits.try_submit(("b", 0, 3))
    with pytest.raises(ServiceUnavailable):  # what submit raises for an item that fails alone
        commits.try_submit(("b", 0, 4))
    assert [k for k, _, _ in stored(database)] == ["a", "held-1", "held-2", "b"]
