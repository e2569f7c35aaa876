"""Path-level deltas of large JSON attributes (``child_delta.py``) and their application
(``protocol.apply_keyed`` v2), on the host, without a sandbox: a session child object over a
trusted test class (our code), its delta sent through JSON like the wire, applied to a
snapshot kept like PID 1's and the host's. After every change the applied snapshot must
be *exactly* the instance's state: same types (``1``, ``1.0``, ``True`` differ), same key
order, at every depth."""

from __future__ import annotations

import datetime
import json
import random
from typing import Any

import pytest
from sandpit.sandbox_images.runner import child_delta, limits, wire
from sandpit.sandbox_images.runner import child_session as child
from sandpit.sandbox_images.runner.protocol import apply_keyed, apply_path_ops


def exact(a: Any, b: Any) -> bool:
    """Equal with types and key order (``==`` alone says ``1 == 1.0 == True``)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(exact(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float and a == 0.0:
        return str(a) == str(b)
    return bool(a == b)


class Holder:  # trusted test class: our code, run on the host on purpose
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class Wire:
    """A session child plus the snapshot PID 1 / the host keep from its deltas."""

    def __init__(self, **attrs: Any) -> None:
        self.session = child.Session.__new__(child.Session)
        self.session.instance, self.session.cache, self.session.limits = Holder(**attrs), {}, {}
        self.snapshot: dict[str, list[Any]] = json.loads(self.session.delta_json(full=True))["set"]
        self.last: dict[str, Any] = {}

    @property
    def state(self) -> Any:
        return self.session.instance.__dict__

    def sync(self) -> dict[str, Any]:
        """One call's delta through JSON; returns it after checking the snapshot is exact."""
        delta = json.loads(self.session.delta_json())
        for name, entry in delta["set"].items():
            if entry[0] == "k":
                before = json.loads(json.dumps(self.snapshot[name]))
                applied = apply_keyed(self.snapshot[name], entry[1])
                assert applied is not None, entry
                assert exact(self.snapshot[name], before)  # the base was not modified
                entry = applied
            self.snapshot[name] = entry
        for name in delta["del"]:
            del self.snapshot[name]
        for name, value in self.state.items():
            if self.snapshot[name][0] == "j":
                assert exact(self.snapshot[name][1], value), name
        assert list(self.snapshot) == list(self.state)
        self.last = delta
        return delta

    def ops(self, name: str = "data") -> list[Any]:
        entry = self.last["set"].get(name)
        assert entry is not None and entry[0] == "k", entry
        ops: list[Any] = entry[1]["ops"]
        return ops


def records(n: int = 400) -> dict[str, Any]:
    return {f"R{i:04d}": {"id": i, "tags": ["a", "b"], "nested": {"x": {"y": i}}, "pad": "p" * 80} for i in range(n)}


def big() -> dict[str, Any]:
    return {"users": records(), "orders": records(300), "meta": {"count": 1}}


def test_unchanged_state_sends_nothing_and_one_nested_change_sends_its_path() -> None:
    wire = Wire(data=big(), small=1)
    assert wire.sync() == {"set": {}, "del": []}
    wire.state["data"]["orders"]["R0007"]["nested"]["x"]["y"] = "changed"
    wire.sync()
    assert wire.ops() == [["s", ["orders", "R0007", "nested", "x", "y"], "changed"]]


def test_the_node_comparison_ignores_reference_counts_but_not_types() -> None:
    """``_marshal_equal`` compares a live value with one fresh from ``marshal.loads``: equal
    content must compare equal although only the live one shares its strings (the
    default marshal version marks shared objects, and such walks went down to every
    scalar), and exact differences must still compare unequal."""
    import marshal

    shared = "".join(["shared", "-value"])  # one string object (not a constant) under many keys
    live = {"a": {"k": shared, "n": [shared, 1, 2.5]}, "b": [{"k": shared}] * 3}
    loaded = marshal.loads(marshal.dumps(live))  # noqa: S302 - our own bytes
    assert marshal.dumps(live) != marshal.dumps(loaded)  # what made the old comparison fail
    assert child_delta._marshal_equal(live, loaded)
    assert child_delta._same_node(live, loaded)
    for a, b in [({"x": 1}, {"x": 1.0}), ({"x": 1}, {"x": True}), ({"x": 0.0}, {"x": -0.0}),
                 ([[1, 2]], [(1, 2)]), ({"x": 1, "y": 2}, {"y": 2, "x": 1}), ([None], [0]),
                 ({"x": "1"}, {"x": 1}), ([1, 2], [1, 2, 3])]:
        assert not child_delta._marshal_equal(a, b), (a, b)

    class Sub(dict):  # trusted test class
        pass

    assert not child_delta._marshal_equal({"x": {}}, {"x": Sub()})
    assert not child_delta._same_node({"x": 1}, Sub(x=1))


@pytest.mark.parametrize("values", [[1, 1.0, True, 1, False, 0, 0.0, -0.0, None, "1"]])
def test_type_only_changes_at_depth_are_seen(values: list[Any]) -> None:
    wire = Wire(data=big())
    target = wire.state["data"]["users"]["R0100"]["nested"]["x"]
    for value in values:
        target["y"] = value
        wire.sync()
        assert wire.ops() == [["s", ["users", "R0100", "nested", "x", "y"], value]]
        assert type(wire.snapshot["data"][1]["users"]["R0100"]["nested"]["x"]["y"]) is type(value)


def test_deletions_additions_and_reordering_of_keys() -> None:
    wire = Wire(data=big())
    users = wire.state["data"]["users"]
    del users["R0003"]
    users["NEW"] = {"k": 1}
    wire.sync()
    assert sorted(wire.ops()) == [["d", ["users", "R0003"]], ["s", ["users", "NEW"], {"k": 1}]]
    record = users["R0005"]
    users["R0005"] = dict(reversed(list(record.items())))  # same content, keys reordered
    wire.sync()
    assert wire.ops() == [["s", ["users", "R0005"], users["R0005"]]]
    del users["R0006"]  # a key deleted and added again moves to the end: the node is set whole
    users["R0006"] = {"back": True}
    wire.sync()
    reordered = dict(wire.state["data"])  # the top level reordered
    wire.state["data"] = {"meta": reordered["meta"], "orders": reordered["orders"], "users": reordered["users"]}
    wire.sync()
    assert list(wire.snapshot["data"][1]) == ["meta", "orders", "users"]


def test_lists_grow_shrink_and_reorder_at_depth() -> None:
    wire = Wire(data=big())
    tags = wire.state["data"]["users"]["R0001"]["tags"]
    tags.append("c")
    wire.sync()
    assert wire.ops() == [["r", ["users", "R0001", "tags"], 2, ["c"]]]
    tags.pop(0)
    wire.sync()
    tags.reverse()
    wire.sync()
    tags.clear()
    wire.sync()
    tags.extend(range(50))
    wire.sync()
    random.Random(1).shuffle(tags)  # noqa: S311 - deterministic test data
    wire.sync()


def test_a_large_list_attribute_is_tracked_element_by_element() -> None:
    log = [{"n": i, "text": "t" * 60} for i in range(2000)]
    wire = Wire(log=log)
    log[1500]["n"] = 1500.0
    wire.sync()
    assert wire.ops("log") == [["s", [1500, "n"], 1500.0]]
    log.append({"n": -1})
    wire.sync()
    assert wire.ops("log") == [["r", [], 2000, [{"n": -1}]]]
    del log[:10]
    wire.sync()
    log.insert(0, "head")
    wire.sync()


def test_aliasing_under_two_attributes_and_two_keys_shows_the_change_under_every_name() -> None:
    shared = {"value": 1, "pad": "x" * 100}
    data = big()
    data["users"]["R0001"] = shared
    data["orders"]["R0002"] = shared
    wire = Wire(data=data, alias=shared, twin=data)  # twin: the whole tree under two names
    shared["value"] = 2.0
    wire.sync()
    assert wire.snapshot["alias"] == ["j", {"value": 2.0, "pad": "x" * 100}]
    assert wire.snapshot["data"][1]["users"]["R0001"]["value"] == 2.0
    assert wire.snapshot["data"][1]["orders"]["R0002"]["value"] == 2.0
    assert wire.snapshot["twin"][1]["orders"]["R0002"]["value"] == 2.0
    assert type(wire.snapshot["twin"][1]["users"]["R0001"]["value"]) is float


def test_a_dict_replaced_by_a_list_and_back() -> None:
    wire = Wire(data=big())
    wire.state["data"]["users"]["R0001"] = [1, 2, {"a": None}]
    wire.sync()
    wire.state["data"]["users"]["R0001"] = {"a": [1]}
    wire.sync()
    wire.state["data"]["users"] = list(wire.state["data"]["users"].values())  # a large node turns into a list
    wire.sync()
    wire.state["data"]["users"] = {"only": 1}
    wire.sync()
    wire.state["data"] = [wire.state["data"]]
    wire.sync()


def test_a_non_json_value_deep_inside_makes_the_attribute_pickled_then_json_again() -> None:
    wire = Wire(data=big())
    wire.state["data"]["orders"]["R0001"]["when"] = datetime.date(2024, 5, 1)
    delta = wire.sync()
    kind, _blob, rendering = delta["set"]["data"]
    assert kind == "p" and rendering["orders"]["R0001"]["when"] == {"$date": "2024-05-01"}
    wire.state["data"]["orders"]["R0001"]["when"] = "2024-05-01"
    assert wire.sync()["set"]["data"][0] == "j"
    wire.state["data"]["orders"]["R0002"]["tags"] = {"a", "b"}  # a set: marshal can write it, JSON cannot
    assert wire.sync()["set"]["data"][0] == "p"
    wire.state["data"]["orders"]["R0002"]["tags"] = ["a"]
    wire.sync()
    wire.state["data"]["orders"]["R0003"]["x"] = (1, 2)  # a tuple would come back as a list: not JSON
    assert wire.sync()["set"]["data"][0] == "p"
    del wire.state["data"]["orders"]["R0003"]["x"]
    wire.sync()
    wire.state["data"]["orders"]["R0003"]["$tag"] = 1
    wire.state["data"]["orders"]["R0004"] = {"$set": [1]}  # reads like a rendering tag
    assert wire.sync()["set"]["data"][0] == "p"


def test_hostile_values_cycles_depth_and_huge_keys() -> None:
    wire = Wire(data=big())
    orders = wire.state["data"]["orders"]
    orders["R0001"]["self"] = orders["R0001"]  # a cycle
    kind = wire.sync()["set"]["data"][0]
    assert kind == "p"
    del orders["R0001"]["self"]
    assert wire.sync()["set"]["data"][0] == "j"
    deep: Any = "bottom"
    for _ in range(limits.JSON_NATIVE_MAX_DEPTH):
        deep = [deep]
    orders["R0002"]["deep"] = deep  # past JSON_NATIVE_MAX_DEPTH below the attribute
    assert wire.sync()["set"]["data"][0] == "p"
    orders["R0002"]["deep"] = deep[0][0][0][0][0][0]  # within the limit again
    assert wire.sync()["set"]["data"][0] == "j"
    huge = "k" * 1_000_000
    orders[huge] = {huge: huge}
    wire.sync()
    assert wire.ops() == [["s", ["orders", huge], {huge: huge}]]
    orders[1] = "int key"  # type: ignore[index]
    assert wire.sync()["set"]["data"][0] == "p"


def test_many_changes_fall_back_to_the_whole_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_delta, "MAX_PATH_OPS", 100)
    wire = Wire(data=big())
    for record in wire.state["data"]["users"].values():
        record["id"] = -1
        record["tags"].append("z")
        record["nested"]["x"]["y"] = None
    delta = wire.sync()
    assert delta["set"]["data"][0] == "j"  # more than MAX_PATH_OPS operations


def test_random_mutations_keep_the_snapshot_exact() -> None:
    rng = random.Random(14)  # noqa: S311 - deterministic test data
    wire = Wire(data=big())
    scalars = [0, 1, 1.0, True, False, None, "s", -0.0, 2**70, "ü"]
    for _ in range(150):
        root = wire.state["data"]
        table = root[rng.choice(["users", "orders"])]
        key = rng.choice(list(table))
        record = table[key]
        move = rng.randrange(8)
        nested, tags = record["nested"], record["tags"]
        if move == 0 and isinstance(nested, dict):
            nested["x"]["y"] = rng.choice(scalars)
        elif move == 1 and isinstance(tags, list):
            tags.append(rng.choice(scalars))
        elif move == 2 and isinstance(tags, list) and tags:
            tags.pop(rng.randrange(len(tags)))
        elif move == 3:
            del table[key]
        elif move == 4:
            table[f"N{rng.randrange(10**6)}"] = {"id": rng.choice(scalars), "tags": [], "nested": {"x": {"y": 0}}}
        elif move == 5:
            table[key] = dict(reversed(list(record.items())))
        elif move == 6:
            record["nested"] = [nested] if isinstance(nested, dict) else nested[0]
        else:
            record["tags"] = {str(i): v for i, v in enumerate(tags)} if isinstance(tags, list) else list(tags.values())
        wire.sync()


@pytest.mark.parametrize("ops", [
    "nope", [["x", []]], [["s"]], [["s", "path", 1]], [["d", []]], [["d", ["missing"]]], [["s", ["a", "b", "c"], 1]],
    [["s", [0], 1]], [["s", ["list", 5], 1]], [["s", ["list", True], 1]], [["r", ["a"], 0, []]],
    [["r", ["list"], 9, []]], [["r", ["list"], -1, []]], [["r", ["list"], 0, "x"]], [["s", ["a"] * 101, 1]],
    [["d", ["list", 0]]],
])
def test_malformed_path_operations_are_refused(ops: Any) -> None:
    base = ["j", {"a": 1, "list": [1, 2]}]
    assert apply_keyed(base, {"v": 2, "ops": ops}) is None
    assert base == ["j", {"a": 1, "list": [1, 2]}]


def test_path_operations_copy_only_the_changed_path() -> None:
    base = {"left": {"deep": [1, {"x": 1}]}, "right": {"untouched": [1]}}
    after = apply_path_ops(base, [["s", ["left", "deep", 1, "x"], 2], ["r", ["left", "deep"], 1, [3]],
                                  ["s", ["new"], {}], ["d", ["new"]]])
    assert after == {"left": {"deep": [1, 3]}, "right": {"untouched": [1]}}
    assert after["right"] is base["right"] and base["left"]["deep"] == [1, {"x": 1}]
    assert apply_path_ops(base, [["s", [], [1]]]) == [1]


def test_ops_refuse_values_that_are_not_json() -> None:
    ops = child_delta.Ops(child._dumps, wire.json_native)
    with pytest.raises(child_delta.Abort):
        ops.set(["a"], {1, 2})
    with pytest.raises(child_delta.Abort):
        ops.resize(["a"], 0, [datetime.date(2024, 1, 1)])


def test_many_operations_on_one_large_list_apply_in_place_after_one_copy() -> None:
    base = {"log": list(range(100_000))}
    ops = [["r", ["log"], 100_000 + i, [i]] for i in range(5_000)] + [["s", ["log", 0], "first"]]
    after = apply_path_ops(base, ops)
    assert after["log"][:2] == ["first", 1] and after["log"][-1] == 4_999 and len(after["log"]) == 105_000
    assert len(base["log"]) == 100_000 and base["log"][0] == 0  # the base is untouched


def test_a_growing_table_is_re_bucketed_and_stays_exact() -> None:
    wire = Wire(data={"users": records(400)})
    first = len(wire.session.cache["data"][1].subs["users"].members)
    for step in range(40):
        for i in range(200):
            wire.state["data"]["users"][f"G{step:02d}{i:03d}"] = {"id": i, "tags": [step]}
        wire.sync()
        assert len(wire.ops()) == 200  # one "s" per new record, whatever the layout
    wire.state["data"]["users"]["G05007"]["tags"].append(1.0)  # a change after the re-layout
    wire.sync()
    assert wire.ops() == [["r", ["users", "G05007", "tags"], 1, [1.0]]]
    members = len(wire.session.cache["data"][1].subs["users"].members)
    assert first < members and 4 * members >= child_delta._bucket_count(8400)
