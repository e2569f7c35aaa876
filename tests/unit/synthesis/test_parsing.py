"""Reading model output (code blocks, JSON, class shape) and prompt templates."""

from __future__ import annotations

import pytest
from sandpit.synthesis import prompts
from sandpit.synthesis.parsing import (
    MalformedOutput,
    assemble_class,
    extract_code,
    extract_function,
    extract_json,
    find_class,
    json_object,
    parse_module,
)


def test_extract_code_takes_the_first_python_or_untagged_block() -> None:
    text = "intro\n```json\n{}\n```\n```python\nx = 1\n```\n```\ny = 2\n```"
    assert extract_code(text) == "x = 1\n"
    assert extract_code("```\ny = 2\n```") == "y = 2\n"
    with pytest.raises(MalformedOutput, match="no ```python code block"):
        extract_code("class A: pass")
    with pytest.raises(MalformedOutput):
        extract_code("```python\n   \n```")


@pytest.mark.parametrize("text, value", [
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ('{"a": [1, 2]}', {"a": [1, 2]}),
    ('Sure! Here it is: {"a": {"b": 2}} hope that helps', {"a": {"b": 2}}),
    ("[1, 2, 3]", [1, 2, 3]),
])
def test_extract_json(text: str, value: object) -> None:
    assert extract_json(text) == value


def test_extract_json_and_json_object_report_malformed_answers() -> None:
    with pytest.raises(MalformedOutput, match="not JSON"):
        extract_json("I think the environment is a library.")
    with pytest.raises(MalformedOutput, match="expected a JSON object"):
        json_object("[1]", {"a": int})
    with pytest.raises(MalformedOutput, match="lacks the key 'stateful'"):
        json_object('{"x": 1}', {"stateful": bool})
    with pytest.raises(MalformedOutput, match="must be of type"):
        json_object('{"n": true}', {"n": int})


def test_python_is_parsed_never_run(tmp_path) -> None:
    marker = tmp_path / "marker"
    source = f"open({str(marker)!r}, 'w').write('x')\nclass A:\n    pass\n"
    find_class(parse_module(source), "A")
    assert not marker.exists()
    with pytest.raises(MalformedOutput, match="syntax error at line 1"):
        parse_module("def f(:\n")
    with pytest.raises(MalformedOutput, match="classes found: A"):
        find_class(parse_module(source), "B")
    with pytest.raises(MalformedOutput, match="null bytes"):
        parse_module("x = 1\0")


def test_extract_function_and_assemble_class() -> None:
    method = extract_function("```python\nimport os\n\ndef get(self, key: str) -> str:\n    return key\n```", "get")
    assert method.startswith("def get(self") and "import os" not in method
    with pytest.raises(MalformedOutput, match="functions found: other"):
        extract_function("```python\ndef other(self):\n    pass\n```", "get")
    definition = "from typing import Dict\n\nclass Shop:\n    def __init__(self, init_config: dict):\n        self.items = {}\n\nVERSION = 1\n"
    code = assemble_class(definition, "Shop", [method])
    tree = parse_module(code)
    assert [n.name for n in find_class(tree, "Shop").body] == ["__init__", "get"]
    assert code.rstrip().endswith("VERSION = 1")
    with pytest.raises(MalformedOutput, match="'Store'"):
        assemble_class(definition, "Store", [method])


def test_every_prompt_template_loads_and_renders() -> None:
    for name, version in prompts.VERSIONS.items():
        prompt = prompts.load(name)
        assert prompt.version == version
        assert prompt.system.startswith(f"# sandpit-prompt {name} v{version}")
    messages = prompts.render("judge_stateful", task="Book a {json} table for $5")
    assert messages[0]["role"] == "system" and "Book a {json} table for $5" in messages[1]["content"]
    with pytest.raises(prompts.PromptError, match="no value for 'task'"):
        prompts.render("judge_stateful")
    with pytest.raises(prompts.PromptError, match="unknown prompt"):
        prompts.load("nope")
    with pytest.raises(prompts.PromptError, match="not found"):
        prompts.load("judge_stateful", 99)
