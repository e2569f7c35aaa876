"""Database engine, sessions and the migration gate (no sessions of its own: see
:mod:`.database` for the unit of work).

SQLite files run in WAL mode with ``synchronous=NORMAL`` (a committed step survives a
process crash; an OS crash may lose the last few milliseconds) and a 30 s busy timeout.
PostgreSQL URLs without a driver (``postgresql://``, ``postgres://``) use psycopg 3
(:func:`normalize_url`). The schema is owned by Alembic (``migrations/``): :func:`upgrade` applies it and
:func:`require_current` refuses to serve a database that is behind.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from tenacity import retry, retry_if_exception, stop_after_delay, wait_random

from ..errors import DatabaseNotMigrated
from .checkpoint import FOREGROUND_PAGES, WAL_KEEP_BYTES

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """``url`` with psycopg 3 as the driver of a driverless PostgreSQL URL
    (``postgresql://`` or ``postgres://`` -> ``postgresql+psycopg://``: SQLAlchemy's own
    default would be psycopg2, which Sandpit does not install); other URLs unchanged."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


@retry(retry=retry_if_exception(lambda exc: isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)),
       wait=wait_random(0.005, 0.05), stop=stop_after_delay(30), reraise=True)
def _use_wal(cursor: Any) -> None:
    """Put the SQLite file in WAL mode (it stays so once set, so a file already in it is
    left alone). Switching the mode can answer SQLITE_BUSY at once, without the busy
    handler, while other connections open the same new file; it is retried for up to 30
    seconds. Raises sqlite3.OperationalError past that."""
    if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        cursor.execute("PRAGMA journal_mode=WAL")


def make_engine(url: str, background_checkpoints: bool = False) -> Engine:
    """An engine for ``url``; creates the parent directory of a SQLite file. PostgreSQL:
    16 pooled connections (+48 overflow, like SQLite), checked before use.

    ``background_checkpoints`` (SQLite; the serving app, which runs a
    :class:`~.checkpoint.WalCheckpointer`): commits leave WAL checkpoints to that thread
    and run one themselves only past ``checkpoint.FOREGROUND_PAGES``; the WAL file is
    truncated to ``checkpoint.WAL_KEEP_BYTES`` when it restarts."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=16, max_overflow=48)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:  # a DB-API connection
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA busy_timeout=30000")
            _use_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            if background_checkpoints:
                cursor.execute(f"PRAGMA wal_autocheckpoint={FOREGROUND_PAGES}")
                cursor.execute(f"PRAGMA journal_size_limit={WAL_KEEP_BYTES}")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=16, max_overflow=48)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    """Alembic configuration pointing at ``migrations/`` and ``url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (``sandpit db upgrade``)."""
    if url.startswith("sqlite"):
        make_engine(url).dispose()  # creates the data directory
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def require_current(engine: Engine) -> None:
    """Raise :class:`DatabaseNotMigrated` unless the database is at the newest migration."""
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    head = head_revision()
    if current != head:
        raise DatabaseNotMigrated(
            f"database {engine.url.render_as_string(hide_password=True)} is at revision "
            f"{current or 'none (empty)'}, this Sandpit needs {head}: run `sandpit db upgrade`")
