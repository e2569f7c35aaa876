"""WAL checkpoints of a SQLite database off the commit path.

In WAL mode a commit appends pages to ``<db>-wal``; a *checkpoint* copies them back into
the database file and syncs it. By default SQLite runs one inside whichever commit finds
the WAL over 1,000 pages (``wal_autocheckpoint``), so every ~1,000 pages one step's
commit, and every step of the group commit waiting behind it, pays for copying ~4 MB and
an ``fsync``: tens of times a commit's own cost, growing with the disk's queue.

:class:`WalCheckpointer` moves that work to a thread of its own: every ``interval_s`` it
runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection, which copies what no
reader still needs without taking the write lock, so commits go on meanwhile. The serving
engine raises its connections' ``wal_autocheckpoint`` to :data:`FOREGROUND_PAGES`
(:func:`~.engine.make_engine`), which stays as a safety net: should the thread fall
behind (or die), a commit checkpoints as SQLite always did once the WAL passes it, so the
WAL cannot grow without bound. ``journal_size_limit`` truncates the WAL file back to
:data:`WAL_KEEP_BYTES` when SQLite restarts it from the start.

A reader that keeps an old snapshot open holds back the frames it may read; the passive
checkpoint then copies what it can and the rest on a later pass (nothing waits for it).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import Engine, text

log = logging.getLogger("sandpit.api")

FOREGROUND_PAGES = 16_000
"""``wal_autocheckpoint`` of the serving connections while the checkpointer runs (pages:
~64 MB of 4 KiB pages; SQLite's default is 1,000)."""
WAL_KEEP_BYTES = 64 * 1024 * 1024
"""``journal_size_limit``: bytes of the WAL file kept when SQLite restarts it."""


@dataclass
class CheckpointStats:
    """What the checkpointer has done (counters, read by tests)."""

    passes: int = 0
    """Checkpoints run."""
    frames_copied: int = 0
    """WAL frames (pages) copied into the database file, summed over passes."""
    incomplete: int = 0
    """Passes that left frames behind (a reader held them, or a commit raced the pass)."""
    errors: int = 0
    """Passes that failed (logged; the next pass tries again)."""


class WalCheckpointer:
    """A thread running passive WAL checkpoints of ``engine``'s SQLite file every
    ``interval_s`` seconds (see the module docstring).

    :meth:`start` returns at once; :meth:`close` stops the thread (after at most one
    pass) and runs a last passive checkpoint. Engines that are not SQLite are ignored:
    ``start`` and ``close`` do nothing.
    """

    def __init__(self, engine: Engine, interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.engine = engine
        self.interval_s = interval_s
        self.stats = CheckpointStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        """True for a SQLite engine (the only kind with a WAL of its own)."""
        return self.engine.dialect.name == "sqlite"

    def start(self) -> WalCheckpointer:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sandpit-wal-checkpoint", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=30)
        self.checkpoint()

    def checkpoint(self) -> tuple[int, int, int] | None:
        """One passive checkpoint: SQLite's ``(busy, frames in the WAL, frames
        checkpointed)``, or None when it failed (logged, counted)."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(text("PRAGMA wal_checkpoint(PASSIVE)")).one()
        except Exception:  # noqa: BLE001 - a failed pass is retried on the next; the foreground net remains
            self.stats.errors += 1
            log.warning("WAL checkpoint failed; retrying in %g s", self.interval_s, exc_info=True)
            return None
        busy, frames, copied = int(row[0]), int(row[1]), int(row[2])
        self.stats.passes += 1
        if frames > 0:
            self.stats.frames_copied += max(0, copied)
            if copied < frames:
                self.stats.incomplete += 1
        return busy, frames, copied

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.checkpoint()
