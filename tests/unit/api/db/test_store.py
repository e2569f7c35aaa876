"""The content-addressed snapshot store (:mod:`sandpit.api.db.store`) on a real SQLite
file: round trips, buckets of large objects, de-duplication, legacy entries, collection."""

from __future__ import annotations

import base64
import json
import zlib
from datetime import UTC, datetime
from typing import Any

import pytest
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.db.store import (
    CHUNK_MIN_BYTES,
    CorruptState,
    PendingBlobs,
    StateCache,
    apply_delta,
    collect_garbage,
    encode_state,
    load_state,
)
from sqlalchemy import func, select

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def store(database: Database, state: dict[str, list[Any]]) -> StateCache:
    pending = PendingBlobs()
    cache = encode_state(state, pending)
    with database.write() as db:
        pending.write(db)
    return cache


def stored(database: Database, cache: StateCache) -> StateCache:
    with database.read() as db:
        return load_state(db, cache.root)


def blob_count(database: Database) -> int:
    with database.read() as db:
        return db.scalar(select(func.count()).select_from(models.Blob)) or 0


def big_records(n: int = 600) -> dict[str, Any]:
    return {f"R{i:04d}": {"name": f"record {i}", "pad": "x" * 64} for i in range(n)}


def test_small_values_round_trip_inline_and_keep_their_order(database: Database) -> None:
    state = {"count": ["j", 3], "names": ["j", ["b", "a"]], "cfg": ["j", {"z": 1, "a": None}]}
    cache = store(database, state)
    back = stored(database, cache)
    assert back.encoded() == state and list(back.encoded()["cfg"][1]) == ["z", "a"]
    assert back.root == cache.root
    assert all(attr.entry[0] == "ji" for attr in cache.attrs.values())


def test_opaque_and_unpicklable_values_are_kept_as_given_never_decoded(database: Database) -> None:
    pickled = base64.b64encode(b"\x80\x04not really a pickle").decode()
    state = {"when": ["p", pickled, {"$date": "2024-05-01"}], "lock": ["u", {"$object": {"type": "Lock"}}]}
    back = stored(database, store(database, state))
    assert back.encoded() == state


def test_a_large_object_is_bucketed_and_a_one_record_change_writes_one_bucket(database: Database) -> None:
    records = big_records()
    assert len(json.dumps(records)) > CHUNK_MIN_BYTES
    head = store(database, {"records": ["j", records], "count": ["j", 0]})
    entry = head.attrs["records"].entry
    assert entry[0] == "jt"
    with database.read() as db:
        node = json.loads(zlib.decompress(db.get(models.Blob, entry[1]).data))
    assert node["t"] == "d" and len(node["b"]) > 1 and node["r"] == []

    changed = dict(records)
    changed["R0007"] = {"name": "renamed", "pad": "y"}
    pending = PendingBlobs()
    after = apply_delta(head, {"records": ["j", changed]}, [], pending)
    assert len(pending.blobs) == 3  # the root, the node, the one changed bucket
    with database.write() as db:
        pending.write(db)
    back = stored(database, after)
    assert back.encoded()["records"][1] == changed
    assert list(back.encoded()["records"][1]) == list(changed)  # insertion order restored


def test_new_and_removed_keys_of_a_bucketed_object(database: Database) -> None:
    records = big_records()
    head = store(database, {"records": ["j", records]})
    grown = {**records, "NEW": {"name": "new"}}
    del grown["R0001"]
    pending = PendingBlobs()
    after = apply_delta(head, {"records": ["j", grown]}, [], pending)
    with database.write() as db:
        pending.write(db)
    assert stored(database, after).encoded()["records"][1] == grown


def test_apply_delta_without_changes_is_the_head_and_deletes_attributes(database: Database) -> None:
    head = store(database, {"a": ["j", 1], "b": ["j", 2]})
    assert apply_delta(head, {}, [], PendingBlobs()) is head
    pending = PendingBlobs()
    after = apply_delta(head, {"c": ["j", 3]}, ["a"], pending)
    with database.write() as db:
        pending.write(db)
    assert stored(database, after).encoded() == {"b": ["j", 2], "c": ["j", 3]}
    assert head.encoded() == {"a": ["j", 1], "b": ["j", 2]}  # the head is not modified


def test_identical_content_is_stored_once(database: Database) -> None:
    state = {"blob": ["j", "x" * 10_000], "records": ["j", big_records()]}
    first = store(database, state)
    count = blob_count(database)
    second = store(database, json.loads(json.dumps(state)))
    assert second.root == first.root and blob_count(database) == count


def test_legacy_manifests_load_as_legacy_entries(database: Database) -> None:
    raw = b"legacy pickle bytes"
    pending = PendingBlobs()
    digest = pending.add(raw)
    root = pending.add(json.dumps({"v": 1, "attrs": {"old": ["p", digest], "weird": ["u", "<Lock object>"]}}).encode())
    with database.write() as db:
        pending.write(db)
    with database.read() as db:
        back = load_state(db, root)
    assert back.encoded() == {"old": ["p", base64.b64encode(raw).decode()], "weird": ["u", "<Lock object>"]}


def test_a_missing_blob_is_a_corrupt_state(database: Database) -> None:
    with database.read() as db, pytest.raises(CorruptState):
        load_state(db, "0" * 32)


def test_malformed_encodings_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_state({"x": ["q", 1]}, PendingBlobs())
    with pytest.raises(ValueError):
        encode_state({"x": "not a list"}, PendingBlobs())  # type: ignore[dict-item]


def _reference(database: Database, root: str) -> None:
    with database.write() as db:
        db.add(models.Environment(id="envr_1", tenant="t", class_name="C", source_code="", code_sha256="0",
                                  tools=[], created_at=NOW))
        db.flush()
        db.add(models.Env(id="env_1", tenant="t", environment_id="envr_1", init_config={}, created_at=NOW,
                          last_used_at=NOW, expires_at=NOW))
        db.flush()
        db.add(models.Step(env_id="env_1", episode=1, step=0, observation="", status="ok", duration_ms=0.0,
                           state_root=root, created_at=NOW))


def test_garbage_collection_keeps_every_referenced_blob_and_deletes_the_rest(database: Database) -> None:
    kept_state = {"records": ["j", big_records()], "p": ["p", base64.b64encode(b"kept").decode(), "x" * 4000],
                  "u": ["u", {"$object": "y" * 4000}]}
    kept = store(database, kept_state)
    dropped = store(database, {"other": ["j", "z" * 5000]})
    _reference(database, kept.root)
    with database.write() as db:
        deleted = collect_garbage(db)
    assert deleted == 2  # the dropped root and its one value blob
    assert stored(database, kept).encoded() == kept_state
    with database.read() as db, pytest.raises(CorruptState):
        load_state(db, dropped.root)
    with database.write() as db:
        assert collect_garbage(db) == 0
