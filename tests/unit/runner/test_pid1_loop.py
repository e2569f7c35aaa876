"""PID 1's event loop (``pid1_loop``) on real sockets in this process: callbacks of what is
readable, deadlines that shorten the wait, deferred actions that wait while something is
busy (but not past DEFER_MAX_S) and, for starts of processes, for QUIET_S without an event,
after-round actions, and a stop that ends the round."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest
from sandpit.sandbox_images.runner import limits
from sandpit.sandbox_images.runner.pid1_loop import Loop

SLACK_S = 0.002
"""The loop notes an event's time just before its callback, which records it here."""


@pytest.fixture
def pair() -> tuple[socket.socket, socket.socket]:
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def run_rounds(loop: Loop, rounds: int) -> None:
    """Stop ``loop`` after ``rounds`` rounds (an after-round action counts them)."""
    seen = [0]

    def count() -> None:
        seen[0] += 1
        if seen[0] >= rounds:
            loop.stop()

    loop.after_round(count)
    loop.run()


def test_readable_objects_reach_their_callback_and_unwatch_is_quiet(pair) -> None:
    left, right = pair
    loop = Loop(poll_s=0.01)
    got: list[bytes] = []
    loop.watch(right, lambda sock: got.append(sock.recv(100)))
    left.sendall(b"ping")
    run_rounds(loop, 2)
    assert got == [b"ping"]
    loop.unwatch(right)
    loop.unwatch(right)  # twice: quiet
    loop.unwatch(12345)  # never watched: quiet
    right.close()
    loop.unwatch(right)  # closed: quiet


def test_deadlines_shorten_the_wait_and_run_every_round() -> None:
    loop = Loop(poll_s=5.0)
    now_seen: list[float] = []

    def check(now: float) -> float | None:
        now_seen.append(now)
        return 0.01

    loop.add_deadlines(check)
    loop.add_deadlines(lambda now: None)  # no deadline: does not shorten anything
    started = time.monotonic()
    run_rounds(loop, 3)
    assert len(now_seen) == 3 and time.monotonic() - started < 2.0  # not the 5 s poll


def test_deferred_actions_wait_while_busy_but_not_past_their_due_time() -> None:
    loop = Loop(poll_s=0.005)
    busy = [True]
    ran: list[float] = []
    loop.add_busy(lambda: busy[0])
    action = lambda: ran.append(time.monotonic())  # noqa: E731
    started = time.monotonic()
    loop.later(action)
    loop.later(action)  # asked twice: runs once
    loop.after_round(lambda: loop.stop() if ran else None)
    loop.run()
    assert len(ran) == 1 and ran[0] - started >= limits.DEFER_MAX_S * 0.9  # waited for the busy part
    busy[0] = False
    loop.running = True
    ran.clear()
    started = time.monotonic()
    loop.later(action)
    loop.run()
    assert len(ran) == 1 and ran[0] - started < limits.DEFER_MAX_S  # nothing busy: at once
    loop.later(action)
    loop.cancel_deferred()
    assert loop.deferred == [] and loop.deferred_due is None


def test_quiet_actions_wait_for_quiet_after_the_last_event_others_do_not(pair) -> None:
    """A spare's or a template's start (``quiet=True``) waits until no event came for
    QUIET_S; a fork ahead (no ``quiet``) runs in the first round nothing is busy; events
    that never stop delay a quiet start by QUIET_MAX_S, no longer; a recycle's
    ``cancel_deferred`` drops a start still waiting."""
    left, right = pair
    loop = Loop(poll_s=0.5)
    received: list[float] = []
    loop.watch(right, lambda sock: (sock.recv(100), received.append(time.monotonic())))
    ran: dict[str, float] = {}
    stop_events = threading.Event()

    def events(gap_s: float) -> None:  # another thread keeps the loop's socket readable
        while not stop_events.is_set():
            left.sendall(b"e")
            time.sleep(gap_s)

    sender = threading.Thread(target=events, args=(0.002,))
    asked = time.monotonic()
    loop.later(lambda: ran.setdefault("quiet", time.monotonic()), quiet=True)
    loop.later(lambda: ran.setdefault("plain", time.monotonic()))
    sender.start()
    try:
        loop.after_round(lambda: loop.stop() if "quiet" in ran else None)
        loop.run()
    finally:
        stop_events.set()
        sender.join()
    assert ran["plain"] <= ran["quiet"] < asked + limits.DEFER_MAX_S + 5.0
    last = max(t for t in received if t <= ran["quiet"])  # (a loaded machine may stall the sender)
    assert ran["quiet"] - last >= limits.QUIET_S - SLACK_S or ran["quiet"] - asked >= limits.QUIET_MAX_S

    loop.running, ran = True, {}
    left.sendall(b"e")  # one event, then quiet
    loop.later(lambda: ran.setdefault("quiet", time.monotonic()), quiet=True)
    loop.after_round(lambda: loop.stop() if "quiet" in ran else None)
    loop.run()
    assert ran["quiet"] - received[-1] >= limits.QUIET_S - SLACK_S  # measured from the last event
    assert ran["quiet"] - received[-1] < limits.DEFER_MAX_S + 5.0

    loop.later(lambda: ran.setdefault("cancelled", time.monotonic()), quiet=True)
    loop.cancel_deferred()
    loop.running = True
    run_rounds(loop, 2)
    assert "cancelled" not in ran and loop.deferred == []


def test_a_quiet_action_under_endless_events_runs_once_its_quiet_max_has_passed() -> None:
    """Opens back to back never leave QUIET_S of quiet: a waiting start then runs at the
    first round after QUIET_MAX_S, not at DEFER_MAX_S."""
    loop = Loop(poll_s=0.5)
    ran: list[float] = []
    asked = time.monotonic()
    loop.later(lambda: ran.append(time.monotonic()), quiet=True)
    loop.last_event = time.monotonic()  # an event in this round
    loop._run_deferred()
    if not ran:  # (a test thread stalled past QUIET_MAX_S has run it already)
        assert 0 < loop._next_wait() <= limits.QUIET_MAX_S  # select wakes for it
    assert ran == [] or ran[0] - asked >= limits.QUIET_MAX_S
    time.sleep(limits.QUIET_MAX_S)
    loop.last_event = time.monotonic()  # and one in the round after QUIET_MAX_S
    loop._run_deferred()
    assert len(ran) == 1 and ran[0] - asked >= limits.QUIET_MAX_S
    assert loop.deferred == [] and loop.deferred_due is None


def test_a_quiet_action_waiting_behind_a_busy_call_does_not_spin_the_loop() -> None:
    """While a call is in flight and its quiet time has passed, the loop waits for the
    call's event (or the poll, or the due time), not in a busy loop of empty rounds."""
    loop = Loop(poll_s=0.05)
    loop.add_busy(lambda: True)
    rounds = [0]
    loop.after_round(lambda: rounds.__setitem__(0, rounds[0] + 1))
    ran: list[float] = []
    started = time.monotonic()
    loop.later(lambda: ran.append(time.monotonic()), quiet=True)
    loop.after_round(lambda: loop.stop() if ran else None)
    loop.run()
    assert ran and ran[0] - started >= limits.DEFER_MAX_S * 0.9
    assert rounds[0] <= limits.DEFER_MAX_S / 0.05 + 3  # one round per poll, not thousands


def test_a_stop_ends_the_round_after_the_current_callback(pair) -> None:
    left, right = pair
    other_left, other_right = socket.socketpair()
    with other_left, other_right:
        loop = Loop(poll_s=0.01)
        calls: list[str] = []

        def first(sock: socket.socket) -> None:
            sock.recv(10)
            calls.append("stop")
            loop.stop()

        def second(sock: socket.socket) -> None:
            sock.recv(10)
            calls.append("second")
            loop.stop()

        loop.watch(right, first)
        loop.watch(other_right, second)
        left.sendall(b"a")
        other_left.sendall(b"b")
        after: list[int] = []
        loop.after_round(lambda: after.append(1))
        loop.run()
        assert len(calls) == 1 and after == [1]  # one callback, then the round's end


@pytest.fixture
def child_wakeup() -> list[Loop]:
    """Loops the test makes wake on SIGCHLD; then their wakeup sockets closed and the
    process-wide SIGCHLD handler and wakeup fd as they were before the test."""
    handler = signal.getsignal(signal.SIGCHLD)
    loops: list[Loop] = []
    yield loops
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, handler)
    for loop in loops:
        for sock in loop._wakeup or ():
            sock.close()
        loop.sel.close()


def test_without_the_sigchld_wakeup_child_exit_actions_run_every_round(pair) -> None:
    left, right = pair
    loop = Loop(poll_s=5.0)
    loop.watch(right, lambda sock: sock.recv(100))
    ran: list[int] = []
    loop.after_child_exit(lambda: ran.append(1))
    left.sendall(b"a")
    run_rounds(loop, 1)
    left.sendall(b"b")
    loop.running = True
    run_rounds(loop, 1)
    assert len(ran) == 2


def test_child_exit_actions_run_when_a_child_exits_or_select_times_out_not_on_busy_rounds(pair, child_wakeup) -> None:
    """A PID 1 holding hundreds of sessions reaps (``waitpid(-1)`` walks every child) only
    after SIGCHLD or an idle round, not after every request's round."""
    left, right = pair
    loop = Loop(poll_s=5.0)  # no idle round within the test unless asked for
    child_wakeup.append(loop)
    loop.wake_on_child_exit()
    loop.watch(right, lambda sock: sock.recv(100))
    ran: list[int] = []
    loop.after_child_exit(lambda: ran.append(1))
    left.sendall(b"a")
    run_rounds(loop, 1)
    assert len(ran) == 1  # the first round looks once
    for _ in range(5):  # busy rounds, no child exited: nothing to reap
        left.sendall(b"x")
        loop.running = True
        run_rounds(loop, 1)
    assert len(ran) == 1
    pid = os.fork()
    if pid == 0:  # the child exits at once; its SIGCHLD must wake the 5 s select
        os._exit(0)
    try:
        started = time.monotonic()
        loop.running = True
        loop.after_round(lambda: loop.stop() if ran[1:] else None)
        loop.run()
        assert len(ran) == 2 and time.monotonic() - started < 2.0
    finally:
        os.waitpid(pid, 0)
    idle = Loop(poll_s=0.01)  # a round in which select found nothing looks too
    child_wakeup.append(idle)
    idle.wake_on_child_exit()
    idle_ran: list[int] = []
    idle.after_child_exit(lambda: idle_ran.append(1))
    run_rounds(idle, 3)
    assert len(idle_ran) == 3
