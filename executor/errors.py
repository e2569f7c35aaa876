"""Exceptions raised by the executor (failures of Sandpit itself, never of user code).

A tool call that times out, runs out of memory or raises is a normal *result*
(:class:`sandpit.executor.results.CallResult` with ``status="timeout"`` etc.), not an
exception. Everything below is a failure to provide the sandbox at all::

    ExecutorError
    ├── ArgumentError            a caller's bad argument (over a cap, wrong type, unknown
    │                            host); the message names it. Also a ValueError
    ├── DockerUnavailable        engine not reachable / API error (wraps docker.errors.*)
    ├── ImageError               sandbox image missing or its build failed
    ├── ProfileError             resource profile unknown or above the operator's limits
    ├── CapacityError            no sandbox can be placed now (carries retry_after_s)
    ├── SandboxStartError        container did not come up and say hello in time
    ├── SandboxLost              container/runner died or stopped answering mid-request
    ├── LinkRefused              (Ray backend) a host link could not be opened; nothing was
    │                            sent and the request goes through Ray instead: it never
    │                            leaves the backend
    └── SessionError             request the session cannot serve (closed, open failed)
        ├── SessionClosed
        │   ├── HostDraining     (Ray backend) the host is being drained: the request goes to
        │   │                    another host; one that reaches the caller is a SessionClosed
        │   └── SessionLost      closed because its sandbox was lost (found dead before the
        │                        request ran: nothing ran)
        └── SessionOpenError     the environment's code failed to load or instantiate
            └── ToolSchemaError  its tool schemas could not be derived

Each carries the data a caller needs (``retry_after_s``, ``status``, ``sandbox_id``...).
The Docker SDK's own exceptions never cross this package's boundary: they are translated
in :func:`sandpit.executor.docker.engine.map_docker_errors`.
"""

from __future__ import annotations


class ExecutorError(Exception):
    """Base class of every executor failure."""


class ArgumentError(ExecutorError, ValueError):
    """An argument the executor refuses before anything runs: a value over a cap, of the
    wrong type or shape, a timeout above the profile's, an unknown host. The message names
    the argument (``checks[3].check_func has ...``) so a caller can name the field. Also a
    :class:`ValueError`: code that catches ``ValueError`` around executor calls still does."""


class DockerUnavailable(ExecutorError):
    """The Docker Engine could not be reached or refused an API call."""


class ImageError(ExecutorError):
    """The sandbox image is missing or could not be built."""


class ProfileError(ExecutorError, ValueError):
    """A resource profile is unknown, malformed, or exceeds the operator's maximum."""


class CapacityError(ExecutorError):
    """No sandbox capacity right now. ``retry_after_s`` is a hint in seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SandboxStartError(ExecutorError):
    """A container was created but its runner did not connect and say hello in time."""

    def __init__(self, message: str, sandbox_id: str, logs: str = "") -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.logs = logs


class SandboxLost(ExecutorError):
    """The sandbox stopped answering or disappeared during a request.

    ``status`` is what the interrupted tool call reports: ``timeout`` when the host-side
    watchdog gave up on an unresponsive runner, ``oom`` when the container was OOM-killed,
    ``crashed`` otherwise.
    """

    def __init__(self, message: str, sandbox_id: str, status: str = "crashed") -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.status = status


class SessionError(ExecutorError):
    """The session cannot serve this request (``reason`` says why)."""


class SessionClosed(SessionError):
    """The session was closed; create a new one."""


class HostDraining(SessionClosed):
    """The sandbox host is being drained: it takes no new session nor pool work (the Ray
    executor then places the request on another host). A ``SessionClosed``, so one that
    reaches the API is a retryable 503."""


class SessionLost(SessionClosed):
    """The session is closed because its sandbox was lost (the container or its runner is
    gone): found so before this request ran, so nothing ran. A caller that re-opens the
    session from its own copy of the state re-opens it after a loss (the failure taxonomy
    counts that as the platform's), where a plain :class:`SessionClosed` may also mean
    the session was closed on purpose or, on the Ray backend, used by another replica."""


class LinkRefused(ExecutorError):
    """A host link (the Ray backend's direct data path) could not be opened: nothing was
    sent, so the request goes through Ray instead. Raised and caught inside the backend."""


class SessionOpenError(SessionError):
    """The environment could not be instantiated (its code raised, timed out, ran out of
    memory, or ``class_name`` is missing or not a class); in describe-only mode, the module
    could not be loaded or the class found. ``status`` (``error``, ``timeout``, ``oom``,
    ``crashed``, ``rejected``), ``observation`` (``"Error: <Type>: <message>"``) and
    ``traceback`` (bounded, or None) say how."""

    def __init__(self, status: str, observation: str, traceback: str | None = None) -> None:
        super().__init__(observation)
        self.status = status
        self.observation = observation
        self.traceback = traceback


class ToolSchemaError(SessionOpenError):
    """The environment's tool schemas could not be derived: the class has more public
    methods than ``MAX_TOOLS`` or its schemas exceed ``MAX_SCHEMAS_BYTES`` (runner caps)
    (``status="rejected"``), or introspecting it raised (``error``), timed out, ran out of
    memory or crashed. A subclass of :class:`SessionOpenError`, with the same fields."""
