"""Tool calls of several sessions at once, one frame per sandbox each way.

:func:`call_many` carries out one tool call in each of several sessions. The calls whose
sessions are this pool's (:class:`~.session.Session`) are grouped by the sandbox that
holds them: a sandbox with one call gets the runner's ``call`` request, one with several
gets one ``calls`` request (``sandbox_images/runner/pid1_groups.py``), and every
sandbox's request is sent before any reply is awaited. Each call's result is the one
:meth:`Session.call <.session.Session.call>` would have returned for it alone: the same
checks before the sandbox (``rejected``), the same reply checks, a lost sandbox closing
every handle it held and giving each of its calls the loss's status. A group the runner
refuses as a whole (``fault``) or answers malformed is a :class:`SessionError` for each
of its calls (a group whose replies are large comes in parts, put back in order by their
positions); a group whose frame cannot be encoded (a call's arguments are not JSON) is
sent call by call. Sessions of other executors (the Ray backend's) are called through
their own ``call``, concurrently on threads.

:func:`start_many` is :func:`call_many` in two halves, for a caller that has more to do
while the sandboxes work (the batched step sends each sandbox's calls as soon as they are
ready, ``api/envs/batch.py``): the calls of this pool's sessions are sent at once, each
session's lock held from then until :meth:`Flight.finish` took its outcome; the calls of
other executors' sessions are made in ``finish``.

:func:`start_call` sends one call of this pool's sessions without waiting for its reply
(:meth:`Session.start_call <.session.Session.start_call>`), for a caller that must not
block; for other executors' sessions it sends nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import SandboxLost, SessionError
from ..results import CallResult, CallRules
from .session import Session, StartedCall

if TYPE_CHECKING:
    from ..interface import ExecutorSession
    from .placement import SandboxSlot

Outcome = CallResult | Exception
"""A call's result, or the exception its :meth:`Session.call` would have raised."""

_fallback_lock = threading.Lock()
_fallback: list[ThreadPoolExecutor] = []


def call_many(calls: Sequence[tuple[ExecutorSession, str, dict[str, Any] | None, CallRules]]) -> list[Outcome]:
    """One tool call ``(session, name, arguments, rules)`` in each session of ``calls``
    (module docstring); the outcomes in the order of ``calls``. Raises ValueError when a
    session appears twice (its requests are serialized: group them in separate calls)."""
    return start_many(calls).finish()


def start_many(calls: Sequence[tuple[ExecutorSession, str, dict[str, Any] | None, CallRules]]) -> Flight:
    """:func:`call_many` in two halves (module docstring): the calls of this pool's
    sessions are sent now, each session locked until :meth:`Flight.finish` took its
    outcome. Call ``finish`` always (in a ``finally``): it releases the sessions. Raises
    ValueError when a session appears twice, and what sending raises apart from a call's
    own outcome (nothing is then held)."""
    if len({id(call[0]) for call in calls}) != len(calls):
        raise ValueError("call_many: a session appears twice")
    return Flight(calls)


class Flight:
    """Calls sent by :func:`start_many`, their outcomes not taken yet."""

    def __init__(self, calls: Sequence[tuple[ExecutorSession, str, dict[str, Any] | None, CallRules]]) -> None:
        self.calls = calls
        self.outcomes: list[Outcome | None] = [None] * len(calls)
        self.ours: list[int] = []
        """Positions of the calls of this pool's sessions (sent now, grouped by sandbox)."""
        self.others: list[int] = []
        """Positions of the calls of other executors' sessions (made in :meth:`finish`)."""
        ours: list[tuple[Session, str, dict[str, Any] | None, CallRules]] = []
        for i, (session, name, arguments, rules) in enumerate(calls):
            if isinstance(session, Session):
                self.ours.append(i)
                ours.append((session, name, arguments, rules))
            else:
                self.others.append(i)
        self.finished = False
        self._grouped = _Grouped(ours) if ours else None

    def finish(self, arrived: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
        """Wait for every call's outcome; each goes to ``arrived(index in calls, outcome)``
        as it comes (its session released just before), so the caller can go on with it
        while the other sandboxes answer. The outcomes in the order of ``calls``. Every
        reply is taken, so each session's handle follows its sandbox, even when
        ``arrived`` raises; then the first exception it raised is raised. A second call
        returns the outcomes again and calls nothing."""
        if self.finished:
            return [o if o is not None else SessionError("call_many: no outcome") for o in self.outcomes]
        self.finished = True
        failed: list[BaseException] = []

        def deliver(i: int, outcome: Outcome) -> None:
            self.outcomes[i] = outcome
            if arrived is not None:
                try:
                    arrived(i, outcome)
                except BaseException as exc:  # noqa: BLE001 - raised once every reply is taken
                    failed.append(exc)

        grouped, ours = self._grouped, self.ours
        try:
            if self.others:
                for i, outcome in zip(self.others, _each([self.calls[i] for i in self.others]), strict=True):
                    deliver(i, outcome)
            if grouped is not None:
                grouped.finish(lambda k, outcome: deliver(ours[k], outcome))
        finally:
            if grouped is not None:  # a failure of this pool's code: the sessions go back all the same
                grouped.release()
        if failed:
            raise failed[0]
        return [o if o is not None else SessionError("call_many: no outcome") for o in self.outcomes]


def start_call(session: ExecutorSession, name: str, arguments: dict[str, Any] | None,
               rules: CallRules = "sandpit") -> StartedCall | CallResult | None:
    """One tool call sent without waiting for its reply (:meth:`Session.start_call
    <.session.Session.start_call>`), for a caller that must not block: a
    :class:`~.session.StartedCall` to finish, a ``rejected`` result, or None when the call
    cannot be sent at once, and always for sessions of other executors (the Ray
    backend's): then call ``session.call`` on a thread."""
    if not isinstance(session, Session):
        return None
    return session.start_call(name, arguments, rules)


def _each(calls: Sequence[tuple[ExecutorSession, str, dict[str, Any] | None, CallRules]]) -> list[Outcome]:
    """Each call through its session's own ``call``, on threads when there are several."""

    def one(call: tuple[ExecutorSession, str, dict[str, Any] | None, CallRules]) -> Outcome:
        try:
            return call[0].call(call[1], call[2], call[3])
        except Exception as exc:  # noqa: BLE001 - the call's outcome, raised again by the caller
            return exc

    if len(calls) == 1:
        return [one(calls[0])]
    with _fallback_lock:
        if not _fallback:
            _fallback.append(ThreadPoolExecutor(max_workers=64, thread_name_prefix="sandpit-calls"))
        pool = _fallback[0]
    return list(pool.map(one, calls))


def _raise(exc: BaseException) -> Callable[[], dict[str, Any]]:
    def reply() -> dict[str, Any]:
        raise exc

    return reply


class _Grouped:
    """This pool's calls of a :class:`Flight`: each session locked (in session id order,
    one order for every caller) and each sandbox's calls sent at construction; the
    outcomes delivered, and the sessions released, by :meth:`finish`."""

    def __init__(self, calls: list[tuple[Session, str, dict[str, Any] | None, CallRules]]) -> None:
        self.calls = calls
        self.started = time.perf_counter()
        fields: dict[int, dict[str, Any]] = {}
        self.early: list[tuple[int, Outcome]] = []
        for i, (session, name, arguments, rules) in enumerate(calls):
            prepared = session.call_fields(name, arguments, rules, self.started)
            if isinstance(prepared, CallResult):
                self.early.append((i, prepared))
            else:
                fields[i] = prepared
        self.held: set[int] = set()
        """The calls whose session this flight holds locked."""
        self.waits: list[tuple[list[int], Callable[[], dict[str, Any]]]] = []
        try:
            for i in sorted(fields, key=lambda i: calls[i][0].id):
                calls[i][0].locked.acquire()
                self.held.add(i)
            by_sandbox: dict[int, tuple[SandboxSlot, list[int]]] = {}
            for i in sorted(self.held, key=lambda i: calls[i][0].id):
                try:
                    slot = calls[i][0].slot()
                except SandboxLost as exc:
                    self.early.append((i, self._finish(i, _raise(exc))))
                    continue
                except Exception as exc:  # noqa: BLE001 - the call's outcome (SessionClosed, CapacityError)
                    self.early.append((i, exc))
                    continue
                by_sandbox.setdefault(id(slot), (slot, []))[1].append(i)
            for slot, members in by_sandbox.values():
                self.waits.extend(_send(slot, members, calls, fields))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Release every session this flight still holds (their outcomes not taken)."""
        held, self.held = self.held, set()
        for i in held:
            self.calls[i][0].locked.release()

    def _finish(self, i: int, reply: Callable[[], dict[str, Any]]) -> Outcome:
        """Call ``i``'s outcome from its sandbox's ``reply`` (:meth:`Session.finish_call`)."""
        try:
            return self.calls[i][0].finish_call(reply, self.started)
        except Exception as exc:  # noqa: BLE001 - the call's outcome
            return exc

    def finish(self, deliver: Callable[[int, Outcome], None]) -> None:
        """Each call's outcome to ``deliver(index, outcome)``, its session released first;
        every session still held is released when this returns or raises."""
        calls = self.calls

        def done(i: int, outcome: Outcome) -> None:
            if i in self.held:
                self.held.discard(i)
                calls[i][0].locked.release()
            deliver(i, outcome)

        try:
            for i, outcome in self.early:
                done(i, outcome)
            for members, wait in self.waits:
                if len(members) == 1:
                    done(members[0], self._finish(members[0], wait))
                    continue
                try:
                    reply = wait()
                except SandboxLost as exc:
                    for i in members:
                        done(i, self._finish(i, _raise(exc)))
                    continue
                parts = _results(reply, len(members))
                if parts is None:
                    error = SessionError(f"sandbox refused 'calls': {str(reply.get('message'))[:500]}"
                                         if reply.get("status") == "fault" else "sandbox sent a malformed 'calls' reply")
                    for i in members:
                        done(i, error)
                    continue
                for i, part in zip(members, parts, strict=True):
                    done(i, self._finish(i, lambda part=part: part))  # type: ignore[misc]
        finally:
            self.release()


def _results(reply: dict[str, Any], size: int) -> list[dict[str, Any]] | None:
    """The ``size`` call replies of a ``calls`` reply in the request's order, its parts
    (``parts``, gathered by the channel) put in place by their ``indices``; None when the
    group was refused or anything is malformed (a position missing, twice, out of range)."""
    if reply.get("status") != "ok":
        return None
    parts = reply.get("parts")
    if parts is None and "indices" not in reply:
        results = reply.get("results")
        if isinstance(results, list) and len(results) == size and all(isinstance(r, dict) for r in results):
            return results
        return None
    placed: list[dict[str, Any] | None] = [None] * size
    for frame in [*(parts if isinstance(parts, list) else [None]), reply]:
        indices = frame.get("indices") if isinstance(frame, dict) else None
        results = frame.get("results") if isinstance(frame, dict) else None
        if not isinstance(indices, list) or not isinstance(results, list) or len(indices) != len(results):
            return None
        for index, result in zip(indices, results, strict=True):
            if type(index) is not int or not 0 <= index < size or placed[index] is not None \
                    or not isinstance(result, dict):
                return None
            placed[index] = result
    if any(result is None for result in placed):
        return None
    return [result for result in placed if result is not None]


def _send(slot: SandboxSlot, members: list[int], calls: list[tuple[Session, str, dict[str, Any] | None, CallRules]],
          fields: dict[int, dict[str, Any]]) -> list[tuple[list[int], Callable[[], dict[str, Any]]]]:
    """Send ``members``' calls to ``slot``: one ``call``, or one ``calls`` for several (call
    by call when the group's frame cannot be encoded); ``(members, wait)`` per request sent."""
    if len(members) > 1:
        try:
            return [(members, slot.submit("calls", calls=[{"session": calls[i][0].id, **fields[i]} for i in members]))]
        except (ValueError, TypeError):
            pass  # a call's arguments are not JSON: each call alone, so only that one is rejected
        except SandboxLost as exc:
            return [(members, _raise(exc))]
    sent: list[tuple[list[int], Callable[[], dict[str, Any]]]] = []
    for i in members:
        try:
            sent.append(([i], slot.submit("call", session=calls[i][0].id, **fields[i])))
        except (ValueError, TypeError, SandboxLost) as exc:
            sent.append(([i], _raise(exc)))
    return sent
