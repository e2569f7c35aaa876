"""How a stored state looks to readers: the one JSON view (``GET /state``, diffs,
``?include=state``) of a :class:`~sandpit.api.db.store.StateCache`, and that view
rendered once to JSON bytes per state root (:class:`RenderedStates`)."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
from cachetools import LRUCache

from ..db.store import StateCache
from ..sandboxes import is_truncated, render_entry

RENDERED_CACHE_BYTES = 64 * 1024 * 1024
"""Default budget (bytes of JSON) of :class:`RenderedStates`: about twenty 3 MB states."""


def state_view(cache: StateCache) -> dict[str, Any]:
    """The JSON view of a stored state (the one rendering every reader sees): JSON
    attributes as they are, others as the rendering their sandbox made
    (``sandbox_images/runner/child_render.py``). Nothing is decoded or executed here."""
    return {name: render_entry(attr.encoded) for name, attr in cache.attrs.items()}


def view_truncated(cache: StateCache) -> bool:
    """True when a rendering in the state says something was cut (JSON attributes never are)."""
    return any(attr.encoded[0] != "j" and is_truncated(render_entry(attr.encoded)) for attr in cache.attrs.values())


def dumps_view(view: dict[str, Any]) -> bytes:
    """Compact JSON bytes of a state view, as the API's responses carry it: orjson (in C),
    or Python's ``json`` (what FastAPI's ``JSONResponse`` uses) for what orjson refuses,
    e.g. integers beyond 64 bits. Both give the same JSON value. Raises what
    ``json.dumps`` raises (``ValueError`` for text with a lone surrogate, which a state
    from a sandbox never holds: its encoder replaces them)."""
    try:
        return orjson.dumps(view)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(view, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _json_bytes(entry: tuple[bytes, bool]) -> int:
    return len(entry[0])


class RenderedStates:
    """State root -> the state's JSON view as bytes (and its ``truncated`` flag), least
    recently used first out past ``max_bytes`` (bytes of JSON; a view larger than that is
    rendered but not kept).

    A root is a content hash of the whole stored state (manifest, values and renderings),
    so a root's bytes never go stale: a step, reset or restore gives the env another root
    and its next read renders (or finds) that one; forks and envs created with the same
    config share theirs. A ``cachetools.LRUCache`` weighing each view by its JSON bytes,
    behind a lock. Thread-safe; rendering runs outside the lock."""

    def __init__(self, max_bytes: int = RENDERED_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: LRUCache[str, tuple[bytes, bool]] = LRUCache(max_bytes, getsizeof=_json_bytes)
        self._lock = threading.Lock()

    def get(self, root: str) -> tuple[bytes, bool] | None:
        """The cached ``(JSON bytes, truncated)`` of ``root``, or None."""
        with self._lock:
            return self._entries.get(root)

    def render(self, cache: StateCache) -> tuple[bytes, bool]:
        """``(JSON bytes of state_view(cache), view_truncated(cache))``, from the cache
        when ``cache.root`` was rendered before. A cache without a root is rendered each
        time."""
        if cache.root:
            hit = self.get(cache.root)
            if hit is not None:
                return hit
        rendered = (dumps_view(state_view(cache)), view_truncated(cache))
        if cache.root and len(rendered[0]) <= self.max_bytes:
            with self._lock:
                if cache.root not in self._entries:
                    self._entries[cache.root] = rendered
        return rendered

    def __len__(self) -> int:
        return len(self._entries)


def state_response(env_id: str, episode: int, step: int, state: bytes, truncated: bool) -> bytes:
    """The ``StateView`` JSON object (``env_id``, ``episode``, ``step``, ``state``,
    ``truncated``) around already rendered ``state`` bytes, without re-encoding them."""
    head = orjson.dumps({"env_id": env_id, "episode": episode, "step": step})
    return b"".join((head[:-1], b',"state":', state, b',"truncated":', b"true" if truncated else b"false", b"}"))
