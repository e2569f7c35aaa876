"""Placement: how a session gets a sandbox slot, and gives it back.

A :class:`~sandpit.executor.pool.session.Session` depends only on :class:`Placement` (what
:class:`~sandpit.executor.pool.SandboxPool` implements) and on :class:`SandboxSlot` (what
it uses of the sandbox it was placed in, which :class:`~sandpit.executor.docker.sandbox.Sandbox`
provides), never on the pool itself: the pool imports the session module, not the other
way round, and neither calls the other's private methods.

Lifecycle of one session's slot::

    place(spec, snapshot) ──► (sandbox, opened state, retyped)   the session is open there
        │ the sandbox died under it:  forget(sandbox, id)       (destroyed; the session closes)
        │ the session closes:         release(sandbox, id)
        └─ it is retiring (still alive): the session reads its state from that sandbox,
           release(sandbox, id), and place(spec, that state) elsewhere

Every method is called with the session's own lock held, so one session never has two
placements in flight; different sessions are placed concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..profiles import ResourceProfile
from ..results import EncodedValue, OpenedState


class Reply(Protocol):
    """A runner request sent, its reply not yet taken (:meth:`SandboxSlot.submit`)."""

    def answered(self, wait_s: float, spin_s: float = 0.0) -> bool:
        """Wait up to ``wait_s`` seconds for the reply, the first ``spin_s`` of them
        (at most ``wait_s``) polling without sleeping where the transport can
        (:meth:`~sandpit.executor.pool.channel.PendingReply.answered`); True when it came
        (calling then returns it at once), False when not yet or when the sandbox was lost
        (calling then raises SandboxLost)."""
        ...

    def __call__(self) -> dict[str, Any]:
        """Wait for the reply and return it. Raises SandboxLost (the sandbox died or did
        not answer within the request's timeout)."""
        ...


class SandboxSlot(Protocol):
    """What a session uses of the sandbox it is placed in."""

    @property
    def id(self) -> str:
        """The sandbox's id (for logs and tests)."""
        ...

    @property
    def alive(self) -> bool:
        """False once the sandbox died or was destroyed: the session must be placed again."""
        ...

    @property
    def retiring(self) -> bool:
        """True when no session may stay: leave (release) at the next request."""
        ...

    def request(self, op: str, timeout_s: float | None = None, **fields: object) -> dict[str, Any]:
        """One runner request (``op`` with ``fields``); the runner's reply.

        Raises:
            SandboxLost: the sandbox died or did not answer in time (``status`` says how).
            ValueError / TypeError: ``fields`` are not JSON-encodable.
        """
        ...

    def submit(self, op: str, timeout_s: float | None = None, **fields: object) -> Reply:
        """:meth:`request` in two halves: sent now, the returned :class:`Reply` waits for
        the reply when called (raising what :meth:`request` raises). Raises ValueError /
        TypeError and SandboxLost at once when the request cannot be sent."""
        ...

    def check_churn(self) -> bool:
        """Re-evaluate :attr:`retiring` after a call (gVisor pid churn); returns it."""
        ...


@dataclass(frozen=True)
class SessionSpec:
    """Everything a sandbox needs to (re)create one session; never changes after open."""

    session_id: str
    """Unique id of the session (the runner refuses a reused one)."""
    tenant: str
    """Only sandboxes of this tenant may host it."""
    profile: ResourceProfile
    """Limits; with the tenant, the warm-pool key."""
    source: str
    """The environment's Python source (executed only inside the sandbox)."""
    class_name: str
    init_config: dict[str, Any]
    describe_only: bool = False
    """Load the class without instantiating it; only ``describe`` is served."""
    config_json: bytes | None = None
    """``init_config`` as exact JSON bytes (:func:`~sandpit.executor.pool.configs.wire_config`),
    sent once per sandbox and by ``config_hash`` afterwards; None: sent inside the request."""
    config_hash: str | None = None
    """SHA-256 hex of ``config_json``."""
    seed: int | None = None
    """Seeds the session's ``random`` before the instance is made (EnvScaler's
    ``reset(seed=...)``); None: not seeded."""


class Placement(Protocol):
    """Where sessions live: a source of sandbox slots for one session at a time."""

    def place(self, spec: SessionSpec,
              snapshot: dict[str, EncodedValue]) -> tuple[SandboxSlot, OpenedState, list[dict[str, str]]]:
        """Open ``spec`` in a sandbox of its tenant and profile and restore ``snapshot``
        (encoded attributes; ``{}`` for none) on top of its ``init_config``.

        Returns:
            The sandbox now holding the session, the state it opened with
            (:class:`~sandpit.executor.results.OpenedState`: the encoded attributes the
            sandbox reported, or only the runner's digest of a template-forked state; no
            attributes when ``snapshot`` was given) and the ``init_config`` keys the
            construction retyped (``results.check_retyped``).

        Raises:
            SessionOpenError: the environment failed to load or instantiate (or the
                sandbox was lost three times while opening it).
            SessionError: the sandbox refused the request.
            CapacityError, DockerUnavailable, ImageError, SandboxStartError.
            ArgumentError: ``init_config`` or ``snapshot`` is not JSON-encodable.
        """
        ...

    def release(self, sandbox: SandboxSlot, session_id: str, close: bool = True) -> None:
        """Free ``session_id``'s slot in a live ``sandbox`` (ask the runner to close the
        session first when ``close``). Never raises for a sandbox lost meanwhile."""
        ...

    def forget(self, sandbox: SandboxSlot, session_id: str) -> None:
        """``sandbox`` died under ``session_id``: destroy it and stop placing anything there."""
        ...
