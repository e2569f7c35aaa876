"""HTML for the values the viewer shows: state values in their JSON view (``$``-tagged
values made readable), state diffs, actions. Everything here is LLM-written data, so every
piece of text goes through :func:`markupsafe.escape`; the result is ``Markup`` the
templates insert as is (templates never mark data ``|safe``).

A rendering has a *budget* (characters of HTML): past it a value is cut with a note
pointing at the raw JSON, so a 3 MB state gives a page of bounded size. Containers show
at most :data:`MAX_ITEMS` items. Containers render as ``<details>`` (expandable without
JavaScript); small ones start open.

The ``$`` tags (``sandbox_images/runner/child_render.py``) read as::

    {"$set": [1, 2]}                    set {1, 2}          ($frozenset, $tuple alike)
    {"$date": "2024-05-01"}             date 2024-05-01     ($datetime, $time, $decimal,
                                                             $uuid, $fraction, $float alike)
    {"$timedelta": 90.0}                timedelta 90.0 s
    {"$bytes": "<base64>"}              bytes (n base64 characters)
    {"$enum": {"type", "name"}}         Color.RED
    {"$object": {"type", "attrs"}}      module.Class with its attributes
    {"$dict": [[k, v], ...]}            a dict whose keys are renderings
    {"$repr": {"type", "repr"}}         the repr text
    {"$truncated": {...}}               what the sandbox cut, and why
    {"$cycle": "path"}                  a reference back to ``path``
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

MAX_ITEMS = 200
"""Most items of one list or dict shown; the rest are counted."""
MAX_TEXT = 4000
"""Most characters of one string shown."""
OPEN_BELOW = 8
"""Containers with fewer items than this start expanded."""
DEFAULT_BUDGET = 400_000
"""Characters of HTML one rendering may produce before it is cut."""

SCALAR_TAGS = ("$date", "$datetime", "$time", "$decimal", "$uuid", "$fraction", "$float")
SEQUENCE_TAGS = {"$set": "set", "$frozenset": "frozenset", "$tuple": "tuple"}


class Budget:
    """The characters of HTML a rendering may still produce (``chars``, default
    :data:`DEFAULT_BUDGET`); one budget is shared by every value of a page."""

    def __init__(self, chars: int = DEFAULT_BUDGET) -> None:
        self.left = chars

    def spend(self, text: str) -> str:
        """Count ``text`` (characters) against the budget; returns it unchanged."""
        self.left -= len(text)
        return text

    @property
    def spent(self) -> bool:
        """True once the budget is used up: what follows is replaced by a cut note."""
        return self.left <= 0


def tag_of(value: Any) -> str | None:
    """The ``$`` tag of a one-key dict such as ``{"$set": [...]}``, else None."""
    if type(value) is dict and len(value) == 1:
        (key,) = value
        if type(key) is str and key.startswith("$"):
            return key
    return None


def _scalar(value: Any) -> str:
    if value is None or type(value) is bool:
        return f'<span class="v-lit">{escape(json.dumps(value))}</span>'
    if type(value) in (int, float):
        return f'<span class="v-num">{escape(repr(value))}</span>'
    text = str(value)
    cut = ""
    if len(text) > MAX_TEXT:
        cut = f'<span class="v-note"> … {len(text) - MAX_TEXT} more characters</span>'
        text = text[:MAX_TEXT]
    return f'<span class="v-str">"{escape(text)}"</span>{cut}'


CUT = '<span class="v-note">… cut here (open the raw JSON for the rest)</span>'


def _container(label: str, items: list[str], count: int, budget: Budget) -> str:
    more = f'<li class="v-note">… {count - len(items)} more</li>' if count > len(items) else ""
    opened = " open" if count < OPEN_BELOW else ""
    head = f'<details class="v"{opened}><summary>{escape(label)}</summary><ul class="v-items">'
    budget.spend(head + more + "</ul></details>")  # the items spent their own share
    return f'{head}{"".join(items)}{more}</ul></details>'


def _items(entries: list[Any], show: Any, budget: Budget) -> list[str]:
    """``<li>`` of each entry (``show(entry)`` gives its inner HTML) until the budget is spent."""
    out = []
    for entry in entries[:MAX_ITEMS]:
        if budget.spent:
            out.append(f"<li>{CUT}</li>")
            break
        out.append(f"<li>{show(entry)}</li>")
        budget.left -= 9  # <li></li>
    return out


def _render(value: Any, budget: Budget, depth: int) -> str:
    if budget.spent:
        return CUT
    if type(value) is list:
        shown = _items(value, lambda item: _render(item, budget, depth + 1), budget)
        return _container(f"list · {len(value)} items", shown, len(value), budget)
    if type(value) is dict:
        tag = tag_of(value)
        if tag is not None:
            return _tagged(tag, value[tag], budget, depth)
        shown = _items(list(value.items()), lambda pair: _pair(pair, budget, depth), budget)
        return _container(f"dict · {len(value)} keys", shown, len(value), budget)
    return budget.spend(_scalar(value))


def _pair(pair: tuple[Any, Any], budget: Budget, depth: int) -> str:
    key = budget.spend(f'<span class="v-key">{escape(str(pair[0]))}</span>: ')
    return key + _render(pair[1], budget, depth + 1)


def _tagged(tag: str, body: Any, budget: Budget, depth: int) -> str:
    kind = f'<span class="v-tag">{escape(tag[1:])}</span> '
    if tag in SCALAR_TAGS:
        return budget.spend(kind + f'<span class="v-num">{escape(str(body))}</span>')
    if tag == "$timedelta":
        return budget.spend(kind + f'<span class="v-num">{escape(str(body))}</span> s')
    if tag in ("$bytes", "$bytearray"):
        return budget.spend(kind + f'<span class="v-note">({len(str(body))} base64 characters)</span>')
    if tag in SEQUENCE_TAGS and type(body) is list:
        shown = _items(body, lambda item: _render(item, budget, depth + 1), budget)
        return _container(f"{SEQUENCE_TAGS[tag]} · {len(body)} items", shown, len(body), budget)
    if tag == "$enum" and type(body) is dict:
        return budget.spend(kind + f'<span class="v-num">{escape(str(body.get("type")))}.'
                                   f'{escape(str(body.get("name")))}</span>')
    if tag == "$object" and type(body) is dict:
        found = body.get("attrs")
        attrs: dict[str, Any] = found if type(found) is dict else {}
        shown = _items(list(attrs.items()), lambda pair: _pair(pair, budget, depth), budget)
        return _container(f"object {body.get('type')} · {len(attrs)} attributes", shown, len(attrs), budget)
    if tag == "$dict" and type(body) is list:
        def show(pair: Any) -> str:
            if type(pair) is list and len(pair) == 2:
                return f"{_render(pair[0], budget, depth + 1)} → {_render(pair[1], budget, depth + 1)}"
            return _render(pair, budget, depth + 1)
        return _container(f"dict · {len(body)} keys", _items(body, show, budget), len(body), budget)
    if tag == "$repr" and type(body) is dict:
        return budget.spend(kind + f'<span class="v-str">{escape(str(body.get("repr", ""))[:MAX_TEXT])}</span>')
    if tag == "$cycle":
        return budget.spend(kind + f'<span class="v-note">back to {escape(str(body))}</span>')
    if tag == "$truncated" and type(body) is dict:
        reason = escape(str(body.get("reason")))
        return budget.spend(kind + f'<span class="v-note">{escape(str(body.get("type")))} cut by the sandbox '
                                   f'({reason})</span>')
    return kind + _render(body, budget, depth + 1)  # an unknown tag: its body as plain data


def value_html(value: Any, budget: Budget | None = None) -> Markup:
    """``value`` (a state's JSON view, or any part of it) as escaped HTML; ``budget``
    shared by the calls of one page (a fresh :data:`DEFAULT_BUDGET` when None)."""
    # every piece of text in the rendering went through escape()
    return Markup(_render(value, budget if budget is not None else Budget(), 0))  # noqa: S704


@dataclass(frozen=True)
class DiffRow:
    """One leaf of a state diff: ``kind`` is ``added``, ``removed`` or ``changed``;
    ``path`` the keys from the state's top (``records`` › ``a``)."""

    path: tuple[str, ...]
    kind: str
    old: Any = None
    new: Any = None


def _mapping(value: Any) -> dict[str, Any] | None:
    """``value`` as :func:`~sandpit.api.services.diff.state_diff` recurses into it: a plain
    dict, or a ``$dict`` tag keyed by the JSON text of its keys; None otherwise."""
    if type(value) is not dict:
        return None
    if tag_of(value) is None:
        return value
    pairs = value.get("$dict")
    if type(pairs) is not list or not all(type(p) is list and len(p) == 2 for p in pairs):
        return None
    return {json.dumps(key, sort_keys=True, ensure_ascii=False): item for key, item in pairs}


def diff_rows(diff: dict[str, Any], old: dict[str, Any], new: dict[str, Any],
              prefix: tuple[str, ...] = ()) -> list[DiffRow]:
    """The leaves of ``diff`` = ``state_diff(old, new)``
    (:func:`sandpit.api.services.diff.state_diff`), nested diffs flattened into paths, in
    the diff's order. The two states say which entries are leaves: EnvScaler's shape alone
    is ambiguous (``{"box": {"added": x}}`` is either ``box`` added, or the key ``added``
    inside ``box`` changed)."""
    rows: list[DiffRow] = []
    for key, entry in diff.items():
        path = (*prefix, str(key))
        if type(entry) is not dict:
            continue
        if key not in old:
            rows.append(DiffRow(path, "added", new=entry.get("added")))
        elif key not in new:
            rows.append(DiffRow(path, "removed", old=entry.get("removed")))
        else:
            left, right = _mapping(old[key]), _mapping(new[key])
            if left is not None and right is not None:
                rows.extend(diff_rows(entry, left, right, path))
            else:
                rows.append(DiffRow(path, "changed", old=old[key], new=new[key]))
    return rows


def action_text(action: dict[str, Any] | None) -> tuple[str, str]:
    """``(tool, arguments)`` of a stored step action for display: the tool name and the
    arguments as indented JSON; a raw-text action (``{"text": ...}``) gives
    ``("text", <the text>)``; none (step 0) gives ``("", "")``."""
    if not action:
        return "", ""
    if "name" in action:
        arguments = action.get("arguments")
        text = arguments if type(arguments) is str else json.dumps(arguments, indent=2, ensure_ascii=False,
                                                                     sort_keys=True)
        return str(action["name"]), text
    if "text" in action:
        return "text", str(action["text"])
    return "action", json.dumps(action, indent=2, ensure_ascii=False, sort_keys=True)


def milliseconds(value: Any) -> str:
    """A stored duration (milliseconds) as ``12.3 ms``; ``""`` for anything not a number."""
    if type(value) not in (int, float):
        return ""
    return f"{value:.1f} ms"
