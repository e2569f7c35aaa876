"""The viewer's HTML helpers (:mod:`sandpit.api.http.ui.render`, ``highlight``, ``web``):
``$``-tagged values made readable, diffs flattened, hostile text always escaped, big
values cut within the budget, the sign-in redirect kept on this site."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from sandpit.api.http.ui.highlight import python_html
from sandpit.api.http.ui.render import (
    MAX_ITEMS,
    Budget,
    DiffRow,
    action_text,
    diff_rows,
    milliseconds,
    tag_of,
    value_html,
)
from sandpit.api.http.ui.web import local_path, templates
from sandpit.api.services.diff import state_diff

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&'


def text_of(markup: str) -> str:
    """The text a browser shows for ``markup`` (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def assert_no_raw_markup(markup: str) -> None:
    assert "<script" not in markup and "<img" not in markup and "onerror=alert(2)>" not in markup


@pytest.mark.parametrize("value", [
    HOSTILE, {HOSTILE: HOSTILE}, [HOSTILE], {"$set": [HOSTILE]}, {"$date": HOSTILE},
    {"$object": {"type": HOSTILE, "attrs": {HOSTILE: HOSTILE}}}, {"$repr": {"type": "X", "repr": HOSTILE}},
    {"$dict": [[HOSTILE, HOSTILE]]}, {"$enum": {"type": HOSTILE, "name": HOSTILE}}, {"$cycle": HOSTILE},
    {"$truncated": {"type": HOSTILE, "reason": HOSTILE}}, {"$" + HOSTILE: HOSTILE}, {"$unknown": [HOSTILE]},
])
def test_every_text_of_every_shape_is_escaped(value: Any) -> None:
    markup = str(value_html(value))
    assert_no_raw_markup(markup)
    assert "<script>alert(1)</script>" in text_of(markup)  # shown, as text


@pytest.mark.parametrize("value, shown", [
    ({"$set": [1, 2]}, "set · 2 items 1 2"),
    ({"$frozenset": ["a"]}, 'frozenset · 1 items "a"'),
    ({"$tuple": [1, "x"]}, 'tuple · 2 items 1 "x"'),
    ({"$date": "2024-05-01"}, "date 2024-05-01"),
    ({"$datetime": "2024-05-01T10:00:00+00:00"}, "datetime 2024-05-01T10:00:00+00:00"),
    ({"$decimal": "1.10"}, "decimal 1.10"),
    ({"$timedelta": 90.0}, "timedelta 90.0 s"),
    ({"$bytes": "aGVsbG8="}, "bytes (8 base64 characters)"),
    ({"$enum": {"type": "Color", "name": "RED", "value": 1}}, "enum Color.RED"),
    ({"$object": {"type": "shop.Order", "attrs": {"id": "O1"}}}, 'object shop.Order · 1 attributes id : "O1"'),
    ({"$dict": [[1, "one"]]}, 'dict · 1 keys 1 → "one"'),
    ({"$float": "nan"}, "float nan"),
    ({"$truncated": {"type": "list", "reason": "items", "kept": [], "dropped": 5}}, "truncated list cut by the sandbox (items)"),
    (None, "null"), (True, "true"), (3, "3"), (2.5, "2.5"),
])
def test_tagged_values_read_as_what_they_stand_for(value: Any, shown: str) -> None:
    assert " ".join(text_of(str(value_html(value))).split()) == shown


def test_a_plain_dict_with_a_dollar_key_among_others_is_a_dict_not_a_tag() -> None:
    assert tag_of({"$set": [1], "other": 2}) is None
    assert text_of(str(value_html({"$set": [1], "other": 2}))).split()[:4] == ["dict", "·", "2", "keys"]


def test_small_containers_start_open_and_big_ones_closed_and_capped() -> None:
    assert "<details class=\"v\" open>" in str(value_html([1, 2]))
    big = str(value_html(list(range(MAX_ITEMS + 50))))
    assert "<details class=\"v\">" in big and "… 50 more" in text_of(big)
    assert big.count("<li>") == MAX_ITEMS


def test_a_huge_value_is_cut_within_the_budget() -> None:
    state = {f"record{i}": {"text": "x" * 1000, "n": i} for i in range(3000)}  # ~3 MB of state
    budget = Budget(100_000)
    markup = str(value_html(state, budget))
    assert len(markup) < 200_000 and budget.spent
    assert "cut here (open the raw JSON for the rest)" in markup


def test_a_long_string_is_cut_with_a_count() -> None:
    markup = text_of(str(value_html("y" * 10_000)))
    assert "6000 more characters" in markup and markup.count("y") == 4000


def test_diff_rows_flatten_the_envscaler_diff() -> None:
    old = {"count": 1, "records": {"a": {"v": 1}, "b": 2}, "gone": [1], "tags": {"$set": [1]}}
    new = {"count": 2, "records": {"a": {"v": 2}, "c": 3}, "tags": {"$set": [1, 2]}, "new": None}
    rows = diff_rows(state_diff(old, new), old, new)
    assert rows == [
        DiffRow(("count",), "changed", old=1, new=2),
        DiffRow(("records", "a", "v"), "changed", old=1, new=2),
        DiffRow(("records", "b"), "removed", old=2),
        DiffRow(("records", "c"), "added", new=3),
        DiffRow(("gone",), "removed", old=[1]),
        DiffRow(("tags",), "changed", old={"$set": [1]}, new={"$set": [1, 2]}),
        DiffRow(("new",), "added", new=None),
    ]
    assert diff_rows({}, old, old) == []


def test_a_state_key_named_like_a_diff_entry_is_still_a_path() -> None:
    """A state attribute called ``added`` that changed nests as a path, not as a row kind."""
    old, new = {"box": {"added": 1}, "n": {"$dict": [[1, "a"]]}}, {"box": {"added": 2}, "n": {"$dict": [[1, "b"]]}}
    rows = diff_rows(state_diff(old, new), old, new)
    assert rows == [DiffRow(("box", "added"), "changed", old=1, new=2), DiffRow(("n", "1"), "changed", old="a", new="b")]
    gained = {"box": {"added": 1}}
    assert diff_rows(state_diff({}, gained), {}, gained) == [DiffRow(("box",), "added", new={"added": 1})]


def test_the_diff_macro_escapes_paths_and_values() -> None:
    rows = diff_rows(state_diff({HOSTILE: 1}, {HOSTILE: HOSTILE}), {HOSTILE: 1}, {HOSTILE: HOSTILE})
    macro = templates.get_template("macros.html").module.diff_table  # type: ignore[attr-defined]
    markup = str(macro(rows, Budget()))
    assert_no_raw_markup(markup)
    assert text_of(markup).count("<script>alert(1)</script>") == 2  # the path and the new value


@pytest.mark.parametrize("action, expected", [
    (None, ("", "")),
    ({"name": "bump", "arguments": {"by": 5}}, ("bump", '{\n  "by": 5\n}')),
    ({"name": "bump", "arguments": "{oops"}, ("bump", "{oops")),
    ({"text": "<tool_call>raw</tool_call>"}, ("text", "<tool_call>raw</tool_call>")),
    ({"other": 1}, ("action", '{\n  "other": 1\n}')),
])
def test_action_text(action: dict[str, Any] | None, expected: tuple[str, str]) -> None:
    assert action_text(action) == expected


def test_milliseconds_takes_numbers_only() -> None:
    assert (milliseconds(12.345), milliseconds(3), milliseconds("12"), milliseconds(None)) == ("12.3 ms", "3.0 ms", "", "")


def test_highlighted_source_is_escaped_and_uses_classes_only() -> None:
    source = f'class Env:\n    """{HOSTILE}"""\n    def tool(self):\n        return "</pre><script>x</script>"\n'
    markup = str(python_html(source))
    assert_no_raw_markup(markup)
    assert "</pre><script>" not in markup and "&lt;/pre&gt;&lt;script&gt;" in markup
    assert 'style="' not in markup  # no inline style: the CSP allows only the stylesheet
    assert '<span class="k">class</span>' in markup


@pytest.mark.parametrize("target, expected", [
    ("/ui/episodes?status=running", "/ui/episodes?status=running"), (None, "/ui"), ("", "/ui"),
    ("//evil.example/ui", "/ui"), ("https://evil.example/ui", "/ui"), ("/v1/envs", "/ui"),
    ("/ui\\@evil.example", "/ui"), ("javascript:alert(1)", "/ui"),
])
def test_the_page_after_sign_in_stays_on_this_site(target: str | None, expected: str) -> None:
    assert local_path(target) == expected


def test_templates_autoescape_whatever_the_name() -> None:
    rendered = templates.from_string("{{ x }}").render(x=HOSTILE)
    assert_no_raw_markup(rendered)
