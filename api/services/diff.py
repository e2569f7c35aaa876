"""State diffs in EnvScaler's ``get_state_diff`` shape, on the state's JSON view.

``state_diff(old, new)`` maps each key whose value differs to one entry::

    {key: {"added": new}}                   key only in ``new``
    {key: {"removed": old}}                 key only in ``old``
    {key: {"changed": {"old": old, "new": new}}}
    {key: {<nested diff>}}                  both values are dicts: their diff, recursively
                                            (left out when it is empty)

exactly as EnvScaler's ``get_state_diff`` builds it (keys with equal values do not appear;
lists, scalars and anything that is not a dict on both sides are compared whole with
``==``, so ``1`` -> ``1.0`` is no change, as in Python).

The diff runs on renderings (``sandbox_images/runner/child_render.py``), not on live objects:
a *tag* (``{"$set": [...]}``, ``{"$date": ...}``, ``{"$object": ...}``) is one value, never
recursed into, just as EnvScaler compares a set or an object whole; a ``{"$dict": [[k, v],
...]}`` (a dict with non-string keys) on both sides is recursed into like the dict it
stands for, with each key written as its JSON text. One deliberate difference: EnvScaler
deep-copies both states before comparing, so an instance whose class does not define
``__eq__`` always compares unequal there and shows as changed at every step; here two
instances are equal when their renderings (class and attributes) are.
"""

from __future__ import annotations

import json
from typing import Any

from sandpit.sandbox_images.runner.wire import is_tag


def _as_mapping(value: Any) -> dict[str, Any] | None:
    """``value`` as a dict to recurse into: a plain (non-tag) dict, or a ``$dict`` tag
    keyed by the JSON text of its keys; None for anything compared whole."""
    if type(value) is not dict:
        return None
    if not is_tag(value):
        return value
    pairs = value.get("$dict")
    if type(pairs) is not list or not all(type(p) is list and len(p) == 2 for p in pairs):
        return None
    return {json.dumps(key, sort_keys=True, ensure_ascii=False): item for key, item in pairs}


def state_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """EnvScaler ``get_state_diff`` of two state views (see the module docstring).

    Args:
        old, new: state views (attribute name -> rendering), e.g. ``GET /state`` bodies.

    Returns:
        ``{key: {"added": v} | {"removed": v} | {"changed": {"old", "new"}} | <nested>}``;
        ``{}`` when nothing differs.
    """
    out: dict[str, Any] = {}
    for key in list(old) + [k for k in new if k not in old]:
        if key not in new:
            out[key] = {"removed": old[key]}
            continue
        if key not in old:
            out[key] = {"added": new[key]}
            continue
        before, after = old[key], new[key]
        if before is after:
            continue
        left, right = _as_mapping(before), _as_mapping(after)
        if left is not None and right is not None:
            nested = state_diff(left, right)
            if nested:
                out[key] = nested
        elif before != after:
            out[key] = {"changed": {"old": before, "new": after}}
    return out
