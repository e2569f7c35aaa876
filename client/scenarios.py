"""`client.scenarios`: EnvScaler scenarios (sync and async)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from . import calls
from .models import Page, Scenario, ScenarioStats
from .transport import AsyncTransport, SyncTransport

__all__ = ["AsyncScenarios", "Scenarios"]


class Scenarios:
    """`client.scenarios`: EnvScaler scenarios. `create(body)` takes the server's
    `ScenarioCreate` fields (`environment_id`, `task`, `init_config`, `checklist`,
    `checklist_with_func`, `external_id`)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, body: Mapping[str, Any]) -> Scenario:
        """Store a scenario. Raises `NotFound` (environment), `InvalidRequest`."""
        return self._t.run(calls.scenario_create(body))

    def get(self, scenario_id: str) -> Scenario:
        """One scenario. Raises `NotFound`."""
        return self._t.run(calls.scenario_get(scenario_id))

    def list(self, limit: int | None = None, offset: int | None = None, *,
             environment_id: str | None = None) -> Page[Scenario]:
        """A page of scenarios, newest first (only those of `environment_id` when given)."""
        return self._t.run(calls.scenario_list(limit, offset, environment_id))

    def stats(self, scenario_id: str, *, kind: str | None = None, since: datetime | str | None = None,
              recent: int | None = None) -> ScenarioStats:
        """The scenario's statistics: attempts, finished episodes, passes (reward 1.0),
        pass rate, mean reward and the newest rewards, newest first. kind: `training` (envs of `/v1/envs`), `evaluation` (batch evaluations) or `all`
        (the server's default). since: count only episodes started at or after this time
        (a naive datetime or a string without a zone is UTC). recent: how many of the
        newest rewards to list (0..100; the server's default is 20).

        Raises `NotFound` (unknown or another tenant's scenario), `InvalidRequest` (a bad
        `kind`, `since` or `recent`)."""
        return self._t.run(calls.scenario_stats(scenario_id, kind, since, recent))

    def delete(self, scenario_id: str) -> None:
        """Delete a scenario. Raises `NotFound`."""
        self._t.run(calls.scenario_delete(scenario_id))


class AsyncScenarios:
    """`AsyncClient.scenarios`: see `Scenarios`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: Mapping[str, Any]) -> Scenario:
        return await self._t.run(calls.scenario_create(body))

    async def get(self, scenario_id: str) -> Scenario:
        return await self._t.run(calls.scenario_get(scenario_id))

    async def list(self, limit: int | None = None, offset: int | None = None, *,
                   environment_id: str | None = None) -> Page[Scenario]:
        return await self._t.run(calls.scenario_list(limit, offset, environment_id))

    async def stats(self, scenario_id: str, *, kind: str | None = None, since: datetime | str | None = None,
                    recent: int | None = None) -> ScenarioStats:
        """See `Scenarios.stats`."""
        return await self._t.run(calls.scenario_stats(scenario_id, kind, since, recent))

    async def delete(self, scenario_id: str) -> None:
        await self._t.run(calls.scenario_delete(scenario_id))
