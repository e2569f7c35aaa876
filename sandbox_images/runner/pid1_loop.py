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
* :meth:`Loop.later` ``(action)``: run once nothing is busy (a spare's or a template's
  start, a Python start-up on the sandbox's CPU quota, must not compete with the request that made
  it necessary), at the latest DEFER_MAX_S seconds after it was first asked for; an
  action asked for twice in one round runs once.

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

from .limits import DEFER_MAX_S

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
        self.deferred: list[Callable[[], None]] = []
        """Actions waiting for a quiet moment (:meth:`later`)."""
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
    def later(self, action: Callable[[], None]) -> None:
        """Run ``action`` once nothing is busy, at the latest DEFER_MAX_S seconds from the
        first action asked for since the last run; at most once per round."""
        if action not in self.deferred:
            self.deferred.append(action)
        if self.deferred_due is None:
            self.deferred_due = time.monotonic() + DEFER_MAX_S

    def cancel_deferred(self) -> None:
        """Forget every deferred action (``recycle``: what was wanted before is not now)."""
        self.deferred, self.deferred_due = [], None

    def _run_deferred(self) -> None:
        if not self.deferred:
            return
        if self.busy() and time.monotonic() < (self.deferred_due or 0.0):
            return
        actions, self.deferred, self.deferred_due = self.deferred, [], None
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
        deadline the checks report (they act on what is due first) and to the deferred
        actions' due time."""
        now = time.monotonic()
        wait = self.poll_s
        for check in self._deadlines:
            remaining = check(now)
            if remaining is not None:
                wait = min(wait, remaining)
        if self.deferred_due is not None:
            wait = max(0.0, min(wait, self.deferred_due - time.monotonic()))
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
