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

:class:`EpisodeService` decides a new episode's options and runs its simulated user.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sandpit.client.llm import ModelClient, ModelError, ModelSettings, Usage

from ..errors import InvalidRequest, ServiceUnavailable
from ..schemas.envs import EpisodeOptions
from ..services.model_endpoints import SecretUnavailable, endpoint_key, resolve
from ..services.tenants import TenantService
from ..settings import ApiSettings

TASK_FINISHED = "Task finished"
"""EnvScaler's observation for the termination action."""
STOP_TOKEN = "###STOP###"  # noqa: S105 - a marker, not a password
"""What the simulated user says when the task is done (EnvScaler's user agent)."""
CHAT_ACTION = "chat_with_user"
USER_FIRST_PROMPT = "[Agent] Hi! How can I help you today?"
"""The agent's opening line shown to the simulated user (EnvScaler's user agent opens
the conversation this way)."""
USER_PARSE_ATTEMPTS = 3
"""Times the simulated user is asked again when its answer lacks the reply section."""
MAX_USER_MESSAGES = 400
"""Most messages kept in a conversational episode's user transcript."""


@dataclass(frozen=True)
class UserModel:
    """Where the simulated user's model is (no secret here: the key travels separately)."""

    model: str
    base_url: str
    temperature: float | None = None
    request_timeout_s: float = 60.0
    key_source: str = "none"
    """``request`` (given with the episode, stored encrypted), ``tenant`` (the tenant's
    stored key; only ever sent to the tenant's own endpoint) or ``none``."""


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


# -- the simulated user (conversational episodes) -------------------------------------------
USER_SYSTEM_PROMPT = """You play a person who wants an AI assistant to get something done for you.

What you want done:
{task}

How to behave:
- Speak like a real user in a chat: short, natural messages. Never paste the whole goal at once; \
reveal what the assistant needs step by step, when it asks or when it is the natural next thing.
- Stay within the goal above. Do not invent requirements, names, numbers or other facts that \
are not in it, and keep names, identifiers and key words exactly as written there.
- If the assistant offers choices, accept only those that fit the goal; otherwise restate what \
you need.
- When everything in the goal has been done, answer with exactly {stop} and nothing else.

Answer in this format every time:
# Thought:
<your private reasoning; the assistant never sees it>
# Reply:
<the message the assistant sees>"""
_REPLY = re.compile(r"#\s*Thought:\s*(.*?)\s*#\s*Reply:\s*(.*)", re.DOTALL)


def parse_user_reply(text: str) -> str | None:
    """The visible part of the simulated user's answer: :data:`STOP_TOKEN` when it holds
    one, the text after ``# Reply:``, or None when the format is not followed."""
    if STOP_TOKEN in text:
        return STOP_TOKEN
    match = _REPLY.search(text)
    if match is None:
        return None
    reply = match.group(2).strip()
    return reply or None


class UserSimulator:
    """EnvScaler's user agent over an OpenAI-compatible endpoint (``openai`` client with
    retries, :class:`sandpit.client.llm.ModelClient`). ``messages`` is the whole chat as the user
    model sees it (system; ``user`` = the agent's words, ``assistant`` = the user's); the
    caller stores it with the episode so the conversation survives a restart.

    Raises :class:`sandpit.client.llm.ModelError` (endpoint unavailable after retries, or refused)."""

    def __init__(self, model: UserModel, api_key: str | None, messages: list[dict[str, Any]] | None = None) -> None:
        self.model = model
        self.api_key = api_key
        self.messages: list[dict[str, Any]] = list(messages or [])
        self.usage = Usage()

    def _client(self) -> ModelClient:
        return ModelClient(ModelSettings(base_url=self.model.base_url, model=self.model.model,
                                         temperature=self.model.temperature,
                                         request_timeout_s=self.model.request_timeout_s, retries=3,
                                         retry_initial_s=0.5, retry_max_s=10.0), self.api_key)

    def _turn(self) -> str:
        client = self._client()
        try:
            answer = ""
            for _ in range(USER_PARSE_ATTEMPTS):
                answer = client.chat(self.messages, [], self.usage).text
                reply = parse_user_reply(answer)
                if reply is not None:
                    self.messages.append({"role": "assistant", "content": answer})
                    return reply
            self.messages.append({"role": "assistant", "content": answer})
            return answer.strip()  # the format was never followed: the whole answer is the reply
        finally:
            client.close()

    def start(self, task: str) -> str:
        """The user's first message for ``task`` (EnvScaler ``get_init_reply``)."""
        self.messages = [{"role": "system", "content": USER_SYSTEM_PROMPT.format(task=task, stop=STOP_TOKEN)},
                         {"role": "user", "content": USER_FIRST_PROMPT}]
        return self._turn()

    def reply(self, agent_message: str) -> str:
        """The user's answer to the agent's ``chat_with_user`` content (EnvScaler ``user_step``)."""
        self.messages.append({"role": "user", "content": f"[Agent] {agent_message}"})
        if len(self.messages) > MAX_USER_MESSAGES:
            raise ModelError("model_error", f"the conversation is over {MAX_USER_MESSAGES} messages")
        return self._turn()


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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status != "running"


class EpisodeService:
    """What starting an episode and talking to its simulated user need: the tenant's
    model endpoints and keys (:mod:`.model_endpoints`)."""

    def __init__(self, settings: ApiSettings, tenants: TenantService) -> None:
        self.settings = settings
        self.tenants = tenants

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
