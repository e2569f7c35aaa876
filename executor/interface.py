"""The executor seam: what the API (or any host program) needs from "somewhere that runs
untrusted environment code", as protocols.

:class:`Executor` and :class:`ExecutorSession` are what every backend provides: the
pool (:class:`~sandpit.executor.pool.SandboxPool`), the Ray backend
(:class:`~sandpit.executor.ray.RayExecutor`), and an in-memory fake for unit tests of code
above the executor (:class:`~sandpit.executor.fake.FakeExecutor`: it never executes the
code it is given, it follows a script). Two optional capabilities are protocols of their
own, which a backend has or has not:

* :class:`Cluster`: sandboxes on several hosts, each with its own info, which an operator
  can drain (the Ray backend);
* :class:`KeyedSessions`: sessions keyed by the caller's ``session_id`` that outlive the
  process that opened them, so any API replica can reach one, and end one (the Ray backend).

:class:`Affinity` is what a multi-host backend records placements and drains through (the
API implements it over its database). Everything above the executor depends on these
protocols, never on a concrete class, and asks for a capability with ``isinstance`` (all
are ``runtime_checkable``: ``isinstance`` checks that the members exist), never with
``hasattr``; mypy checks them structurally (``tests/unit/executor/test_interface.py``).

Errors (:mod:`sandpit.executor.errors`) are part of the contract: ``SessionOpenError`` when
environment code fails to load or instantiate, ``CapacityError`` when no sandbox can be
placed, ``ProfileError`` for a profile above the operator's, ``DockerUnavailable`` when the
backend is down, ``SessionClosed``/``SessionError`` on a closed or broken session,
``ArgumentError`` (also a ``ValueError``) for bad arguments. A tool call that raises,
times out or runs out of memory is a :class:`~sandpit.executor.results.CallResult` with
that status, never an exception.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol, Required, TypedDict, runtime_checkable

from .profiles import ProfileOverrides, ResourceProfile
from .results import CallResult, CallRules, CheckResult, EncodedValue, ExecResult, OpenedState, Snapshot

if TYPE_CHECKING:
    from .pool.jobs import PreparedState


@runtime_checkable
class ExecutorSession(Protocol):
    """A handle on one environment instance in a sandbox (EnvScaler semantics; see
    ``executor/pool/session.py``).

    The handle keeps no copy of the state: the state lives in the sandbox, and the caller
    keeps its own copy from :meth:`take_opened` and each call's delta (keyed changes
    resolved with :meth:`~sandpit.executor.results.StateDelta.applied_to`). When the
    sandbox is lost, the failed call reports ``timeout``, ``oom`` or ``crashed`` and the
    handle closes (:attr:`closed`); every later request raises SessionClosed. Recovering
    is the caller's: open a new session with the state it kept."""

    @property
    def id(self) -> str:
        """Unique id of the session (``session_id`` given to ``open_session``, or a random one)."""
        ...

    @property
    def tenant(self) -> str:
        """The tenant whose sandboxes host it."""
        ...

    @property
    def closed(self) -> bool:
        """True after :meth:`close` or once its sandbox was lost; every request then
        raises SessionClosed."""
        ...

    @property
    def retyped(self) -> list[dict[str, str]]:
        """``init_config`` keys whose value replaced an attribute the constructor set to a
        value of another type, as the sandbox reported them at open
        (``[{"key", "constructed", "config"}]``; ``[]`` when it reported none)."""
        ...

    def take_opened(self) -> OpenedState:
        """The state the session opened with, handed over once (later calls, and sessions
        opened with a snapshot, give an empty :class:`OpenedState`): the encoded attributes
        the sandbox reported, or only the runner's digest of a state forked from a config
        template (get the attributes with :meth:`read_state` when the digest is unknown)."""
        ...

    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """``getattr(instance, name)(**arguments)``; a result whatever the tool does (a lost
        sandbox is a ``timeout``/``oom``/``crashed`` result, and the handle closes).
        ``rules`` picks whose step semantics the sandbox applies (:data:`CallRules`).
        Raises SessionClosed (closed), SessionError (refused, malformed reply)."""
        ...

    def read_state(self) -> dict[str, EncodedValue]:
        """The current encoded state, read from the sandbox (one round trip; no
        environment code runs). Raises SessionClosed, SessionError."""
        ...

    def state(self) -> dict[str, Any]:
        """The current state's JSON view (``render_state`` of :meth:`read_state`)."""
        ...

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state. Raises SessionError (not applied;
        the state is unchanged), SandboxLost (the handle closes), SessionClosed."""
        ...

    def describe(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas of the instance's class."""
        ...

    def close(self) -> None:
        """End the session (idempotent)."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Runs untrusted code for tenants: sessions, schema derivation, checks, scripts."""

    def profile(self, name: str | None = None, overrides: ProfileOverrides | None = None) -> ResourceProfile:
        """A named resource profile lowered by ``overrides``. Raises ProfileError."""
        ...

    def open_session(self, *, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None,
                     session_id: str | None = None, seed: int | None = None) -> ExecutorSession:
        """Instantiate ``class_name`` from ``source`` (and restore ``snapshot``); ``seed``
        seeds the session's ``random`` before the constructor runs (EnvScaler's reset).
        The session hands its opened state over once (:meth:`ExecutorSession.take_opened`)."""
        ...

    def describe(self, *, tenant: str, source: str, class_name: str,
                 profile: ResourceProfile | None = None) -> list[dict[str, Any]]:
        """Tool schemas of a class, without instantiating it."""
        ...

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any] | PreparedState,
                   final_state: dict[str, Any] | PreparedState, profile: ResourceProfile | None = None,
                   per_check_timeout_s: float | None = None, source: str | None = None) -> list[CheckResult]:
        """Check functions on two states, each check in a fresh process. A state is an
        encoded state (attribute name -> ``[kind, data]``) or a
        :class:`sandpit.executor.pool.jobs.PreparedState` (its text, validated once, for
        a state sent with many batches)."""
        ...

    def execute(self, *, tenant: str, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
                timeout_s: float | None = None, profile: ResourceProfile | None = None) -> ExecResult:
        """``code`` as a script in a fresh process."""
        ...

    def warm(self, tenant: str, profile: ResourceProfile | None = None, count: int | None = None,
             timeout_s: float = 120.0) -> int:
        """Keep idle sandboxes of ``(tenant, profile)`` ready and wait (at most
        ``timeout_s``) until ``count`` are; how many are idle."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters for ``/metrics`` (sandboxes, sessions, failures by status, ...)."""
        ...

    def ping(self) -> None:
        """Return when the backend answers; raise DockerUnavailable (or another
        ExecutorError) when it cannot take work (``/readyz``)."""
        ...

    def close(self) -> None:
        """Stop: every session and sandbox is closed."""
        ...


@runtime_checkable
class Affinity(Protocol):
    """Where a multi-host backend records which host an env's session is on, and which hosts
    are being drained, so that every API replica sees the same (the API implements it over
    its database: ``api/db/affinity.py``; :class:`~sandpit.executor.ray.affinity.MemoryAffinity`
    keeps it in one process). Host names are the backend's (``sandpit-host-<node>``)."""

    def get(self, session_id: str) -> str | None:
        """The host name recorded for ``session_id``, if any."""
        ...

    def put(self, session_id: str, host: str) -> None:
        """Record that ``session_id`` is placed on ``host``."""
        ...

    def drains(self) -> dict[str, str]:
        """Host -> ``draining`` / ``drained`` of every host an operator drains (or drained)."""
        ...

    def envs_on(self, host: str) -> list[str]:
        """The session ids recorded on ``host``."""
        ...

    def move(self, session_id: str, from_host: str, to_host: str | None) -> bool:
        """Re-record ``session_id`` on ``to_host`` (None: forget it) if it is still on
        ``from_host``; True if moved."""
        ...

    def finish_drain(self, host: str, moved: int) -> bool:
        """Record ``host``'s drain as done (``drained``), ``moved`` envs moved. False when
        the drain is no longer recorded (the host was undrained meanwhile)."""
        ...


class HostInfo(TypedDict, total=False):
    """One sandbox host of a :class:`Cluster`, as :meth:`Cluster.hosts` reports it (plain
    data: it crosses processes). Only ``host`` is always there."""

    host: Required[str]
    """The host's name (``sandpit-host-<node id prefix>``)."""
    node_id: str
    """The node it runs on."""
    hostname: str
    pid: int
    """The host process's pid on its node."""
    uptime_s: float
    sessions: int
    """Sessions placed on the host now."""
    calls: int
    """Tool calls running on the host now."""
    draining: bool
    """The host refuses new work (it is being drained)."""
    links: int
    """Direct links (one per API replica) open to the host now."""
    links_refused: int
    """Link connections the host refused so far (bad or missing hello, over its cap)."""
    stats: dict[str, Any]
    """The host's own executor counters (``Executor.stats``)."""
    max_sandboxes: int
    sessions_per_sandbox: int


@runtime_checkable
class Cluster(Protocol):
    """An executor whose sandboxes run on several hosts, which an operator can drain (the
    API records drains in its database, through the :class:`Affinity`, before asking)."""

    def refresh(self, force: bool = False) -> Collection[str]:
        """The names of the live hosts (re-read at most every few seconds unless ``force``)."""
        ...

    def hosts(self) -> list[HostInfo]:
        """Every live host's info (one request per host; a host that does not answer is
        left out)."""
        ...

    def drain(self, host: str, wait_s: float | None = None) -> bool:
        """Drain ``host`` in the background: nothing new is placed on it, its sessions move
        once their calls return, then it shuts down. True when the drain finished within
        ``wait_s`` seconds (None: return at once). Idempotent. Raises ArgumentError for a
        host the executor does not know."""
        ...

    def undrain(self, host: str) -> bool:
        """Let ``host`` take work again (its drain record is gone). True when it is live now,
        False when its node is gone. Raises the executor errors of bringing it back."""
        ...

    def node_alive(self, host: str) -> bool:
        """Whether the node ``host`` runs on is alive and can host sandboxes."""
        ...


@runtime_checkable
class KeyedSessions(Protocol):
    """An executor whose sessions are keyed by the caller's ``session_id`` (``open_session``)
    and outlive the process that opened them: the API passes the env id, so any replica
    re-attaches to the env's session, and ends it when the env is deleted."""

    def discard(self, session_id: str) -> bool:
        """End session ``session_id`` whichever process's handle on it is current. Best
        effort, never raises for a lost host or an unknown session; True when one ended."""
        ...
