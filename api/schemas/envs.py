"""``/v1/envs``: create (``EnvCreate`` with ``EpisodeOptions``) -> ``EnvPublic`` /
``EnvsPublic``; a step (``StepRequest``) -> ``StepResult``; ``StateView``, ``Trajectory``,
``EpisodesPublic``; reset, restore and fork requests."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from .common import NAME_PATTERN, ArgumentChecking, BaseURL, Failure, Status, Timestamp, _Request
from .profile_limits import profile_value
from .scenarios import CheckOutcome, EpisodeProfile

EpisodeStatus = Literal["running", "terminated", "truncated"]
Seed = Annotated[int, Field(ge=0, le=2**64 - 1, strict=True)]
"""A ``random.seed`` value for the session (0 to 2**64-1)."""


class ProfileRequest(_Request):
    """Lowering overrides of the resource profile (raising is refused with 422)."""

    memory_mib: Annotated[int | None, profile_value("memory_mib")] = None
    cpus: Annotated[float | None, profile_value("cpus")] = None
    call_timeout_s: Annotated[float | None, profile_value("call_timeout_s")] = None

class UserSimulator(_Request):
    """The simulated user of a conversational episode: an OpenAI-compatible chat model
    (EnvScaler's user agent). Without ``base_url``, the tenant's default endpoint (set by
    the operator) is used, with the tenant's stored key; a ``base_url`` given here must be
    one of the operator's allowed model endpoints (``SANDPIT_MODEL_URL_ALLOW``) when that
    list is set."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    base_url: BaseURL | None = None
    api_key: SecretStr | None = None
    """Stored encrypted with the episode (so it survives a restart); never returned."""
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    request_timeout_s: Annotated[float, Field(gt=0, le=600)] = 60.0
    """Seconds per model request; transient failures are retried (429, 5xx, timeouts)."""

class EpisodeOptions(_Request):
    """How an episode runs and ends (EnvScaler's RL environments). An env made from a
    scenario is an episode of it: the reset/create response gives the task, the tools and
    the environment introduction; each step returns ``reward``, ``terminated`` and
    ``truncated``; at the end the scenario's checks give the reward."""

    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"oneOf": [  # _user_for_conversation
            {"properties": {"mode": {"const": "non_conversational"}}},
            {"properties": {"mode": {"const": "conversational"}, "user": {"type": "object"}},
             "required": ["mode", "user"]}]},
        {"oneOf": [  # EpisodeConfig.from_options: what the envscaler profile fixes, when the options name it
            {"properties": {"profile": {"enum": ["sandpit", None]}}},
            {"properties": {"profile": {"const": "envscaler"}, "on_tool_error": {"const": "terminate"},
                            "termination_action": {"const": "chat_with_user"}}, "required": ["profile"]}]},
    ]})

    profile: EpisodeProfile | None = None
    """The episode rulebook: ``sandpit`` (Sandpit's: calls are checked against the
    environment's public methods, a raising tool is an ``Error: Type: message``
    observation and the episode goes on) or ``envscaler`` (EnvScaler's RL environment byte
    for byte: its introduction, observation texts and kinds, parse messages, ``hasattr``
    validity, a raising tool ends the episode with reward 0.0 and a traceback; the
    profile table in docs/envscaler.md). Default: the scenario's ``episode_profile``, else
    ``sandpit``. Under ``envscaler`` the fields below that the profile fixes take its
    values when omitted (``on_tool_error: terminate``, ``termination_action:
    chat_with_user``, ``score_truncated: false``, ``max_steps: null``) and contradicting
    them is a 422."""
    mode: Literal["non_conversational", "conversational"] = "non_conversational"
    """``non_conversational``: the task is the first observation and calling
    ``termination_action`` ends the episode (EnvScaler ``EnvScalerNonConvRLEnv``).
    ``conversational``: a simulated user (``user``) gets the task, its first message is
    the first observation, ``chat_with_user(content)`` talks to it, and the episode ends
    when it says the task is done (``###STOP###``; EnvScaler ``EnvScalerConvRLEnv``)."""
    max_steps: Annotated[int | None, Field(ge=1, le=100_000)] = 30
    """Steps after which the episode is truncated (every recorded step counts, rejected
    ones included); null: no limit."""
    termination_action: Annotated[str, Field(min_length=1, max_length=64)] = "chat_with_user"
    """Non-conversational: the action that ends the episode (EnvScaler: ``chat_with_user``;
    its ``content`` argument is required). Offered to the agent as a tool."""
    on_tool_error: Literal["continue", "terminate"] = "continue"
    """``continue``: a tool that raises gives an ``Error: ...`` observation and the episode
    goes on (Sandpit's default). ``terminate``: it ends the episode with reward 0.0
    (EnvScaler's RL environment does this)."""
    score_truncated: bool = True
    """Run the checks when the episode is truncated by ``max_steps`` too (false: reward 0.0,
    as ROLL's trajectory manager leaves it)."""
    user: UserSimulator | None = None
    """Required for ``conversational`` episodes."""

    @model_validator(mode="after")
    def _user_for_conversation(self) -> EpisodeOptions:
        if self.mode == "conversational" and self.user is None:
            raise ValueError("a conversational episode needs `user` (the simulated user's model)")
        return self

class EnvCreate(_Request):
    """Create an env from a registered environment, from inline code, or from a scenario
    (an episode of it)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [  # _one_source
        {"properties": {"environment_id": {"type": "string"}, "source_code": {"type": "null"},
                        "scenario_id": {"type": "null"}, "class_name": {"type": "null"}},
         "required": ["environment_id"]},
        {"properties": {"source_code": {"type": "string"}, "class_name": {"type": "string"},
                        "environment_id": {"type": "null"}, "scenario_id": {"type": "null"}},
         "required": ["source_code", "class_name"]},
        {"properties": {"scenario_id": {"type": "string"}, "environment_id": {"type": "null"},
                        "source_code": {"type": "null"}},
         "required": ["scenario_id"]},
    ]})

    environment_id: str | None = None
    source_code: Annotated[str | None, Field(min_length=1)] = None
    class_name: Annotated[str | None, Field(pattern=NAME_PATTERN)] = None
    scenario_id: str | None = None
    """Create from a scenario: its environment, and its ``init_config`` unless one is given."""
    init_config: dict[str, Any] | None = None
    """EnvScaler ``init_config``: ``cls(init_config)``, else ``cls()`` + setattr per key."""
    profile: ProfileRequest | None = None
    episode: EpisodeOptions | None = None
    """How episodes run and end; defaults apply when omitted (30 steps, ``chat_with_user``)."""
    argument_checking: ArgumentChecking | None = None
    """Override of the environment's ``argument_checking`` for this env."""
    seed: Seed | None = None
    """Seeds the session's ``random`` before the environment's constructor runs
    (EnvScaler's ``reset(seed=...)`` calls ``random.seed(seed)`` first); null: not seeded."""

    @model_validator(mode="after")
    def _one_source(self) -> EnvCreate:
        given = [self.environment_id is not None, self.source_code is not None, self.scenario_id is not None]
        if sum(given) != 1:
            raise ValueError("give exactly one of environment_id, scenario_id or source_code (+ class_name)")
        if self.source_code is not None and self.class_name is None:
            raise ValueError("class_name is required with source_code")
        if self.environment_id is not None and self.class_name is not None:
            raise ValueError("class_name is only for inline source_code")
        return self

ConstructionReason = Literal[
    "restored", "templates_off", "seeded", "no_config", "source_unsuitable", "import_effects", "nondeterministic",
    "module_state", "construction_failed", "no_verdict", "leaves_process", "template_failed", "first_open",
    "building", "no_room", "other"]


class EnvConstruction(BaseModel):
    """How the env's instance was made when it was created (docs/executor.md, "Repeated
    configs"): ``template``, forked copy-on-write from a process of its sandbox that had
    constructed it from the same environment and exact ``init_config`` (no source executed,
    no construction, no state encoded: the fast path), or ``constructed``, the source
    executed and the constructor called for this env, with ``reason``:

    ``nondeterministic`` (two constructions from the config differ: the clock, random
    numbers, ids), ``module_state`` (construction changes module-level state: instance
    counters, registries), ``source_unsuitable`` (the source breaks a template rule:
    imports outside the pure modules, import-time calls, ``open``/``exec``/``global``...),
    ``import_effects`` (the module left threads or descriptors, or raised), ``leaves_process``,
    ``construction_failed``, ``no_verdict`` (the check construction died or ran out of
    time), ``template_failed``: refused or failed, the env's later creates are constructed
    too; ``first_open`` (the config's first create in this sandbox), ``building`` (its
    template is being built: the next create may take it), ``no_room`` (no room for
    another config template in the sandbox): not yet; ``seeded`` (a ``seed`` was given),
    ``no_config`` (empty or not exact-JSON config), ``templates_off`` (one env per sandbox:
    ``SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX=1``), ``restored``: the fast path does not
    apply; ``other``: a reason this server does not know."""

    model_config = ConfigDict(extra="forbid")

    path: Literal["template", "constructed"]
    reason: ConstructionReason | None = None
    """Why the instance was constructed (None for ``template``)."""
    detail: str | None = None
    """The sandbox's words behind ``reason`` (at most 200 characters), e.g. ``unsuitable:
    two constructions differ``; may quote what the environment's own code reported."""


class EnvPublic(BaseModel):
    """An env and its current episode. For a fresh episode (create, reset) this is
    EnvScaler's ``reset()`` result: ``observation`` (the task, or the simulated user's
    first message), ``tools`` and ``introduction``."""

    id: str
    environment_id: str
    episode: int
    """Starts at 1; each reset begins the next episode."""
    step: int
    """Last acknowledged step of the episode (0 = just instantiated)."""
    status: Literal["live", "evicted", "closed"]
    """live: in a sandbox now; evicted: state in the database, restored on next use."""
    init_config: dict[str, Any]
    created_at: Timestamp
    expires_at: Timestamp
    forked_from: str | None = None
    forked_at_step: int | None = None
    scenario_id: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """OpenAI function-calling schemas the agent may call: the environment's tools plus the
    termination/chat action (``chat_with_user``) when the class has no tool of that name."""
    episode_status: EpisodeStatus = "running"
    observation: str = ""
    """The episode's initial observation: the scenario's task (non-conversational), the
    simulated user's first message (conversational), or "" without a scenario."""
    task: str | None = None
    introduction: str | None = None
    """EnvScaler's environment introduction: the environment's introduction and its rules."""
    reward: float | None = None
    """The episode's reward once it has ended (None while running)."""
    failure: Failure = "none"
    """The current episode's failure so far (docs/failures.md): the worst of its steps'
    and, once it ended, its checks'."""
    mask: bool = False
    """True when the episode's reward does not reflect the policy (``failure`` is
    ``infrastructure`` or ``verifier``): drop it from the gradient."""
    episode_config: dict[str, Any] = Field(default_factory=dict)
    """The episode's options (:class:`EpisodeOptions`, without the user model's key)."""
    argument_checking: ArgumentChecking = "off"
    construction: EnvConstruction | None = None
    """How the instance was made: in the response of ``POST /v1/envs`` only (None elsewhere,
    and when the executor does not say)."""

class EnvsPublic(BaseModel):
    data: list[EnvPublic]
    count: int

class FunctionCall(_Request):
    name: Annotated[str, Field(max_length=1024)]
    """The tool's name (a name that is no tool is recorded as a ``rejected`` step)."""
    arguments: Annotated[Any, Field(json_schema_extra={
        "type": ["string", "object", "array", "number", "integer", "boolean", "null"],
        "description": "A JSON string (as chat-completions emits it) or an object; anything that does "
                       "not give an object is recorded as a rejected step."})] = "{}"
    """JSON string (as chat-completions emits it) or an object; one that does not parse to an
    object is recorded as a ``rejected`` step."""

class StepRequest(BaseModel):
    """One action, in one of three forms: ``{"name", "arguments"}``; an OpenAI tool call
    ``{"type": "function", "function": {"name", "arguments": "<json string>"}}`` (``id`` is
    accepted and ignored); or ``{"text": "<raw model output>"}`` (``<think>``/``<tool_call>``
    prompt format; plain text is ``chat_with_user``). A malformed action (unknown tool,
    private or dunder name, arguments that are not an object or not valid JSON, output that
    does not parse) is recorded as a ``rejected`` step with EnvScaler's observation."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [  # _one_form
        {"properties": {"name": {"type": "string"}, "function": {"type": "null"}, "text": {"type": "null"}},
         "required": ["name"]},
        {"properties": {"function": {"type": "object"}, "name": {"type": "null"}, "text": {"type": "null"},
                        "arguments": {"type": "null"}},
         "required": ["function"]},
        {"properties": {"text": {"type": "string"}, "name": {"type": "null"}, "function": {"type": "null"},
                        "arguments": {"type": "null"}},
         "required": ["text"]},
    ]})

    name: Annotated[str | None, Field(max_length=1024)] = None
    arguments: Annotated[Any, Field(json_schema_extra={
        "type": ["object", "array", "string", "number", "integer", "boolean", "null"],
        "description": "Keyword arguments of the tool: an object. Any other JSON value is accepted "
                       "and recorded as a rejected step (EnvScaler: Error: Failed to parse response to action)."})] = None
    """Keyword arguments of the tool (an object; any other JSON value is recorded as a
    ``rejected`` step, never refused)."""
    type: Literal["function"] | None = None
    function: FunctionCall | None = None
    text: Annotated[str | None, Field(max_length=4 * 1024 * 1024)] = None
    id: Annotated[str | None, Field(max_length=256)] = None

    @model_validator(mode="after")
    def _one_form(self) -> StepRequest:
        forms = [self.name is not None, self.function is not None, self.text is not None]
        if sum(forms) != 1:
            raise ValueError("give exactly one of name (+ arguments), function (an OpenAI tool call) or text")
        if self.arguments is not None and self.name is None:
            raise ValueError("arguments belong with name")
        return self

class StepResult(BaseModel):
    """EnvScaler ``step()``: ``observation``, ``reward``, ``terminated``, ``truncated``,
    plus the step's record."""

    env_id: str
    episode: int
    step: int
    action: dict[str, Any] | None = None
    """The action as parsed and recorded: ``{"name", "arguments"}``."""
    observation: str
    status: Status
    observation_role: Literal["tool", "user"] = "tool"
    """EnvScaler's observation type: ``tool`` for a tool's result, ``user`` for the
    simulated user's reply, errors of the action, and "Task finished"."""
    reward: float = 0.0
    """0.0 until the step that ends the episode; then the episode's reward (the mean of the
    scenario's checks' results, rounded to 4 places; EnvScaler ``calculate_reward``)."""
    terminated: bool = False
    """The episode ended by the termination action, the simulated user, or a tool error
    with ``on_tool_error: terminate``."""
    truncated: bool = False
    """The episode reached ``max_steps``."""
    duration_ms: float
    """Wall-clock time of the tool call in the sandbox round trip, milliseconds."""
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    """The tool's traceback when it raised (last frames, at most ~4 KiB)."""
    error: str | None = None
    """Why a ``rejected`` action was refused (the observation is EnvScaler's generic one)."""
    argument_findings: list[str] | None = None
    """``argument_checking: warn|strict``: how the arguments do not fit the tool's schema."""
    checks: list[CheckOutcome] | None = None
    """At the end of an episode with a scenario: each check's outcome."""
    recovered: bool = False
    """The env was re-opened in a (new) sandbox from its last committed step before this
    call (its sandbox was lost or evicted, the API restarted, or another replica had it)."""
    failure: Failure = "none"
    """Who this step's outcome is to blame on (docs/failures.md): ``none``; ``agent``
    (a rejected action); ``environment`` (the tool raised, looped past its time limit, ran
    out of memory, its process died); ``infrastructure`` (the sandbox was lost, the call
    was starved of CPU, the env was re-opened after a loss); decided by the platform from
    the status and its own measurements, never from what the environment code returns."""
    mask: bool = False
    """Advice for trainers: True when this step's outcome does not reflect the policy
    (``failure`` is ``infrastructure``)."""
    episode_failure: Failure = "none"
    """The episode's failure so far, this step included (the worst of its steps' and, on
    the step that ends it, its checks': a check that errored or timed out is ``verifier``)."""
    episode_mask: bool = False
    """True when the episode's reward does not reflect the policy (``episode_failure`` is
    ``infrastructure`` or ``verifier``): drop the episode from the gradient."""
    state_diff: dict[str, Any] | None = None
    """With ``?include=state_diff``: EnvScaler ``get_state_diff`` of the step, ``{key:
    {"added": v} | {"removed": v} | {"changed": {"old", "new"}} | <nested diff>}``."""
    state: dict[str, Any] | None = None
    """With ``?include=state``: the state after the step (the same view as ``GET /state``)."""

class ResetRequest(_Request):
    """Start the next episode (EnvScaler ``reset()``)."""

    init_config: dict[str, Any] | None = None
    """New ``init_config``; the scenario's (or else the env's current one) when omitted."""
    scenario_id: str | None = None
    """Bind the new episode to this scenario (its environment, task, ``init_config`` and
    checks); the env's current scenario when omitted."""
    episode: EpisodeOptions | None = None
    """New episode options; the current episode's when omitted."""
    seed: Seed | None = None
    """Seeds the session's ``random`` before the constructor runs (EnvScaler's
    ``reset(seed=...)``); null: not seeded."""

class RestoreRequest(_Request):
    step: Annotated[int, Field(ge=0)]

class ForkRequest(_Request):
    step: Annotated[int | None, Field(ge=0)] = None
    """Fork point in the current episode; the head when omitted."""
    count: Annotated[int, Field(ge=1)] = 1

ATTEMPT_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What an attempt token may be: URL-safe base64 characters, at most 64."""


class AttemptPublic(BaseModel):
    """A new attempt of an env (``POST /v1/envs/{id}/attempts``): calls that carry
    ``token`` in ``Sandpit-Attempt`` run; calls carrying an older attempt's token are
    409 ``stale_attempt``; calls without one are not fenced."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env_id: str
    attempt: Annotated[int, Field(ge=1)]
    """The attempt's number: 1 for the env's first resume, then 2, 3, ..."""
    token: Annotated[str, Field(min_length=1, max_length=64, pattern=ATTEMPT_PATTERN)]
    """The attempt's token: send it as the ``Sandpit-Attempt`` header (32 URL-safe characters)."""

class StateView(BaseModel):
    """EnvScaler's state (``vars(instance)`` without dunder keys) as JSON: JSON-native
    values exactly; sets, tuples, dates, bytes, objects... as explicit ``$`` tags
    (``{"$set": [...]}``, ``{"$date": "2024-05-01"}``, ``{"$object": {"type", "attrs"}}``;
    see docs/api.md, "State"); anything cut says so with a ``$truncated`` tag."""

    env_id: str
    episode: int
    step: int
    state: dict[str, Any]
    truncated: bool = False
    """True when a rendering in ``state`` was cut (a ``$truncated`` tag is in it)."""

class TrajectoryStep(BaseModel):
    step: int
    action: dict[str, Any] | None
    observation: str
    status: Status
    duration_ms: float
    reward: float | None = None
    done: EpisodeStatus | None = None
    """``terminated`` or ``truncated`` on the step that ended the episode."""
    info: dict[str, Any] | None = None
    """``observation_role``, ``error``, ``argument_findings``, ``traceback``, ``failure``,
    and for a timed-out call ``cpu_ms`` / ``wait_ms`` (its process's CPU time and run-queue
    wait, milliseconds: what decides whether the platform starved it), ``sandbox_lost``,
    when present."""
    created_at: Timestamp
    failure: Failure = "none"
    """The step's failure (:attr:`StepResult.failure`); for steps recorded before failures
    were, derived from ``status`` alone."""
    mask: bool = False
    """:attr:`StepResult.mask`."""

class EpisodePublic(BaseModel):
    """One episode of an env: its scenario, options, outcome and size."""

    episode: int
    environment_id: str
    scenario_id: str | None
    status: EpisodeStatus
    steps: int
    """Steps recorded in the episode (its head)."""
    observation: str
    task: str | None
    reward: float | None
    checks: list[dict[str, Any]] | None = None
    config: dict[str, Any]
    started_at: Timestamp
    ended_at: Timestamp | None = None
    failure: Failure = "none"
    """The episode's failure (:attr:`EnvPublic.failure`)."""
    mask: bool = False
    """:attr:`EnvPublic.mask`."""

class EpisodesPublic(BaseModel):
    data: list[EpisodePublic]
    count: int

class Trajectory(BaseModel):
    """Steps of one episode (1..head), a page at a time (``limit``/``offset``)."""

    env_id: str
    episode: int
    steps: list[TrajectoryStep]
    count: int = 0
    """Steps in the episode (all pages)."""
    status: EpisodeStatus = "running"
    reward: float | None = None
    failure: Failure = "none"
    """The episode's failure (:attr:`EnvPublic.failure`)."""
    mask: bool = False
    """:attr:`EnvPublic.mask`."""
