"""Declared tools without a server: the request schema's validation and normalization
(``EnvironmentCreate.tools``), the differences computed on the host from two JSON
schemas, and reading the sandbox probe's answer as data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from sandpit.api.schemas.environments import MAX_DECLARED_TOOLS, EnvironmentCreate, ToolDifference
from sandpit.api.services.declared_tools import (
    MAX_DIFFERENCES,
    PROBE_MARK,
    agent_tools,
    read_probe,
    schema_type,
    tool_differences,
)


def create(tools: Any) -> EnvironmentCreate:
    return EnvironmentCreate.model_validate({"source_code": "class A:\n    pass\n", "class_name": "A", "tools": tools})


def wrapped(name: str, description: str = "", properties: dict[str, Any] | None = None,
            required: list[str] | None = None, more: bool = False) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties or {}, "required": required or []}
    if more:
        parameters["additionalProperties"] = True
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def error_locations(tools: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as caught:
        create(tools)
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in caught.value.errors()]


# -- the request schema ------------------------------------------------------------------------
def test_wrapped_bare_and_flat_forms_are_stored_wrapped_with_the_keys_given() -> None:
    given = wrapped("book", "Book it.", {"day": {"type": ["string", "null"]}}, ["day"])
    body = create([given, {"name": "cancel", "parameters": {"type": "object"}},
                   {"type": "function", "name": "peek", "description": "Look.", "strict": True}])
    assert body.declared_tools() == [
        given,
        {"type": "function", "function": {"name": "cancel", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "peek", "description": "Look.", "strict": True}}]
    assert create(None).declared_tools() is None
    assert create([]).declared_tools() == []


@pytest.mark.parametrize(("tools", "where", "says"), [
    ('[{"type": "function"}]', "tools", "valid list"),  # JSON text is not JSON: the API takes values
    ({"name": "x"}, "tools", "valid list"),
    ([5], "tools.0", "valid dictionary"),
    ([{"name": "has space"}], "tools.0.function.name", "pattern"),
    ([{"name": "_private"}], "tools.0.function.name", "pattern"),
    ([{"name": "x" * 65}], "tools.0.function.name", "pattern"),
    ([{"name": "ok", "extra": 1}], "tools.0.function.extra", "Extra inputs"),
    ([{"type": "other", "function": {"name": "ok"}}], "tools.0.type", "function"),
    ([{"name": "ok", "parameters": "{}"}], "tools.0.function.parameters", "valid dictionary"),
    ([{"name": "ok", "parameters": {"type": "array"}}], "tools.0.function.parameters", '"type": "object"'),
    ([{"name": "ok", "parameters": {"type": "object", "properties": {"a": {"type": "strnig"}}}}],
     "tools.0.function.parameters", "not a JSON Schema"),
    ([{"name": "ok", "parameters": {"type": "object", "required": "a"}}], "tools.0.function.parameters",
     "not a JSON Schema"),
    ([{"name": "ok", "parameters": {"type": "object", "properties": {f"p{i}": {} for i in range(129)}}}],
     "tools.0.function.parameters", "at most 128"),
    ([{"name": "ok", "description": 5}], "tools.0.function.description", "valid string"),
    ([{"name": "ok", "description": "x" * 16_001}], "tools.0.function.description", "at most 16000"),
    ([{"name": "dup"}, {"name": "dup"}], "tools", "declared twice"),
    ([{"name": f"t{i}"} for i in range(10_000)], "tools", f"at most {MAX_DECLARED_TOOLS}"),
])
def test_malformed_declared_tools_are_refused_naming_the_part(tools: Any, where: str, says: str) -> None:
    problems = error_locations(tools)
    assert any(loc == where and says in msg for loc, msg in problems), problems


def test_the_tools_all_together_are_capped() -> None:
    big = [{"name": f"t{i}", "description": "x" * 15_000} for i in range(300)]  # 4.5 MB of descriptions
    assert any("bytes of tools" in msg for _, msg in error_locations(big))


# -- differences -------------------------------------------------------------------------------
def test_schema_type_merges_unions_and_reads_array_items() -> None:
    assert schema_type({"type": "string", "default": "a"}) == "string"
    assert schema_type({"type": ["string", "null"]}) == ["null", "string"]
    assert schema_type({"anyOf": [{"type": "integer"}, {"type": "string"}]}) == ["integer", "string"]
    assert schema_type({"anyOf": [{"type": "integer"}, {}]}) is None
    assert schema_type({}) is None and schema_type(True) is None and schema_type("junk") is None
    assert schema_type({"type": "array", "items": {"type": "string"}}) == "array[string]"
    assert schema_type({"type": "array", "items": {}}) == "array"
    assert schema_type({"type": "array", "items": {"type": "array", "items": {"type": ["integer", "null"]}}}) \
        == "array[array[integer|null]]"


def test_differences_name_each_kind() -> None:
    declared = [
        wrapped("book", "Book a visit.\n\nReturns:\n    dict", {"patient": {"type": "string"},
                "urgent": {"type": "boolean"}, "note": {"type": ["string", "null"]}, "ghost": {"type": "string"}},
                ["patient", "urgent"]),
        wrapped("same", "Same  text.", {"a": {"type": "integer"}}, ["a"]),
        wrapped("helper", "A callable attribute."),
        wrapped("loose", "", {"x": {"type": "string"}}),
    ]
    derived = [
        wrapped("book", "Book a visit.", {"patient": {"type": "string", "description": ""},
                "urgent": {"type": "boolean", "default": False}, "note": {"type": "string", "default": None},
                "day": {"type": "string"}}, ["patient", "day"]),
        wrapped("same", "Same text.", {"a": {"type": "integer", "description": "an int"}}, ["a"]),
        wrapped("loose", "", {}, [], more=True),
        wrapped("hours", "Opening hours."),
    ]
    found = tool_differences(declared, derived, frozenset({"helper"}))
    for difference in found:
        ToolDifference.model_validate(difference)  # what the API serves
    assert [(d["tool"], d["kind"], d.get("parameter"), d["severity"]) for d in found] == [
        ("book", "description", None, "info"),
        ("book", "required", "urgent", "info"),
        ("book", "type", "note", "info"),
        ("book", "parameter_extra", "ghost", "warning"),
        ("book", "parameter_missing", "day", "info"),
        ("helper", "not_a_method", None, "warning"),
        ("loose", "parameter_extra", "x", "info"),  # the method takes **kwargs
        ("hours", "undeclared", None, "warning"),
    ]
    assert found[1]["declared"] is True and found[1]["derived"] is False
    assert (found[2]["declared"], found[2]["derived"]) == (["null", "string"], "string")
    assert found[4]["derived"] is True  # the missing parameter is required by the method
    assert tool_differences(derived, derived) == []


def test_differences_are_capped_and_descriptions_cut() -> None:
    declared = [wrapped(f"t{i}", "a" * 2000, {f"p{j}": {"type": "string"} for j in range(10)}) for i in range(500)]
    derived = [wrapped(f"t{i}", "b") for i in range(500)]
    found = tool_differences(declared, derived)
    assert len(found) == MAX_DIFFERENCES + 1 and found[-1]["kind"] == "truncated"
    assert found[-1]["declared"] == 500 * 11 - MAX_DIFFERENCES
    assert len(found[0]["declared"]) == 500


def test_differences_of_hostile_schemas_do_not_raise() -> None:
    declared: list[Any] = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object",
                           "properties": {"x": {"anyOf": "junk"}, "y": {"type": 5}}, "required": [1, None]}}},
                           {"type": "function", "function": "junk"}, "junk"]
    derived = [wrapped("a", "", {"x": {"type": "string"}, "y": {"type": "string"}})]
    kinds = [(d["kind"], d.get("parameter")) for d in tool_differences(declared, derived)]
    assert kinds == [("type", "x"), ("type", "y")]


# -- what the agent is shown, the probe's answer -----------------------------------------------
class Row:
    def __init__(self, tools: list[dict[str, Any]], declared: list[dict[str, Any]] | None) -> None:
        self.tools, self.declared_tools = tools, declared


def test_agent_tools_are_the_declared_ones_when_there_are_some() -> None:
    derived, declared = [wrapped("a")], [wrapped("b")]
    assert agent_tools(Row(derived, None)) == derived
    assert agent_tools(Row(derived, declared)) == declared
    assert agent_tools(Row(derived, [])) == []  # declared as none: the agent is shown none
    shown = agent_tools(Row(derived, declared))
    shown.append(wrapped("c"))
    assert len(declared) == 1


def test_the_probe_answer_is_read_as_data() -> None:
    answer = PROBE_MARK + json.dumps({"instance": True, "names": {"a": "callable", "b": "missing"}})
    assert read_probe(f"noise\n{PROBE_MARK}not json\n{answer}\n", ["a", "b", "c"]) == {
        "a": "callable", "b": "missing", "c": "unknown"}
    assert read_probe("", ["a"]) == {"a": "unknown"}
    assert read_probe(PROBE_MARK + "[1, 2]", ["a"]) == {"a": "unknown"}
    assert read_probe(PROBE_MARK + json.dumps({"names": {"a": "x" * 500}}), ["a"])["a"] == "x" * 100
