"""State trees of the snapshot store (:mod:`sandpit.api.db.store`) on a real SQLite file:
large JSON values stored as nodes bucketed at any depth. Every stored state must load back
*exactly* (types, key order), whether a step arrives copy-on-write (the executor's path
deltas: untouched subtrees are the same objects) or as a whole new value; a step that
changes one record deep down writes a few small blobs; old ``jd`` manifests still load;
garbage collection keeps every node a step refers to."""

from __future__ import annotations

import copy
import json
import zlib
from datetime import UTC, datetime
from typing import Any

import pytest
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.db.store import (
    CorruptState,
    PendingBlobs,
    StateCache,
    apply_delta,
    collect_garbage,
    encode_state,
    load_state,
)
from sandpit.sandbox_images.runner.protocol import apply_path_ops
from sqlalchemy import func, select

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def exact(a: Any, b: Any) -> bool:
    """Equal with types and key order."""
    return json.dumps(a) == json.dumps(b) and type(a) is type(b)


def deep_exact(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(deep_exact(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(deep_exact(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and str(a) == str(b)


def state_tables(n: int = 800) -> dict[str, Any]:
    return {"users": {f"U{i:04d}": {"id": i, "orders": [f"O{i}"], "address": {"city": "Austin", "zip": f"{i:05d}"},
                                    "pad": "p" * 200} for i in range(n)},
            "orders": {f"O{i:04d}": {"id": i, "status": "pending", "items": [{"price": 1.5, "qty": 1}] * 3,
                                     "pad": "q" * 200} for i in range(n)},
            "config": {"flag": True}}


class Chain:
    """A head state in the store, stepped with path operations (copy-on-write, like the
    executor) or whole values, written to SQLite and loaded back after every step."""

    def __init__(self, database: Database, **state: Any) -> None:
        self.database = database
        pending = PendingBlobs()
        self.head = encode_state({k: ["j", v] for k, v in state.items()}, pending)
        self.write(pending)
        self.roots = [self.head.root]

    def write(self, pending: PendingBlobs) -> int:
        with self.database.write() as db:
            before = db.scalar(select(func.coalesce(func.sum(func.length(models.Blob.data)), 0)))
            pending.write(db)
            after = db.scalar(select(func.coalesce(func.sum(func.length(models.Blob.data)), 0)))
        return int(after or 0) - int(before or 0)

    def value(self, name: str) -> Any:
        return self.head.attrs[name].encoded[1]

    def ops(self, name: str, ops: list[Any]) -> int:
        return self.whole(name, apply_path_ops(self.value(name), ops))

    def whole(self, name: str, value: Any) -> int:
        pending = PendingBlobs()
        self.head = apply_delta(self.head, {name: ["j", value]}, [], pending)
        written = self.write(pending)
        self.roots.append(self.head.root)
        self.check()
        return written

    def load(self, root: str) -> StateCache:
        with self.database.read() as db:
            return load_state(db, root)

    def check(self) -> None:
        back = self.load(self.head.root)
        assert list(back.attrs) == list(self.head.attrs)
        for name, attr in self.head.attrs.items():
            assert deep_exact(back.attrs[name].encoded[1], attr.encoded[1]), name


def test_a_deep_change_writes_the_path_and_one_bucket(database: Database) -> None:
    chain = Chain(database, data=state_tables(), count=0)
    assert chain.head.attrs["data"].entry[0] == "jt"
    pending = PendingBlobs()
    changed = apply_path_ops(chain.value("data"), [["s", ["orders", "O0100", "status"], "cancelled"]])
    chain.head = apply_delta(chain.head, {"data": ["j", changed]}, [], pending)
    assert len(pending.blobs) == 5  # root, data node, orders node, one bucket... and nothing else
    assert chain.write(pending) < 20_000
    chain.check()


@pytest.mark.parametrize("value", [1, 1.0, True, 0, 0.0, -0.0, None, False, "1", 2**80, [1], {"1": 1}])
def test_type_only_changes_at_depth_round_trip(database: Database, value: Any) -> None:
    chain = Chain(database, data=state_tables())
    chain.ops("data", [["s", ["users", "U0001", "address", "zip"], value]])
    back = chain.load(chain.head.root).encoded()["data"][1]["users"]["U0001"]["address"]["zip"]
    assert type(back) is type(value) and deep_exact(back, value)
    # the same step arriving as a whole new value (no shared objects): compared exactly
    whole = json.loads(json.dumps(chain.value("data")))
    whole["users"]["U0001"]["address"]["zip"] = 1.0 if value == 1 and type(value) is not float else 1
    chain.whole("data", whole)


def test_deletions_additions_and_reordering(database: Database) -> None:
    chain = Chain(database, data=state_tables())
    chain.ops("data", [["d", ["users", "U0003"]], ["s", ["users", "NEW"], {"a": 1}]])
    assert list(chain.value("data")["users"])[-1] == "NEW"
    users = chain.value("data")["users"]
    reordered = dict(reversed(list(users.items())))
    chain.ops("data", [["s", ["users"], reordered]])
    assert list(chain.load(chain.head.root).encoded()["data"][1]["users"])[0] == "NEW"
    record = chain.value("data")["orders"]["O0001"]
    chain.ops("data", [["s", ["orders", "O0001"], dict(reversed(list(record.items())))]])
    whole = json.loads(json.dumps(chain.value("data")))
    whole["orders"] = dict(sorted(whole["orders"].items(), reverse=True))  # reordered, not shared
    chain.whole("data", whole)


def test_lists_grow_shrink_reorder_and_large_lists(database: Database) -> None:
    log = [{"n": i, "text": "t" * 100} for i in range(3000)]
    chain = Chain(database, data=state_tables(), log=log)
    assert chain.head.attrs["log"].entry[0] == "jt"
    chain.ops("log", [["r", [], 3000, [{"n": -1}]]])
    assert chain.ops("log", [["s", [10, "n"], 10.0]]) < 20_000
    chain.ops("log", [["r", [], 2500, []]])
    chain.whole("log", list(reversed(chain.value("log"))))
    chain.whole("log", [])
    chain.whole("log", [[i] * 50 for i in range(2000)])
    chain.ops("data", [["r", ["users", "U0002", "orders"], 0, list(range(100))]])


def test_a_dict_replaced_by_a_list_and_back(database: Database) -> None:
    chain = Chain(database, data=state_tables())
    users = chain.value("data")["users"]
    chain.ops("data", [["s", ["users"], list(users.values())]])
    chain.ops("data", [["s", ["users"], users]])
    chain.whole("data", list(chain.value("data").values()))
    chain.whole("data", {"back": chain.value("data")})


def test_aliased_subtrees_and_identical_content(database: Database) -> None:
    tables = state_tables()
    tables["copy"] = tables["users"]  # one object under two keys
    chain = Chain(database, data=tables, twin=tables)
    changed = apply_path_ops(chain.value("data"), [["s", ["users", "U0001", "id"], -1],
                                                   ["s", ["copy", "U0001", "id"], -1]])
    pending = PendingBlobs()
    chain.head = apply_delta(chain.head, {"data": ["j", changed], "twin": ["j", changed]}, [], pending)
    chain.write(pending)
    chain.check()
    back = chain.load(chain.head.root).encoded()
    assert back["data"][1]["copy"]["U0001"]["id"] == -1 and back["twin"][1]["users"]["U0001"]["id"] == -1


def test_every_stored_step_loads_as_it_was(database: Database) -> None:
    chain = Chain(database, data=state_tables())
    expected = [copy.deepcopy(chain.value("data"))]
    for i in range(12):
        chain.ops("data", [["s", ["orders", f"O{i:04d}", "status"], i], ["d", ["users", f"U{i:04d}"]]])
        expected.append(copy.deepcopy(chain.value("data")))
    for root, value in zip(chain.roots, expected, strict=True):
        assert deep_exact(chain.load(root).encoded()["data"][1], value)


def test_hostile_values_deep_nesting_and_huge_keys(database: Database) -> None:
    deep: Any = "bottom"
    for _ in range(250):
        deep = {"d": deep, "pad": "x" * 200}
    huge = "k" * 200_000
    chain = Chain(database, data=state_tables(), deep=deep)
    chain.ops("data", [["s", ["users", huge], {huge: [huge]}]])
    chain.ops("deep", [["s", ["d"] * 90 + ["pad"], 1.0]])
    chain.whole("deep", [deep, deep])
    with pytest.raises(ValueError):
        chain.whole("data", {**chain.value("data"), "users": {1: "int key", **{f"k{i}": "v" * 100 for i in range(500)}}})


def test_legacy_bucketed_manifests_load_and_the_next_step_writes_a_tree(database: Database) -> None:
    records = {f"R{i}": {"v": i} for i in range(300)}
    pending = PendingBlobs()
    buckets = [pending.add(json.dumps({k: records[k] for k in list(records)[:150]}).encode()),
               pending.add(json.dumps({k: records[k] for k in list(records)[150:]}).encode())]
    listing = pending.add(json.dumps(buckets).encode())
    order = pending.add(json.dumps(list(reversed(list(records)))).encode())
    root = pending.add(json.dumps({"v": 1, "attrs": {"records": ["jd", listing, order], "n": ["ji", 1]}}).encode())
    with database.write() as db:
        pending.write(db)
    with database.read() as db:
        legacy = load_state(db, root)
    assert list(legacy.encoded()["records"][1]) == list(reversed(list(records)))
    pending = PendingBlobs()
    grown = {**legacy.encoded()["records"][1], "new": {"v": 0.5}} | {f"P{i}": "x" * 100 for i in range(400)}
    after = apply_delta(legacy, {"records": ["j", grown]}, [], pending)
    assert after.attrs["records"].entry[0] == "jt"
    with database.write() as db:
        pending.write(db)
    with database.read() as db:
        assert deep_exact(load_state(db, after.root).encoded()["records"][1], grown)


def _reference(database: Database, roots: list[str]) -> None:
    with database.write() as db:
        db.add(models.Environment(id="envr_1", tenant="t", class_name="C", source_code="", code_sha256="0",
                                  tools=[], created_at=NOW))
        db.flush()
        db.add(models.Env(id="env_1", tenant="t", environment_id="envr_1", init_config={}, created_at=NOW,
                          last_used_at=NOW, expires_at=NOW))
        db.flush()
        for number, root in enumerate(roots):
            db.add(models.Step(env_id="env_1", episode=1, step=number, observation="", status="ok", duration_ms=0.0,
                               state_root=root, created_at=NOW))


def test_garbage_collection_keeps_nested_nodes_of_every_step(database: Database) -> None:
    chain = Chain(database, data=state_tables())
    for i in range(4):
        chain.ops("data", [["s", ["orders", f"O{i:04d}", "items", 0, "qty"], i + 10]])
    kept = chain.roots[::2]
    _reference(database, kept)
    with database.write() as db:
        deleted = collect_garbage(db)
    assert deleted > 0
    for root in kept:
        chain.load(root)  # every blob of a referenced step is still there
    with database.read() as db, pytest.raises(CorruptState):
        load_state(db, chain.roots[1])
    with database.write() as db:
        assert collect_garbage(db) == 0


def test_a_malformed_node_is_a_corrupt_state(database: Database) -> None:
    pending = PendingBlobs()
    node = pending.add(json.dumps({"t": "d", "b": [pending.add(b'[["k", "not an ordinal", 1]]')], "r": []}).encode())
    other = pending.add(json.dumps({"t": "x", "b": [], "r": []}).encode())
    roots = [pending.add(json.dumps({"v": 2, "attrs": {"a": ["jt", h]}}).encode()) for h in (node, other)]
    with database.write() as db:
        pending.write(db)
    for root in roots:
        with database.read() as db, pytest.raises(CorruptState):
            load_state(db, root)
    assert zlib.decompress(zlib.compress(b"x")) == b"x"


def test_values_the_fast_codec_refuses_round_trip_through_json(database: Database) -> None:
    deep: Any = "bottom"
    for _ in range(280):  # past orjson's nesting limit
        deep = [deep]
    chain = Chain(database, data=state_tables(), odd=["x" * 3000, "\ud800", 2**100, deep])
    chain.ops("data", [["s", ["users", "U0001", "id"], 2**90], ["s", ["users", "U0002", "pad"], "lone \udfff"]])
    back = chain.load(chain.head.root).encoded()
    assert back["data"][1]["users"]["U0001"]["id"] == 2**90 and back["odd"][1][1] == "\ud800"
