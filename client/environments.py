"""`client.environments`: registered environment code (sync and async)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from . import calls
from .models import Environment, EnvironmentStats, Page
from .transport import AsyncTransport, SyncTransport

__all__ = ["AsyncEnvironments", "Environments"]


class Environments:
    """`client.environments`: registered environment code."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, source_code: str, class_name: str, *, name: str | None = None,
               description: str | None = None, policy: str = "standard", introduction: str | None = None,
               rules: Iterable[str] | None = None, argument_checking: str | None = None,
               sample_init_config: Mapping[str, Any] | None = None,
               tools: Iterable[Mapping[str, Any]] | None = None) -> Environment:
        """Register `source_code` whose class `class_name` is the environment, checked with
        the static `policy` (`strict` | `standard` | `audit`; the returned `policy_report`
        lists every finding, warnings included), its tools derived and the class
        instantiated once with `sample_init_config` in a sandbox. `introduction` and
        `rules` are EnvScaler's `environment_introduction` / `constraints_rules`;
        `argument_checking` (`off` | `warn` | `strict`) the default for its envs.
        `tools` (OpenAI function-calling schemas, or bare `{name, description,
        parameters}` objects) are declared tools: what the agent is shown instead of the
        derived schemas; each must be a callable attribute of the class (`hasattr`), and
        the returned `tool_differences` say where they differ from the class.

        Raises:
            InvalidRequest: the code is refused, or a declared tool is malformed or not
                a tool of the class (`tools.<i>`; the field and the reason are in the error).
            PayloadTooLarge: the code exceeds the server's size limit.
        """
        extra = {"introduction": introduction, "rules": list(rules) if rules is not None else None,
                 "argument_checking": argument_checking,
                 "sample_init_config": dict(sample_init_config) if sample_init_config is not None else None,
                 "tools": [dict(t) for t in tools] if tools is not None else None}
        return self._t.run(calls.environment_create(source_code, class_name, name, description, policy, extra))

    def get(self, environment_id: str) -> Environment:
        """One environment. Raises `NotFound`."""
        return self._t.run(calls.environment_get(environment_id))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[Environment]:
        """A page of the tenant's environments (server default limit when None)."""
        return self._t.run(calls.environment_list(limit, offset))

    def stats(self, environment_id: str, *, kind: str | None = None, since: datetime | str | None = None,
              recent: int | None = None, limit: int | None = None, offset: int | None = None) -> EnvironmentStats:
        """Statistics of the environment's scenarios: `totals` over all of them and, in
        `data`, each scenario of one page (`limit`/`offset`, newest scenario first) as
        `client.scenarios.stats` gives it. kind: `training` (envs of `/v1/envs`), `evaluation` (batch evaluations) or `all`
        (the server's default). since: count only episodes started at or after this time
        (a naive datetime or a string without a zone is UTC). recent: how many of the
        newest rewards to list (0..100; the server's default is 20).

        Raises `NotFound` (unknown or another tenant's environment), `InvalidRequest`."""
        return self._t.run(calls.environment_stats(environment_id, kind, since, recent, limit, offset))

    def delete(self, environment_id: str) -> None:
        """Delete an environment. Raises `NotFound`; `Conflict` if the server refuses."""
        self._t.run(calls.environment_delete(environment_id))


class AsyncEnvironments:
    """`async_client.environments`; see `Client.environments` for arguments and errors."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, source_code: str, class_name: str, *, name: str | None = None,
                     description: str | None = None, policy: str = "standard", introduction: str | None = None,
                     rules: Iterable[str] | None = None, argument_checking: str | None = None,
                     sample_init_config: Mapping[str, Any] | None = None,
                     tools: Iterable[Mapping[str, Any]] | None = None) -> Environment:
        """See `Client.environments.create`."""
        extra = {"introduction": introduction, "rules": list(rules) if rules is not None else None,
                 "argument_checking": argument_checking,
                 "sample_init_config": dict(sample_init_config) if sample_init_config is not None else None,
                 "tools": [dict(t) for t in tools] if tools is not None else None}
        return await self._t.run(calls.environment_create(source_code, class_name, name, description, policy, extra))

    async def get(self, environment_id: str) -> Environment:
        """See `Client.environments.get`."""
        return await self._t.run(calls.environment_get(environment_id))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[Environment]:
        """See `Client.environments.list`."""
        return await self._t.run(calls.environment_list(limit, offset))

    async def stats(self, environment_id: str, *, kind: str | None = None, since: datetime | str | None = None,
                    recent: int | None = None, limit: int | None = None,
                    offset: int | None = None) -> EnvironmentStats:
        """See `Client.environments.stats`."""
        return await self._t.run(calls.environment_stats(environment_id, kind, since, recent, limit, offset))

    async def delete(self, environment_id: str) -> None:
        """See `Client.environments.delete`."""
        await self._t.run(calls.environment_delete(environment_id))
