"""The fake executor's own derivations (``executor/fake_tools.py``): tool schemas from test
tools' signatures and docstrings, and the state encoding of values, in the sandbox's shapes
(checked by the host's own validator, ``check_tool_schemas``), without importing any code
that runs beside untrusted code."""

from __future__ import annotations

import datetime
import decimal
import json
import threading
from typing import Any

import pytest
from sandpit.executor import fake_tools
from sandpit.executor.results import check_encoded, check_tool_schemas
from sandpit.sandbox_images.runner import limits


def book(state: dict[str, Any], guest: str, nights: int = 1, note: str | None = None,
         tags: list[str] | None = None, extra: dict[str, int] | None = None, ratio: float = 0.5,
         when: datetime.date | None = None, *rest: int, **more: object) -> str:
    """Book a room
    for a guest.

    Args:
        guest: who stays.
        nights (int): how many nights,
            at least one.
        note: free text.

    Returns:
        A confirmation.
    """
    return guest


def bare(state: dict[str, Any], flag: bool, unknown: threading.Lock, *, key: str = "k", cap=set()) -> None:  # noqa: B006
    pass


def test_schemas_follow_the_sandbox_rules_for_plain_tools() -> None:
    tools = check_tool_schemas(fake_tools.describe_tools({"book": book, "bare": bare, "_hidden": bare,
                                                          "bad-name": bare}))
    assert [t["function"]["name"] for t in tools] == ["book", "bare"]  # private and invalid names left out
    booked = tools[0]["function"]
    assert booked["description"] == "Book a room for a guest."
    assert booked["parameters"]["required"] == ["guest"] and booked["parameters"]["additionalProperties"] is True
    properties = booked["parameters"]["properties"]
    assert list(properties) == ["guest", "nights", "note", "tags", "extra", "ratio", "when"]  # no *rest, **more
    assert properties["guest"] == {"type": "string", "description": "who stays."}
    assert properties["nights"] == {"type": "integer", "description": "how many nights, at least one.", "default": 1}
    assert properties["note"] == {"type": "string", "description": "free text.", "default": None}
    assert properties["tags"]["type"] == "array" and properties["extra"]["type"] == "object"
    assert properties["ratio"]["type"] == "number" and "type" not in properties["when"]  # no JSON type for a date
    plain = tools[1]["function"]["parameters"]
    assert plain["required"] == ["flag", "unknown"] and plain["additionalProperties"] is False
    assert plain["properties"]["flag"] == {"type": "boolean", "description": ""}
    assert "type" not in plain["properties"]["unknown"] and "default" not in plain["properties"]["cap"]


def test_too_many_tools_are_refused() -> None:
    with pytest.raises(fake_tools.TooManyTools, match=str(limits.MAX_TOOLS)):
        fake_tools.describe_tools({f"t{i}": bare for i in range(limits.MAX_TOOLS + 1)})
    assert len(fake_tools.describe_tools({f"t{i}": bare for i in range(limits.MAX_TOOLS)})) == limits.MAX_TOOLS


class Room:
    def __init__(self) -> None:
        self.number = 7
        self.guests = ("a", "b")


def test_values_encode_as_the_sandbox_encodes_them() -> None:
    listed = {"a": [1, {"b": None}]}
    entry = fake_tools.encode_value(listed)
    assert entry == ["j", listed] and entry[1] is not listed  # a copy
    cases = {
        "set": ({3, 1, 2}, {"$set": [1, 2, 3]}),
        "frozenset": (frozenset({"x"}), {"$frozenset": ["x"]}),
        "tuple": ((1, (2,)), {"$tuple": [1, {"$tuple": [2]}]}),
        "bytes": (b"\x00\xff", {"$bytes": "AP8="}),
        "date": (datetime.date(2024, 5, 1), {"$date": "2024-05-01"}),
        "datetime": (datetime.datetime(2024, 5, 1, 10), {"$datetime": "2024-05-01T10:00:00"}),
        "decimal": (decimal.Decimal("1.10"), {"$decimal": "1.10"}),
        "nan": (float("nan"), {"$float": "nan"}),
        "int keys": ({1: "one"}, {"$dict": [[1, "one"]]}),
        "a tag-like dict": ({"$set": [1]}, {"$dict": [["$set", [1]]]}),
        "object": (Room(), {"$object": {"type": f"{__name__}.Room", "attrs": {"number": 7, "guests": {"$tuple": ["a", "b"]}}}}),
    }
    for name, (value, rendering) in cases.items():
        entry = fake_tools.encode_value(value)
        assert entry[0] == "p" and entry[2] == rendering, name
        json.dumps(entry, allow_nan=False)  # what is stored is JSON
    lock = fake_tools.encode_value(threading.Lock())
    assert lock[0] == "u" and lock[1]["$repr"]["type"].endswith("lock")
    check_encoded({name: fake_tools.encode_value(value) for name, (value, _) in cases.items()}, "state")


def test_deep_and_cyclic_values_render_without_recursing_forever() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    entry = fake_tools.encode_value(cycle)
    assert entry[0] == "p"  # pickles; its rendering is cut at the depth limit
    deep: Any = ()
    for _ in range(limits.RENDER_MAX_DEPTH + 5):
        deep = (deep,)
    json.dumps(fake_tools.render(deep))
