"""A session that keeps its own state and re-opens itself after a lost sandbox, for code
that uses the executor on its own (``sandpit demo``, benchmarks of the executor alone).

An executor's session is a handle (:class:`~sandpit.executor.interface.ExecutorSession`):
it keeps no state, and when its sandbox is lost the failed call reports ``timeout``,
``oom`` or ``crashed`` and the handle closes. The API needs nothing more (it keeps the
env's state and re-opens from it). A program without such a copy wraps its session in a
:class:`RecoveringSession`: it keeps the state from the opened state and each call's delta
(keyed changes resolved with :meth:`~sandpit.executor.results.StateDelta.applied_to`),
and when the handle closed under it, the next request opens a new session of the same
environment with that state (the call's result then says ``recovered``). The last call's
effects are not lost: a call whose sandbox was lost did not change the kept state.
"""

from __future__ import annotations

import threading
from typing import Any

from .errors import SandboxLost, SessionClosed
from .interface import Executor, ExecutorSession
from .profiles import ResourceProfile
from .results import CallResult, CallRules, EncodedValue, Snapshot, render_state


class RecoveringSession:
    """A session of ``class_name`` (see the module docstring) opened on ``executor`` with
    the arguments of :meth:`Executor.open_session`, plus its own copy of the state.
    Thread-safe (requests are serialized). Raises what ``open_session`` raises."""

    def __init__(self, executor: Executor, *, tenant: str, source: str, class_name: str,
                 init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                 snapshot: dict[str, EncodedValue] | None = None, seed: int | None = None) -> None:
        self._executor = executor
        self._open_args: dict[str, Any] = {"tenant": tenant, "source": source, "class_name": class_name,
                                           "init_config": init_config, "profile": profile, "seed": seed}
        self._lock = threading.Lock()
        self._closed = False
        self.recoveries = 0
        """How many times the session was re-opened after a loss."""
        self._session = executor.open_session(snapshot=snapshot, **self._open_args)
        opened = self._session.take_opened()
        if snapshot:
            self._state: dict[str, EncodedValue] = dict(snapshot)
        elif opened.attributes is not None:
            self._state = dict(opened.attributes)
        else:  # forked from a template: the sandbox named its state by digest only
            self._state = self._session.read_state()

    @property
    def id(self) -> str:
        """The current executor session's id (a new one after each recovery)."""
        return self._session.id

    @property
    def tenant(self) -> str:
        """The tenant whose sandboxes host it."""
        return self._session.tenant

    @property
    def closed(self) -> bool:
        """True after :meth:`close` (a lost sandbox does not close it: it re-opens)."""
        return self._closed

    @property
    def retyped(self) -> list[dict[str, str]]:
        """What the first open reported (``ExecutorSession.retyped``)."""
        return self._session.retyped

    def _live(self) -> tuple[ExecutorSession, bool]:
        """The executor session, re-opened from the kept state when its handle closed.
        Raises SessionClosed after :meth:`close`, what ``open_session`` raises."""
        if self._closed:
            raise SessionClosed("the session is closed")
        if not self._session.closed:
            return self._session, False
        self._session = self._executor.open_session(snapshot=self._state, **self._open_args)
        self.recoveries += 1
        return self._session, True

    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """A tool call (``ExecutorSession.call``), the session re-opened first when its
        sandbox was lost (``recovered`` true then; also when the loss is only noticed as
        the call is sent, in which case the call was not run and is sent once more). The result's delta has its keyed
        changes resolved (whole entries). Raises SessionClosed (after :meth:`close`),
        SessionError (a delta that does not apply to the kept state; nothing is kept),
        what ``open_session`` raises."""
        with self._lock:
            session, recovered = self._live()
            try:
                result = session.call(name, arguments, rules)
            except SessionClosed:
                if not session.closed:
                    raise
                session, recovered = self._live()  # lost before the call was sent: nothing ran
                result = session.call(name, arguments, rules)
            if result.status in ("ok", "error"):
                changed = result.delta.applied_to(self._state.get)
                state = {**self._state, **changed}
                for key in result.delta.deleted:
                    state.pop(key, None)
                self._state = state
                result.delta.set = changed
            result.recovered = recovered
            return result

    def read_state(self) -> dict[str, EncodedValue]:
        """The kept encoded state (no sandbox round trip; a new dict, shared entries)."""
        with self._lock:
            return dict(self._state)

    def state(self) -> dict[str, Any]:
        """The kept state's JSON view (``render_state``)."""
        with self._lock:
            return render_state(self._state)

    def snapshot(self) -> Snapshot:
        """The kept state, to :meth:`restore` later."""
        with self._lock:
            return Snapshot(attributes=dict(self._state))

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state (re-opened with it when the sandbox
        was lost). Raises SessionError (not applied), SessionClosed, what ``open_session``
        raises."""
        with self._lock:
            if self._closed:
                raise SessionClosed("the session is closed")
            if self._session.closed:
                self._state = dict(snapshot.attributes)
                self._live()
                return
            try:
                self._session.restore(snapshot)
            except (SandboxLost, SessionClosed):  # its sandbox was lost: open a new session with the snapshot
                self._state = dict(snapshot.attributes)
                self._live()
                return
            self._state = dict(snapshot.attributes)

    def describe(self) -> list[dict[str, Any]]:
        """The environment's tool schemas (``ExecutorSession.describe``)."""
        with self._lock:
            return self._live()[0].describe()

    def close(self) -> None:
        """End the session (idempotent)."""
        with self._lock:
            self._closed = True
            self._session.close()
