"""Deadlines of in-flight requests, in a heap (stdlib only; PID 1 never runs environment code).

PID 1 checks deadlines before every ``select`` (``pid1_loop``); with hundreds of sessions
in a sandbox, looking at every session each round costs more than the round's own work.
:class:`Deadlines` keeps one heap entry per deadline set (:meth:`Deadlines.arm`): an item
(a request's bookkeeping dict) and its owner (the session). An entry is *live* while
``live(owner, item)`` holds and the item's ``"deadline"`` is still the one armed; a request
answered in time, failed, or re-timed leaves a stale entry behind, which is skipped when it
reaches the top (:meth:`Deadlines.due`) and dropped when stale entries pile up (the heap is
rebuilt from its live entries once it holds twice as many as at the last rebuild, at least
``COMPACT_MIN``). So a round costs O(log n) per deadline due or armed, not O(sessions).
"""

from __future__ import annotations

import heapq
import itertools

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator  # annotations only: never evaluated in the sandbox
    from typing import Any

COMPACT_MIN = 64
"""Entries the heap may hold before stale ones are dropped (:meth:`Deadlines.arm`)."""


class Deadlines:
    """Armed deadlines (module docstring). ``live(owner, item)``: whether ``item`` is still
    ``owner``'s in-flight item (for sessions: ``session.current is item``)."""

    def __init__(self, live: Callable[[Any, dict[str, Any]], bool]) -> None:
        self._live = live
        self._heap: list[tuple[float, int, Any, dict[str, Any]]] = []
        self._order = itertools.count()
        self._compact_at = COMPACT_MIN

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def arm(self, owner: Any, item: dict[str, Any], deadline: float) -> None:
        """Set ``item["deadline"]`` to ``deadline`` (monotonic seconds) and queue it; an
        earlier deadline of the same item becomes stale."""
        item["deadline"] = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), owner, item))
        if len(self._heap) > self._compact_at:
            self._heap = [entry for entry in self._heap if self._is_live(entry)]
            heapq.heapify(self._heap)
            self._compact_at = max(COMPACT_MIN, 2 * len(self._heap))

    def _is_live(self, entry: tuple[float, int, Any, dict[str, Any]]) -> bool:
        deadline, _, owner, item = entry
        return item.get("deadline") == deadline and self._live(owner, item)

    def due(self, now: float) -> Iterator[tuple[Any, dict[str, Any]]]:
        """``(owner, item)`` of every live deadline at or before ``now``, earliest first,
        each taken off the heap as it is yielded; the caller may arm new deadlines
        between two of them (one due at ``now`` is yielded too)."""
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._is_live(entry):
                yield entry[2], entry[3]

    def next_in(self, now: float) -> float | None:
        """Seconds from ``now`` to the earliest live deadline (stale entries on top are
        dropped), or None when there is none."""
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] - now if self._heap else None
