"""Fair scheduling of sandbox work across tenants.

Every piece of untrusted-code work (a tool call, an instantiation, a check batch, a
snippet) holds one *slot* while it runs. :class:`FairScheduler` has ``slots`` of them in
total; a tenant may hold at most its own limit at once (``max_running_calls``). Work
that cannot start waits in its tenant's FIFO queue; when a slot frees, the queues are
served round-robin, one grant per tenant per turn, skipping tenants at their limit.

Why both rules: sandbox work cannot be pre-empted (an infinite loop holds its slot until
the call timeout), so round-robin alone would let a tenant that filled every slot delay
everyone by a whole timeout. The per-tenant limit keeps slots free for other tenants; as
long as ``slots`` exceeds any one tenant's limit, a quiet tenant's call starts at once
however many calls a noisy tenant has queued. It also bounds the CPU a tenant can take
(limit x the profile's CPU quota).

The API's adapter over the executor (:class:`~sandpit.api.sandboxes.Sandboxes`) is its one
user. :class:`SchedulerBusy` never leaves it: ``Sandboxes.slot`` turns it into
:class:`~sandpit.api.errors.QuotaExceeded` (429, ``max_running_calls``). It is the API's
own failure, not the executor's, so it is no part of the executor's error tree.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


class SchedulerBusy(Exception):
    """A call waited ``timeout_s`` seconds without getting a slot."""

    def __init__(self, tenant: str, waited_s: float, queued: int) -> None:
        super().__init__(f"tenant {tenant!r}: no execution slot after {waited_s:.1f} s ({queued} call(s) queued)")
        self.tenant = tenant
        self.waited_s = waited_s
        self.queued = queued


@dataclass
class _Waiter:
    limit: int
    granted: threading.Event = field(default_factory=threading.Event)


class FairScheduler:
    """``slots`` concurrent executions shared round-robin by per-tenant FIFO queues."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        self._lock = threading.Lock()
        self._running: collections.Counter[str] = collections.Counter()
        self._total = 0
        self._queues: dict[str, collections.deque[_Waiter]] = {}
        self._turn: collections.deque[str] = collections.deque()
        """Tenants with queued work, in round-robin order."""
        self.granted = 0
        self.waited_s = 0.0

    @contextmanager
    def slot(self, tenant: str, limit: int, timeout_s: float) -> Iterator[float]:
        """Hold one slot of ``tenant`` (at most ``limit`` at once) for the block; yields
        the seconds waited. Raises SchedulerBusy after ``timeout_s`` seconds of waiting."""
        started = time.monotonic()
        waiter = _Waiter(limit=max(1, limit))
        with self._lock:
            if tenant not in self._queues and self._total < self.slots and self._running[tenant] < waiter.limit:
                self._grant_locked(tenant)
                waiter.granted.set()
            else:
                queue = self._queues.get(tenant)
                if queue is None:
                    queue = self._queues[tenant] = collections.deque()
                    self._turn.append(tenant)
                queue.append(waiter)
        if not waiter.granted.wait(timeout_s):
            with self._lock:
                if not waiter.granted.is_set():  # still queued: leave the queue
                    queue = self._queues.get(tenant)
                    queued = len(queue) if queue else 0
                    if queue is not None:
                        queue.remove(waiter)
                        if not queue:
                            del self._queues[tenant]
                            self._turn.remove(tenant)
                    raise SchedulerBusy(tenant, time.monotonic() - started, queued)
        waited = time.monotonic() - started
        self.waited_s += waited
        try:
            yield waited
        finally:
            with self._lock:
                self._running[tenant] -= 1
                self._total -= 1
                self._dispatch_locked()

    def _grant_locked(self, tenant: str) -> None:
        self._running[tenant] += 1
        self._total += 1
        self.granted += 1

    def _dispatch_locked(self) -> None:
        """Grant free slots to queued work, one per tenant per round-robin turn."""
        while self._total < self.slots and self._turn:
            for _ in range(len(self._turn)):
                tenant = self._turn[0]
                self._turn.rotate(-1)
                queue = self._queues[tenant]
                if self._running[tenant] < queue[0].limit:
                    waiter = queue.popleft()
                    if not queue:
                        del self._queues[tenant]
                        self._turn.remove(tenant)
                    self._grant_locked(tenant)
                    waiter.granted.set()
                    break
            else:
                return  # every queued tenant is at its limit

    def stats(self) -> dict[str, object]:
        """``{"slots", "running", "queued": {tenant: n}, "running_by_tenant": {...}}``."""
        with self._lock:
            return {"slots": self.slots, "running": self._total,
                    "queued": {t: len(q) for t, q in self._queues.items()},
                    "running_by_tenant": {t: n for t, n in self._running.items() if n}}
