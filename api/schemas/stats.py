"""Per-scenario statistics (``GET /v1/scenarios/{id}/stats``,
``GET /v1/environments/{id}/stats``): ``ScenarioStats`` for one scenario,
``EnvironmentStats`` for the scenarios of an environment and their totals.

What the figures count is stated on :class:`ScenarioStats`; how they are computed (SQL
aggregates over ``episodes`` and ``evaluation_episodes``) is
:mod:`sandpit.api.services.stats`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from .common import Timestamp

StatsKind = Literal["all", "training", "evaluation"]
"""Which episodes count: ``training`` (episodes of envs driven through ``/v1/envs``: a
trainer, an agent, the CLI), ``evaluation`` (scenarios run by batch evaluations,
``/v1/evaluations``) or ``all`` (both)."""

RECENT_DEFAULT = 20
"""Rewards listed in ``recent`` unless the request names another count."""
RECENT_MAX = 100
"""Most rewards ``recent`` may list (the query parameter's bound)."""


class RecentReward(BaseModel):
    """One finished episode's reward, with when it ended and where it ran."""

    reward: float
    ended_at: Timestamp
    kind: Literal["training", "evaluation"]


class ScenarioStats(BaseModel):
    """Statistics of one scenario over the episodes ``kind`` selects that started at or
    after ``since`` (all when None).

    ``attempts`` counts episodes started (finished or not); ``finished`` those that ended
    with a reward (a training episode ``terminated`` or ``truncated``, an evaluation
    episode ``done``). ``passed`` counts finished episodes whose reward is exactly 1.0:
    EnvScaler's reward is the mean of the checklist's boolean results, so 1.0 means every
    check passed (checklists have at most 4096 checks, so a single failure keeps the
    4-place reward at or below 0.9998). ``pass_rate`` is ``passed / finished`` and
    ``mean_reward`` the mean of the finished episodes' rewards; both are None when none
    finished. ``recent`` lists the newest finished episodes' rewards, newest first."""

    scenario_id: str
    environment_id: str
    kind: StatsKind
    since: Timestamp | None
    attempts: int
    finished: int
    passed: int
    pass_rate: float | None
    mean_reward: float | None
    last_ended_at: Timestamp | None
    recent: list[RecentReward]


class StatsTotals(BaseModel):
    """The figures of :class:`ScenarioStats` over all of an environment's scenarios
    together (``mean_reward`` is the mean over their finished episodes, not the mean of
    per-scenario means)."""

    scenarios: int
    attempts: int
    finished: int
    passed: int
    pass_rate: float | None
    mean_reward: float | None


class EnvironmentStats(BaseModel):
    """An environment's totals over its scenarios, and one page of its scenarios'
    statistics (newest scenario first, as ``GET /v1/scenarios`` lists them); ``count``
    is the number of its scenarios."""

    environment_id: str
    kind: StatsKind
    since: Timestamp | None
    totals: StatsTotals
    data: list[ScenarioStats]
    count: int
