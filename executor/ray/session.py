"""A replica's handle on a session that lives in a sandbox host: :class:`RaySession`.
Every request carries the version the handle last saw; a host that has another answers
``SessionClosed`` (another replica used the env) and the handle closes. Neither the handle
nor the host keeps a copy of the state (the host's pool session is a handle too): a call
whose sandbox was lost reports its status and closes the handle, and the replica's caller
re-opens the session from the state it keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import ExecutorError, SandboxLost, SessionClosed
from ..results import CallResult, CallRules, EncodedValue, OpenedState, Snapshot

if TYPE_CHECKING:
    from .executor import RayExecutor


class RaySession:
    """A replica's handle on a session hosted by a :class:`~sandpit.executor.ray.host.SandboxHost` (the package docstring)."""

    def __init__(self, owner: RayExecutor, host: str, session_id: str, tenant: str, version: int) -> None:
        self._owner = owner
        self.host = host
        self._id = session_id
        self._tenant = tenant
        self._version = version
        self._closed = False
        self.retyped: list[dict[str, str]] = []
        """What the host's session reported at open (``Session.retyped``)."""
        self.opened = OpenedState()
        """What the host's session reported it opened with (:meth:`take_opened`)."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise SessionClosed(f"session {self._id!r} is closed")

    def _ask(self, method: str, *args: Any) -> Any:
        try:
            return self._owner.ask(self.host, method, *args)
        except (SandboxLost, SessionClosed):
            self._closed = True
            raise

    def call(self, name: str, arguments: dict[str, Any] | None = None, rules: CallRules = "sandpit") -> CallResult:
        """A tool call in the host (EnvScaler semantics; ``rules`` as the executor's
        session); when its sandbox was lost the result says how and the handle closes.
        Raises SessionClosed (closed, or stale: another replica used the env),
        SandboxLost (host lost), ArgumentError."""
        self._check()
        reply = self._ask("call", self._id, self._version, name, arguments or {}, rules)
        self._version = reply[0]
        if len(reply) > 2 and reply[2] is True:
            self._closed = True  # the host's session closed with its sandbox
        return CallResult.model_validate(reply[1])

    def take_opened(self) -> OpenedState:
        """The state the host's session opened with, once (then an empty one)."""
        opened, self.opened = self.opened, OpenedState()
        return opened

    def read_state(self) -> dict[str, EncodedValue]:
        """The current encoded state, read from the sandbox through its host."""
        self._check()
        attributes: dict[str, EncodedValue] = self._ask("read", self._id, "snapshot")
        return attributes

    def state(self) -> dict[str, Any]:
        """The state's JSON view, read from the sandbox through its host."""
        self._check()
        state: dict[str, Any] = self._ask("read", self._id, "state")
        return state

    def restore(self, snapshot: Snapshot) -> None:
        """Put the instance into ``snapshot``'s state. Raises SessionError, SandboxLost."""
        self._check()
        self._version = self._ask("restore", self._id, self._version, snapshot.attributes)

    def describe(self) -> list[dict[str, Any]]:
        """The OpenAI tool schemas of the instance's class."""
        self._check()
        schemas: list[dict[str, Any]] = self._ask("read", self._id, "describe")
        return schemas

    def close(self) -> None:
        """End the session in its host unless another replica took it over (idempotent;
        a lost host has nothing left to close)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._owner.ask(self.host, "close_session", self._id, self._version)
        except ExecutorError:
            pass
