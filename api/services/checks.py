"""Check functions (EnvScaler ``checklist_with_func``) run in sandboxes on two states:
what an episode's reward (:mod:`sandpit.api.envs.rewards`) and ``/v1/validate``'s check
cases (:mod:`.execution`) are computed from.

Every check runs in a sandbox process that never ran environment code, on the states
restored there (stored states from the snapshot store, or plain JSON states whose ``$``
tags become objects). Nothing is decoded on the host. Objects of the environment's own
classes are rebuilt as stand-ins carrying their attributes, so no code of the environment
being judged runs where a verdict is computed; a scenario with ``check_objects:
environment`` opts in to loading the environment's module for its checks instead, and then
the environment's code takes part in the verdict (``child_oneshot.py``; docs/isolation.md,
"Verdicts the judged code cannot write").

A checklist longer than one sandbox job takes (``CHECKS_PER_JOB``, 256) runs in
consecutive jobs of at most that many checks, each on the same two states, and the
results are concatenated in order: a check's verdict depends only on its source and the
states, so the reward is the one a single job would give. Each job holds its own slot
and has its own time budget (per-check timeout times its checks, plus slack).

A stored state goes to the sandbox as its JSON text (``sandpit.executor.pool.jobs``'s
:class:`~sandpit.executor.pool.jobs.PreparedState`), which is a function of the state's
root hash alone (the store is content-addressed). The texts are kept by root, the most
recently used first, up to :data:`STATE_TEXTS_BYTES` in all: an episode's initial state
is the same for every evaluation and every end-of-episode reward of every episode started
from one config, and its text is then neither loaded from the store nor encoded again.
``/metrics`` counts both outcomes (``sandpit_check_state_texts_total{result="kept"|"made"}``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

from ..db.store import StateCache
from ..errors import InvalidRequest
from ..metrics import Metrics
from ..sandboxes import (
    CHECKS_PER_JOB,
    CheckResult,
    PreparedState,
    ResourceProfile,
    Sandboxes,
    encode_json_state,
    prepare_state,
)
from ..schemas.scenarios import CheckOutcome

STATE_TEXTS_BYTES = 64 * 1024 * 1024
"""Bytes of state texts kept by root (module docstring): a 1.5 MB state's text takes
1.5 MB, where its loaded and decoded form takes tens of megabytes."""


def _outcomes(results: list[CheckResult]) -> list[CheckOutcome]:
    return [CheckOutcome(check_item=r.check_item, passed=r.passed, error=r.error, status=r.status,
                         duration_ms=r.duration_ms) for r in results]


class Checks:
    """Runs check functions through the sandboxes (each run holds a slot)."""

    def __init__(self, sandboxes: Sandboxes, metrics: Metrics, texts_bytes: int = STATE_TEXTS_BYTES) -> None:
        self.sandboxes = sandboxes
        self.metrics = metrics  # sandpit_check_state_texts_total counts the texts kept and made
        self._texts: LRUCache[str, PreparedState] = LRUCache(texts_bytes, getsizeof=lambda p: len(p.text))
        self._lock = threading.Lock()

    def prepared(self, root: str, load: Callable[[], StateCache]) -> PreparedState:
        """The text of the stored state with root hash ``root`` for check batches: kept
        by root (module docstring), else ``load()`` (a :class:`StateCache` of that root,
        e.g. ``load_state(db, root)`` or an env's live head) encoded and kept. Raises
        InvalidRequest (the state is over the sandbox's state cap or not JSON) and what
        ``load`` raises."""
        with self._lock:
            kept = self._texts.get(root) if root else None
        self.metrics.check_state_texts["kept" if kept is not None else "made"].inc()
        if kept is not None:
            return kept
        try:
            text = prepare_state(load().encoded(), "the state")
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="checks") from None
        if root and len(text.text) <= self._texts.maxsize:
            with self._lock:
                self._texts[root] = text
        return text

    def on_states(self, tenant: str, checks: list[dict[str, Any]], initial: StateCache | PreparedState,
                  final: StateCache | PreparedState, source: str | None, profile: ResourceProfile | None = None,
                  objects: str | None = None) -> list[CheckOutcome]:
        """Checks on two stored states, restored in a sandbox, in jobs of at most
        ``CHECKS_PER_JOB`` (module docstring). A state is a :class:`StateCache` (its text
        comes from :meth:`prepared`, by its root) or a text :meth:`prepared` gave.
        Objects of the environment's classes are stand-ins (no environment code runs
        where the verdict is computed) unless ``objects`` is ``environment``: only then
        is the environment's ``source`` sent, to be loaded so its classes unpickle as
        themselves (a scenario's ``check_objects``). Raises InvalidRequest (a check or a
        state over the caps), NoCapacity, QuotaExceeded."""
        if not checks:
            return []
        source = source if objects == "environment" else None
        return _outcomes(self._batched(tenant, checks, self._text(initial), self._text(final), profile, source))

    def _text(self, state: StateCache | PreparedState) -> PreparedState:
        if isinstance(state, PreparedState):
            return state
        return self.prepared(state.root, lambda: state)

    def _batched(self, tenant: str, checks: list[dict[str, Any]], initial: dict[str, list[Any]] | PreparedState,
                 final: dict[str, list[Any]] | PreparedState, profile: ResourceProfile | None,
                 source: str | None) -> list[CheckResult]:
        """``run_checks`` over consecutive slices of at most ``CHECKS_PER_JOB`` checks,
        results concatenated in order. Raises InvalidRequest (a check over the caps: the
        message gives its index in the whole list), NoCapacity, QuotaExceeded."""
        results: list[CheckResult] = []
        for start in range(0, len(checks), CHECKS_PER_JOB):
            batch = checks[start:start + CHECKS_PER_JOB]
            try:
                results += self.sandboxes.run_checks(tenant=tenant, checks=batch, initial_state=initial,
                                                     final_state=final, profile=profile, source=source)
            except ValueError as exc:
                where = f" (in the checks from index {start} on)" if start else ""
                raise InvalidRequest(f"{exc}{where}", field="checks") from None
        return results

    def on_json(self, tenant: str, checks: list[dict[str, Any]], initial: dict[str, Any],
                final: dict[str, Any]) -> list[CheckOutcome]:
        """Checks on two plain JSON states (validation cases: ``$`` tags of the state
        rendering become real objects in the sandbox). Raises as :meth:`on_states`."""
        if not checks:
            return []
        return _outcomes(self._batched(tenant, checks, encode_json_state(initial), encode_json_state(final),
                                       None, None))
