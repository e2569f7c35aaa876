"""Reading a registered environment (:meth:`EnvironmentService.get_environment`): the row
as the ORM would load it, never another tenant's."""

from __future__ import annotations

import pytest
from api_fakes import caller
from sandpit.api.app import Services
from sandpit.api.db import models
from sandpit.api.errors import NotFound
from sqlalchemy import inspect


def test_the_environment_read_has_every_column_the_orm_loads(services: Services, environment_id: str) -> None:
    read = services.environments.get_environment("team-a", environment_id)
    with services.db.read() as db:
        loaded = db.get(models.Environment, environment_id)
    assert loaded is not None
    columns = [attr.key for attr in inspect(models.Environment).column_attrs]
    assert {key: getattr(read, key) for key in columns} == {key: getattr(loaded, key) for key in columns}
    assert read.tools and read.source_code and read.created_at is not None
    assert inspect(read).transient  # no session knows it: nothing can flush it again


def test_another_tenants_or_an_unknown_environment_is_not_found_alike(services: Services,
                                                                        environment_id: str) -> None:
    messages = []
    for tenant, wanted in (("team-b", environment_id), ("team-a", "envr_" + "0" * 24),
                           ("team-a", environment_id + "' OR '1'='1")):
        with pytest.raises(NotFound) as raised:
            services.environments.get_environment(tenant, wanted)
        messages.append(str(raised.value).replace(repr(wanted[:64]), "ID"))
    assert len(set(messages)) == 1
    assert services.environments.read(caller("team-a"), environment_id).id == environment_id
