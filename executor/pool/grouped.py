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

:func:`start_call` sends one call of this pool's sessions without waiting for its reply
(:meth:`Session.start_call <.session.Session.start_call>`), for a caller that must not
block; for other executors' sessions it sends nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
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
    if len({id(call[0]) for call in calls}) != len(calls):
        raise ValueError("call_many: a session appears twice")
    outcomes: list[Outcome | None] = [None] * len(calls)
    ours = [i for i, call in enumerate(calls) if isinstance(call[0], Session)]
    others = [i for i, call in enumerate(calls) if not isinstance(call[0], Session)]
    if others:
        for i, outcome in zip(others, _each([calls[i] for i in others]), strict=True):
            outcomes[i] = outcome
    if ours:
        grouped = _grouped([(calls[i][0], calls[i][1], calls[i][2], calls[i][3]) for i in ours])  # type: ignore[misc]
        for i, outcome in zip(ours, grouped, strict=True):
            outcomes[i] = outcome
    return [outcome if outcome is not None else SessionError("call_many: no outcome") for outcome in outcomes]


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


def _grouped(calls: list[tuple[Session, str, dict[str, Any] | None, CallRules]]) -> list[Outcome]:
    """:func:`call_many` for this pool's sessions (module docstring)."""
    started = time.perf_counter()
    outcomes: list[Outcome | None] = [None] * len(calls)
    fields: dict[int, dict[str, Any]] = {}
    for i, (session, name, arguments, rules) in enumerate(calls):
        prepared = session.call_fields(name, arguments, rules, started)
        if isinstance(prepared, CallResult):
            outcomes[i] = prepared
        else:
            fields[i] = prepared

    def finish(i: int, reply: Callable[[], dict[str, Any]]) -> None:
        try:
            outcomes[i] = calls[i][0].finish_call(reply, started)
        except Exception as exc:  # noqa: BLE001 - the call's outcome
            outcomes[i] = exc

    order = sorted(fields, key=lambda i: calls[i][0].id)  # one lock order for every caller
    with ExitStack() as stack:
        for i in order:
            stack.enter_context(calls[i][0].locked)
        by_sandbox: dict[int, tuple[SandboxSlot, list[int]]] = {}
        for i in order:
            try:
                slot = calls[i][0].slot()
            except SandboxLost as exc:
                finish(i, _raise(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - the call's outcome (SessionClosed, CapacityError)
                outcomes[i] = exc
                continue
            by_sandbox.setdefault(id(slot), (slot, []))[1].append(i)
        waits: list[tuple[list[int], Callable[[], dict[str, Any]]]] = []
        for slot, members in by_sandbox.values():
            waits.extend(_send(slot, members, calls, fields))
        for members, wait in waits:
            if len(members) == 1:
                finish(members[0], wait)
                continue
            try:
                reply = wait()
            except SandboxLost as exc:
                for i in members:
                    finish(i, _raise(exc))
                continue
            parts = _results(reply, len(members))
            if parts is None:
                error = SessionError(f"sandbox refused 'calls': {str(reply.get('message'))[:500]}"
                                     if reply.get("status") == "fault" else "sandbox sent a malformed 'calls' reply")
                for i in members:
                    outcomes[i] = error
                continue
            for i, part in zip(members, parts, strict=True):
                finish(i, lambda part=part: part)  # type: ignore[misc]
    return [outcome if outcome is not None else SessionError("call_many: no outcome") for outcome in outcomes]


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
