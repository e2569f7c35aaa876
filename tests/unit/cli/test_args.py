"""How ``sandpit envs step`` and the ``JSON|@file`` options read their input (no server)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from sandpit.api_cli import json_object, json_or_text, json_value, text_value
from sandpit.envs_cli import _arguments, _includes, format_action


@pytest.mark.parametrize(("raw", "value"), [
    ("5", 5), ("-1.5", -1.5), ("true", True), ("null", None), ('["a", 1]', ["a", 1]), ('{"k": 1}', {"k": 1}),
    ('"5"', "5"), ("Ada", "Ada"), ("", ""), ("NaN", "NaN"), ("Infinity", "Infinity"), ("{oops", "{oops"),
    ("a=b", "a=b"), ("[" * 100_000, "[" * 100_000),
])
def test_key_value_values_are_json_when_they_parse(raw: str, value: object) -> None:
    assert json_or_text(raw) == value


def test_pairs_lay_over_args_and_non_objects_go_as_given() -> None:
    assert _arguments(["by=2", "name=Ada", "tags=[1]"], None) == {"by": 2, "name": "Ada", "tags": [1]}
    assert _arguments(["by=2", "x=y=z"], {"by": 1, "keep": True}) == {"by": 2, "keep": True, "x": "y=z"}
    assert _arguments([], None) == {}
    assert _arguments([], [1, 2]) == [1, 2]  # the server records it as a rejected step
    assert _arguments([], "text") == "text"
    for pairs, args in ((["novalue"], None), (["=1"], None), (["a=1"], [1])):
        with pytest.raises(typer.BadParameter):
            _arguments(pairs, args)


def test_includes() -> None:
    assert _includes(["state,state_diff"]) == ["state_diff", "state"]
    assert _includes(["state", " state_diff ", "state"]) == ["state_diff", "state"]
    assert _includes(None) == []
    with pytest.raises(typer.BadParameter, match="diff"):
        _includes(["diff"])


def test_json_options(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"count": 1}')
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    assert json_object(f"@{tmp_path / 'config.json'}") == {"count": 1}
    assert json_value("[1]") == [1]
    assert text_value("plain") == "plain" and text_value(f"@{tmp_path / 'config.json'}") == '{"count": 1}'
    for raw, message in (("{bad", "not valid JSON"), ('{"a": NaN}', "NaN"), ("[" * 100_000, "not valid JSON"),
                         (f"@{tmp_path / 'missing.json'}", "cannot read"), (f"@{tmp_path / 'binary'}", "not UTF-8"),
                         (f"@{tmp_path}", "cannot read")):
        with pytest.raises(typer.BadParameter, match=message):
            json_value(raw)
    with pytest.raises(typer.BadParameter, match="JSON object"):
        json_object("[1]")


def test_format_action() -> None:
    assert format_action({"name": "bump", "arguments": {"by": 2, "who": "Ada"}}) == 'bump(by=2, who="Ada")'
    assert format_action({"name": "bump", "arguments": "{broken"}) == 'bump("{broken")'
    assert format_action(None) == ""
