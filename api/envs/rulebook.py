"""Episodes: EnvScaler's RL episode semantics, computed by the server.

An env's history is a sequence of episodes (``reset()`` .. end); each has a
:class:`EpisodeConfig` and, when made from a scenario, a task and checks. What follows is
EnvScaler's ``EnvScalerBaseEnv`` (``rl/roll/pipeline/agentic/env/envscaler_env``) and its two
subclasses, restated for a server that runs the tools in sandboxes:

* ``reset()``: the initial observation is the scenario's task (non-conversational) or the
  simulated user's first message (conversational); the agent also gets the tools and the
  environment introduction (:func:`introduction_text`).
* ``step(action)``: a malformed action is recorded with ``Error: Failed to parse response
  to action`` / ``Error: Invalid action`` and the episode goes on; the termination action
  (``chat_with_user`` by default) ends a non-conversational episode with the observation
  ``Task finished``; in a conversational episode ``chat_with_user(content)`` goes to the
  simulated user, whose reply is the observation, and the episode ends when the reply
  holds ``###STOP###``; any other action is a tool call whose observation is
  ``str(result)``. A tool that raises gives ``Error: ...`` and the episode goes on
  (``on_tool_error: terminate`` ends it with reward 0.0, as EnvScaler's RL env does).
* the episode is truncated after ``max_steps`` recorded steps (ROLL's env manager).
* at the end, the scenario's checks run on the episode's initial and final state and the
  reward is EnvScaler's ``calculate_reward``: the mean of the checks' boolean results, a
  check that errors or returns a non-bool counting as not passed, rounded to 4 places
  (:func:`sandpit.api.envs.rewards.episode_reward`).

:class:`EpisodeService` decides what a new episode runs (environment, scenario,
``init_config``, options: :meth:`EpisodeService.start`) and runs its simulated user
(:mod:`.users`); :class:`EpisodeRun` is an episode's live bookkeeping.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sandpit.client.llm import ModelError
from sqlalchemy.orm import Session as DbSession

from ..db import models
from ..db.configs import CanonicalConfig, canonical
from ..db.database import Database
from ..errors import InvalidRequest, ServiceUnavailable
from ..schemas.envs import EpisodeOptions
from ..services.common import owned
from ..services.environments import EnvironmentService
from ..services.model_endpoints import SecretUnavailable, endpoint_key, resolve
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .actions import ToolSets
from .configs import EnvConfigs
from .failures import Failure, episode_failure, worst
from .users import UserModel, UserSimulator

TASK_FINISHED = "Task finished"
"""EnvScaler's observation for the termination action."""
CHAT_ACTION = "chat_with_user"


@dataclass(frozen=True)
class EpisodeConfig:
    """Options of one episode (the stored form of :class:`~sandpit.api.schemas.envs.EpisodeOptions`).
    ``termination_action`` None and ``max_steps`` None: an open-ended episode (an env
    made without a scenario and without ``episode`` options)."""

    mode: str = "non_conversational"
    max_steps: int | None = None
    termination_action: str | None = None
    on_tool_error: str = "continue"
    score_truncated: bool = True
    user: UserModel | None = None
    profile: str = "sandpit"
    """The episode rulebook: ``sandpit`` or ``envscaler`` (:mod:`.envscaler`)."""

    @property
    def envscaler(self) -> bool:
        return self.profile == "envscaler"

    @property
    def conversational(self) -> bool:
        return self.mode == "conversational"

    def public(self) -> dict[str, Any]:
        """As stored and shown (JSON; no key)."""
        out = asdict(self)
        if self.user is None:
            out.pop("user")
        return out

    @classmethod
    def from_stored(cls, data: dict[str, Any] | None) -> EpisodeConfig:
        """From :meth:`public` output (``{}`` or None: an open-ended episode)."""
        data = dict(data or {})
        user = data.pop("user", None)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known, user=UserModel(**user) if isinstance(user, dict) else None)

    @classmethod
    def from_options(cls, options: EpisodeOptions, user: UserModel | None, profile: str = "sandpit") -> EpisodeConfig:
        """The config of ``options`` under ``profile``. The ``envscaler`` profile fixes
        ``on_tool_error`` (``terminate``) and ``termination_action`` (``chat_with_user``)
        and, when the options leave them out, has no step limit and scores no truncated
        episode (EnvScaler's environment has neither: ROLL's env manager truncates with
        reward 0.0). Raises InvalidRequest naming the option that contradicts the profile."""
        if profile != "envscaler":
            return cls(mode=options.mode, max_steps=options.max_steps, termination_action=options.termination_action,
                       on_tool_error=options.on_tool_error, score_truncated=options.score_truncated, user=user)
        given = options.model_fields_set
        if "on_tool_error" in given and options.on_tool_error != "terminate":
            raise InvalidRequest("the envscaler profile ends the episode on a tool error (on_tool_error: terminate)",
                                 field="episode.on_tool_error")
        if "termination_action" in given and options.termination_action != CHAT_ACTION:
            raise InvalidRequest(f"the envscaler profile ends the episode with {CHAT_ACTION}",
                                 field="episode.termination_action")
        return cls(mode=options.mode, max_steps=options.max_steps if "max_steps" in given else None,
                   termination_action=CHAT_ACTION, on_tool_error="terminate",
                   score_truncated=options.score_truncated if "score_truncated" in given else False, user=user,
                   profile="envscaler")


OPEN_ENDED = EpisodeConfig()


def introduction_text(introduction: str | None, rules: list[str] | None, description: str | None) -> str | None:
    """The environment introduction an agent gets at ``reset()`` (EnvScaler builds it from
    ``environment_introduction`` and ``constraints_rules``): the introduction (or, without
    one, the description), then the rules as a list. None when there is nothing to say."""
    intro = (introduction or description or "").strip()
    lines = [f"- {rule.strip()}" for rule in rules or [] if rule.strip()]
    if not intro and not lines:
        return None
    parts = ["# Environment", "", intro or "(no introduction)"]
    if lines:
        parts += ["", "## Rules", *lines]
    return "\n".join(parts)


def chat_tool(conversational: bool) -> dict[str, Any]:
    """The OpenAI schema of ``chat_with_user`` as offered to the agent."""
    description = ("Send a message to the user and get their reply. Use it to ask for information or to "
                   "report what you did." if conversational else
                   "Finish the task: report the outcome to the user. Ends the episode.")
    return {"type": "function", "function": {
        "name": CHAT_ACTION, "description": description,
        "parameters": {"type": "object", "properties": {"content": {"type": "string", "description":
                       "What to tell the user."}}, "required": ["content"], "additionalProperties": False}}}


def episode_tools(tools: list[dict[str, Any]], config: EpisodeConfig) -> list[dict[str, Any]]:
    """The tools offered to the agent: the environment's, plus ``chat_with_user`` when the
    episode uses it (termination action, or conversational) and the class defines no tool
    of that name."""
    names = {t.get("function", {}).get("name") for t in tools}
    wants_chat = config.conversational or config.termination_action == CHAT_ACTION
    if wants_chat and CHAT_ACTION not in names:
        return [*tools, chat_tool(config.conversational)]
    return list(tools)


@dataclass
class EpisodeRun:
    """The live bookkeeping of an env's current episode (mirrors its ``episodes`` row)."""

    config: EpisodeConfig = OPEN_ENDED
    scenario_id: str | None = None
    status: str = "running"
    reward: float | None = None
    observation: str = ""
    task: str | None = None
    user_messages: list[dict[str, Any]] | None = None
    user_key_enc: bytes | None = None
    initial_root: str | None = None
    """State root of the episode's step 0 (the checks' initial state)."""
    failure: Failure = "none"
    """The episode's failure so far (:func:`stored_failure` of its row)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status != "running"

    @staticmethod
    def of(db: DbSession, row: models.Env) -> EpisodeRun:
        """The bookkeeping of ``row``'s current episode, read from its ``episodes`` row
        (an open-ended running episode when there is none)."""
        first = db.get(models.Step, (row.id, row.episode, 0))
        return EpisodeRun.of_rows(row, db.get(models.Episode, (row.id, row.episode)),
                                  first.state_root if first is not None else None)

    @staticmethod
    def of_rows(row: models.Env, episode: models.Episode | None, initial_root: str | None) -> EpisodeRun:
        """:meth:`of` from rows already read: ``row``'s current ``episode`` row (None: an
        open-ended running episode) and the state root of its step 0 (None: no step 0)."""
        if episode is None:
            return EpisodeRun(scenario_id=row.scenario_id, initial_root=initial_root)
        return EpisodeRun(config=EpisodeConfig.from_stored(episode.config), scenario_id=episode.scenario_id,
                          status=episode.status, reward=episode.reward, observation=episode.observation,
                          task=episode.task, user_messages=episode.user_messages, user_key_enc=episode.user_key_enc,
                          initial_root=initial_root, failure=stored_failure(episode))


@dataclass
class EpisodeStart:
    """What a new episode (create or reset) runs: its environment, scenario, ``init_config``
    and options (:meth:`EpisodeService.start`)."""

    environment: models.Environment
    scenario: models.Scenario | None
    init_config: CanonicalConfig
    """The config with its canonical bytes and hash (stored once: :mod:`sandpit.api.db.configs`)."""
    config: EpisodeConfig
    user_key_enc: bytes | None = None


def step_zero(env_id: str, episode: int, root: str, now: datetime) -> models.Step:
    """The row of an episode's step 0 (the state right after instantiation, ``root``)."""
    return models.Step(env_id=env_id, episode=episode, step=0, action=None, observation="", status="ok",
                       duration_ms=0.0, state_root=root, created_at=now)


def stored_failure(episode: models.Episode) -> Failure:
    """An ``episodes`` row's failure: its ``failure`` column, or for a row written before
    failures were recorded (NULL) the one its checks give (:func:`~.failures.episode_failure`
    with no steps: ``verifier`` when a check did not run cleanly, else ``none``)."""
    if episode.failure is not None:
        return worst([episode.failure])
    checks = episode.checks if isinstance(episode.checks, list) else []
    return episode_failure([], [str(c.get("status", "ok")) for c in checks if isinstance(c, dict)])


def episode_row(env_id: str, episode: int, start: EpisodeStart, run: EpisodeRun, now: datetime) -> models.Episode:
    """The ``episodes`` row of a new episode of ``env_id`` (running; ``run``'s first
    observation, task and user transcript)."""
    return models.Episode(env_id=env_id, episode=episode, environment_id=start.environment.id,
                          scenario_id=run.scenario_id, config=run.config.public(), user_key_enc=run.user_key_enc,
                          status="running", observation=run.observation, task=run.task,
                          user_messages=run.user_messages, started_at=now, failure="none")


class EpisodeService:
    """What starting an episode and talking to its simulated user need: the environments,
    the tenant's scenarios, model endpoints and keys (:mod:`sandpit.api.services.model_endpoints`)."""

    def __init__(self, settings: ApiSettings, db: Database, tenants: TenantService,
                 environments: EnvironmentService, configs: EnvConfigs, toolsets: ToolSets) -> None:
        self.settings = settings
        self.db = db
        self.tenants = tenants
        self.environments = environments
        self.configs = configs
        self.toolsets = toolsets

    def start(self, tenant: str, *, environment_id: str | None, source_code: str | None, class_name: str | None,
              scenario_id: str | None, init_config: CanonicalConfig | None, options: EpisodeOptions | None,
              current: models.Env | None = None, current_run: EpisodeRun | None = None) -> EpisodeStart:
        """Resolve what a new episode runs: the environment (registered, a scenario's, or
        ``source_code`` + ``class_name`` inline), the scenario, ``init_config`` (given >
        the scenario's > the env's ``current`` one > ``{}``) and the options
        (:meth:`config_for`; a reset keeps ``current_run``'s options and user key unless
        new ones are given). The environment's tools are compiled here.

        Raises NotFound (environment, scenario), PayloadTooLarge (``init_config`` over the
        server's cap), InvalidRequest (inline code the static policy refuses, an unusable
        user endpoint, an option the profile fixes)."""
        scenario = None
        config = init_config
        if scenario_id is not None:
            with self.db.read() as db:
                scenario = owned(db, models.Scenario, scenario_id, tenant, "scenario")
            environment_id = scenario.environment_id
            if config is None:
                config = canonical(scenario.init_config)
        if config is None:  # the env's current config, kept (from memory by its hash when there)
            config = self.configs.current(current) if current is not None else canonical({})
        self.configs.check(config)
        if environment_id is not None:
            environment = self.environments.get_environment(tenant, environment_id)
        else:
            assert source_code is not None and class_name is not None
            environment = self.environments.inline_environment(tenant, source_code, class_name)
        self.toolsets.of(environment)
        keep = current_run.config if current_run is not None else None
        episode_config, key_enc = self.config_for(tenant, options, scenario is not None, keep,
                                                  scenario.episode_profile if scenario is not None else None)
        if options is None and current_run is not None:
            key_enc = current_run.user_key_enc
        return EpisodeStart(environment, scenario, config, episode_config, key_enc)

    def config_for(self, tenant: str, options: EpisodeOptions | None, has_scenario: bool,
                   current: EpisodeConfig | None = None,
                   scenario_profile: str | None = None) -> tuple[EpisodeConfig, bytes | None]:
        """The options of a new episode and the simulated user's encrypted key: the
        given ``options``; else the current episode's (reset); else the defaults for a
        scenario (its ``episode_profile``'s: 30 steps and ``chat_with_user`` ends it under
        ``sandpit``); else open-ended. The profile is the options' own, else the
        scenario's (``scenario_profile``), else ``sandpit``. Raises InvalidRequest (the
        user's endpoint, field ``episode.user.base_url``; an option the profile fixes)."""
        if options is None:
            if current is not None:
                return current, None
            if not has_scenario:
                return OPEN_ENDED, None
            options = EpisodeOptions()
        profile = options.profile or scenario_profile or "sandpit"
        user, key_enc = None, None
        if options.user is not None:
            endpoint = resolve(self.tenants, self.settings, tenant, options.user.base_url, options.user.api_key,
                               field="episode.user.base_url")
            user = UserModel(model=options.user.model, base_url=endpoint.base_url,
                             temperature=options.user.temperature, request_timeout_s=options.user.request_timeout_s,
                             key_source=endpoint.key_source)
            key_enc = endpoint.key_enc
        return EpisodeConfig.from_options(options, user, profile), key_enc

    def simulator(self, tenant: str, run: EpisodeRun) -> UserSimulator:
        """The simulated user of ``run``'s episode with its chat so far. Raises
        InvalidRequest (no user), ServiceUnavailable (its stored key cannot be read)."""
        user = run.config.user
        if user is None:
            raise InvalidRequest("this episode has no simulated user", field="episode.user")
        try:
            key = endpoint_key(self.tenants, tenant, user.key_source, run.user_key_enc)
        except SecretUnavailable as exc:
            raise ServiceUnavailable(f"the simulated user's API key cannot be read: {exc}", retry_after=60) from None
        return UserSimulator(user, key, run.user_messages)

    def first_observation(self, tenant: str, task: str | None, run: EpisodeRun) -> None:
        """EnvScaler ``get_initial_observation`` into ``run``: the task, or the simulated
        user's first message (which may take a model call). Raises ServiceUnavailable
        when the user's model cannot be reached."""
        run.task = task
        if run.config.conversational:
            simulator = self.simulator(tenant, run)
            try:
                run.observation = simulator.start(task or "")
            except ModelError as exc:
                raise ServiceUnavailable(f"the simulated user's model failed ({exc.status}): {exc.message}",
                                         retry_after=5) from None
            run.user_messages = simulator.messages
        else:
            run.observation = task or ""
