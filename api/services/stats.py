"""Per-scenario statistics for curricula: attempts, finished episodes, pass rate, mean
reward and the newest rewards of a scenario, and the same over an environment's
scenarios, from what the control database already holds.

Two tables hold finished episodes with a scenario and a reward, and they tell training
from evaluation apart:

* ``episodes``: every episode of an env driven through ``/v1/envs`` (kind ``training``),
  the tenant being its env's. An episode has finished when its status is ``terminated``
  or ``truncated``; its reward is the ``reward`` column. A fork's copy of an episode that
  had already ended before the fork is the same episode again and is not counted. An
  env's deletion copies the episodes counted of it to ``deleted_env_episodes``
  (:func:`keep_deleted_env_episodes`), so they keep counting (an MCP or OpenEnv
  scenario session deletes its env when it ends).
  Episodes of the envs a batch evaluation made (running, or kept after it with
  ``keep_envs``) are left out (the evaluation episode below counts them).
* ``evaluation_episodes``: every scenario run of a batch evaluation (kind
  ``evaluation``), the tenant being its evaluation's. Started once it is ``running``,
  ``done`` or ``error``; finished with a reward when ``done``.

Every figure is one SQL aggregate over the union of the two selections (``COUNT``,
``SUM``, ``AVG``; the newest rewards by ``ROW_NUMBER() OVER (PARTITION BY scenario_id
ORDER BY ended_at DESC)``): no episode row is loaded into Python. The same statements
run on SQLite (3.25 or later, for window functions) and PostgreSQL. Both tables are
indexed on ``scenario_id`` (migration 0010).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, String, and_, case, func, insert, literal_column, not_, select, union_all
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.sql.elements import ColumnElement

from ..db import models
from ..db.database import Database
from ..errors import InvalidRequest
from ..schemas.stats import (
    RECENT_MAX,
    EnvironmentStats,
    RecentReward,
    ScenarioStats,
    StatsKind,
    StatsTotals,
)
from .common import aware, owned
from .quotas import TenantContext

ENDED = ("terminated", "truncated")
"""Statuses of a finished training episode (``episodes.status``)."""
EVALUATION_STARTED = ("running", "done", "error")
"""Statuses of an evaluation episode that was started (``evaluation_episodes.status``)."""
ID_BATCH = 500
"""Scenario ids per statement of :meth:`StatsService.pass_rates` (bound parameters stay
far below SQLite's limit)."""


@dataclass(frozen=True)
class StatsQuery:
    """What to count: ``kind`` of episodes, those started at or after ``since`` (UTC;
    None: all), and ``recent`` newest rewards per scenario (0..:data:`RECENT_MAX`)."""

    kind: StatsKind = "all"
    since: datetime | None = None
    recent: int = 20

    def checked(self) -> StatsQuery:
        """This query with ``since`` in UTC (a naive time is taken as UTC). Raises
        InvalidRequest (``recent`` out of 0..:data:`RECENT_MAX`)."""
        if not 0 <= self.recent <= RECENT_MAX:
            raise InvalidRequest(f"recent must be between 0 and {RECENT_MAX}, not {self.recent}", field="recent")
        since = self.since
        if since is not None:
            since = since.replace(tzinfo=UTC) if since.tzinfo is None else since.astimezone(UTC)
        return StatsQuery(kind=self.kind, since=since, recent=self.recent)


def _training(where: list[ColumnElement[bool]], keys: bool = False) -> Select[Any]:
    """Training episodes (``episodes`` joined to their env) that ``where`` selects and the
    statistics count (a fork's copy of an episode ended before the fork is not one; an
    env a batch evaluation made is left out: its evaluation episode counts): scenario_id, started_at, ended_at,
    reward (NULL unless finished), kind; with ``keys`` also tenant, env_id, episode."""
    episode, env = models.Episode, models.Env
    finished = and_(episode.status.in_(ENDED), episode.reward.is_not(None))
    fork_copy = and_(env.forked_from.is_not(None), episode.episode == 1, episode.ended_at.is_not(None),
                     episode.ended_at < env.created_at)
    evaluating = select(models.EvaluationEpisode.env_id).where(models.EvaluationEpisode.env_id.is_not(None))
    columns: list[Any] = [episode.scenario_id.label("scenario_id"), episode.started_at.label("started_at"),
                          case((finished, episode.ended_at)).label("ended_at"),
                          case((finished, episode.reward)).label("reward"),
                          literal_column("'training'", String).label("kind")]
    if keys:
        columns += [env.tenant.label("tenant"), episode.env_id.label("env_id"), episode.episode.label("episode")]
    return (select(*columns).join(env, env.id == episode.env_id)
            .where(episode.scenario_id.is_not(None), not_(fork_copy), episode.env_id.not_in(evaluating), *where))


def _episodes(tenant: str, query: StatsQuery, scenarios: Any) -> list[Select[Any]]:
    """Training episodes of ``tenant`` whose scenario is in ``scenarios`` (a subquery of
    ids): those of live envs and those of deleted ones (``deleted_env_episodes``), as
    two selects of scenario_id, started_at, ended_at, reward (NULL unless finished), kind."""
    kept = models.DeletedEnvEpisode
    where: list[ColumnElement[bool]] = [models.Env.tenant == tenant, models.Episode.scenario_id.in_(scenarios)]
    kept_where: list[ColumnElement[bool]] = [kept.tenant == tenant, kept.scenario_id.in_(scenarios)]
    if query.since is not None:
        where.append(models.Episode.started_at >= query.since)
        kept_where.append(kept.started_at >= query.since)
    deleted = select(kept.scenario_id.label("scenario_id"), kept.started_at.label("started_at"),
                     kept.ended_at.label("ended_at"), kept.reward.label("reward"),
                     literal_column("'training'", String).label("kind")).where(*kept_where)
    return [_training(where), deleted]


def keep_deleted_env_episodes(db: DbSession, env_id: str) -> None:
    """Copy the episodes of ``env_id`` that the statistics count into
    ``deleted_env_episodes``, in ``db``'s transaction; call it before the env's rows are
    deleted (``DELETE /v1/envs/{id}``), so its episodes keep counting. An env a batch
    evaluation made is left out: its evaluation episode is what counts."""
    evaluated = select(models.EvaluationEpisode.index).where(models.EvaluationEpisode.env_id == env_id).limit(1)
    if db.scalar(evaluated) is not None:
        return
    counted = _training([models.Episode.env_id == env_id], keys=True).subquery("counted")
    kept = models.DeletedEnvEpisode
    db.execute(insert(kept).from_select(
        ["env_id", "episode", "tenant", "scenario_id", "started_at", "ended_at", "reward"],
        select(counted.c.env_id, counted.c.episode, counted.c.tenant, counted.c.scenario_id,
               counted.c.started_at, counted.c.ended_at, counted.c.reward)))


def _evaluation_episodes(tenant: str, query: StatsQuery, scenarios: Any) -> Select[Any]:
    """Evaluation episodes of ``tenant`` (same columns as :func:`_episodes`)."""
    row, job = models.EvaluationEpisode, models.EvaluationJob
    finished = and_(row.status == "done", row.reward.is_not(None), row.finished_at.is_not(None))
    where: list[ColumnElement[bool]] = [job.tenant == tenant, row.scenario_id.in_(scenarios),
                                        row.status.in_(EVALUATION_STARTED), row.started_at.is_not(None)]
    if query.since is not None:
        where.append(row.started_at >= query.since)
    return (select(row.scenario_id.label("scenario_id"), row.started_at.label("started_at"),
                   case((finished, row.finished_at)).label("ended_at"),
                   case((finished, row.reward)).label("reward"),
                   literal_column("'evaluation'", String).label("kind"))
            .join(job, job.id == row.evaluation_id).where(*where))


def _union(tenant: str, query: StatsQuery, scenarios: Any) -> Any:
    """The episodes ``query.kind`` selects, as one subquery."""
    parts: list[Select[Any]] = []
    if query.kind in ("all", "training"):
        parts.extend(_episodes(tenant, query, scenarios))
    if query.kind in ("all", "evaluation"):
        parts.append(_evaluation_episodes(tenant, query, scenarios))
    return union_all(*parts).subquery("counted")


def _figures(u: Any) -> list[Any]:
    """The aggregate columns over the union ``u``: attempts, finished, passed, mean reward,
    last end."""
    return [func.count().label("attempts"), func.count(u.c.reward).label("finished"),
            func.coalesce(func.sum(case((u.c.reward == 1.0, 1), else_=0)), 0).label("passed"),
            func.avg(u.c.reward).label("mean_reward"), func.max(u.c.ended_at).label("last_ended_at")]


def _rate(passed: int, finished: int) -> float | None:
    return round(passed / finished, 4) if finished else None


def _mean(value: Any) -> float | None:
    return None if value is None else round(float(value), 4)


class StatsService:
    """Scenario and environment statistics (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def scenario(self, caller: TenantContext, scenario_id: str, query: StatsQuery) -> ScenarioStats:
        """``GET /v1/scenarios/{id}/stats``: the scenario's statistics. Raises NotFound
        (also for another tenant's scenario), InvalidRequest (``recent`` out of bounds)."""
        query = query.checked()
        with self.db.read() as db:
            row = owned(db, models.Scenario, scenario_id, caller.tenant, "scenario")
            stats = self._per_scenario(db, caller.tenant, query, [row.id])
        return self._public(row.id, row.environment_id, query, stats.get(row.id))

    def environment(self, caller: TenantContext, environment_id: str, query: StatsQuery, limit: int,
                    offset: int) -> EnvironmentStats:
        """``GET /v1/environments/{id}/stats``: totals over all the environment's
        scenarios and the statistics of a page of them (``limit``/``offset``, newest
        scenario first). Raises NotFound (also for another tenant's environment),
        InvalidRequest (``recent`` out of bounds)."""
        query = query.checked()
        tenant = caller.tenant
        with self.db.read() as db:
            owned(db, models.Environment, environment_id, tenant, "environment")
            of_environment = select(models.Scenario.id).where(models.Scenario.tenant == tenant,
                                                              models.Scenario.environment_id == environment_id)
            count = db.scalar(select(func.count()).select_from(of_environment.subquery())) or 0
            page = list(db.scalars(of_environment.order_by(models.Scenario.created_at.desc(), models.Scenario.id)
                                   .limit(limit).offset(offset)).all())
            u = _union(tenant, query, of_environment)
            attempts, finished, passed, mean, _ = db.execute(select(*_figures(u))).one()
            stats = self._per_scenario(db, tenant, query, page) if page else {}
        totals = StatsTotals(scenarios=count, attempts=attempts, finished=finished, passed=passed,
                             pass_rate=_rate(passed, finished), mean_reward=_mean(mean))
        return EnvironmentStats(environment_id=environment_id, kind=query.kind, since=query.since, totals=totals,
                                data=[self._public(s, environment_id, query, stats.get(s)) for s in page],
                                count=count)

    def pass_rates(self, tenant: str, scenario_ids: list[str]) -> dict[str, tuple[float | None, int]]:
        """Each scenario's overall pass rate and finished episodes (every kind, all time;
        scenarios without a finished episode are left out): what an evaluation report
        shows beside its own."""
        ids = sorted(set(scenario_ids))
        stats: dict[str, dict[str, Any]] = {}
        with self.db.read() as db:
            for start in range(0, len(ids), ID_BATCH):
                stats.update(self._per_scenario(db, tenant, StatsQuery(recent=0), ids[start:start + ID_BATCH]))
        return {sid: (_rate(s["passed"], s["finished"]), s["finished"]) for sid, s in stats.items() if s["finished"]}

    # -- the statements ---------------------------------------------------------------------
    def _per_scenario(self, db: DbSession, tenant: str, query: StatsQuery,
                      scenario_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Figures and newest rewards of each of ``scenario_ids`` that has an episode."""
        u = _union(tenant, query, scenario_ids)
        out: dict[str, dict[str, Any]] = {}
        for sid, attempts, finished, passed, mean, last in db.execute(
                select(u.c.scenario_id, *_figures(u)).group_by(u.c.scenario_id)):
            out[sid] = {"attempts": attempts, "finished": finished, "passed": passed or 0, "mean": mean,
                        "last": last, "recent": []}
        if query.recent and out:
            v = _union(tenant, query, scenario_ids)
            rank = func.row_number().over(partition_by=v.c.scenario_id,
                                          order_by=(v.c.ended_at.desc(), v.c.started_at.desc())).label("rank")
            ranked = select(v.c.scenario_id, v.c.reward, v.c.ended_at, v.c.kind, rank).where(
                v.c.reward.is_not(None)).subquery("ranked")
            for sid, reward, ended, kind, _ in db.execute(
                    select(ranked).where(ranked.c.rank <= query.recent).order_by(ranked.c.scenario_id,
                                                                                   ranked.c.rank)):
                out[sid]["recent"].append(RecentReward(reward=reward, ended_at=_moment(ended), kind=kind))
        return out

    @staticmethod
    def _public(scenario_id: str, environment_id: str, query: StatsQuery,
                stats: dict[str, Any] | None) -> ScenarioStats:
        s = stats or {"attempts": 0, "finished": 0, "passed": 0, "mean": None, "last": None, "recent": []}
        return ScenarioStats(scenario_id=scenario_id, environment_id=environment_id, kind=query.kind,
                             since=query.since, attempts=s["attempts"], finished=s["finished"], passed=s["passed"],
                             pass_rate=_rate(s["passed"], s["finished"]), mean_reward=_mean(s["mean"]),
                             last_ended_at=None if s["last"] is None else _moment(s["last"]), recent=s["recent"])


def _moment(value: Any) -> datetime:
    """A timestamp from a union column: SQLite hands back text or a naive datetime (UTC)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return aware(value)

