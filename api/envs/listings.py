"""Read-only listings the web viewer pages through: a tenant's episodes across all its
envs (filtered by environment, scenario, status and reward) and its environments
(searched by name or class). Every query is scoped to the caller's tenant; the page size
is the caller's (the viewer asks for 50) and ``count`` is the total that matched, so a
10,000-row listing costs one page of rows and one count.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, func, or_, select

from ..db import models
from ..db.database import Database
from ..services.quotas import TenantContext

EPISODE_STATUSES = ("running", "terminated", "truncated")
"""The statuses an episode filter may name."""


@dataclass(frozen=True)
class EpisodeFilter:
    """What the episode listing keeps; None keeps all. ``reward_min``/``reward_max`` are
    inclusive and leave out episodes without a reward."""

    environment_id: str | None = None
    scenario_id: str | None = None
    status: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None


@dataclass(frozen=True)
class EpisodeRow:
    """One episode of the listing."""

    env_id: str
    episode: int
    environment_id: str
    environment_name: str | None
    scenario_id: str | None
    status: str
    reward: float | None
    steps: int
    """Recorded steps of the episode (its head)."""
    started_at: datetime
    forked_from: str | None


def _episodes_query(tenant: str, wanted: EpisodeFilter) -> Select[models.Episode, models.Env]:
    query = (select(models.Episode, models.Env).join(models.Env, models.Env.id == models.Episode.env_id)
             .where(models.Env.tenant == tenant))
    if wanted.environment_id:
        query = query.where(models.Episode.environment_id == wanted.environment_id)
    if wanted.scenario_id:
        query = query.where(models.Episode.scenario_id == wanted.scenario_id)
    if wanted.status:
        query = query.where(models.Episode.status == wanted.status)
    if wanted.reward_min is not None:
        query = query.where(models.Episode.reward >= wanted.reward_min)
    if wanted.reward_max is not None:
        query = query.where(models.Episode.reward <= wanted.reward_max)
    return query


class Listings:
    """The viewer's listings over the control database (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def episodes(self, ctx: TenantContext, wanted: EpisodeFilter, limit: int,
                 offset: int) -> tuple[list[EpisodeRow], int]:
        """A page of the tenant's episodes, newest first, and how many matched. Two
        queries for the page (rows, their heads) and one count."""
        query = _episodes_query(ctx.tenant, wanted)
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            pairs = db.execute(query.order_by(models.Episode.started_at.desc(), models.Episode.env_id,
                                              models.Episode.episode.desc()).limit(limit).offset(offset)).all()
            env_ids = {env.id for _, env in pairs}
            heads = {(env_id, number): int(head) for env_id, number, head in db.execute(
                select(models.Step.env_id, models.Step.episode, func.max(models.Step.step))
                .where(models.Step.env_id.in_(env_ids)).group_by(models.Step.env_id, models.Step.episode))}
            names: dict[str, str | None] = {environment_id: name for environment_id, name in db.execute(
                select(models.Environment.id, models.Environment.name).where(
                    models.Environment.id.in_({episode.environment_id for episode, _ in pairs})))}
        return [EpisodeRow(env_id=env.id, episode=episode.episode, environment_id=episode.environment_id,
                           environment_name=names.get(episode.environment_id), scenario_id=episode.scenario_id,
                           status=episode.status, reward=episode.reward,
                           steps=heads.get((env.id, episode.episode), 0), started_at=episode.started_at,
                           forked_from=env.forked_from)
                for episode, env in pairs], total

    def environments(self, ctx: TenantContext, search: str | None, limit: int,
                     offset: int) -> tuple[list[models.Environment], int]:
        """A page of the tenant's registered environments (inline ones left out), newest
        first, whose name, class name or id contains ``search`` (case-insensitive; the
        text is a bound parameter, ``%`` and ``_`` in it match themselves); and the total."""
        query = select(models.Environment).where(models.Environment.tenant == ctx.tenant,
                                                 models.Environment.inline.is_(False))
        if search:
            pattern = "%" + search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query = query.where(or_(func.lower(models.Environment.name).like(pattern, escape="\\"),
                                    func.lower(models.Environment.class_name).like(pattern, escape="\\"),
                                    func.lower(models.Environment.id).like(pattern, escape="\\")))
        with self.db.read() as db:
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            rows = db.scalars(query.order_by(models.Environment.created_at.desc(), models.Environment.id)
                              .limit(limit).offset(offset)).all()
        return list(rows), total

    def scenarios_of(self, ctx: TenantContext, environment_id: str, limit: int) -> list[models.Scenario]:
        """The newest ``limit`` scenarios of one of the tenant's environments."""
        with self.db.read() as db:
            return list(db.scalars(select(models.Scenario).where(
                models.Scenario.tenant == ctx.tenant, models.Scenario.environment_id == environment_id)
                .order_by(models.Scenario.created_at.desc()).limit(limit)).all())

    def relatives(self, ctx: TenantContext, env_id: str, limit: int = 20) -> list[models.Env]:
        """Envs of the same fork family as ``env_id`` (its forks, its parent, its
        parent's other forks), newest first, at most ``limit``; the env itself left out."""
        with self.db.read() as db:
            env = db.get(models.Env, env_id)
            if env is None or env.tenant != ctx.tenant:
                return []
            roots = {env_id} | ({env.forked_from} if env.forked_from else set())
            rows = db.scalars(select(models.Env).where(
                models.Env.tenant == ctx.tenant, models.Env.id != env_id,
                or_(models.Env.forked_from.in_(roots), models.Env.id == env.forked_from))
                .order_by(models.Env.created_at.desc()).limit(limit)).all()
        return list(rows)
