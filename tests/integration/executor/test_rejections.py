"""Calls that are not tool calls are ``rejected`` without running environment code, and
the session carries on unharmed."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker

SHOP = '''
class Shop:
    currency = "EUR"  # public class attribute, not callable

    def __init__(self, init_config):
        self.items = {"pen": 2}
        self.getter_runs = 0
        self._token = "private"

    def buy(self, item, qty=1):
        self.items[item] -= qty
        return self.items[item]

    def _restock(self):
        self.items = {"pen": 1000}
        return "restocked"

    @property
    def inventory(self):
        self.getter_runs += 1  # would show up in the state if the getter ran
        return lambda: dict(self.items)

    class Receipt:
        pass
'''


@pytest.mark.parametrize("name,arguments", [
    ("__class__", {}),
    ("__init__", {"init_config": {}}),
    ("__reduce_ex__", {"protocol": 2}),
    ("_restock", {}),
    ("_token", {}),
    ("currency", {}),  # public but not callable (class attribute)
    ("items", {}),  # public instance attribute
    ("does_not_exist", {}),
    ("inventory", {}),  # a property, even one returning a callable
    ("Receipt", {}),  # a nested class is not a tool
    ("buy.__globals__", {}),
    ("x" * 200, {}),
    ("buy", ["pen"]),  # arguments must be an object
    ("buy", "pen"),
    ("buy", {"item": float("nan")}),  # not JSON
    ("buy", {"item": float("inf")}),
    ("buy", {"item": object()}),
    ("buy", {1: "pen"}),  # non-string key
])
def test_rejected_calls_leave_the_session_working(open_env, name, arguments) -> None:
    session = open_env(source=SHOP, class_name="Shop")
    before = session.state()
    result = session.call(name, arguments)
    assert result.status == "rejected", result
    assert result.observation.startswith("Error: ")
    assert result.delta.set == {} and result.delta.deleted == []
    assert session.state() == before == {"items": {"pen": 2}, "getter_runs": 0, "_token": "private"}
    ok = session.call("buy", {"item": "pen"})
    assert (ok.status, ok.observation, ok.recovered) == ("ok", "1", False)


def test_unknown_keyword_argument_is_an_error_observation(open_env) -> None:
    session = open_env(source=SHOP, class_name="Shop")
    result = session.call("buy", {"item": "pen", "colour": "red"})
    assert result.status == "error"
    assert result.observation.startswith("Error: TypeError"), result.observation
    assert session.call("buy", {"item": "pen"}).observation == "1"
