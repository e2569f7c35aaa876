"""An env's history (``GET /v1/envs/{id}/state``, ``/trajectory``, ``/episodes``): every
acknowledged step of every episode stays readable, its state as the one JSON view
(:mod:`.state`). Reads only; a live env's head state comes from its live entry."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.database import Database
from ..db.store import load_state
from ..errors import Conflict, NotFound
from ..schemas.envs import EpisodePublic, EpisodesPublic, EpisodeStatus, StateView, Trajectory, TrajectoryStep
from ..services.common import owned
from ..services.quotas import TenantContext
from .live import LiveEnvs
from .state import RenderedStates, state_response, state_view, view_truncated


class EnvHistory:
    """Reads of envs' stored steps, states and episodes."""

    def __init__(self, db: Database, live: LiveEnvs, rendered: RenderedStates | None = None) -> None:
        self.db = db
        self.live = live
        self.rendered = rendered if rendered is not None else RenderedStates()

    # -- the HTTP contract -------------------------------------------------------------------
    def state_at(self, caller: TenantContext, env_id: str, step: int | None, episode: int | None) -> StateView:
        """``GET /state``: :meth:`state` as the API shows it."""
        row, number, at, state, truncated = self.state(caller.tenant, env_id, step, episode)
        return StateView(env_id=row.id, episode=number, step=at, state=state, truncated=truncated)

    def state_json(self, caller: TenantContext, env_id: str, step: int | None, episode: int | None) -> bytes:
        """``GET /state`` as JSON bytes: the same ``StateView`` as :meth:`state_at`, its
        ``state`` rendered once per state root (:class:`~.state.RenderedStates`). The
        step's root always comes from the database (with API replicas, another process
        may have committed a later step than this process's live entry holds); the state is
        loaded only when that root was rendered neither before nor by the live entry.
        Raises what :meth:`state` raises."""
        with self.db.read() as db:
            found = db.execute(select(models.Env.tenant, models.Env.episode, models.Env.step)
                               .where(models.Env.id == env_id)).first()
            if found is None or found.tenant != caller.tenant:
                raise NotFound(f"env {env_id[:64]!r} not found")
            number, head = self._head_of(db, env_id, found.episode, found.step, episode)
            at = self._checked_step(env_id, number, head, found.episode, step)
            root = db.scalar(select(models.Step.state_root).where(
                models.Step.env_id == env_id, models.Step.episode == number, models.Step.step == at))
            if root is None:
                raise NotFound(f"step {at} of env {env_id!r} not found")
            hit = self.rendered.get(root)
            if hit is None:
                entry = self.live.get(env_id)
                if entry is not None and entry.cache.root == root and not entry.session.closed:
                    hit = self.rendered.render(entry.cache)
                else:
                    hit = self.rendered.render(load_state(db, root))
        return state_response(env_id, number, at, *hit)

    def trajectory_page(self, caller: TenantContext, env_id: str, episode: int | None, limit: int | None,
                        offset: int) -> Trajectory:
        """``GET /trajectory``: a page of :meth:`trajectory`."""
        row, number, steps, total, record = self.trajectory(caller.tenant, env_id, episode, limit, offset)
        return Trajectory(env_id=row.id, episode=number, count=total,
                          status=cast(EpisodeStatus, record.status) if record is not None else "running",
                          reward=record.reward if record is not None else None,
                          steps=[TrajectoryStep.model_validate(s, from_attributes=True) for s in steps])

    def episodes_page(self, caller: TenantContext, env_id: str, limit: int, offset: int) -> EpisodesPublic:
        """``GET /episodes``: a page of :meth:`episodes`."""
        records, total = self.episodes_of(caller.tenant, env_id, limit, offset)
        return EpisodesPublic(count=total, data=[
            EpisodePublic(episode=r.episode, environment_id=r.environment_id, scenario_id=r.scenario_id,
                          status=cast(EpisodeStatus, r.status), steps=steps, observation=r.observation,
                          task=r.task, reward=r.reward, checks=r.checks, config=r.config, started_at=r.started_at,
                          ended_at=r.ended_at)
            for r, steps in records])

    # -- reads ---------------------------------------------------------------------------------
    @staticmethod
    def _episode_number(db: DbSession, row: models.Env, episode: int | None) -> tuple[int, int]:
        """``(episode, head step)`` of ``episode`` (the current one when None). Raises
        NotFound for an episode the env never had."""
        if episode is None or episode == row.episode:
            return row.episode, row.step
        head = db.scalar(select(func.max(models.Step.step)).where(models.Step.env_id == row.id,
                                                                   models.Step.episode == episode))
        if head is None:
            raise NotFound(f"episode {episode} of env {row.id!r} not found (it has episodes 1..{row.episode})")
        return episode, head

    @staticmethod
    def _head_of(db: DbSession, env_id: str, current: int, current_head: int, episode: int | None) -> tuple[int, int]:
        """:meth:`_episode_number` from the env's ``(episode, step)`` columns alone."""
        if episode is None or episode == current:
            return current, current_head
        head = db.scalar(select(func.max(models.Step.step)).where(models.Step.env_id == env_id,
                                                                   models.Step.episode == episode))
        if head is None:
            raise NotFound(f"episode {episode} of env {env_id!r} not found (it has episodes 1..{current})")
        return episode, head

    @staticmethod
    def _checked_step(env_id: str, number: int, head: int, current: int, step: int | None) -> int:
        """``step`` (the head when None) if it is not past ``head``. Raises Conflict (past
        the head of the current episode), NotFound (past the last step of an older one)."""
        at = head if step is None else step
        if at > head:
            if number == current:
                raise Conflict(f"step {at} is past the head ({head}) of episode {number}")
            raise NotFound(f"step {at} of episode {number} of env {env_id!r} not found (its last step is {head})")
        return at

    def state(self, tenant: str, env_id: str, step: int | None,
              episode: int | None = None) -> tuple[models.Env, int, int, dict[str, Any], bool]:
        """State at ``step`` of ``episode`` (head / current episode when None), as the one
        JSON view every reader gets (:func:`~.state.state_view`). Returns ``(row,
        episode, step, state, truncated)``. Raises NotFound (episode or step unknown),
        Conflict (step past the head of the current episode)."""
        with self.db.read() as db:
            row = owned(db, models.Env, env_id, tenant, "env")
            number, head = self._episode_number(db, row, episode)
            at = head if step is None else step
            if at > head:
                if number == row.episode:
                    raise Conflict(f"step {at} is past the head ({head}) of episode {number}")
                raise NotFound(f"step {at} of episode {number} of env {env_id!r} not found (its last step is {head})")
            entry = self.live.get(env_id)
            if entry is not None and entry.episode == number and entry.step == at and not entry.session.closed:
                cache = entry.cache
            else:
                stored = db.get(models.Step, (env_id, number, at))
                if stored is None:
                    raise NotFound(f"step {at} of env {env_id!r} not found")
                cache = load_state(db, stored.state_root)
        return row, number, at, state_view(cache), view_truncated(cache)

    def trajectory(self, tenant: str, env_id: str, episode: int | None = None, limit: int | None = None,
                   offset: int = 0) -> tuple[models.Env, int, list[models.Step], int, models.Episode | None]:
        """Steps 1..head of ``episode`` (the current one when None), in order, a page at a
        time. Returns ``(row, episode, steps, total, episode row)``. Raises NotFound."""
        with self.db.read() as db:
            row = owned(db, models.Env, env_id, tenant, "env")
            number, head = self._episode_number(db, row, episode)
            where = (models.Step.env_id == env_id, models.Step.episode == number, models.Step.step > 0,
                     models.Step.step <= head)
            query = select(models.Step).where(*where).order_by(models.Step.step).offset(offset)
            if limit is not None:
                query = query.limit(limit)
            steps = db.scalars(query).all()
            record = db.get(models.Episode, (env_id, number))
        return row, number, list(steps), head, record

    def episodes_of(self, tenant: str, env_id: str, limit: int,
                    offset: int) -> tuple[list[tuple[models.Episode, int]], int]:
        """The env's episodes, oldest first, each with its step count, and the total."""
        with self.db.read() as db:
            owned(db, models.Env, env_id, tenant, "env")
            total = db.scalar(select(func.count()).select_from(models.Episode)
                              .where(models.Episode.env_id == env_id)) or 0
            records = db.scalars(select(models.Episode).where(models.Episode.env_id == env_id)
                                 .order_by(models.Episode.episode).limit(limit).offset(offset)).all()
            heads: dict[int, int] = {number: head for number, head in db.execute(
                select(models.Step.episode, func.max(models.Step.step))
                .where(models.Step.env_id == env_id).group_by(models.Step.episode))}
        return [(r, int(heads.get(r.episode, 0))) for r in records], total
