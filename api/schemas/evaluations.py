"""Evaluations: ``POST /v1/envs/{id}/evaluate`` (``EvaluateRequest`` ->
``EvaluationPublic``) and ``/v1/evaluations`` (batch evaluations: replay and rollout):
``EvaluationCreate`` -> ``EvaluationJobPublic`` (with ``progress`` and, when finished,
``summary``) / ``EvaluationJobsPublic(data, count)``; ``EpisodeResult`` is one line of
``GET /v1/evaluations/{id}/results`` (JSON lines).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .common import BaseURL, Failure, Timestamp, _Request
from .envs import StepRequest
from .scenarios import MAX_CHECKS, CheckObjects, CheckOutcome, CheckSpec

MAX_EPISODES = 10_000
"""Episodes (replays or scenario ids) of one evaluation."""
MAX_STEPS = 200
"""Tool calls of one episode (a replay's list, or a rollout's ``max_steps``)."""
ID = Annotated[str, Field(min_length=1, max_length=64)]
RESULT_INCLUDES = frozenset({"transcript"})
"""What ``GET /v1/evaluations/{id}/results?include=`` may name (comma-separated)."""

Mode = Literal["replay", "rollout"]
JobStatus = Literal["queued", "running", "completed", "cancelled", "failed"]
EpisodeStatus = Literal["pending", "running", "done", "error", "cancelled"]


class EvaluateRequest(_Request):
    """Checks to run; the env's scenario checklist when omitted."""

    checks: list[CheckSpec] | None = Field(default=None, max_length=MAX_CHECKS)
    """At most ``MAX_CHECKS`` (4096), their sources together at most ``max_code_bytes``;
    run in sandbox jobs of 256."""
    check_objects: CheckObjects | None = None
    """How the checks see objects of the environment's classes: ``standins`` (no
    environment code runs where the verdict is computed) or ``environment`` (its module is
    loaded; its code takes part in the verdict). Default: the env's scenario's setting,
    else ``standins``."""

class EvaluationPublic(BaseModel):
    id: str
    env_id: str
    episode: int
    step: int
    reward: float
    """EnvScaler ``calculate_reward``: passed / total rounded to 4 places (0.0 with no checks)."""
    passed: int
    total: int
    results: list[CheckOutcome]
    created_at: Timestamp
    failure: Literal["none", "verifier"] = "none"
    """``verifier`` when a check errored or timed out (its ``status`` is not ``ok``), so the
    reward does not reflect the state (docs/failures.md), else ``none``."""
    mask: bool = False
    """True when ``failure`` is ``verifier``: leave this reward out of training."""


class ReplayEpisode(_Request):
    """One trajectory to score: replayed call by call in a fresh env of the scenario."""

    scenario_id: ID
    tool_calls: list[StepRequest] = Field(default_factory=list, max_length=MAX_STEPS)
    """Tool calls in order, each ``{"name", "arguments"}`` or an OpenAI tool call
    ``{"type": "function", "function": {"name", "arguments": "<json string>"}}``. A call the
    environment's tools refuse (unknown tool, arguments not matching the schema or not a
    JSON object) is recorded as a ``rejected`` step and the replay goes on."""


def check_base_url(value: str) -> str:
    """An ``http(s)://host[:port][/path]`` URL without credentials, query or fragment,
    without its trailing ``/``. Raises ValueError. Request fields are checked against
    :data:`~.common.BASE_URL_PATTERN` first (what the OpenAPI document says), which no
    URL passes that this refuses; this also checks a tenant's stored ``model_base_url``."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("base_url must not carry credentials; give api_key")
    if parts.query or parts.fragment:
        raise ValueError("base_url must not have a query or fragment")
    return value.rstrip("/")


class EvaluationCreate(_Request):
    """Start a batch evaluation.

    * ``mode="replay"``: ``episodes`` (each a scenario id and the tool calls to replay).
    * ``mode="rollout"``: ``scenario_ids`` (repeat an id to sample it several times),
      ``model``, and the endpoint: ``base_url``/``api_key`` or the tenant's defaults.

    Every scenario must exist and belong to the caller (404 naming the index otherwise);
    nothing is created when any is refused. The OpenAPI document states which fields each
    mode needs and refuses as a ``oneOf`` (:meth:`_mode_fields`)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"properties": {"mode": {"const": "replay"}, "episodes": {"type": "array"},
                        **{name: {"type": "null"} for name in ("scenario_ids", "model", "base_url", "api_key")}},
         "required": ["episodes"]},
        {"properties": {"mode": {"const": "rollout"}, "scenario_ids": {"type": "array"},
                        "model": {"type": "string"}, "episodes": {"type": "null"}},
         "required": ["scenario_ids", "model"]},
    ]})

    mode: Mode
    episodes: list[ReplayEpisode] | None = Field(default=None, min_length=1, max_length=MAX_EPISODES)
    """Replay mode only."""
    scenario_ids: list[ID] | None = Field(default=None, min_length=1, max_length=MAX_EPISODES)
    """Rollout mode only."""
    model: Annotated[str | None, Field(min_length=1, max_length=200)] = None
    """Rollout mode: the model name sent to the endpoint."""
    base_url: BaseURL | None = None
    """Rollout mode: OpenAI-compatible endpoint (``http(s)://.../v1``); default the tenant's."""
    api_key: Annotated[SecretStr | None, Field(max_length=4096)] = None
    """Rollout mode: model API key; default the tenant's stored key, which is only used
    when ``base_url`` is omitted or equals the tenant's ``model_base_url`` (else no key is
    sent). Stored encrypted so the job can resume after a restart; never returned,
    logged or audited."""
    max_steps: Annotated[int, Field(ge=1, le=MAX_STEPS)] = 30
    """Rollout mode: tool calls per episode at most (rejected ones count)."""
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    max_tokens: Annotated[int | None, Field(ge=1, le=1_000_000)] = None
    """Rollout mode: ``max_tokens`` of each chat completion."""
    request_timeout_s: Annotated[float, Field(gt=0, le=600)] = 120.0
    """Rollout mode: seconds per model request."""
    retries: Annotated[int, Field(ge=0, le=10)] = 4
    """Rollout mode: retries of a model request on 429, 5xx, timeouts, connection errors."""
    retry_initial_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    """Rollout mode: first backoff (seconds), doubling per retry; a ``Retry-After`` from
    the endpoint wins when longer."""
    retry_max_s: Annotated[float, Field(ge=0, le=600)] = 30.0
    """Rollout mode: longest single backoff (seconds)."""
    concurrency: Annotated[int | None, Field(ge=1)] = None
    """Episodes of this evaluation running at once; default (and at most) the tenant's
    ``max_evaluation_concurrency`` (above it: 429)."""
    keep_envs: bool = False
    """Keep each episode's env (its id is in the results) instead of deleting it."""

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_base_url(value)

    @model_validator(mode="after")
    def _mode_fields(self) -> EvaluationCreate:
        if self.mode == "replay":
            if self.episodes is None:
                raise ValueError("mode 'replay' needs episodes: [{scenario_id, tool_calls}]")
            given = [n for n in ("scenario_ids", "model", "base_url", "api_key") if getattr(self, n) is not None]
            if given:
                raise ValueError(f"mode 'replay' does not take {', '.join(given)}")
        else:
            if self.scenario_ids is None:
                raise ValueError("mode 'rollout' needs scenario_ids")
            if self.model is None:
                raise ValueError("mode 'rollout' needs model")
            if self.episodes is not None:
                raise ValueError("mode 'rollout' does not take episodes (use scenario_ids)")
        return self

    def scenario_list(self) -> list[str]:
        """The scenario id of every episode, in index order."""
        if self.mode == "replay":
            assert self.episodes is not None
            return [e.scenario_id for e in self.episodes]
        assert self.scenario_ids is not None
        return list(self.scenario_ids)


class EvaluationProgress(BaseModel):
    """Episode counts of a job so far; rewards over finished episodes."""

    total: int
    done: int
    """Episodes scored (status ``done``)."""
    errors: int
    """Episodes that ended with an error status (no reward)."""
    running: int
    pending: int
    cancelled: int
    mean_reward: float | None
    """Mean reward over ``done`` + ``errors`` episodes (an errored episode counts 0.0);
    None before any finished."""
    success: int
    """Episodes with reward 1.0."""


class EnvironmentBreakdown(BaseModel):
    """Summary of one environment's episodes."""

    name: str | None = None
    """The environment's registered name (None for unnamed or deleted environments)."""
    episodes: int
    """Finished (scored or errored) episodes."""
    mean_reward: float | None
    success_rate: float | None


class ScenarioBreakdown(BaseModel):
    """Summary of one scenario's episodes in an evaluation, beside the scenario's figures
    over every episode of it (training and evaluations, this one included:
    :mod:`sandpit.api.services.stats`)."""

    episodes: int
    """Finished (scored or errored) episodes of this evaluation."""
    mean_reward: float | None
    success_rate: float | None
    """Share of this evaluation's finished episodes with reward == 1.0."""
    overall_pass_rate: float | None = None
    """The scenario's pass rate over all its finished episodes (None when none finished,
    e.g. every episode of it errored)."""
    overall_finished: int = 0
    """Finished episodes behind ``overall_pass_rate``."""


class EvaluationSummary(BaseModel):
    """Result of a finished job (EnvScaler reward: passed / total checks per episode)."""

    episodes: int
    """Finished (scored or errored) episodes; cancelled ones are not counted."""
    scored: int
    mean_reward: float | None
    """Mean over finished episodes; errored episodes count 0.0."""
    success_rate: float | None
    """Share of finished episodes with reward == 1.0."""
    by_environment: dict[str, EnvironmentBreakdown]
    by_scenario: dict[str, ScenarioBreakdown]
    """Per scenario: this evaluation's figures and the scenario's overall pass rate."""
    errors_by_status: dict[str, int]
    """``error_status`` -> episodes (``model_error``, ``model_unavailable``, ``no_capacity``, ...)."""
    by_failure: dict[str, int] = Field(default_factory=dict)
    """Failure -> finished episodes (:attr:`EpisodeResult.failure`; every failure named,
    0 included): episodes whose failure is masked (``infrastructure``, ``verifier``) say
    nothing about the model."""
    cancelled: int
    usage: dict[str, int]
    """Token totals over the episodes (``prompt_tokens``, ``completion_tokens``, ``requests``, ``retries``)."""


class EvaluationJobPublic(BaseModel):
    """A batch evaluation: status, configuration (never the API key) and progress."""

    id: str
    mode: Mode
    status: JobStatus
    config: dict[str, Any]
    """Mode parameters: model, base_url, max_steps, temperature, retries, keep_envs, ..."""
    concurrency: int
    total: int
    progress: EvaluationProgress
    summary: EvaluationSummary | None = None
    """Set once the job is ``completed``, ``cancelled`` or ``failed``."""
    error: str | None = None
    created_by: str
    """The API key id that created it."""
    created_at: Timestamp
    finished_at: Timestamp | None = None


class EvaluationJobsPublic(BaseModel):
    data: list[EvaluationJobPublic]
    count: int
    """Total of the tenant's evaluations (not just this page)."""


class EpisodeResult(BaseModel):
    """One finished episode (a line of ``/results``)."""

    index: int
    scenario_id: str
    environment_id: str | None
    status: EpisodeStatus
    reward: float | None
    passed: int | None
    checks_total: int | None
    checks: list[dict[str, Any]] | None
    """Per check: ``check_item``, ``passed``, ``error``, ``status``, ``duration_ms``."""
    steps: int
    """Tool calls attempted (rejected ones included)."""
    error_status: str | None
    error: str | None
    failure: Failure = "none"
    """Who the episode's outcome is to blame on (docs/failures.md): from ``error_status``
    when it errored (``model_error`` agent; ``model_unavailable``, ``no_capacity``,
    ``unavailable``, ``env_lost`` infrastructure; ``env_error`` environment;
    ``check_error`` verifier), else the worst of its steps' and checks'."""
    mask: bool = False
    """True when its reward does not reflect the model (``infrastructure``, ``verifier``)."""
    env_id: str | None
    """The episode's env (deleted at the end unless ``keep_envs``)."""
    attempt: int
    """How many times the episode was started (more than 1 after a restart)."""
    trajectory: list[dict[str, Any]] | None
    """``[{step, action: {name, arguments}, observation, status, duration_ms}]``."""
    usage: dict[str, Any] | None
    transcript: list[dict[str, Any]] | None = None
    """Rollout mode, with ``?include=transcript``: every chat message."""
    started_at: Timestamp | None
    finished_at: Timestamp | None
