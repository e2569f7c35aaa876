"""Blocking work on worker threads, its result handed back to the event loop with the GIL
released (:class:`WorkerThreads`).

``loop.run_in_executor`` hands a result back with ``call_soon_threadsafe``, whose wake-up
write runs while the worker still holds the GIL: the loop thread wakes only to wait for
the GIL until the worker has finished its own tail (its future's callbacks, back to the
pool's queue), and on a busy machine the worker is often preempted in between while it
still holds the GIL. Here the worker appends ``(future, outcome)`` to a queue and writes
one byte to a socket pair with ``socket.send``, which releases the GIL for the system
call, so the loop thread takes the GIL the moment it wakes; the loop reads the byte
(``loop.add_reader``) and settles every queued future.

Contract: :meth:`WorkerThreads.run` returns ``work()``'s value or raises its exception
(``BaseException`` included) in the caller's task; a caller cancelled meanwhile leaves
the work running to its end and its outcome dropped; at most ``threads`` works run at
once (more wait for a free thread, in order). One wake-up pair per event loop that used
it; :meth:`WorkerThreads.close` ends the threads (once their work returns) and the pairs.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

_T = TypeVar("_T")


class _Wake(Generic[_T]):
    """One event loop's side: settled futures queued by workers, and the socket pair
    whose byte tells the loop to settle them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.writer.setblocking(False)
        self.done: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        loop.add_reader(self.reader.fileno(), self._settle)

    def deliver(self, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """From a worker thread: queue the outcome, then wake the loop (GIL released in
        ``send``). A full pair already has a wake-up pending; a closed one has no loop
        to wake (the future is dropped with it)."""
        self.done.append((future, ok, value))
        try:
            self.writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _settle(self) -> None:
        """On the loop: read the wake-up bytes, then settle every queued future (those
        whose caller was cancelled are skipped)."""
        try:  # one read: bytes left over (over 4096 wake-ups) keep the pair readable, so the loop comes back
            self.reader.recv(4096)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # closed under us: nothing left to settle
            return
        while self.done:
            future, ok, value = self.done.popleft()
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def close(self) -> None:
        """Stop watching the pair and close it (from the loop's thread or after the loop ended)."""
        try:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.reader.fileno())
        except (RuntimeError, ValueError, OSError):  # pragma: no cover - a loop closing under us
            pass
        self.reader.close()
        self.writer.close()


class _Worker:
    """One worker thread's side: its own socket pair (the thread waits in ``recv`` on
    ``wait``; one byte on ``ring`` hands it :attr:`task`)."""

    __slots__ = ("ring", "task", "wait")

    def __init__(self) -> None:
        self.wait, self.ring = socket.socketpair()
        self.task: Callable[[], None] | None = None

    def close(self) -> None:
        self.wait.close()
        self.ring.close()


class _Crew:
    """One generation of worker threads: the idle ones (the most recently idle last), the
    tasks waiting for a thread while all are busy, how many were started, and whether the
    crew is dismissed. Each thread waits on its own socket pair, so a task wakes exactly
    the thread it is handed to: threads waiting together on one pair would all wake for
    every byte (the kernel wakes every reader of a socket), which with hundreds of idle
    threads costs a millisecond of CPU per task."""

    def __init__(self) -> None:
        self.tasks: collections.deque[Callable[[], None]] = collections.deque()
        self.idle: list[_Worker] = []
        self.started = 0
        self.dismissed = False
        self.lock = threading.Lock()

    def serve(self, worker: _Worker, task: Callable[[], None] | None) -> None:
        """A thread's loop: run ``task``, then the tasks queued meanwhile, then wait idle
        for the next one handed over (None: the crew is dismissed)."""
        try:
            while task is not None:
                task()
                with self.lock:
                    if self.tasks:
                        task = self.tasks.popleft()
                        continue
                    if self.dismissed:
                        return
                    worker.task = None
                    self.idle.append(worker)
                worker.wait.recv(1)  # the byte comes after the task was set
                task = worker.task
        finally:
            worker.close()

    def dismiss(self) -> None:
        """End the threads once the work queued and running is done (idle ones at once)."""
        with self.lock:
            self.dismissed = True
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.ring.send(b"\0")  # its task is None


class WorkerThreads:
    """Runs blocking callables on up to ``threads`` threads named ``<name>_N`` (started as
    work arrives and no thread is idle, again after :meth:`close`; see the module
    docstring). An idle thread waits for work in ``recv`` on its own socket pair (the GIL
    released), and the loop hands a task to the most recently idle one with ``send`` (the
    GIL released too), where a ``ThreadPoolExecutor``'s queue wakes it with the GIL held.
    With every thread busy, tasks queue (in order) for the first thread that finishes."""

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads!r}")
        self.threads = threads
        self.name = name
        self._wakes: dict[asyncio.AbstractEventLoop, _Wake[Any]] = {}
        self._lock = threading.Lock()
        self._crew: _Crew | None = None
        self.running = 0
        """Calls of :meth:`run` awaiting their work now (changed on the event loop only)."""

    def _wake(self, loop: asyncio.AbstractEventLoop) -> _Wake[Any]:
        wake = self._wakes.get(loop)
        if wake is None:
            with self._lock:
                for old in [w for w in self._wakes.values() if w.loop.is_closed()]:  # loops gone: their pairs too
                    del self._wakes[old.loop]
                    old.close()
                wake = self._wakes[loop] = _Wake(loop)
        return wake

    def _submit(self, task: Callable[[], None]) -> None:
        """Hand ``task`` to the most recently idle thread, else to a new thread (below
        ``threads``), else queue it for the first thread that finishes its work."""
        with self._lock:
            crew = self._crew
            if crew is None:
                crew = self._crew = _Crew()
            with crew.lock:
                worker = crew.idle.pop() if crew.idle else None
                start = worker is None and crew.started < self.threads
                if worker is not None:
                    worker.task = task
                elif start:
                    crew.started += 1
                else:
                    crew.tasks.append(task)
            if start:
                threading.Thread(target=crew.serve, args=(_Worker(), task), daemon=True,
                                 name=f"{self.name}_{crew.started - 1}").start()
        if worker is not None:
            worker.ring.send(b"\0")

    async def run(self, work: Callable[[], _T]) -> _T:
        """``work()`` on a worker thread; its value, or its exception raised here."""
        loop = asyncio.get_running_loop()
        wake = self._wake(loop)
        future: asyncio.Future[_T] = loop.create_future()

        def task() -> None:
            try:
                value = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's task
                wake.deliver(future, False, exc)
            else:
                wake.deliver(future, True, value)

        self._submit(task)
        self.running += 1
        try:
            return await future
        finally:
            self.running -= 1

    def close(self) -> None:
        """Let the threads end once the work they run returns (what is queued still runs
        first), and close the wake-up pairs (a later :meth:`run` makes new ones)."""
        with self._lock:
            crew, self._crew = self._crew, None
            wakes, self._wakes = list(self._wakes.values()), {}
        if crew is not None:
            crew.dismiss()
        for wake in wakes:
            wake.close()
