"""Admission by measured memory: whether one more session fits a sandbox, and whether the
pool may grow (:class:`Admission`).

With ``sessions_per_sandbox > 1`` a sandbox has room while it holds fewer than its hard cap
of sessions (:meth:`Admission.session_cap`: ``sessions_per_sandbox``, lowered so that its
processes fit the profile's ``pids``; the runner's descriptors always fit, its
``nofile`` is sized for ``sessions_per_sandbox``:
:meth:`~sandpit.executor.profiles.ResourceProfile.runner_nofile`) *and* its measured memory, plus the expected cost of the sessions
placed since that sample and of one more, plus the headroom
(``sandbox_memory_headroom_mib``, default the profile's ``memory_mib``), stays within its
memory limit (:meth:`Admission.fits_locked`). The expected cost of a session is learnt from
the sandboxes' own samples ((usage - usage when empty) / sessions, a moving average, never
below ``session_memory_floor_mib``). Across the pool, every placement must keep the sum of
all sandboxes' projected memory within ``memory_budget_mib`` (default 80 % of the memory
the driver reports), else the placement is refused (:meth:`Admission.require_locked`).

Every method but :meth:`session_cap` is called with the pool's lock held: samples are
updated in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import CapacityError
from ..profiles import MiB, ResourceProfile
from ..settings import ExecutorSettings
from .warm import PooledSandbox, WarmSets


class Admission:
    """The pool's memory estimates and budget.

    Args:
        settings: ``sessions_per_sandbox``, ``session_memory_estimate_mib``,
            ``session_memory_floor_mib``, ``sandbox_memory_headroom_mib``,
            ``memory_sample_s``, ``memory_budget_mib``.
        memory_total: bytes of memory the sandboxes share (the driver's
            ``memory_total``; 0: unknown, then the budget is unbounded).
    """

    def __init__(self, settings: ExecutorSettings, memory_total: Callable[[], int]) -> None:
        self.settings = settings
        self._memory_total = memory_total
        self.session_bytes = settings.session_memory_estimate_mib * MiB
        """Expected memory of one more session (bytes), learnt from samples."""
        self.empty_bytes = 24 * MiB
        """Expected memory of a sandbox with no session (runner, spare), learnt from samples."""
        self.rejections = 0
        """Placements refused because the pool's memory budget was reached."""

    def session_cap(self, profile: ResourceProfile) -> int:
        """Hard cap of sessions in one sandbox of ``profile``: ``sessions_per_sandbox``,
        lowered so its processes (one per session, the spare, templates) fit the
        profile's ``pids``; at least 1. The runner's descriptors are not a bound: its
        ``nofile`` is sized for ``sessions_per_sandbox``
        (:meth:`~sandpit.executor.profiles.ResourceProfile.runner_nofile`)."""
        per = self.settings.sessions_per_sandbox
        if per == 1:
            return 1
        return max(1, min(per, profile.pids - 16))

    def budget(self) -> int:
        """Bytes all sandboxes may use together: ``memory_budget_mib``, else 80 % of the
        driver's memory (unbounded when unknown)."""
        if self.settings.memory_budget_mib:
            return self.settings.memory_budget_mib * MiB
        return int(self._memory_total() * 0.8) or 1 << 62

    def projected_locked(self, sandbox: PooledSandbox) -> int:
        """Measured memory of ``sandbox`` plus the expected cost of sessions placed since
        the sample (bytes); the expected empty sandbox when it cannot be measured."""
        used = sandbox.sample_memory(self.settings.memory_sample_s)
        if used is None:
            return self.empty_bytes + len(sandbox.sessions) * int(self.session_bytes)
        if sandbox.memory_empty is not None and sandbox.sessions_at_sample >= 2:
            per_session = (used - sandbox.memory_empty) / sandbox.sessions_at_sample
            floor = self.settings.session_memory_floor_mib * MiB
            self.session_bytes = max(floor, 0.8 * self.session_bytes + 0.2 * per_session)
        if sandbox.memory_empty is not None:
            self.empty_bytes = int(0.8 * self.empty_bytes + 0.2 * sandbox.memory_empty)
        return used + max(0, len(sandbox.sessions) - sandbox.sessions_at_sample) * int(self.session_bytes)

    def projected_total_locked(self, sandboxes: Iterable[PooledSandbox], starting: int) -> int:
        """Projected bytes of ``sandboxes`` plus ``starting`` sandboxes on their way."""
        return sum(self.projected_locked(s) for s in sandboxes) + starting * int(self.empty_bytes)

    def fits_locked(self, sandbox: PooledSandbox, profile: ResourceProfile) -> bool:
        """Room for one more session in ``sandbox`` by its measured memory (module
        docstring); True for one-session sandboxes and when its limit is unknown."""
        limit = sandbox.handle.memory_limit
        if self.settings.sessions_per_sandbox == 1 or not limit:
            return True
        headroom = (self.settings.sandbox_memory_headroom_mib or profile.memory_mib) * MiB
        return self.projected_locked(sandbox) + self.session_bytes + headroom <= limit

    def require_locked(self, sets: WarmSets, extra: float, unless_back: PooledSandbox | None = None) -> None:
        """Raise CapacityError (and count a rejection) when ``extra`` more bytes would take
        the projected memory of every sandbox of ``sets`` (and those starting) past
        :meth:`budget`. ``unless_back``: a warm sandbox taken for this placement, put back
        in its idle set first."""
        if self.projected_total_locked(sets.all.values(), sum(sets.starting.values())) + extra <= self.budget():
            return
        self.rejections += 1
        if unless_back is not None:
            sets.idle[unless_back.key].appendleft(unless_back)
        raise CapacityError(f"the sandboxes' memory budget ({self.budget() // MiB} MiB) is reached", retry_after_s=1.0)
