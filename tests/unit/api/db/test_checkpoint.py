"""WAL checkpoints off the commit path (``sandpit.api.db.checkpoint``) on a real SQLite
file: the serving engine's commits leave checkpoints to the thread, the thread copies the
WAL back, a reader holding an old snapshot neither blocks writers nor the thread, and
nothing committed is lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sandpit.api.db.checkpoint import FOREGROUND_PAGES, WAL_KEEP_BYTES, WalCheckpointer
from sandpit.api.db.engine import make_engine
from sqlalchemy import Engine, create_engine, text
from waiting import wait_until


def make_table(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)"))


def write(engine: Engine, first: int, count: int) -> list[float]:
    """``count`` commits of one ~4 KiB row each; their wall times (seconds)."""
    took = []
    for key in range(first, first + count):
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t (id, payload) VALUES (:id, :payload)"),
                         {"id": key, "payload": bytes(4000)})
        took.append(time.perf_counter() - started)
    return took


def pragma(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"PRAGMA {name}")).scalar_one())


def test_the_serving_engine_leaves_checkpoints_to_the_thread(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}", background_checkpoints=True)
    plain = make_engine(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        assert pragma(engine, "wal_autocheckpoint") == FOREGROUND_PAGES
        assert pragma(engine, "journal_size_limit") == WAL_KEEP_BYTES
        assert pragma(plain, "wal_autocheckpoint") == 1000  # SQLite's own, as before
    finally:
        engine.dispose()
        plain.dispose()


def test_the_thread_copies_the_wal_back_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sandpit.db"
    engine = make_engine(f"sqlite:///{path}", background_checkpoints=True)
    checkpointer = WalCheckpointer(engine, interval_s=0.05).start()
    try:
        make_table(engine)
        write(engine, 0, 600)
        wait_until(lambda: checkpointer.stats.frames_copied >= 600, "600 frames copied", 20.0, poll_s=0.05)
        assert checkpointer.stats.errors == 0
    finally:
        checkpointer.close()
        engine.dispose()
    # nothing committed was lost (read from the file alone: immutable, no WAL)
    reader = create_engine(f"sqlite:///file:{path}?immutable=1&uri=true")
    try:
        with reader.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 600
    finally:
        reader.dispose()


def test_a_reader_holding_a_snapshot_blocks_neither_writes_nor_the_thread(tmp_path: Path) -> None:
    """A long read transaction (a slow ``GET /history``, a stuck client) keeps the frames
    it may read; passes copy what they can, commits go on at full speed, and once the
    reader ends a later pass copies the rest."""
    engine = make_engine(f"sqlite:///{tmp_path / 'sandpit.db'}", background_checkpoints=True)
    checkpointer = WalCheckpointer(engine, interval_s=0.05).start()
    try:
        make_table(engine)
        write(engine, 0, 50)
        with engine.connect() as reader:
            reader.execute(text("BEGIN"))
            assert reader.execute(text("SELECT count(*) FROM t")).scalar_one() == 50  # snapshot taken
            took = write(engine, 50, 400)
            passes = checkpointer.stats.passes
            wait_until(lambda: checkpointer.stats.passes >= passes + 3, "3 passes", 20.0, poll_s=0.05)
            assert checkpointer.stats.incomplete > 0  # the reader's frames were held back
            assert reader.execute(text("SELECT count(*) FROM t")).scalar_one() == 50  # its snapshot held
            reader.execute(text("COMMIT"))
        assert max(took) < 5.0  # nothing waited on the reader (the busy timeout is 30 s)
        result = checkpointer.checkpoint()
        assert result is not None and result[1] == result[2]  # everything copied
    finally:
        checkpointer.close()
        engine.dispose()
    assert checkpointer.stats.errors == 0


def test_bad_intervals_and_other_databases() -> None:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    try:
        with pytest.raises(ValueError, match="positive"):
            WalCheckpointer(engine, interval_s=0)
        with pytest.raises(ValueError, match="positive"):
            WalCheckpointer(engine, interval_s=-1)
        checkpointer = WalCheckpointer(engine).start()  # not SQLite: no thread, nothing to do
        assert not checkpointer.enabled and checkpointer._thread is None
        checkpointer.close()
    finally:
        engine.dispose()
