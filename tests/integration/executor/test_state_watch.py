"""The delta scan's write barrier (``sandbox_images/native/state_watch.c``), as the image
build compiled it: the module is copied out of the real sandbox image and loaded here
(the image's interpreter and the host's are both CPython 3.11 on Debian bookworm; on a
host whose extension suffix differs the module tests skip and say why).

* The module itself: every way of writing to a dict or a list, at any depth, makes
  ``unchanged`` False, and nothing else does; what it cannot watch gives None; hostile
  input (forged watches, cycles, depth, subclasses) gives None or TypeError, never a crash.
* ``child_delta`` with the module: every test of ``tests/unit/runner/test_child_delta.py``
  runs again with the barrier on (random mutations, aliasing, type-only changes, key
  order), and a bucket nothing wrote to is not re-marshalled.
"""

from __future__ import annotations

import gc
import importlib.util
import io
import sysconfig
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import docker
import pytest
from sandpit.sandbox_images.runner import child_delta

pytestmark = [pytest.mark.docker]

RUNNER_DIR = "/opt/sandpit/sandpit_runner"


@pytest.fixture(scope="session")
def state_watch(docker_client: docker.DockerClient, sandbox_image: str,
                tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """``state_watch`` copied out of the sandbox image and imported on the host."""
    container = docker_client.containers.create(sandbox_image, command=["true"], network_disabled=True,
                                                labels={"sandpit.test": "state_watch"})
    try:
        stream, _ = container.get_archive(RUNNER_DIR)
        data = b"".join(stream)
    finally:
        container.remove(force=True)
    names: list[str] = []
    out = tmp_path_factory.mktemp("state_watch")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive.getmembers():
            name = Path(member.name).name
            if name.startswith("state_watch.") and name.endswith(".so") and member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                (out / name).write_bytes(extracted.read())
                names.append(name)
    assert names, f"the sandbox image has no compiled state_watch in {RUNNER_DIR}"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if f"state_watch{suffix}" not in names:
        pytest.skip(f"the image's module {names} is not for this interpreter ({suffix})")
    spec = importlib.util.spec_from_file_location("state_watch", out / f"state_watch{suffix}")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the module ---------------------------------------------------------------------------

def _nested() -> dict[str, Any]:
    return {"a": {"b": [1, {"c": 2.5}], "t": (1, [2, 3], {"u": None})}, "s": "x", "n": [[], {}]}


WRITES = {
    "set a new value": lambda d: d["a"].__setitem__("b", [1]),
    "type only, 1 -> 1.0": lambda d: d["a"]["b"].__setitem__(0, 1.0),
    "type only, 1 -> True": lambda d: d["a"]["b"].__setitem__(0, True),
    "an equal new object": lambda d: d["a"]["b"][1].__setitem__("c", float("2.5")),
    "-0.0 for 0.0 at depth": lambda d: d["n"][1].__setitem__("z", -0.0),
    "delete a key": lambda d: d["a"].__delitem__("t"),
    "reorder keys": lambda d: d["a"].__setitem__("b", d["a"].pop("b")),
    "clear": lambda d: d["a"]["b"][1].clear(),
    "update": lambda d: d["a"]["b"][1].update(c=3),
    "setdefault of a new key": lambda d: d["a"]["b"][1].setdefault("new", 0),
    "popitem": lambda d: d["a"]["b"][1].popitem(),
    "list append": lambda d: d["n"][0].append(1),
    "list pop": lambda d: d["a"]["b"].pop(),
    "list item": lambda d: d["a"]["b"].__setitem__(1, {"c": 2.5}),
    "list reverse": lambda d: d["a"]["b"].reverse(),
    "list sort": lambda d: d["a"]["t"][1].sort(reverse=True),
    "list insert": lambda d: d["a"]["t"][1].insert(0, 0),
    "list slice delete": lambda d: d["a"]["t"][1].__delitem__(slice(None)),
    "list inside a tuple": lambda d: d["a"]["t"][1].append(4),
    "dict inside a tuple": lambda d: d["a"]["t"][2].__setitem__("u", 0),
    "dict inside a list of lists": lambda d: d["n"][1].__setitem__("k", "v"),
    "update of an empty dict": lambda d: d["n"][1].update({"k": 1}),
    "dict __init__ again": lambda d: d["a"]["b"][1].__init__({"c": 3}),
    "list *= 2": lambda d: d["a"]["b"].__imul__(2),
    "list __init__ again": lambda d: d["a"]["b"].__init__([1]),
    "extended slice": lambda d: d["a"]["t"][1].__setitem__(slice(None, None, 2), [7]),
}


@pytest.mark.parametrize("write", list(WRITES), ids=list(WRITES))
def test_every_write_at_any_depth_is_seen(state_watch: ModuleType, write: str) -> None:
    data = _nested()
    roots = (data, data["a"]["b"])
    watch = state_watch.watch(roots)
    assert watch is not None
    assert state_watch.unchanged(watch, roots)
    WRITES[write](data)
    assert not state_watch.unchanged(watch, (data, data["a"]["b"]) if "b" in data["a"] else roots)


def test_reads_and_writes_of_identical_content_are_not_changes(state_watch: ModuleType) -> None:
    data = _nested()
    roots = [data, "leaf", 7]
    watch = state_watch.watch(roots)
    assert watch is not None
    _ = (list(data), data.get("a"), "a" in data, len(data["a"]["b"]), dict(data), data["a"]["b"][:], repr(data))
    data["a"]["b"][1]["c"] = data["a"]["b"][1]["c"]  # the same object again: nothing changed
    data["a"]["t"][1][:] = list(data["a"]["t"][1])  # the same items in the same order
    assert state_watch.unchanged(watch, roots)
    assert state_watch.unchanged(watch, (data, "leaf", 7))  # a list or a tuple of the same objects


def test_the_roots_must_be_the_same_objects(state_watch: ModuleType) -> None:
    data = _nested()
    watch = state_watch.watch((data, 1.5))
    assert not state_watch.unchanged(watch, (_nested(), 1.5))  # equal, but another object
    assert not state_watch.unchanged(watch, (data,))
    assert not state_watch.unchanged(watch, (data, 1.5, None))
    assert not state_watch.unchanged(watch, (data, float("1.5")))


def test_a_freed_leaf_cannot_come_back_at_the_same_address(state_watch: ModuleType) -> None:
    # the watch holds references: a replaced value is never freed, so its address cannot
    # be reused by a new object that would then compare as "the same item"
    items = [float(f"{i}.5") for i in range(1000)]
    watch = state_watch.watch((items,))
    for i in range(1000):
        items[i] = float(f"{i}.25")
        assert not state_watch.unchanged(watch, (items,))
        items[i] = float(f"{i}.5")  # equal content, new objects: reported, the caller compares


@pytest.mark.parametrize("value", [
    {1, 2}, frozenset({1}), bytearray(b"x"), type("D", (dict,), {})(), type("L", (list,), {})(), object(),
    [{"deep": [{"set": {1}}]}], {"k": (1, {2})}, {(1, 2): 3, frozenset(): 4},
], ids=["set", "frozenset", "bytearray", "dict-subclass", "list-subclass", "instance", "set-deep",
        "set-in-tuple", "frozenset-key"])
def test_what_it_cannot_watch_gives_none(state_watch: ModuleType, value: Any) -> None:
    assert state_watch.watch((value,)) is None


def test_cycles_and_deep_nesting_give_none(state_watch: ModuleType) -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    looped: dict[str, Any] = {}
    looped["me"] = {"again": looped}
    assert state_watch.watch((cycle,)) is None
    assert state_watch.watch((looped,)) is None
    deep: Any = 0
    for _ in range(64):  # containers at depths 0..63 are watched
        deep = [deep]
    assert state_watch.watch((deep,)) is not None
    assert state_watch.watch(([deep],)) is None
    very: Any = {}
    for _ in range(100_000):  # far past the C stack if it recursed without a limit
        very = {"x": very}
    assert state_watch.watch((very,)) is None


def test_finalizers_that_change_the_state_while_it_is_watched_cannot_crash_it(state_watch: ModuleType) -> None:
    # watch() allocates (a tuple per list), so the garbage collector may run inside it, and
    # a finalizer of the session's own code may drop the last other reference to what is
    # being followed: every object on the way is held while it is followed
    state = {f"k{i}": [{"v": [i]}, [i]] for i in range(400)}
    ran: list[int] = []

    class Saboteur:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            ran.append(1)
            for key in list(state)[:8]:
                del state[key]
            if len(ran) < 40:
                Saboteur()  # garbage for the next collection, further into the walk

    old = gc.get_threshold()
    gc.disable()
    Saboteur()
    try:
        gc.set_threshold(1)
        gc.enable()
        watch = state_watch.watch((state,))
    finally:
        gc.set_threshold(*old)
        gc.enable()
    assert len(ran) > 1  # finalizers ran during the walk, not only before it
    state["new"] = [1]
    assert watch is None or not state_watch.unchanged(watch, (state,))


def test_scalars_of_every_kind_are_leaves(state_watch: ModuleType) -> None:
    values = ("s", "ü" * 10, b"b", 0, 2**200, -1.5, -0.0, float("nan"), True, None, 1j, ())
    assert state_watch.watch(values) is not None
    assert state_watch.unchanged(state_watch.watch(values), values)


@pytest.mark.parametrize("args", [
    (), (1,), (None, ()), ((1, 2), ()), ("watch", ()), ((), (), ()),
], ids=["none", "one", "none-watch", "short-tuple", "str", "three"])
def test_misuse_is_a_type_error(state_watch: ModuleType, args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        state_watch.unchanged(*args)


def test_forged_watches_are_refused_not_read(state_watch: ModuleType) -> None:
    data = {"a": [1]}
    real = state_watch.watch((data,))
    assert real is not None
    roots, dicts, tags, lists, snaps = real
    forged = [
        (roots, (None,) * len(dicts), tags, lists, snaps),  # not dicts where dicts are read
        (roots, (object(),), b"\0" * 8, lists, snaps),
        (roots, dicts, tags[:-1], lists, snaps),  # tags of the wrong length
        (roots, dicts, tags, (None,), snaps),  # not a list
        (roots, dicts, tags, lists, ([1],)),  # a snapshot that is not a tuple
        (roots, dicts, tags, lists, ()),
        ([data], dicts, tags, lists, snaps),
        (roots, list(dicts), tags, lists, snaps),
        (roots, dicts, bytearray(tags), lists, snaps),
    ]
    for watch in forged:
        with pytest.raises(TypeError):
            state_watch.unchanged(watch, roots)
    with pytest.raises(TypeError):
        state_watch.unchanged(real, {"a": 1})
    with pytest.raises(TypeError):
        state_watch.watch({"a": 1})
    with pytest.raises(TypeError):
        state_watch.watch(None)
    assert state_watch.unchanged(real, (data,))  # the real one still works


def test_dirty_checks_every_bucket_of_a_node_in_one_call(state_watch: ModuleType) -> None:
    table = {f"k{i}": {"v": i, "l": [i]} for i in range(10)}
    buckets = [["k0", "k1", "k2"], ["k3", "k4"], ["k5", "k6", "k7"], ["k8", "k9"]]
    watches = [state_watch.watch(tuple(table[k] for k in bucket)) for bucket in buckets]
    watches[3] = None  # no watch: always dirty
    assert state_watch.dirty(watches, table, buckets) == [3]
    table["k4"]["v"] = 4.0  # written to at depth
    table["k6"] = {"v": 6, "l": [6]}  # an equal new object under a key
    assert state_watch.dirty(watches, table, buckets) == [1, 2, 3]
    del table["k0"]  # a key gone
    assert state_watch.dirty(watches, table, buckets) == [0, 1, 2, 3]
    items = [[i] for i in range(9)]
    spans = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    watches = [state_watch.watch(items[span[0]:span[-1] + 1]) for span in spans]
    assert state_watch.dirty(watches, items, spans) == []
    items[4].append(0)
    items.pop()  # the last span now runs past the end
    assert state_watch.dirty(watches, items, spans) == [1, 2]
    assert state_watch.dirty([], {}, []) == []


class Key(str):  # a str subclass: hashing it may run code, so it is never looked up
    def __hash__(self) -> int:
        raise AssertionError("dirty() hashed a key that is not an exact str")


@pytest.mark.parametrize("args", [
    ([None], {}, []), ([], {}, [[]]), ((), {}, []), ([None], {}, ([],)), ([None], set(), [[]]),
    ([None], type("D", (dict,), {})(), [[]]), ([("x",)], {}, [[]]), ([()], {}, [[]]),
    ([None], {}),
], ids=["fewer-buckets", "fewer-watches", "tuple-watches", "tuple-buckets", "set-node", "dict-subclass-node",
        "forged-watch", "empty-watch", "two-args"])
def test_dirty_refuses_what_it_is_not_given(state_watch: ModuleType, args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        state_watch.dirty(*args)


def test_dirty_never_hashes_a_key_that_is_not_an_exact_str(state_watch: ModuleType) -> None:
    key = Key("k")
    table = {"a": 1}
    watch = state_watch.watch(({"x": 1},))
    assert state_watch.dirty([watch], table, [[key]]) == [0]  # reported, not looked up
    with pytest.raises(TypeError):
        state_watch.dirty([watch], [1], [["0"]])  # a list node's bucket holds int indexes
    with pytest.raises(TypeError):
        state_watch.dirty([watch], table, ["a"])  # a bucket is a list


# -- child_delta with the module ----------------------------------------------------------

@pytest.fixture
def barrier(state_watch: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``child_delta`` scans with the write barrier, as in the sandbox."""
    monkeypatch.setattr(child_delta, "state_watch", state_watch)
    yield state_watch


def _load_delta_tests() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "unit" / "runner" / "test_child_delta.py"
    spec = importlib.util.spec_from_file_location("child_delta_tests_with_barrier", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DELTA_TESTS = _load_delta_tests()
for _name in dir(_DELTA_TESTS):
    if _name.startswith("test_"):
        globals()[f"{_name}__with_the_write_barrier"] = pytest.mark.usefixtures("barrier")(getattr(_DELTA_TESTS, _name))


def test_a_bucket_nothing_wrote_to_is_not_marshalled_again(barrier: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    wire = _DELTA_TESTS.Wire(data=_DELTA_TESTS.big())
    tree = wire.session.cache["data"][1]
    assert all(w is not None for sub in tree.subs.values() for w in sub.watches)
    marshalled: list[Any] = []
    real = child_delta._marshal
    monkeypatch.setattr(child_delta, "_marshal", lambda value: marshalled.append(value) or real(value))
    assert wire.sync()["set"] == {}
    assert marshalled == []  # nothing written: no bucket re-marshalled
    wire.state["data"]["users"]["R0007"]["nested"]["x"]["y"] = 7.0  # type only, at depth
    wire.sync()
    assert wire.ops() == [["s", ["users", "R0007", "nested", "x", "y"], 7.0]]
    assert len(marshalled) == 1  # only the written record's bucket
    marshalled.clear()
    wire.state["data"]["orders"]["R0001"] = wire.state["data"]["orders"]["R0001"]  # same object: no write
    assert wire.sync()["set"] == {}
    assert marshalled == []
