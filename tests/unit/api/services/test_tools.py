"""Raw model output to an action (`sandpit.api.services.tools.parse_text`, EnvScaler's prompt format)."""

from __future__ import annotations

import pytest
from sandpit.api.services.tools import parse_text


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
