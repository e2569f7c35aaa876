"""Fixtures of the API's unit tests: a migrated SQLite database per test (copied from one
migrated once per session, so a test costs a file copy, not a migration run). Nothing
runs but this process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandpit.api.db.database import Database
from sandpit.api.db.engine import make_engine, make_sessionmaker, upgrade


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file at the newest migration."""
    path = tmp_path_factory.mktemp("template") / "sandpit.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def db_path(tmp_path: Path, migrated_template: Path) -> Path:
    """This test's own copy of the migrated database (``sandpit.db`` in ``tmp_path``)."""
    path = tmp_path / "sandpit.db"
    shutil.copyfile(migrated_template, path)
    return path


@pytest.fixture
def database(db_path: Path) -> Iterator[Database]:
    """The unit of work over this test's database."""
    engine = make_engine(f"sqlite:///{db_path}")
    try:
        yield Database(make_sessionmaker(engine))
    finally:
        engine.dispose()
