"""Group commit: the writes of concurrent requests committed in one transaction.

A step's write is small (a few rows) while a transaction costs a fixed amount (begin,
SQLAlchemy's session bookkeeping, the commit; on SQLite also one writer at a time), so
under concurrency committing each step alone makes the database the queue. A
:class:`GroupCommit` collects the items of concurrent callers and writes them together::

    caller A ──submit(a)──┐            (A leads: nobody was committing)
    caller B ──submit(b)──┤ queue ──►  A: write_batch(session, [a]) + commit ─► A, wakes B
    caller C ──submit(c)──┘            B leads next: write_batch(session, [b, c]) + commit

Leader/follower, no thread of its own: the first caller to find nobody committing leads,
writes every queued item (at most ``max_batch``) in one
:meth:`Database.write_connection` transaction, wakes the callers of that batch, and hands the lead to the oldest caller
still queued. A lone caller therefore commits on its own thread with no hand-off, and
callers that arrive while a batch commits share the next one.

Guarantees (what :meth:`GroupCommit.submit` promises its caller):

* it returns only after the transaction holding its item has committed (durable as the
  database makes a commit; see :mod:`.engine`);
* if the batch transaction fails, nothing of it was committed and every item is retried
  alone, in its own transaction: an item that fails alone gets that error (raised from
  ``submit``), the others commit. One bad item never takes the rest of its batch down,
  and an item that ``submit`` reports as failed was never committed;
* items are written in the order they were submitted (a caller that submits the next
  item of the same env only after ``submit`` returned is always later).

:meth:`GroupCommit.submit_many` queues several items of one caller at once (each with
the guarantees above): the writes of a batched step's steps, one transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sqlalchemy import Connection

from .database import Database

Item = TypeVar("Item")


@dataclass(eq=False)
class _Waiter(Generic[Item]):
    item: Item
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    """Set (with ``done``) when this caller must lead the next batch."""
    error: BaseException | None = None


class GroupCommit(Generic[Item]):
    """Commits items of concurrent callers together (see the module docstring).

    Args:
        db: the unit of work (its :meth:`Database.write` transactions).
        write_batch: writes a list of items into the open transaction of the Core
            connection it is given (:meth:`Database.write_connection`); it must only write (no commit) and may be called again with a
            subset of the items after a failure (rolled back first).
        max_batch: most items in one transaction.
    """

    def __init__(self, db: Database, write_batch: Callable[[Connection, list[Item]], None], max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.db = db
        self.write_batch = write_batch
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[_Waiter[Item]] = []
        self._leading = False
        self.batches = 0
        """Transactions committed so far (batch attempts that committed, retries included)."""
        self.items = 0
        """Items committed so far."""

    def submit(self, item: Item) -> None:
        """Write ``item`` and return once it is committed. Raises what writing it alone
        raised (ServiceUnavailable for a database failure: see :class:`Database`)."""
        waiter = _Waiter(item)
        with self._lock:
            self._queue.append(waiter)
            lead = not self._leading
            if lead:
                self._leading = True
        if not lead:
            waiter.done.wait()
            if not waiter.lead:
                if waiter.error is not None:
                    raise waiter.error
                return
        self._lead(waiter)
        if waiter.error is not None:
            raise waiter.error

    def try_submit(self, item: Item) -> bool:
        """:meth:`submit`, only when ``item`` can be committed at once on this thread: no
        batch is being committed or waits to be, and the database's writer is free now
        (:meth:`Database.write_free`). Returns True once committed, False when it could
        not start (nothing was queued: :meth:`submit` it then). Raises what :meth:`submit`
        raises. For a caller that must not wait for other writers (the event loop,
        :func:`~sandpit.api.envs.step_work.run_inline`)."""
        if not self.db.write_free():
            return False
        waiter = _Waiter(item)
        with self._lock:
            if self._leading or self._queue:
                return False
            self._queue.append(waiter)
            self._leading = True
        self._lead(waiter)
        if waiter.error is not None:
            raise waiter.error
        return True

    def submit_many(self, items: list[Item]) -> list[BaseException | None]:
        """Write ``items`` (queued together, in their order) and return once each is
        committed or failed: ``[None | the error writing it alone raised]`` in the order
        of ``items``. An item's error never fails the others (the module's guarantees)."""
        waiters = [_Waiter(item) for item in items]
        if not waiters:
            return []
        with self._lock:
            self._queue.extend(waiters)
            if not self._leading:  # nobody commits, so the queue held nothing before these
                self._leading = True
                waiters[0].lead = True
                waiters[0].done.set()
        for waiter in waiters:
            waiter.done.wait()
            if waiter.lead:  # the lead came to this caller: commit until this item is done
                self._lead(waiter)
        return [waiter.error for waiter in waiters]

    def _lead(self, own: _Waiter[Item]) -> None:
        """Commit batches until ``own`` is committed (or failed), then hand the lead on."""
        try:
            while not own.done.is_set() or own.lead:
                own.lead = False
                with self._lock:
                    batch = self._queue[:self.max_batch]
                    del self._queue[:self.max_batch]
                if not any(waiter is own for waiter in batch):  # pragma: no cover - own is queued before it leads
                    raise RuntimeError("group commit: the leader's item is not queued")
                self._commit(batch)
                for waiter in batch:
                    if waiter is not own:
                        waiter.done.set()
                own.done.set()
        finally:
            with self._lock:
                if self._queue:
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.done.set()
                else:
                    self._leading = False

    def _commit(self, batch: list[_Waiter[Item]]) -> None:
        """One transaction for ``batch``; on failure each item alone (errors recorded)."""
        try:
            self._write([w.item for w in batch])
            return
        except BaseException as exc:  # noqa: BLE001 - recorded per item below, or re-raised
            if len(batch) == 1:
                batch[0].error = exc
                return
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: give up on all
                for waiter in batch:
                    waiter.error = exc
                return
        for waiter in batch:
            try:
                self._write([waiter.item])
            except BaseException as exc:  # noqa: BLE001 - the item's own failure, raised by its submit
                waiter.error = exc

    def _write(self, items: list[Item]) -> None:
        with self.db.write_connection() as conn:
            self.write_batch(conn, items)
        with self._lock:
            self.batches += 1
            self.items += len(items)

