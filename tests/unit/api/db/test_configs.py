"""``init_config`` stored once (:mod:`sandpit.api.db.configs`) on a real SQLite file: the
canonical bytes and hash, the size the caps measure, storing, reading back, collection."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandpit.api.db import models
from sandpit.api.db.configs import (
    HASH_HEX,
    ConfigCache,
    MissingConfig,
    canonical,
    collect_configs,
    env_config,
    parse,
    store_config,
)
from sandpit.api.db.database import CoreSession, Database
from sandpit.api.json_rules import json_size
from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

NOW = datetime(2026, 1, 1, tzinfo=UTC)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), JSON, max_size=6))
def test_size_is_pythons_compact_json_size_and_bytes_give_the_value_back(value: dict[str, Any]) -> None:
    config = canonical(value)
    assert config.size == json_size(value)
    assert parse(config.data) == value
    assert canonical(parse(config.data)).hash == config.hash  # stable across a round trip


@pytest.mark.parametrize("value", [
    {"tiny": 1e-05, "huge": 1e+22, "neg": -2.5e-07},  # exponents orjson spells otherwise
    {"": 5.96e-08, "e": 1e-7, "two": 2.5e-300, "big": 1.5e16},  # one-digit negative exponent (Hypothesis)
    {"big": 2**80, "neg": -(2**70)},  # beyond 64 bits: Python's json
    {"inf": float("inf"), "nan_free": None},  # orjson would write null for inf
    {"ctl": "\x00\x1f\x7f\u2028", "astral": "\U0001f600", "quote": '"\\'},
    {"lone": "\ud800x"},  # not from HTTP (refused there), but never a failure here
])
def test_edge_values(value: dict[str, Any]) -> None:
    config = canonical(value)
    assert config.size == json_size(value)
    back = parse(config.data)
    assert json.dumps(back, sort_keys=True) == json.dumps(value, sort_keys=True)


def test_same_config_same_hash_one_value_or_the_key_order_makes_another() -> None:
    base = {"data": {"users": {f"u{i}": {"name": f"n{i}", "age": i} for i in range(200)}}, "flag": True}
    same = json.loads(json.dumps(base))
    changed = json.loads(json.dumps(base))
    changed["data"]["users"]["u150"]["age"] = 151
    reordered = {"flag": True, "data": base["data"]}
    assert canonical(base).hash == canonical(same).hash
    assert canonical(changed).hash != canonical(base).hash
    assert canonical(reordered).hash != canonical(base).hash
    assert canonical({"a": 1}).hash != canonical({"a": 1.0}).hash != canonical({"a": True}).hash


def _env(env_id: str, digest: str | None, config: dict[str, Any] | None = None) -> models.Env:
    return models.Env(id=env_id, tenant="t", environment_id="e1", init_config=config or {}, init_config_hash=digest,
                      profile=None, episode=1, step=0, closed=False, created_at=NOW, last_used_at=NOW,
                      expires_at=NOW)


def _environment() -> models.Environment:
    return models.Environment(id="e1", tenant="t", name=None, class_name="C", source_code="", code_sha256="",
                              tools=[], description=None, created_at=NOW)


def test_stored_once_read_back_and_collected(database: Database) -> None:
    config = canonical({"data": {"k": "v" * 1000}, "n": 1})
    other = canonical({"data": {"k": "v" * 1000}, "n": 2})
    with database.write() as db:
        db.add(_environment())
        db.flush()
        for env_id, cfg in (("env1", config), ("env2", config), ("env3", other)):
            store_config(db, cfg)
            db.add(_env(env_id, cfg.hash))
        db.add(_env("old", None, {"legacy": True}))
    with database.read() as db:
        rows = db.execute(select(models.InitConfig.hash, models.InitConfig.data, models.InitConfig.size)).all()
        assert sorted(r.hash for r in rows) == sorted([config.hash, other.hash])
        assert {r.hash: zlib.decompress(r.data) for r in rows}[config.hash] == config.data
        cache = ConfigCache()
        assert env_config(db, db.get(models.Env, "env1"), cache) == config.value
        assert cache.cached(config.hash) == config.value  # parsed once, then from memory
        assert env_config(db, db.get(models.Env, "old"), cache) == {"legacy": True}
    with database.write() as db:
        assert collect_configs(db) == 0
        db.delete(db.get(models.Env, "env3"))
        db.delete(db.get(models.Env, "env1"))
    with database.write() as db:
        assert collect_configs(db) == 1  # `other` has no env left; `config` still has env2
        assert db.scalar(select(func.count()).select_from(models.InitConfig)) == 1
        with pytest.raises(MissingConfig):
            ConfigCache().get(db, other.hash)


def test_a_create_write_stores_a_config_once_and_leaves_a_stored_one_as_it_is(database: Database) -> None:
    """An env create stores its config through a Core connection (``CoreSession``), in
    the create's own transaction: the first write stores the row; a later one with the
    same hash (and other bytes offered) changes nothing and raises nothing."""
    config = canonical({"data": {"k": "v" * 500}, "n": 3})
    with database.write_connection() as conn:
        store_config(cast(DbSession, CoreSession(conn)), config)
    with database.write_connection() as conn:
        store_config(cast(DbSession, CoreSession(conn)), config, b"other bytes")
        store_config(cast(DbSession, CoreSession(conn)), config)  # twice in one transaction
    with database.read() as db:
        rows = db.execute(select(models.InitConfig.hash, models.InitConfig.data, models.InitConfig.size)).all()
    assert [(r.hash, zlib.decompress(r.data), r.size) for r in rows] == [(config.hash, config.data, config.size)]


def test_a_config_in_memory_is_known_by_its_hash_with_the_size_the_caps_measured(database: Database) -> None:
    """``ConfigCache.known``: a config in memory comes back with its value, hash and size
    (no canonical bytes: ``data`` is empty), whether it was put or read from the database;
    the size is the one stored, Python's compact JSON size, also where orjson's bytes are
    shorter (a float it spells ``0.00001``); a hash not in memory is None."""
    config = canonical({"tiny": 1e-05, "data": {"k": "v" * 200}})
    assert config.size != len(config.data)  # orjson's spelling is shorter than Python's
    with database.write_connection() as conn:
        store_config(cast(DbSession, CoreSession(conn)), config)
    put = ConfigCache()
    put.put(config)
    with database.read() as db:
        read = ConfigCache()
        assert read.known(config.hash) is None
        assert read.get(db, config.hash) == config.value
    for cache in (put, read):
        known = cache.known(config.hash)
        assert known is not None
        assert (known.value, known.hash, known.size, known.data) == (config.value, config.hash, config.size, b"")
    assert put.known("0" * HASH_HEX) is None


def test_cache_keeps_recent_configs_within_its_budget() -> None:
    cache = ConfigCache(max_bytes=100)
    configs = [canonical({"k": "x" * 30, "i": i}) for i in range(5)]
    for config in configs:
        cache.put(config)
    assert cache.cached(configs[0].hash) is None and cache.cached(configs[4].hash) == configs[4].value
    assert len(cache) == 2
    cache.put(canonical({"k": "y" * 200}))  # larger than the budget: not kept
    assert len(cache) == 2
