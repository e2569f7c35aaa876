"""Fixtures of the API's unit tests: a migrated SQLite database per test (copied from one
migrated once per session, so a test costs a file copy, not a migration run), and the
services the app factory's :func:`~sandpit.api.app.build` wires over the executor's
scripted fake and that database (no threads started). Nothing runs but this process.

With ``SANDPIT_TEST_DATABASE=postgresql`` (``scripts/test`` runs the DB-layer tests a
second time so) the ``database`` fixture is a fresh PostgreSQL database per test instead,
cloned from a migrated template on the test server (``tests/support/postgres.py``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_fakes import SOURCE, caller, fake_executor
from databases import opened
from env_calls import CHECK_COUNT, CHECK_LOG, ME
from sandpit.api.app import Services, build
from sandpit.api.db.database import Database
from sandpit.api.db.engine import upgrade
from sandpit.api.schemas.environments import EnvironmentCreate
from sandpit.api.schemas.scenarios import CheckSpec, ScenarioCreate
from sandpit.api.settings import ApiSettings
from sandpit.executor.fake import FakeExecutor


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


@pytest.fixture(scope="session")
def database_kind() -> Iterator[str]:
    """``sqlite`` (default) or ``postgresql`` (``SANDPIT_TEST_DATABASE``)."""
    kind = os.environ.get("SANDPIT_TEST_DATABASE", "sqlite")
    yield kind
    if kind == "postgresql":
        import postgres

        postgres.drop_template()


@contextmanager
def _open(database_kind: str, sqlite_path: Callable[[], Path]) -> Iterator[Database]:
    """A fresh PostgreSQL clone, or the SQLite file ``sqlite_path()`` gives, as a unit of work."""
    if database_kind == "postgresql":
        import postgres

        with postgres.fresh_database() as url, opened(url) as db:
            yield db
    else:
        with opened(f"sqlite:///{sqlite_path()}") as db:
            yield db


@pytest.fixture
def database(database_kind: str, request: pytest.FixtureRequest) -> Iterator[Database]:
    """The unit of work over this test's database (SQLite copy or PostgreSQL clone)."""
    with _open(database_kind, lambda: request.getfixturevalue("db_path")) as db:
        yield db


@pytest.fixture
def second_database(database_kind: str, migrated_template: Path, tmp_path: Path) -> Iterator[Database]:
    """Another database of the same kind as ``database``, for comparing two writes."""

    def copy() -> Path:
        path = tmp_path / "second.db"
        shutil.copyfile(migrated_template, path)
        return path

    with _open(database_kind, copy) as db:
        yield db


@pytest.fixture
def fake() -> Iterator[FakeExecutor]:
    with fake_executor() as executor:
        yield executor


@pytest.fixture
def settings(tmp_path: Path) -> ApiSettings:
    return ApiSettings(data_dir=tmp_path, call_slots=4, call_queue_timeout_s=0.5, warm_on_start=False)


@pytest.fixture
def services(settings: ApiSettings, database: Database, fake: FakeExecutor) -> Iterator[Services]:
    built = build(settings, database, fake)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def environment_id(services: Services) -> str:
    """A registered ``Counter`` of tenant ``team-a``."""
    return services.environments.register(caller(), EnvironmentCreate(
        name="counter", source_code=SOURCE, class_name="Counter")).id


@pytest.fixture
def scenario_id(services: Services, fake: FakeExecutor, environment_id: str) -> str:
    """A scenario of ``Counter`` (config ``count: 1``) whose two checks the fake scripts."""
    fake.script_check(CHECK_COUNT, lambda initial, final: final["count"] == 3)
    fake.script_check(CHECK_LOG, lambda initial, final: len(final["log"]) == 1)
    return services.scenarios.create(ME, ScenarioCreate(
        environment_id=environment_id, task="Bring the counter to 3.", init_config={"count": 1},
        checklist_with_func=[CheckSpec(check_item="count is 3", check_func=CHECK_COUNT),
                             CheckSpec(check_item="one bump", check_func=CHECK_LOG)])).id
