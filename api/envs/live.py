"""The live-session cache: which envs are in a sandbox now, their locks, eviction, and
the janitor thread.

A live env (:class:`LiveEnv`) holds a sandbox session plus its head
:class:`~sandpit.api.db.store.StateCache`, its environment's compiled tools and its
episode's bookkeeping, so a step on a live env reads nothing from the database. An env
without one (new fork, evicted, after an API restart) is re-created from its head state
on its next request (:meth:`.sessions.Sessions.live_entry`). Requests on one env are
serialized by its lock (:meth:`LiveEnvs.lock`); different envs run concurrently.
Eviction never waits: an env whose lock is held is busy and stays.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from ..db.store import StateCache
from ..metrics import Metrics
from ..sandboxes import SandboxSession
from .actions import ToolSet
from .rulebook import EpisodeRun

log = logging.getLogger("sandpit.api")

CLOSE_CONCURRENCY = 16
"""Sessions :meth:`LiveEnvs.close` closes at once (each is a round trip to its sandbox;
sessions of different sandboxes close in parallel)."""
RETIRE_THREADS = 2
"""Threads closing the sessions :meth:`LiveEnvs.retire` is given (a close is a round trip
to the session's sandbox: 1 to 2 ms, more when it empties the sandbox, which is then
recycled)."""


@dataclass(kw_only=True)
class LiveEnv:
    """An env placed in a sandbox: its session and head state, plus what a step needs
    from the database rows (so a step on a live env reads nothing from the database)."""

    session: SandboxSession
    cache: StateCache
    """The head state (the state of ``step``)."""
    episode: int
    step: int
    toolset: ToolSet
    """The environment's derived tools with their argument validators."""
    tenant: str
    environment_id: str
    expires_at: datetime
    last_used: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` of the last request (idle eviction, least recently used first)."""
    run: EpisodeRun = field(default_factory=EpisodeRun)
    argument_checking: str = "off"
    """``off``, ``warn`` or ``strict`` (the env's own, else its environment's)."""


class LiveEnvs:
    """Env id -> :class:`LiveEnv`, and one lock per env id (see the module docstring)."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._live: dict[str, LiveEnv] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._registry = threading.Lock()
        self._retiring: ThreadPoolExecutor | None = None
        """:meth:`retire`'s threads (made on first use; None again once :meth:`close` ran)."""
        self._closed = False

    def __contains__(self, env_id: object) -> bool:
        return env_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def get(self, env_id: str) -> LiveEnv | None:
        """The env's live entry, if it has one (possibly with a closed session)."""
        return self._live.get(env_id)

    @contextmanager
    def lock(self, env_id: str) -> Iterator[None]:
        """Hold the env's lock (requests on one env run one at a time)."""
        with self._lock_of(env_id):
            yield

    def busy(self, env_id: str) -> bool:
        """Whether a request holds the env's lock now (a hint: it may be taken or
        released right after)."""
        lock = self._locks.get(env_id)
        return lock is not None and lock.locked()

    def _lock_of(self, env_id: str) -> threading.Lock:
        with self._registry:
            return self._locks.setdefault(env_id, threading.Lock())

    def forget(self, env_id: str) -> None:
        """Drop the lock of a deleted env."""
        with self._registry:
            self._locks.pop(env_id, None)

    def put(self, env_id: str, entry: LiveEnv) -> None:
        """Make ``entry`` the env's live entry."""
        with self._registry:
            self._live[env_id] = entry
            self._count()

    def detach(self, env_id: str) -> LiveEnv | None:
        """Forget the env's live entry without closing its session, and return it (None:
        it had none): the caller closes the session (``reset`` opens the next episode's
        first, so the sandbox it leaves still holds the environment's templates)."""
        with self._registry:
            entry = self._live.pop(env_id, None)
            self._count()
        return entry

    def drop(self, env_id: str) -> None:
        """Close the env's session and forget it (its state stays in the database)."""
        with self._registry:
            entry = self._live.pop(env_id, None)
            self._count()
        if entry is not None:
            entry.session.close()

    def _entries(self) -> list[tuple[str, LiveEnv]]:
        """The live entries as of now, ``(env id, entry)``: copied under the registry lock
        (one C-level copy), so a pass over thousands of them (eviction's sort by last use)
        runs without holding the lock every request's :meth:`lock` takes."""
        with self._registry:
            return list(self._live.items())

    def _count(self) -> None:
        if self.metrics is not None:
            self.metrics.live_envs.set(len(self._live))

    def evict_lru(self, exclude: str) -> bool:
        """Evict the least recently used env that is not busy; True if one was evicted."""
        candidates = sorted((e.last_used, env_id) for env_id, e in self._entries() if env_id != exclude)
        for _, env_id in candidates:
            lock = self._lock_of(env_id)
            if not lock.acquire(blocking=False):
                continue
            try:
                self.drop(env_id)
                return True
            finally:
                lock.release()
        return False

    def evict_idle(self, idle_s: float, keep_going: Callable[[], bool] | None = None) -> int:
        """Close the sessions of envs idle for ``idle_s`` seconds (not busy ones), least
        recently used first; ``keep_going()``, when given, is asked before the first one
        (a False then returns before the live entries are even listed: with 10,000 of
        them, listing and sorting holds this process for milliseconds every janitor pass)
        and again after each eviction, and the eviction stops at its first False. Returns
        how many were evicted."""
        if keep_going is not None and not keep_going():
            return 0
        cutoff = time.monotonic() - idle_s
        idle = [env_id for _, env_id in sorted((e.last_used, env_id) for env_id, e in self._entries()
                                               if e.last_used <= cutoff)]
        evicted = 0
        for env_id in idle:
            lock = self._lock_of(env_id)
            if not lock.acquire(blocking=False):
                continue
            try:
                entry = self._live.get(env_id)
                if entry is not None and entry.last_used <= cutoff:
                    self.drop(env_id)
                    evicted += 1
            finally:
                lock.release()
            if evicted and keep_going is not None and not keep_going():
                break
        return evicted

    def retire(self, session: SandboxSession) -> None:
        """Close ``session``, one no entry holds any more (a reset's previous episode,
        detached), on a thread of :data:`RETIRE_THREADS`: the request that replaced it
        does not wait for its sandbox's reply (the process killed and reaped, leftovers
        swept, its work directory removed; the sandbox recycled when that was its last
        session). A close that raises is logged. After :meth:`close`, it closes at once."""
        with self._registry:
            if not self._closed:
                if self._retiring is None:
                    self._retiring = ThreadPoolExecutor(RETIRE_THREADS, thread_name_prefix="sandpit-retire")
                self._retiring.submit(self._close_quietly, session)
                return
        self._close_quietly(session)

    @staticmethod
    def _close_quietly(session: SandboxSession) -> None:
        try:
            session.close()
        except Exception:  # noqa: BLE001 - nobody waits for it; logged
            log.exception("closing a retired session failed")

    def close(self, concurrency: int = CLOSE_CONCURRENCY) -> None:
        """Close every live session (their state stays in the database), ``concurrency``
        at a time (at least 1), once the retired sessions (:meth:`retire`) are closed. A
        session whose close raises is logged and the others are still closed; the
        executor removes every sandbox when it closes after this."""
        with self._registry:
            retiring, self._retiring, self._closed = self._retiring, None, True
        if retiring is not None:
            retiring.shutdown(wait=True)
        with self._registry:
            live = list(self._live.values())
            self._live.clear()
            self._count()

        def close_one(entry: LiveEnv) -> None:
            try:
                entry.session.close()
            except Exception:  # noqa: BLE001 - the other sessions must still close; logged
                log.exception("closing a live session at shutdown failed")

        if len(live) <= 1 or concurrency <= 1:
            for entry in live:
                close_one(entry)
            return
        with ThreadPoolExecutor(min(concurrency, len(live)), thread_name_prefix="sandpit-close") as closer:
            list(closer.map(close_one, live))


class Janitor:
    """A daemon thread that runs ``tasks`` every ``interval_s`` seconds (idle eviction,
    expiry, storage collection); a task that raises is logged and the others go on."""

    def __init__(self, interval_s: float, tasks: list[Callable[[], object]]) -> None:
        self.interval_s = interval_s
        self.tasks = tasks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sandpit-janitor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop (waits up to 10 s for a pass in progress)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for task in self.tasks:
                    task()
            except Exception:  # noqa: BLE001 - the janitor must keep running; logged
                log.exception("janitor pass failed")
