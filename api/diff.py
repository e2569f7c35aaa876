"""State diffs in EnvScaler's ``get_state_diff`` shape.

``state_diff(old, new)`` -> ``{"added": {key: new}, "removed": {key: old}, "changed":
{key: {"old": old, "new": new}}}``; when a changed value is a dict on both sides, its entry
is itself a diff of that shape (recursive for dicts, as in EnvScaler), so one changed record
of a large ``Dict[id, record]`` shows up as one small nested entry. Lists and scalars are
compared whole. Keys with equal values do not appear. Recursion is bounded by ``max_depth``
(beyond it a changed dict is reported whole as ``{"old", "new"}``).
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32


def state_diff(old: dict[str, Any], new: dict[str, Any], max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """Diff two JSON states (dicts of attribute name -> value); see the module docstring."""
    added = {k: v for k, v in new.items() if k not in old}
    removed = {k: v for k, v in old.items() if k not in new}
    changed: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            continue
        before = old[key]
        if before is value or before == value:
            continue
        if isinstance(before, dict) and isinstance(value, dict) and max_depth > 0:
            changed[key] = state_diff(before, value, max_depth - 1)
        else:
            changed[key] = {"old": before, "new": value}
    return {"added": added, "removed": removed, "changed": changed}
