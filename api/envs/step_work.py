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
  group commit; this is ``POST /v1/envs/{id}/step``.
* :mod:`.batch`'s vectorised driver advances the steps of a batch together: every step's
  call is sent in one :meth:`~..sandboxes.SandboxSession.call_many` (one frame per
  sandbox each way), and once no step waits for a call, the writes of the steps waiting
  to commit go to the group commit together; blocking work of several steps runs on
  threads at once.

A generator left unfinished (its driver failed) is closed, which runs its ``finally`` and
``with`` exits (locks, quota tokens) as an exception would.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..db.group_commit import GroupCommit
from ..db.step_writes import StepWrite
from ..sandboxes import CallRules, SandboxSession

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


def run_alone(work: Work[T], commits: GroupCommit[StepWrite]) -> T:
    """Drive ``work`` to its end on this thread: each call through its session, each
    write through ``commits``. Returns the work's value; raises what it raises."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            need = work.send(value) if error is None else work.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        try:
            if isinstance(need, CallNeed):
                value = need.session.call(need.name, need.arguments, need.rules)
            elif isinstance(need, BlockingNeed):
                value = need.run()
            else:
                commits.submit(need.write)
        except BaseException as exc:  # noqa: BLE001 - thrown into the work, where the step handles it
            error = exc
