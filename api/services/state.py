"""How a stored state looks to readers: the one JSON view (``GET /state``, diffs,
``?include=state``) of a :class:`~sandpit.api.db.store.StateCache`."""

from __future__ import annotations

from typing import Any

from ..db.store import StateCache
from ..sandboxes import is_truncated, render_entry


def state_view(cache: StateCache) -> dict[str, Any]:
    """The JSON view of a stored state (the one rendering every reader sees): JSON
    attributes as they are, others as the rendering their sandbox made
    (``sandbox_images/runner/child_render.py``). Nothing is decoded or executed here."""
    return {name: render_entry(attr.encoded) for name, attr in cache.attrs.items()}


def view_truncated(cache: StateCache) -> bool:
    """True when a rendering in the state says something was cut (JSON attributes never are)."""
    return any(attr.encoded[0] != "j" and is_truncated(render_entry(attr.encoded)) for attr in cache.attrs.values())
