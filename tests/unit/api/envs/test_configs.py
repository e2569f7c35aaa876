"""Envs' configs (:mod:`sandpit.api.envs.configs`): the server-wide cap, the compressed
bytes remembered for the last configs, and a stored config gone missing (the database
was edited) answered 503 rather than a 500."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sandpit.api.db import models
from sandpit.api.db.configs import canonical
from sandpit.api.db.database import Database
from sandpit.api.envs.configs import COMPRESSED_CONFIGS, EnvConfigs
from sandpit.api.errors import PayloadTooLarge, ServiceUnavailable
from sandpit.api.settings import ApiSettings


@pytest.fixture
def configs(tmp_path: Path, database: Database) -> EnvConfigs:
    return EnvConfigs(ApiSettings(data_dir=tmp_path, max_init_config_bytes=1024), database)


def test_a_config_over_the_servers_cap_is_413(configs: EnvConfigs) -> None:
    configs.check(canonical({"k": "x" * 1000}))
    with pytest.raises(PayloadTooLarge) as raised:
        configs.check(canonical({"k": "x" * 1100}))
    assert raised.value.field == "init_config" and "1024" in raised.value.message


def test_compressed_bytes_are_remembered_for_the_last_configs(configs: EnvConfigs) -> None:
    first = canonical({"n": 0, "pad": "y" * 500})
    data = configs.compressed(first)
    assert zlib.decompress(data) == first.data and configs.compressed(first) is data
    for n in range(1, COMPRESSED_CONFIGS + 1):
        configs.compressed(canonical({"n": n}))
    again = configs.compressed(first)  # pushed out by newer ones: compressed anew, same bytes
    assert again is not data and again == data


def test_a_missing_stored_config_is_503(configs: EnvConfigs) -> None:
    now = datetime.now(UTC)
    row = models.Env(id="env_x", tenant="team-a", environment_id="envr_x", init_config={},
                     init_config_hash="0" * 32, episode=1, step=0, closed=False, created_at=now, last_used_at=now,
                     expires_at=now)
    with pytest.raises(ServiceUnavailable) as raised:
        configs.config_of(row)
    assert raised.value.retry_after == 1 and "env_x" in raised.value.message
    legacy = models.Env(id="env_y", tenant="team-a", environment_id="envr_x", init_config={"count": 2},
                        init_config_hash=None, episode=1, step=0, closed=False, created_at=now, last_used_at=now,
                        expires_at=now)
    assert configs.config_of(legacy) == {"count": 2}  # a row from before configs were stored once
