"""Services built by the app factory's :func:`~sandpit.api.app.build` over the fake
executor and a migrated SQLite copy (no threads started)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_fakes import SOURCE, caller, fake_executor
from sandpit.api.app import Services, build
from sandpit.api.db.database import Database
from sandpit.api.schemas.environments import EnvironmentCreate
from sandpit.api.settings import ApiSettings
from sandpit.executor.fake import FakeExecutor


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
