"""An env as the API shows it (:class:`~sandpit.api.schemas.envs.EnvPublic`): its row,
its status, its current episode and the tools and introduction the agent gets.

The tools shown are the environment's (declared ones when it has them) plus
``chat_with_user`` when the episode uses it; under the ``envscaler`` profile they are the
environment record's tools as they are, with EnvScaler's own introduction text
(:mod:`.envscaler`).
"""

from __future__ import annotations

from typing import Any

from ..db import models
from ..db.database import Database
from ..schemas.envs import EnvPublic
from ..services.common import aware, utcnow
from ..services.declared_tools import agent_tools
from . import envscaler
from .configs import EnvConfigs
from .failures import masked
from .live import LiveEnvs
from .rulebook import EpisodeConfig, episode_tools, introduction_text, stored_failure


class EnvViews:
    """Renders env rows as :class:`EnvPublic` (see the module docstring)."""

    def __init__(self, db: Database, configs: EnvConfigs, live: LiveEnvs) -> None:
        self.db = db
        self.configs = configs
        self.live = live

    def public(self, row: models.Env, tools: bool = True) -> EnvPublic:
        """``row`` as the API shows it, its environment and episode read in one
        transaction; ``tools`` False leaves the tools out (listings)."""
        with self.db.read() as db:
            environment = db.get(models.Environment, row.environment_id)
            episode = db.get(models.Episode, (row.id, row.episode))
        return self.of_rows(row, environment, episode, tools)

    def of_rows(self, row: models.Env, environment: models.Environment | None, episode: models.Episode | None,
                tools: bool = True, live: bool | None = None) -> EnvPublic:
        """:meth:`public` of rows already at hand (no database read but the config's, when
        it is not in memory). ``live``: whether the env is in a sandbox (a create or reset
        renders its reply before the commit after which its session joins the live envs);
        None: as the live envs say now."""
        return EnvPublic(id=row.id, environment_id=row.environment_id, episode=row.episode, step=row.step,
                         init_config=self.configs.config_of(row), created_at=row.created_at,
                         expires_at=row.expires_at, forked_from=row.forked_from, forked_at_step=row.forked_at_step,
                         scenario_id=row.scenario_id, **self._view(row, environment, episode, tools, live))

    def status(self, row: models.Env, live: bool | None = None) -> str:
        """``live`` (in a sandbox), ``evicted`` (state in the database only) or ``closed``;
        ``live`` None: whether the env is in a sandbox is asked of the live envs."""
        if row.closed or aware(row.expires_at) <= utcnow():
            return "closed"
        return "live" if (row.id in self.live if live is None else live) else "evicted"

    def _view(self, row: models.Env, environment: models.Environment | None, episode: models.Episode | None,
              with_tools: bool, live: bool | None = None) -> dict[str, Any]:
        """What ``EnvPublic`` shows of ``row`` beyond its columns: status, tools (with the
        episode's chat action), the current episode (status, observation, task, reward,
        options) and the environment's introduction."""
        config = EpisodeConfig.from_stored(episode.config if episode is not None else None)
        view: dict[str, Any] = {"status": self.status(row, live), "episode_config": config.public()}
        if environment is not None:
            if config.envscaler:  # EnvScaler's reset(): its introduction, the record's tools as they are
                view["introduction"] = envscaler.introduction_text(environment.introduction, environment.rules)
            else:
                view["introduction"] = introduction_text(environment.introduction, environment.rules,
                                                         environment.description)
            view["argument_checking"] = row.argument_checking or environment.argument_checking
            if with_tools:
                tools = agent_tools(environment)
                view["tools"] = list(tools) if config.envscaler else episode_tools(tools, config)
        if episode is not None:
            failure = stored_failure(episode)
            view.update(episode_status=episode.status, observation=episode.observation, task=episode.task,
                        reward=episode.reward, failure=failure, mask=masked(failure))
        return view
