"""PID 1's event loop: one selector, deadlines, deferred actions (stdlib only).

PID 1 is single-threaded: everything it does runs in a callback of this loop. Its parts
(the host channel, the process table, the sessions, the jobs, the templates) register
what they need here and never reach each other through the loop:

* :meth:`Loop.watch` ``(obj, callback)``: ``callback(obj)`` whenever ``obj`` (a socket or
  a descriptor) is readable; :meth:`Loop.unwatch` forgets it (quietly when it is not
  watched or already closed);
* :meth:`Loop.add_deadlines` ``(check)``: ``check(now)`` (monotonic seconds) acts on what
  is due and returns the seconds to its next deadline, or None;
* :meth:`Loop.add_busy` ``(busy)``: while any ``busy()`` is True, deferred actions wait;
* :meth:`Loop.after_round` ``(action)``: run after every pass;
* :meth:`Loop.after_child_exit` ``(action)``: run after a pass in which a child may have
  exited (reaping exited children: ``waitpid(-1)`` walks every child in the kernel, so a
  PID 1 holding hundreds of sessions does not pay it on every call);
* :meth:`Loop.later` ``(action)``: run once nothing is busy (a fork ahead must not compete
  with the request that made it necessary), at the latest DEFER_MAX_S seconds after it was
  first asked for; an action asked for twice in one round runs once. With ``quiet=True``
  (a spare's or an environment template's start: a Python start-up, tens of milliseconds
  of the sandbox's CPU quota), only once the loop has also been quiet for QUIET_S (no
  event and nothing busy), or QUIET_MAX_S after it was asked for. The host is still
  finishing the request that was just answered (a create's write and HTTP reply) and its
  client's next request often follows within a few milliseconds: a start that begins at
  once competes with both for the machine's CPU, and one that a ``recycle`` would kill (a
  create's env deleted at once, its sandbox emptied) is not started at all
  (``cancel_deferred``).

A round: deadlines checked; ``select`` for at most the shortest of the poll interval, the
next deadline and the deferred actions' due time; the callbacks of what is readable (the
round's remaining callbacks are skipped once one of them stopped the loop); the
after-round actions; the child-exit actions when SIGCHLD arrived in the round, when
``select`` found nothing (so a missed signal costs at most one poll interval) or when
SIGCHLD does not wake the loop; the deferred actions. SIGCHLD wakes ``select`` through a
socketpair (:meth:`Loop.wake_on_child_exit`), so a child's exit is handled in the round it
happens.
"""

from __future__ import annotations

import selectors
import signal
import socket
import time

from .limits import DEFER_MAX_S, QUIET_MAX_S, QUIET_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any


class Loop:
    """The selector and the callbacks registered with it (module docstring). ``poll_s`` is
    the longest ``select`` wait in seconds."""

    def __init__(self, poll_s: float) -> None:
        self.sel = selectors.DefaultSelector()
        self.poll_s = poll_s
        self.running = True
        self._deadlines: list[Callable[[float], float | None]] = []
        self._busy: list[Callable[[], bool]] = []
        self._after: list[Callable[[], None]] = []
        self._after_exit: list[Callable[[], None]] = []
        self._child_exited = True
        """SIGCHLD arrived since the child-exit actions last ran (True at first: nothing
        has looked yet)."""
        self.deferred: list[tuple[Callable[[], None], float | None]] = []
        """Actions waiting for a quiet moment, each with the time until which it waits for
        QUIET_S of quiet (monotonic seconds; None: it does not, :meth:`later`)."""
        self.last_event = 0.0
        """When ``select`` last returned a readable event (monotonic seconds)."""
        self.deferred_due: float | None = None
        """When the deferred actions run even if something is busy (monotonic seconds)."""
        self._wakeup: tuple[socket.socket, socket.socket] | None = None

    # -- registration ----------------------------------------------------------------------
    def watch(self, obj: Any, callback: Callable[[Any], None]) -> None:
        """Call ``callback(obj)`` whenever ``obj`` is readable. Raises what
        ``selectors`` raises for an object already watched or not selectable."""
        self.sel.register(obj, selectors.EVENT_READ, callback)

    def unwatch(self, obj: Any) -> None:
        """Stop watching ``obj``; nothing happens when it is not watched (or was closed)."""
        try:
            self.sel.unregister(obj)
        except (KeyError, ValueError, OSError):
            pass

    def add_deadlines(self, check: Callable[[float], float | None]) -> None:
        """Have ``check(now)`` called before every ``select`` (see the module docstring)."""
        self._deadlines.append(check)

    def add_busy(self, busy: Callable[[], bool]) -> None:
        """Have deferred actions wait while ``busy()`` is True (at most DEFER_MAX_S)."""
        self._busy.append(busy)

    def busy(self) -> bool:
        """Whether any ``busy()`` of :meth:`add_busy` is True now (a request or a job in flight)."""
        return any(busy() for busy in self._busy)

    def after_round(self, action: Callable[[], None]) -> None:
        """Have ``action()`` run after the callbacks of every round."""
        self._after.append(action)

    def after_child_exit(self, action: Callable[[], None]) -> None:
        """Have ``action()`` run after a round in which a child may have exited (module
        docstring): SIGCHLD arrived, ``select`` timed out with nothing readable, or
        :meth:`wake_on_child_exit` was not called (then after every round)."""
        self._after_exit.append(action)

    # -- deferred actions ------------------------------------------------------------------
    def later(self, action: Callable[[], None], quiet: bool = False) -> None:
        """Run ``action`` once nothing is busy (with ``quiet``: once nothing has been busy
        and no event has come for QUIET_S seconds, or QUIET_MAX_S seconds from now), at
        the latest DEFER_MAX_S seconds from the first action asked for since the last run;
        at most once per round (an action asked for again while it waits keeps its first
        ``quiet``)."""
        now = time.monotonic()
        if all(waiting != action for waiting, _ in self.deferred):  # bound methods: equal, not identical
            self.deferred.append((action, now + QUIET_MAX_S if quiet else None))
        if self.deferred_due is None:
            self.deferred_due = now + DEFER_MAX_S

    def cancel_deferred(self) -> None:
        """Forget every deferred action (``recycle``: what was wanted before is not now)."""
        self.deferred, self.deferred_due = [], None

    def _run_deferred(self) -> None:
        if not self.deferred:
            return
        now = time.monotonic()
        due = now >= (self.deferred_due or 0.0)
        if not due and self.busy():
            return
        quiet = now - self.last_event >= QUIET_S

        def held(until: float | None) -> bool:  # still waiting for quiet (:meth:`later`)
            return not due and not quiet and until is not None and now < until

        actions = [action for action, until in self.deferred if not held(until)]
        if not actions:
            return
        self.deferred = [entry for entry in self.deferred if held(entry[1])]
        if not self.deferred:
            self.deferred_due = None
        for action in actions:
            action()

    # -- running ---------------------------------------------------------------------------
    def stop(self) -> None:
        """End :meth:`run` after the current callback (the rest of its round still runs
        its after-round and deferred actions)."""
        self.running = False

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called."""
        return not self.running

    def _next_wait(self) -> float:
        """Seconds ``select`` may wait: the poll interval, shortened to the nearest
        deadline the checks report (they act on what is due first), to the deferred
        actions' due time and, while one of them waits for quiet, to the end of QUIET_S
        after the last event or to its QUIET_MAX_S, whichever is still ahead."""
        now = time.monotonic()
        wait = self.poll_s
        for check in self._deadlines:
            remaining = check(now)
            if remaining is not None:
                wait = min(wait, remaining)
        if self.deferred_due is not None:
            wait = max(0.0, min(wait, self.deferred_due - now))
            untils = [until for _, until in self.deferred if until is not None]
            if untils:  # only times still ahead: while busy, the end of the call is an event
                for ahead in (self.last_event + QUIET_S - now, min(untils) - now):
                    if ahead > 0:
                        wait = min(wait, ahead)
        return wait

    def wake_on_child_exit(self) -> None:
        """Make a child's exit wake ``select`` (SIGCHLD through a wakeup fd), so its exit
        status is collected at once, not at the next poll. Signals from sessions stay
        ignored except SIGCHLD, whose handler only wakes the loop. Process-wide (the
        signal's handler and wakeup fd): called once, in the main thread."""
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader.setblocking(False)
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self._wakeup = (reader, writer)
        self.watch(reader, self._drain_wakeup)

    def run(self) -> None:
        """Serve rounds (module docstring) until :meth:`stop`."""
        while self.running:
            events = self.sel.select(self._next_wait())
            if events:
                self.last_event = time.monotonic()
            for key, _ in events:
                key.data(key.fileobj)
                if self.stopped:
                    break
            for action in self._after:
                action()
            if self._child_exited or not events or self._wakeup is None:
                self._child_exited = False  # before the actions: an exit during them wakes the next round
                for action in self._after_exit:
                    action()
            self._run_deferred()

    def _drain_wakeup(self, reader: socket.socket) -> None:
        """SIGCHLD arrived: empty the wakeup socket; the round's child-exit actions run."""
        self._child_exited = True
        try:
            while reader.recv(4096):
                pass
        except OSError:
            pass
