"""An in-process env -> host affinity for the Ray backend: :class:`MemoryAffinity`, what a
:class:`~sandpit.executor.ray.executor.RayExecutor` records placements and drains in when
it is given none (one process, tests). Replicas sharing a database use the API's
``DbAffinity``; the protocol both satisfy is :class:`sandpit.executor.interface.Affinity`."""

from __future__ import annotations


class MemoryAffinity:
    """An in-process :class:`~sandpit.executor.interface.Affinity` (a single API process, tests); a drain is recorded
    with :meth:`start_drain` (before :meth:`~.executor.RayExecutor.drain`) and forgotten with
    :meth:`undrain` (before :meth:`~.executor.RayExecutor.undrain`)."""

    def __init__(self) -> None:
        self._hosts: dict[str, str] = {}
        self._drains: dict[str, str] = {}

    def get(self, session_id: str) -> str | None:
        return self._hosts.get(session_id)

    def put(self, session_id: str, host: str) -> None:
        self._hosts[session_id] = host

    def start_drain(self, host: str) -> None:
        """Record ``host`` as draining (idempotent)."""
        self._drains.setdefault(host, "draining")

    def drains(self) -> dict[str, str]:
        return dict(self._drains)

    def envs_on(self, host: str) -> list[str]:
        return [sid for sid, h in self._hosts.items() if h == host]

    def move(self, session_id: str, from_host: str, to_host: str | None) -> bool:
        if self._hosts.get(session_id) != from_host:
            return False
        if to_host is None:
            del self._hosts[session_id]
        else:
            self._hosts[session_id] = to_host
        return True

    def finish_drain(self, host: str, moved: int) -> bool:
        if host not in self._drains:
            return False
        self._drains[host] = "drained"
        return True

    def undrain(self, host: str) -> None:
        """Forget ``host``'s drain (it takes work again)."""
        self._drains.pop(host, None)

