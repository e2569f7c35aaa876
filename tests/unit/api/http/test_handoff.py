"""Worker threads with a GIL-free hand-back (``sandpit.api.http.handoff``): values and
exceptions reach the caller's task, at most ``threads`` works run at once and the rest
wait their turn, a task wakes only the thread it is handed to (the most recently idle),
a cancelled caller leaves its work to finish, and ``close`` ends the threads and lets a
later run start new ones, on any event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sandpit.api.http.handoff import WorkerThreads


class Stop(BaseException):
    """Not an Exception: handed back all the same."""


def test_values_and_exceptions_reach_the_caller() -> None:
    threads = WorkerThreads(2, "t-values")

    async def main() -> None:
        assert await threads.run(lambda: 41 + 1) == 42
        assert await threads.run(threading.current_thread) is not threading.current_thread()  # another thread
        with pytest.raises(ValueError, match="bad"):
            await threads.run(lambda: int("bad"))
        with pytest.raises(Stop):
            await threads.run(lambda: (_ for _ in ()).throw(Stop()))
        assert await threads.run(lambda: "after errors") == "after errors"

    try:
        asyncio.run(main())
    finally:
        threads.close()


def test_at_most_threads_run_at_once_and_every_work_runs() -> None:
    threads = WorkerThreads(3, "t-cap")
    lock = threading.Lock()
    running, peak, names = [0], [0], set()

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            names.add(threading.current_thread().name)
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return i

    async def main() -> list[int]:
        return await asyncio.gather(*(threads.run(lambda i=i: work(i)) for i in range(12)))

    try:
        assert asyncio.run(main()) == list(range(12))
    finally:
        threads.close()
    assert peak[0] == 3
    assert names <= {"t-cap_0", "t-cap_1", "t-cap_2"}


def test_a_cancelled_caller_leaves_its_work_to_finish() -> None:
    threads = WorkerThreads(1, "t-cancel")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        finished.set()
        return "late"

    async def main() -> str:
        task = asyncio.ensure_future(threads.run(slow))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        return await threads.run(lambda: "next")  # queued behind the cancelled one on the one thread

    try:
        assert asyncio.run(main()) == "next"
        assert finished.is_set()
    finally:
        threads.close()


def test_close_ends_the_threads_and_a_later_run_on_another_loop_starts_new_ones() -> None:
    threads = WorkerThreads(2, "t-close")

    def names() -> set[str]:
        return {t.name for t in threading.enumerate() if t.name.startswith("t-close")}

    async def main() -> str:
        return await threads.run(lambda: threading.current_thread().name)

    assert asyncio.run(main()).startswith("t-close_")
    threads.close()
    deadline = time.monotonic() + 10
    while names() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert names() == set()
    assert asyncio.run(main()).startswith("t-close_")  # a new loop and new threads
    threads.close()
    threads.close()


def _switches(native_id: int) -> int:
    """The voluntary context switches of this process's thread ``native_id`` so far."""
    with open(f"/proc/self/task/{native_id}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def test_a_task_wakes_only_the_thread_it_is_handed_to() -> None:
    """With 64 idle threads, works run one after another go to the most recently idle
    threads (a few: the one that just finished may not be back in time), and no thread
    that runs none of them is woken (threads waiting together on one socket would all
    wake for every task)."""
    threads = WorkerThreads(64, "t-idle")

    async def main() -> tuple[set[int], list[int]]:
        gate = threading.Barrier(64)  # 64 works at once: 64 threads started
        ids = await asyncio.gather(*[threads.run(lambda: (gate.wait(10), threading.get_native_id())[1])
                                     for _ in range(64)])
        await asyncio.sleep(0.2)  # every thread back to waiting
        before = {native_id: _switches(native_id) for native_id in ids}
        ran = {await threads.run(threading.get_native_id) for _ in range(200)}
        return ran, [native_id for native_id in ids if _switches(native_id) != before[native_id]]

    try:
        ran, woken = asyncio.run(main())
    finally:
        threads.close()
    assert len(ran) <= 16, f"200 tasks one at a time went to {len(ran)} of 64 threads"
    assert set(woken) <= ran, f"{len(set(woken) - ran)} threads woke without a task"


def test_outcomes_that_pile_up_while_the_loop_is_blocked_all_reach_their_callers() -> None:
    threads = WorkerThreads(4, "t-many")

    async def main() -> None:
        tasks = [asyncio.ensure_future(threads.run(lambda i=i: i)) for i in range(3000)]
        await asyncio.sleep(0)  # every task hands its work over
        time.sleep(1.0)  # the loop is blocked while the works finish: their wake-up bytes pile up (or the pair fills)
        assert await asyncio.wait_for(asyncio.gather(*tasks), 60) == list(range(3000))

    try:
        asyncio.run(main())
    finally:
        threads.close()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WorkerThreads(0, "t-none")
