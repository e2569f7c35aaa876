"""A step as resumable work: what it needs from outside, and the driver of one step alone.

:meth:`.steps.Steps.work` is a generator that carries out one step and stops where it
waits for something other steps could share or wait for at the same time: its tool call
in the env's sandbox (it yields a :class:`CallNeed` and is resumed with the call's
result, or has the call's error thrown in), its write (a :class:`CommitNeed`, resumed
once the write committed, or with the write's error thrown in), and blocking work that is
not on every step's path (a :class:`BlockingNeed`: re-attaching the env's session,
scoring an ending episode, the simulated user's reply; resumed with its value or error). Everything else (parsing, quotas,
episode rules, the state delta, rewards, the reply) runs inside the generator, the same
code for every driver:

* :func:`run_alone` drives one step: the call through its session, the write through the
  group commit; this is ``POST /v1/envs/{id}/step`` on a worker thread.
* :func:`run_inline` drives one step on the event loop while nothing makes it wait (a
  call sent at once and answered within a short wait, a write committed at once), and
  hands the rest, from the need that would wait, to a worker thread (:class:`Handoff`):
  the step door's way when the process runs no other step (:mod:`sandpit.api.http.step`).
* :mod:`.batch`'s vectorised driver advances the steps of a batch together: every step's
  call is sent in one :meth:`~..sandboxes.SandboxSession.call_many` (one frame per
  sandbox each way), and once no step waits for a call, the writes of the steps waiting
  to commit go to the group commit together; blocking work of several steps runs on
  threads at once.

A generator left unfinished (its driver failed) is closed, which runs its ``finally`` and
``with`` exits (locks, quota tokens) as an exception would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar, cast

from ..db.group_commit import GroupCommit
from ..db.step_writes import StepWrite
from ..sandboxes import CallInFlight, CallRules, SandboxSession

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CallNeed:
    """The step's tool call: resume with ``session.call(name, arguments, rules)``'s
    :class:`~..sandboxes.CallResult` or throw in what it raised."""

    session: SandboxSession
    name: str
    arguments: dict[str, Any]
    rules: CallRules


@dataclass(frozen=True, slots=True)
class CommitNeed:
    """The step's write: resume once it is committed, or throw in what writing it raised."""

    write: StepWrite


@dataclass(frozen=True, slots=True)
class BlockingNeed:
    """Blocking work of the step: resume with ``run()``'s value or throw in what it raised."""

    run: Callable[[], Any]


Need = CallNeed | CommitNeed | BlockingNeed
Work = Generator[Need, Any, T]
"""A step's work: yields what it needs, returns its outcome."""


def run_alone(work: Work[T], commits: GroupCommit[StepWrite], value: Any = None,
              error: BaseException | None = None) -> T:
    """Drive ``work`` to its end on this thread: each call through its session, each
    write through ``commits``. ``value`` (or ``error``) is what the work is resumed with
    first (None for work not started). Returns the work's value; raises what it raises."""
    return cast(T, _drive(work, partial(_carry_out, commits=commits), value, error))


def _carry_out(need: Need, commits: GroupCommit[StepWrite]) -> Any:
    """What ``need`` asks for, done on this thread (it may wait): its value."""
    if isinstance(need, CallNeed):
        return need.session.call(need.name, need.arguments, need.rules)
    if isinstance(need, BlockingNeed):
        return need.run()
    commits.submit(need.write)
    return None


@dataclass(frozen=True, slots=True)
class Handoff(Generic[T]):
    """Where :func:`run_inline` stopped: ``resume()`` carries the work on to its end on a
    thread that may wait (the need it stopped at first) and returns its value or raises."""

    resume: Callable[[], T]


class _Stop(Exception):
    """Raised by a driver's way of carrying out a need to stop driving: the work goes on
    in :attr:`handoff`."""

    def __init__(self, handoff: Handoff[Any]) -> None:
        super().__init__()
        self.handoff = handoff


def _drive(work: Work[T], carry_out: Callable[[Need], Any], value: Any = None,
           error: BaseException | None = None) -> T | Handoff[T]:
    """Advance ``work``, resumed first with ``value`` (or ``error``), until it returns:
    each need it yields is carried out by ``carry_out``, whose value is sent in and whose
    exception is thrown in (where the step handles it); a :class:`_Stop` it raises stops
    the driving, and its hand-off is returned. Returns the work's value; raises what it
    raises."""
    while True:
        try:
            need = work.send(value) if error is None else work.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            value = carry_out(need)
        except _Stop as stop:
            return stop.handoff
        except BaseException as exc:  # noqa: BLE001 - thrown into the work, where the step handles it
            error = exc


def run_inline(work: Work[T], commits: GroupCommit[StepWrite], wait_s: float, spin_s: float = 0.0,
               spun: Callable[[float, bool], None] | None = None) -> T | Handoff[T]:
    """Drive ``work`` on a thread that must not wait long (the event loop) for as long as
    nothing makes it wait: each tool call sent at once
    (:meth:`~..sandboxes.SandboxSession.start_call`) whose reply comes within ``wait_s``
    seconds (the first ``spin_s`` of them polling the sandbox's socket without sleeping:
    :meth:`~..sandboxes.CallInFlight.answered`; ``spun(seconds, caught)`` is then told
    how long it polled, at most ``spin_s``, and whether the reply came meanwhile), each
    write committed at once (:meth:`~..db.group_commit.GroupCommit.try_submit`).
    At the first need that would wait (a call that cannot start at once or is not answered
    in time, a write behind another writer, any :class:`BlockingNeed`) it stops and
    returns a :class:`Handoff`, whose ``resume`` does that need and drives the rest as
    :func:`run_alone` does: the same outcome as :func:`run_alone` on one thread, the
    work's locks and slots held across the move. Returns the work's value; raises what it
    raises."""

    def carry_out(need: Need) -> Any:
        if isinstance(need, CallNeed):
            started = need.session.start_call(need.name, need.arguments, need.rules)
            if started is None:
                raise _Stop(Handoff(partial(_resume, work, commits, need, None)))
            if not isinstance(started, CallInFlight):
                return started  # rejected before the sandbox
            began = time.monotonic()
            came = started.answered(wait_s, spin_s)
            if spun is not None:
                polled = time.monotonic() - began
                spun(min(polled, spin_s), came and polled <= spin_s)
            if not came:
                raise _Stop(Handoff(partial(_resume, work, commits, None, started)))
            return started.finish()
        if isinstance(need, CommitNeed) and commits.try_submit(need.write):
            return None
        raise _Stop(Handoff(partial(_resume, work, commits, need, None)))

    return _drive(work, carry_out)


def _resume(work: Work[T], commits: GroupCommit[StepWrite], need: Need | None, call: CallInFlight | None) -> T:
    """:func:`run_inline`'s hand-off: finish ``call`` (a call in flight) or carry out
    ``need``, then drive ``work`` on to its end (:func:`run_alone`)."""
    try:
        if call is not None:
            value = call.finish()
        else:
            assert need is not None
            value = _carry_out(need, commits)
    except BaseException as exc:  # noqa: BLE001 - thrown into the work, where the step handles it
        return run_alone(work, commits, None, exc)
    return run_alone(work, commits, value)
