"""An env's history (``GET /v1/envs/{id}/state``, ``/trajectory``, ``/episodes``): every
acknowledged step of every episode stays readable, its state as the one JSON view
(:mod:`.state`). Reads only; a state is rendered once per state root, and a live env's
head state comes from its live entry instead of the store when it is the one asked for."""

from __future__ import annotations

from typing import cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.database import Database
from ..db.store import load_state
from ..errors import Conflict, NotFound
from ..schemas.envs import EpisodePublic, EpisodesPublic, EpisodeStatus, Trajectory, TrajectoryStep
from ..services.common import owned
from ..services.quotas import TenantContext
from .failures import Failure, masked, step_failure, worst
from .live import LiveEnvs
from .rulebook import stored_failure
from .state import RenderedStates, state_response


def stored_step_failure(status: str, info: object) -> Failure:
    """A stored step's failure: the one recorded in its ``info`` (the host's verdict when it
    ran), else (a step recorded before failures were) :func:`~.failures.step_failure` of
    its status alone."""
    stored = info.get("failure") if isinstance(info, dict) else None
    return worst([stored]) if isinstance(stored, str) else step_failure(status)


def trajectory_step(row: models.Step) -> TrajectoryStep:
    """A stored step as the trajectory shows it, with its failure and mask."""
    step = TrajectoryStep.model_validate(row, from_attributes=True)
    step.failure = stored_step_failure(row.status, row.info)
    step.mask = masked(step.failure)
    return step


class EnvHistory:
    """Reads of envs' stored steps, states and episodes."""

    def __init__(self, db: Database, live: LiveEnvs, rendered: RenderedStates | None = None) -> None:
        self.db = db
        self.live = live
        self.rendered = rendered if rendered is not None else RenderedStates()

    def state(self, ctx: TenantContext, env_id: str, step: int | None, episode: int | None) -> bytes:
        """``GET /v1/envs/{id}/state``: the ``StateView`` JSON bytes of the state at
        ``step`` (the head when None) of ``episode`` (the current one when None), its
        ``state`` rendered once per state root (:class:`~.state.RenderedStates`). The
        step's root always comes from the database (with API replicas, another process
        may have committed a later step than this process's live entry holds); the state
        is loaded only when that root was rendered neither before nor by the live entry.

        Raises NotFound (env, episode or step unknown; another tenant's env), Conflict
        (``step`` past the head of the current episode)."""
        with self.db.read() as db:
            found = db.execute(select(models.Env.tenant, models.Env.episode, models.Env.step)
                               .where(models.Env.id == env_id)).first()
            if found is None or found.tenant != ctx.tenant:
                raise NotFound(f"env {env_id[:64]!r} not found")
            number, head = self._head_of(db, env_id, found.episode, found.step, episode)
            at = head if step is None else step
            if at > head:
                if number == found.episode:
                    raise Conflict(f"step {at} is past the head ({head}) of episode {number}")
                raise NotFound(f"step {at} of episode {number} of env {env_id!r} not found (its last step is {head})")
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

    def trajectory(self, ctx: TenantContext, env_id: str, episode: int | None, limit: int | None,
                   offset: int) -> Trajectory:
        """``GET /v1/envs/{id}/trajectory``: steps 1..head of ``episode`` (the current one
        when None), in order, ``limit`` at a time from ``offset`` (all when ``limit`` is
        None), with the episode's status and reward; ``count`` is the episode's number of
        steps. Raises NotFound (env or episode)."""
        with self.db.read() as db:
            row = owned(db, models.Env, env_id, ctx.tenant, "env")
            number, head = self._head_of(db, env_id, row.episode, row.step, episode)
            query = select(models.Step).where(models.Step.env_id == env_id, models.Step.episode == number,
                                              models.Step.step > 0, models.Step.step <= head
                                              ).order_by(models.Step.step).offset(offset)
            if limit is not None:
                query = query.limit(limit)
            steps = db.scalars(query).all()
            record = db.get(models.Episode, (env_id, number))
        failure = stored_failure(record) if record is not None else "none"
        return Trajectory(env_id=row.id, episode=number, count=head,
                          status=cast(EpisodeStatus, record.status) if record is not None else "running",
                          reward=record.reward if record is not None else None, failure=failure,
                          mask=masked(failure), steps=[trajectory_step(s) for s in steps])

    def episodes(self, ctx: TenantContext, env_id: str, limit: int, offset: int) -> EpisodesPublic:
        """``GET /v1/envs/{id}/episodes``: the env's episodes, oldest first, a page at a
        time, each with its number of steps. Raises NotFound."""
        with self.db.read() as db:
            owned(db, models.Env, env_id, ctx.tenant, "env")
            total = db.scalar(select(func.count()).select_from(models.Episode)
                              .where(models.Episode.env_id == env_id)) or 0
            records = db.scalars(select(models.Episode).where(models.Episode.env_id == env_id)
                                 .order_by(models.Episode.episode).limit(limit).offset(offset)).all()
            heads: dict[int, int] = {number: head for number, head in db.execute(
                select(models.Step.episode, func.max(models.Step.step))
                .where(models.Step.env_id == env_id).group_by(models.Step.episode))}
        return EpisodesPublic(count=total, data=[
            EpisodePublic(episode=r.episode, environment_id=r.environment_id, scenario_id=r.scenario_id,
                          status=cast(EpisodeStatus, r.status), steps=int(heads.get(r.episode, 0)),
                          observation=r.observation, task=r.task, reward=r.reward, checks=r.checks, config=r.config,
                          started_at=r.started_at, ended_at=r.ended_at, failure=stored_failure(r),
                          mask=masked(stored_failure(r)))
            for r in records])

    @staticmethod
    def _head_of(db: DbSession, env_id: str, current: int, current_head: int, episode: int | None) -> tuple[int, int]:
        """``(episode, its head step)`` of ``episode`` (the current one, whose head is
        ``current_head``, when None). Raises NotFound for an episode the env never had."""
        if episode is None or episode == current:
            return current, current_head
        head = db.scalar(select(func.max(models.Step.step)).where(models.Step.env_id == env_id,
                                                                   models.Step.episode == episode))
        if head is None:
            raise NotFound(f"episode {episode} of env {env_id!r} not found (it has episodes 1..{current})")
        return episode, head
