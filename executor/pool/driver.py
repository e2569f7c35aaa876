"""The seam under the pool: what starts sandboxes (a *driver*) and what the pool and its
sessions use of one sandbox (a *handle*). :class:`~sandpit.executor.pool.SandboxPool`
decides which tenant's session goes where, keeps warm sets, admits by memory and recycles;
a driver only makes sandboxes exist. The Docker backend's driver is
:class:`~sandpit.executor.docker.driver.DockerDriver` (containers on a Docker Engine); a
backend that starts sandboxes some other way (pods, VMs) is one more driver.

Every sandbox runs the runner (``sandbox_images/runner``) and speaks its protocol: a
handle's :meth:`SandboxHandle.request` is one runner request, whatever carries it. So
placement, sessions, config templates and one-shot jobs work unchanged over any driver.

Lifecycle the pool drives::

    driver.open(pool_id)                     once, before any start (connect, check, lease)
    driver.start(tenant, profile, uid)  ──►  handle          (a started sandbox that said hello)
        handle.request(...) ... handle.recycle() ... handle.request(...)
        handle.destroy()                                     (idempotent)
    driver.maintain() every maintenance_s   (cheap; may hand back slow work for a worker)
    driver.close()                           once: remove whatever is left of this pool

Both protocols are ``runtime_checkable``: ``isinstance`` checks that the members exist, mypy
checks their signatures (``tests/unit/executor/pool/test_driver.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ..profiles import ResourceProfile
from .placement import SandboxSlot


@runtime_checkable
class SandboxHandle(SandboxSlot, Protocol):
    """One started sandbox, as the pool and its sessions use it (a session sees only the
    :class:`~sandpit.executor.pool.placement.SandboxSlot` part: ``id``, ``alive``,
    ``retiring``, ``request``, ``check_churn``). Thread-safe: sessions of one sandbox send
    requests concurrently."""

    @property
    def started_ms(self) -> float:
        """Milliseconds from asking for the sandbox to its runner's hello."""
        ...

    @property
    def memory_limit(self) -> int:
        """The sandbox's memory limit in bytes (0: unknown; admission then only counts)."""
        ...

    def memory(self) -> int | None:
        """Bytes the sandbox is charged now (what its limit and an OOM kill compare), or
        None when it cannot be read. Called with the pool's lock held: must be cheap (a
        file read, not an API call)."""
        ...

    def recycle(self) -> bool:
        """Make the sandbox, whose last session or job has ended, as it was at start (the
        runner's ``recycle``). True when it may serve its tenant again; False when it may
        not (not proven clean, retiring, lost): the pool then destroys it. Never raises
        for a lost sandbox."""
        ...

    def destroy(self) -> None:
        """Remove the sandbox and everything of it on the host; idempotent, safe from any
        thread. Raises the backend's ExecutorError when it cannot reach its engine."""
        ...


@runtime_checkable
class SandboxDriver(Protocol):
    """Starts sandboxes for one pool, and cleans up after it."""

    @property
    def maintenance_s(self) -> float:
        """Seconds between two calls of :meth:`maintain` the driver wants (at most)."""
        ...

    def open(self, pool_id: str) -> None:
        """Get ready to start sandboxes labelled with ``pool_id`` (connect, check the
        runtime, resolve the image, remove leftovers of dead pools). Called once.

        Raises:
            DockerUnavailable (or another ExecutorError): the backend cannot start sandboxes.
            ImageError: the sandbox image is missing.
        """
        ...

    def start(self, tenant: str, profile: ResourceProfile, uid: int) -> SandboxHandle:
        """Start one sandbox of ``tenant`` under ``profile``, its processes running as
        ``uid``; return once its runner has said hello. Blocking (seconds); the pool calls
        it from worker threads, several at once.

        Raises:
            SandboxStartError: the sandbox did not come up (nothing of it is left).
            DockerUnavailable, ImageError: the backend refused.
        """
        ...

    def ping(self) -> None:
        """Return when the backend answers. Raises DockerUnavailable (or another
        ExecutorError) when it cannot take work, or was never opened."""
        ...

    def memory_total(self) -> int:
        """Bytes of memory the sandboxes of this pool share (the host's); 0: unknown."""
        ...

    def maintain(self) -> Callable[[], None] | None:
        """Periodic housekeeping, called from the pool's maintenance thread: only cheap
        work here (no engine call), never raising for a slow backend. Returns slow work
        that is due (a sweep of dead owners' sandboxes), which the pool runs on its start
        workers, or None."""
        ...

    def stats(self) -> dict[str, int]:
        """The driver's counters, merged into the pool's ``stats()``."""
        ...

    def close(self) -> None:
        """Remove every sandbox of this pool still on the backend (handles the pool
        destroyed are gone already) and give up what :meth:`open` took. Raises the
        backend's ExecutorError when the backend did not answer."""
        ...
