"""Opening a test's control database: the unit of work over a migrated URL, its engine
disposed at the end (SQLite file or PostgreSQL database alike)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sandpit.api.db.database import Database
from sandpit.api.db.engine import make_engine, make_sessionmaker


@contextmanager
def opened(url: str) -> Iterator[Database]:
    """The :class:`Database` of a migrated ``url``, its engine disposed at the end."""
    engine = make_engine(url)
    db = Database(make_sessionmaker(engine))
    try:
        yield db
    finally:
        db.close()
        engine.dispose()
