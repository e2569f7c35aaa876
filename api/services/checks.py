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
"""

from __future__ import annotations

from typing import Any

from ..db.store import StateCache
from ..errors import InvalidRequest
from ..sandboxes import CHECKS_PER_JOB, CheckResult, ResourceProfile, Sandboxes, encode_json_state
from ..schemas.scenarios import CheckOutcome


def _outcomes(results: list[CheckResult]) -> list[CheckOutcome]:
    return [CheckOutcome(check_item=r.check_item, passed=r.passed, error=r.error, status=r.status,
                         duration_ms=r.duration_ms) for r in results]


class Checks:
    """Runs check functions through the sandboxes (each run holds a slot)."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes

    def on_states(self, tenant: str, checks: list[dict[str, Any]], initial: StateCache, final: StateCache,
                  source: str | None, profile: ResourceProfile | None = None,
                  objects: str | None = None) -> list[CheckOutcome]:
        """Checks on two stored states, restored in a sandbox, in jobs of at most
        ``CHECKS_PER_JOB`` (module docstring). Objects of the environment's classes are
        stand-ins (no environment code runs where the verdict is computed) unless
        ``objects`` is ``environment``: only then is the environment's ``source`` sent, to
        be loaded so its classes unpickle as themselves (a scenario's ``check_objects``).
        Raises InvalidRequest (a check over the caps), NoCapacity, QuotaExceeded."""
        if not checks:
            return []
        source = source if objects == "environment" else None
        return _outcomes(self._batched(tenant, checks, initial.encoded(), final.encoded(), profile, source))

    def _batched(self, tenant: str, checks: list[dict[str, Any]], initial: dict[str, list[Any]],
                 final: dict[str, list[Any]], profile: ResourceProfile | None,
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
