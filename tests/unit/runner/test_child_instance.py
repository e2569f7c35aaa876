"""``child_instance`` (imported, never run as a process here): EnvScaler's instance from a
config, the keys it reports as retyped, and the host's reading of what a sandbox reports
of them (``results.check_retyped``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from sandpit.executor.results import check_retyped
from sandpit.sandbox_images.runner import child_instance as child
from sandpit.sandbox_images.runner import limits


class Shop:
    def __init__(self, init_config: dict[str, Any]) -> None:
        self.orders = {o["id"]: o for o in init_config.get("orders", [])}
        self.tags: defaultdict[str, list[str]] = defaultdict(list)
        self.count = 0
        self.ratio = 0.5
        self.flag = False
        self.user = None


def test_only_constructed_attributes_replaced_by_another_type_are_found() -> None:
    config = {"orders": [{"id": "a"}], "tags": {}, "count": 1.5, "ratio": 2, "flag": 0, "user": "x", "new": []}
    found: list[dict[str, str]] = []
    instance = child.instantiate(Shop, config, found)
    assert found == [{"key": "orders", "constructed": "dict", "config": "list"},
                     {"key": "tags", "constructed": "defaultdict", "config": "dict"},
                     {"key": "flag", "constructed": "bool", "config": "int"}]
    assert vars(instance)["orders"] == [{"id": "a"}]  # EnvScaler's rule is unchanged


def test_without_a_list_or_a_config_nothing_is_compared() -> None:
    assert vars(child.instantiate(Shop, {"orders": []}))["orders"] == []
    found: list[dict[str, str]] = []
    child.instantiate(Shop, {}, found)
    assert found == []


class Meta(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise RuntimeError("hostile")


class Odd(metaclass=Meta):
    pass


class Slots:
    __slots__ = ("a",)

    def __init__(self, init_config: dict[str, Any]) -> None:
        self.a = 1


class Hostile:
    def __init__(self, init_config: dict[str, Any]) -> None:
        self.odd = Odd()
        for i in range(100):
            setattr(self, f"k{i}", i)


def test_hostile_instances_are_bounded_and_run_no_environment_code() -> None:
    config: dict[str, Any] = {"odd": 1, **{f"k{i}": str(i) for i in range(100)}}
    found = child.retyped_attributes(Hostile({}), config)
    assert found[0] == {"key": "odd", "constructed": "Odd", "config": "int"}  # no metaclass property ran
    assert len(found) == limits.INIT_RETYPED_MAX
    assert child.retyped_attributes(Slots({}), {"a": "x"}) == []
    long = "k" * 5000
    obj = Shop({})
    obj.__dict__[long] = 1
    assert child.retyped_attributes(obj, {long: "s"})[0]["key"] == "k" * limits.INIT_RETYPED_NAME_CHARS


def test_the_host_keeps_only_well_formed_bounded_entries() -> None:
    good = {"key": "a", "constructed": "dict", "config": "list"}
    assert check_retyped(None) == check_retyped("x") == check_retyped({"key": "a"}) == []
    assert check_retyped([good, {"key": 1, "constructed": "a", "config": "b"}, "junk", {"key": "b"}]) == [good]
    assert len(check_retyped([good] * 1000)) == limits.INIT_RETYPED_MAX
    assert check_retyped([{**good, "key": "x" * 10_000}])[0]["key"] == "x" * limits.INIT_RETYPED_NAME_CHARS


def test_instantiate_follows_envscaler_init_env_instance() -> None:
    class WithConfig:  # trusted test classes: our code, run on the host on purpose
        def __init__(self, init_config):
            self.seen = dict(init_config)

    class NoArgs:
        def __init__(self):
            self.ready = True

    class Raises:
        def __init__(self, init_config):
            raise TypeError("a bug inside __init__")

    with_config = child.instantiate(WithConfig, {"a": 1})
    assert vars(with_config) == {"seen": {"a": 1}, "a": 1}  # and every key is set as an attribute
    assert vars(child.instantiate(WithConfig, {})) == {"seen": {}}  # cls({}) for an empty config
    assert vars(child.instantiate(NoArgs, {"b": 2})) == {"ready": True, "b": 2}  # TypeError -> cls() + setattr
    with pytest.raises(TypeError, match="missing 1 required"):  # any TypeError falls back to cls(), as in
        child.instantiate(Raises, {"c": 3})  # EnvScaler, whose own error then propagates
