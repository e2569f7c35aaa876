"""Actions (:mod:`sandpit.api.envs.actions`): raw model output (EnvScaler's prompt
format), the three forms of a step request, malformed actions, size caps and argument
findings against a tool's derived schema."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from sandpit.api.envs.actions import (
    INVALID_ACTION,
    PARSE_FAILED,
    ToolCall,
    ToolSet,
    ToolSets,
    parse_step,
    parse_text,
)
from sandpit.api.errors import PayloadTooLarge, QuotaExceeded
from sandpit.api.schemas.envs import StepRequest


@pytest.mark.parametrize(("text", "error"), [
    ("<tool_call>{not json</tool_call>", "holds no JSON object"),  # no closing brace: no JSON object at all
    ("<tool_call>[1, 2]</tool_call>", "holds no JSON object"),
    ('<tool_call>"bump"</tool_call> and some words', "holds no JSON object"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>{"name": "bump"', "unclosed <tool_call>"),
    ("<think>never closed", "unclosed <think>"),
    ("   ", "empty"),
])
def test_malformed_calls_are_errors_not_replies(text: str, error: str) -> None:
    name, arguments, problem, _ = parse_text(text)
    assert name is None and arguments is None and problem is not None and error in problem


def test_replies_and_calls() -> None:
    assert parse_text("<think>ok</think> The counter is 5.")[:3] == ("chat_with_user", {"content": "The counter is 5."},
                                                                      None)
    assert parse_text('<tool_call>\n{"name": "bump", "arguments": {"by": 1}}\n</tool_call>')[:3] == (
        "bump", {"by": 1}, None)


# -- parse_step: the three forms of a step request ---------------------------------------------

CAP = 1024
DEPTH = 16


def parse(**body: Any) -> Any:
    return parse_step(StepRequest.model_validate(body), CAP, DEPTH)


def test_the_three_forms_give_the_same_call() -> None:
    plain = parse(name="bump", arguments={"by": 2})
    openai = parse(type="function", id="call_1", function={"name": "bump", "arguments": '{"by": 2}'})
    openai_object = parse(type="function", function={"name": "bump", "arguments": {"by": 2}})
    text = parse(text='<think>bump it</think><tool_call>{"name": "bump", "arguments": {"by": 2}}</tool_call>')
    for action in (plain, openai, openai_object, text):
        assert action.problem is None and action.call == ToolCall("bump", {"by": 2})
        assert action.record() == {"name": "bump", "arguments": {"by": 2}}
    assert text.reasoning == "bump it"
    assert parse(name="look").arguments == {} and parse(type="function", function={"name": "look",
                                                                                   "arguments": ""}).arguments == {}


def test_plain_text_is_a_reply_to_the_user() -> None:
    action = parse(text="All done, your order is placed.")
    assert action.call == ToolCall("chat_with_user", {"content": "All done, your order is placed."})


@pytest.mark.parametrize("body, problem, error", [
    ({"name": "bump", "arguments": [1, 2]}, PARSE_FAILED, "arguments must be a JSON object, got list"),
    ({"name": "bump", "arguments": "by=2"}, PARSE_FAILED, "arguments must be a JSON object, got str"),
    ({"type": "function", "function": {"name": "bump", "arguments": "{by: 2"}}, PARSE_FAILED,
     "function.arguments is not valid JSON"),
    ({"type": "function", "function": {"name": "bump", "arguments": "NaN"}}, PARSE_FAILED, "not valid JSON"),
    ({"text": "<tool_call>{\"name\": \"bump\"}</tool_call>"}, PARSE_FAILED, "needs fields 'name' and 'arguments'"),
    ({"text": "<think>unfinished"}, PARSE_FAILED, "unclosed <think> block"),
    ({"name": "_secret"}, INVALID_ACTION, "is private"),
    ({"name": "__class__"}, INVALID_ACTION, "is private"),
    ({"name": "not a name"}, INVALID_ACTION, "is not a tool name"),
    ({"name": "x" * 65}, INVALID_ACTION, "is not a tool name"),
    ({"name": ""}, INVALID_ACTION, "has no tool name"),
    ({"name": "bump", "arguments": {"k": "\ud800"}}, INVALID_ACTION, "lone surrogate"),
])
def test_malformed_actions_are_actions_with_a_problem(body: dict[str, Any], problem: str, error: str) -> None:
    action = parse(**body)
    assert action.problem == problem and error in (action.error or "")
    json.dumps(action.record(), ensure_ascii=False).encode("utf-8")  # always storable


def test_a_name_that_is_no_string_in_raw_text_is_a_parse_failure() -> None:
    action = parse(text='<tool_call>{"name": 7, "arguments": {}}</tool_call>')
    assert action.problem == PARSE_FAILED and action.error == "the tool name is not a string"


def test_arguments_over_the_cap_are_refused_not_recorded() -> None:
    with pytest.raises(PayloadTooLarge) as raised:
        parse(name="bump", arguments={"pad": "x" * CAP})
    assert raised.value.field == "arguments"
    with pytest.raises(PayloadTooLarge) as raised:
        parse(type="function", function={"name": "bump", "arguments": json.dumps({"pad": "x" * CAP})})
    assert raised.value.field == "function.arguments"
    with pytest.raises(PayloadTooLarge):
        parse(text="x" * (CAP + 1))


def test_the_tenant_quota_sees_the_size_within_the_cap() -> None:
    seen: list[int] = []

    def quota(size: int) -> None:
        seen.append(size)
        if size > 10:
            raise QuotaExceeded("over", limit="max_arguments_bytes", retry_after=1)

    assert parse_step(StepRequest(name="bump", arguments={}), CAP, DEPTH, quota).problem is None
    with pytest.raises(QuotaExceeded):
        parse_step(StepRequest(name="bump", arguments={"by": 123456}), CAP, DEPTH, quota)
    assert seen == [2, 13]


TOOLS = [
    {"type": "function", "function": {"name": "pay", "parameters": {
        "type": "object", "properties": {"amount": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["amount"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "loose", "parameters": {"type": "not-a-type"}}},
    {"type": "function", "function": {"name": "bare"}},
]


def test_argument_findings_against_the_derived_schema() -> None:
    tools = ToolSet(TOOLS)
    assert "pay" in tools and "nope" not in tools
    assert tools.findings(ToolCall("pay", {"amount": 5})) == []
    assert tools.findings(ToolCall("pay", {"amount": 5, "note": None})) == []  # null optional = absent
    findings = tools.findings(ToolCall("pay", {"amount": "5", "extra": 1}))
    assert any(f.startswith("arguments.amount: '5' is not of type 'integer'") for f in findings)
    assert any("extra" in f for f in findings)
    assert tools.findings(ToolCall("pay", {})) == ["arguments: 'amount' is a required property"]
    assert tools.findings(ToolCall("loose", {"x": 1})) == []  # an unusable schema: Python decides
    assert tools.findings(ToolCall("bare", {"x": 1})) == []
    assert tools.unknown("nope") == "unknown tool 'nope'; tools: bare, loose, pay"


def test_toolsets_compile_an_environment_once_and_keep_the_last_ones() -> None:
    tools = [{"type": "function", "function": {"name": "bump", "parameters": {"type": "object"}}}]
    toolsets = ToolSets(max_entries=2)
    first = toolsets.of(SimpleNamespace(id="envr_1", tools=tools))
    assert "bump" in first and toolsets.of(SimpleNamespace(id="envr_1", tools=[])) is first  # by id: compiled once
    toolsets.of(SimpleNamespace(id="envr_2", tools=[]))
    toolsets.of(SimpleNamespace(id="envr_3", tools=[]))  # over the bound: envr_1 (least recently used) goes
    again = toolsets.of(SimpleNamespace(id="envr_1", tools=tools))
    assert again is not first and "bump" in again
