"""The pool's sandboxes by key and state, and the work that keeps them: :class:`WarmSets`.

A key is ``(tenant, profile name)``: a sandbox only ever serves the tenant it was started
for, under one profile. Each sandbox of the pool is in exactly one state, all guarded by
:attr:`WarmSets.lock`::

    starting ──► idle (warm) ──► active (sessions or a job's slot) ──► recycling ──► idle
                   │                     └── dead or unclean ──► dropped (destroyed)
                   └── beyond the warm quota for idle_timeout_s, or dead ──► dropped

* **Refill** (:meth:`WarmSets.refill_loop`): for every key that has been used (or warmed),
  keep ``pool_size`` idle sandboxes, starting at most ``pool_refill_concurrency`` at once
  and never more than ``max_sandboxes`` in all.
* **Idle drop** (:meth:`WarmSets.drop_idle`, from :meth:`WarmSets.maintenance_loop`, which
  also runs the driver's maintenance): dead idle sandboxes go at once; idle ones beyond the
  warm quota of their key go after ``idle_timeout_s``.
* **uids**: every live sandbox runs as a uid of its own from ``[uid_base, uid_base +
  uid_count)`` (:meth:`WarmSets.take_uid_locked`), so RLIMIT_NPROC and file ownership
  never span two sandboxes.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..errors import CapacityError
from ..profiles import ResourceProfile
from ..settings import ExecutorSettings
from .configs import SentConfigs
from .driver import SandboxDriver, SandboxHandle

log = logging.getLogger("sandpit.executor.pool")

PoolKey = tuple[str, str]
"""``(tenant, profile name)``: which sandboxes may serve a placement."""


class PooledSandbox:
    """The pool's record of one sandbox: the driver's handle and what placement and
    admission know of it. Fields are read and written with :attr:`WarmSets.lock` held,
    except :attr:`configs` and :attr:`config_keys`, which the session being placed there
    updates."""

    def __init__(self, handle: SandboxHandle, key: PoolKey, uid: int) -> None:
        self.handle = handle
        self.id = handle.id
        self.key = key
        self.uid = uid
        self.sessions: set[str] = set()
        """Sessions (and one-shot jobs' slots) placed here."""
        self.idle_since = time.monotonic()
        self.memory_used: int | None = None
        """Bytes it was charged at the last sample (None: never read, or unreadable)."""
        self.memory_empty: int | None = None
        """The first sample taken with no session placed: the runner and its spare."""
        self.memory_sampled_at = 0.0
        self.sessions_at_sample = 0
        """How many sessions were placed when :attr:`memory_used` was read."""
        self.configs = SentConfigs()
        """Config hashes sent to its runner (what we believe it holds; a miss is answered
        ``missing_config`` and the bytes are sent again)."""
        self.config_keys: set[tuple[str, str, str]] = set()
        """(source sha256, class name, config hash) opened here since the last recycle: where
        a config template may be ready (placement prefers such a sandbox)."""

    def sample_memory(self, max_age_s: float) -> int | None:
        """The bytes the sandbox is charged (:meth:`SandboxHandle.memory`), read again when
        the last sample is older than ``max_age_s`` seconds; None when it cannot be read.
        Call with the pool's lock held (it updates the sample fields)."""
        now = time.monotonic()
        if self.memory_used is None or now - self.memory_sampled_at >= max_age_s:
            used = self.handle.memory()
            if used is not None:
                self.memory_used = used
                self.memory_sampled_at = now
                self.sessions_at_sample = len(self.sessions)
                if not self.sessions and self.memory_empty is None:
                    self.memory_empty = used
        return self.memory_used

    def forget_configs(self) -> None:
        """The runner forgot its configs and templates (a recycle)."""
        self.configs.clear()
        self.config_keys.clear()


class WarmSets:
    """Every sandbox of one pool by key and state (module docstring).

    Args:
        settings: ``pool_size``, ``pool_refill_concurrency``, ``max_sandboxes``,
            ``idle_timeout_s``, ``uid_base``, ``uid_count``.
    """

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.lock = threading.Condition()
        """Guards every field here and every :class:`PooledSandbox`'s bookkeeping;
        notified whenever a sandbox becomes placeable, is dropped, or the pool stops."""
        self.idle: collections.defaultdict[PoolKey, collections.deque[PooledSandbox]] = \
            collections.defaultdict(collections.deque)
        self.active: collections.defaultdict[PoolKey, list[PooledSandbox]] = collections.defaultdict(list)
        self.all: dict[str, PooledSandbox] = {}
        """Every live sandbox by id (idle, active and recycling)."""
        self.starting: collections.Counter[PoolKey] = collections.Counter()
        self.recycling: collections.Counter[PoolKey] = collections.Counter()
        """Sandboxes of a key being recycled off their caller's path: invisible to placement,
        which waits for them rather than start a container."""
        self.wanted: dict[PoolKey, ResourceProfile] = {}
        """Keys kept warm, with the profile their sandboxes start with."""
        self.stop = threading.Event()
        self._uids_in_use: set[int] = set()
        self._next_uid = secrets.randbelow(settings.uid_count)

    # -- with the lock held -------------------------------------------------------------
    def take_uid_locked(self) -> int:
        """A uid no live sandbox of this pool runs as. Raises CapacityError when all
        ``uid_count`` are taken."""
        for _ in range(self.settings.uid_count):
            uid = self.settings.uid_base + self._next_uid
            self._next_uid = (self._next_uid + 1) % self.settings.uid_count
            if uid not in self._uids_in_use:
                self._uids_in_use.add(uid)
                return uid
        raise CapacityError("no free sandbox uid", retry_after_s=1.0)

    def free_uid_locked(self, uid: int) -> None:
        """``uid`` is no sandbox's any more (its start failed)."""
        self._uids_in_use.discard(uid)

    def room_locked(self) -> int:
        """Sandboxes that may still be started under ``max_sandboxes``."""
        return self.settings.max_sandboxes - len(self.all) - sum(self.starting.values())

    def drop_locked(self, sandbox: PooledSandbox) -> None:
        """Forget ``sandbox`` wherever it is and destroy it in a thread of its own (the
        handle's destroy is idempotent)."""
        self.all.pop(sandbox.id, None)
        self._uids_in_use.discard(sandbox.uid)
        if sandbox in self.active[sandbox.key]:
            self.active[sandbox.key].remove(sandbox)
        if sandbox in self.idle[sandbox.key]:
            self.idle[sandbox.key].remove(sandbox)
        threading.Thread(target=sandbox.handle.destroy, daemon=True).start()

    def reclaim_idle_locked(self, key: PoolKey) -> bool:
        """At capacity: drop the longest-idle warm sandbox kept for another key, so a
        request of ``key`` can start one. False when none is idle."""
        idle = [s for k, queue in self.idle.items() if k != key for s in queue]
        if not idle:
            return False
        self.drop_locked(min(idle, key=lambda s: s.idle_since))
        return True

    def add_idle_locked(self, sandbox: PooledSandbox) -> None:
        """``sandbox`` (in :attr:`all`) is warm now."""
        sandbox.idle_since = time.monotonic()
        self.idle[sandbox.key].append(sandbox)
        self.lock.notify_all()

    def counts_locked(self) -> dict[str, int]:
        """``sandboxes`` (live), ``idle``, ``active``, ``starting``, ``recycling`` and
        ``sessions`` (placed in them, one-shot jobs' slots included)."""
        return {"sandboxes": len(self.all), "idle": sum(len(q) for q in self.idle.values()),
                "active": sum(len(v) for v in self.active.values()), "starting": sum(self.starting.values()),
                "recycling": sum(self.recycling.values()),
                "sessions": sum(len(s.sessions) for s in self.all.values())}

    def take(self) -> list[PooledSandbox]:
        """Empty every set and return the sandboxes that were in it (the pool closes)."""
        with self.lock:
            sandboxes = list(self.all.values())
            self.all.clear()
            self.idle.clear()
            self.active.clear()
            return sandboxes

    # -- background work ------------------------------------------------------------------
    def drop_idle(self) -> None:
        """Drop dead idle sandboxes, and idle ones beyond their key's warm quota for more
        than ``idle_timeout_s`` seconds."""
        now = time.monotonic()
        with self.lock:
            for key, queue in list(self.idle.items()):
                keep = self.settings.pool_size if key in self.wanted else 0
                for sandbox in list(queue):
                    if not sandbox.handle.alive:
                        self.drop_locked(sandbox)
                    elif len(queue) > keep and now - sandbox.idle_since > self.settings.idle_timeout_s:
                        self.drop_locked(sandbox)

    def refill_loop(self, start: Callable[[PoolKey, ResourceProfile, int], PooledSandbox],
                    workers: ThreadPoolExecutor) -> None:
        """Until :attr:`stop`: start sandboxes on ``workers`` with ``start(key, profile,
        uid)`` wherever a wanted key has fewer than ``pool_size`` idle or starting (module
        docstring). A failed start is logged and retried after a second."""
        while not self.stop.is_set():
            jobs: list[tuple[PoolKey, ResourceProfile, int]] = []
            with self.lock:
                for key, profile in self.wanted.items():
                    deficit = self.settings.pool_size - len(self.idle[key]) - self.starting[key]
                    for _ in range(max(0, min(deficit, self.room_locked(), self.settings.pool_refill_concurrency))):
                        self.starting[key] += 1
                        jobs.append((key, profile, self.take_uid_locked()))
                if not jobs:
                    self.lock.wait(0.5)
                    continue
            futures = [workers.submit(start, *job) for job in jobs]
            for (key, _, _), future in zip(jobs, futures, strict=True):
                try:
                    sandbox = future.result()
                except Exception as exc:  # noqa: BLE001 - logged, retried after a pause
                    log.warning("warm sandbox start failed: %s", exc)
                    with self.lock:
                        self.starting[key] -= 1
                    self.stop.wait(1.0)
                    continue
                with self.lock:
                    self.starting[key] -= 1
                    if self.stop.is_set():
                        sandbox.handle.destroy()
                        continue
                    self.all[sandbox.id] = sandbox
                    self.add_idle_locked(sandbox)

    def maintenance_loop(self, driver: SandboxDriver, workers: ThreadPoolExecutor) -> None:
        """Until :attr:`stop`, every few seconds (at most 5, half ``idle_timeout_s``, the
        driver's ``maintenance_s``): the driver's maintenance, whose slow part (if due) goes
        to ``workers``, then :meth:`drop_idle`. Nothing here waits on the backend."""
        period = min(5.0, self.settings.idle_timeout_s / 2, driver.maintenance_s)
        while not self.stop.wait(period):
            try:
                slow = driver.maintain()
                if slow is not None:
                    try:
                        workers.submit(slow)
                    except RuntimeError:  # the workers were shut down: the pool is closing
                        pass
                self.drop_idle()
            except Exception:  # noqa: BLE001 - the loop must outlive a bug: it renews the driver's lease
                log.exception("pool maintenance failed")
