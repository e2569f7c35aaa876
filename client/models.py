"""Wire models: what the client reads from (and, for `Profile`, sends to) the API.

Response models ignore fields they do not know (`extra="ignore"`; `StepResult` keeps them
as extra attributes), so the server may add fields without breaking older clients; the
contract test (tests/unit/client/test_contract.py) checks every field the server's
OpenAPI document lists is here with a compatible type. Times are timezone-aware
`datetime`s; durations are in milliseconds where the name says `_ms`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ApiKey",
    "AuditEvent",
    "CheckOutcome",
    "Env",
    "EnvConstruction",
    "EnvStatus",
    "Environment",
    "Episode",
    "EpisodeResult",
    "EpisodeStatus",
    "Evaluation",
    "EvaluationJob",
    "EvaluationProgress",
    "EvaluationSummary",
    "Failure",
    "EnvironmentStats",
    "ExecResult",
    "Include",
    "Page",
    "Profile",
    "RecentReward",
    "Scenario",
    "ScenarioStats",
    "StateView",
    "StatsTotals",
    "StepResult",
    "StepStatus",
    "Tenant",
    "ToolAction",
    "Trajectory",
    "TrajectoryStep",
    "every_item",
]

StepStatus = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
Failure = Literal["none", "agent", "environment", "infrastructure", "verifier"]
"""Who an outcome is to blame on (docs/failures.md): `none`; `agent` (a rejected action);
`environment` (the environment's code raised, looped, ran out of memory or died);
`infrastructure` (sandbox lost, CPU-starved, quota, capacity: not the policy's doing);
`verifier` (a check function errored or timed out). Decided by the server."""
EnvStatus = Literal["live", "evicted", "closed"]
Include = Literal["state_diff", "state"]
"""What a step may also return: the state diff, the state after the step."""

T = TypeVar("T")


class _ResponseModel(BaseModel):
    """Responses ignore unknown fields so the server may add some."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Environment(_ResponseModel):
    """Registered environment code (`/v1/environments`)."""

    id: str
    name: str | None = None
    class_name: str
    code_sha256: str
    """Hex SHA-256 of `source_code`."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """OpenAI function-calling tool schemas, ready to pass as `tools=` to a chat completion:
    what the agent is shown (the declared tools when the environment has them, else the
    derived ones)."""
    derived_tools: list[dict[str, Any]] = Field(default_factory=list)
    """The schemas derived from the class in a sandbox (what argument checking uses)."""
    tools_source: Literal["declared", "derived"] = "derived"
    """Whether `tools` are the declared tools (given at registration) or the derived ones."""
    tool_differences: list[dict[str, Any]] = Field(default_factory=list)
    """Where the declared tools differ from the class: `{"tool", "kind", "severity",
    "parameter"?, "declared"?, "derived"?}` (kinds: `undeclared`, `not_a_method`,
    `description`, `required`, `type`, `parameter_missing`, `parameter_extra`, `truncated`)."""
    description: str | None = None
    introduction: str | None = None
    """EnvScaler `environment_introduction`."""
    rules: list[str] | None = None
    """EnvScaler `constraints_rules`."""
    policy: str = "standard"
    """The static policy the code was registered under (`strict`, `standard`, `audit`)."""
    policy_report: dict[str, Any] | None = None
    """The static policy's report: `passed`, `counts` by severity and every finding
    (`rule`, `severity`, `line`, `column`, `message`); warnings do not block registration."""
    argument_checking: Literal["off", "warn", "strict"] = "off"
    created_at: datetime


class Scenario(_ResponseModel):
    """An EnvScaler scenario (`/v1/scenarios`): task, initial config, checklist."""

    id: str
    environment_id: str
    task: str
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[str] = Field(default_factory=list)
    checklist_with_func: list[dict[str, Any]] = Field(default_factory=list)
    external_id: str | None = None
    episode_profile: Literal["sandpit", "envscaler"] = "sandpit"
    """The episode rulebook of its envs unless a create/reset names one."""
    check_objects: Literal["standins", "environment"] = "standins"
    """How its checks see objects of the environment's classes: stand-ins (no
    environment code where a verdict is computed) or the environment's own classes."""
    created_at: datetime


class RecentReward(_ResponseModel):
    """A finished episode's reward, when it ended, and whether it was a training episode
    (an env of `/v1/envs`) or an evaluation's."""

    reward: float
    ended_at: datetime
    kind: Literal["training", "evaluation"]


class ScenarioStats(_ResponseModel):
    """A scenario's statistics (`GET /v1/scenarios/{id}/stats`): episodes started
    (`attempts`) and finished with a reward, how many passed (reward exactly 1.0: every
    check passed), `pass_rate` and `mean_reward` (None when none finished), and the
    newest rewards, newest first; over `kind` episodes started at or after `since`."""

    scenario_id: str
    environment_id: str
    kind: Literal["all", "training", "evaluation"]
    since: datetime | None = None
    attempts: int
    finished: int
    passed: int
    pass_rate: float | None = None
    mean_reward: float | None = None
    last_ended_at: datetime | None = None
    recent: list[RecentReward] = Field(default_factory=list)


class StatsTotals(_ResponseModel):
    """`ScenarioStats`' figures over all of an environment's scenarios together."""

    scenarios: int
    attempts: int
    finished: int
    passed: int
    pass_rate: float | None = None
    mean_reward: float | None = None


class EnvironmentStats(_ResponseModel):
    """`GET /v1/environments/{id}/stats`: totals, and one page of its scenarios' statistics
    (`count`: all its scenarios)."""

    environment_id: str
    kind: Literal["all", "training", "evaluation"]
    since: datetime | None = None
    totals: StatsTotals
    data: list[ScenarioStats] = Field(default_factory=list)
    count: int


class CheckOutcome(_ResponseModel):
    """One check function's result in an evaluation."""

    check_item: str
    passed: bool
    error: str | None = None
    status: str = "ok"
    duration_ms: float = 0.0


class Evaluation(_ResponseModel):
    """`POST /v1/envs/{id}/evaluate`: per-check results and `reward = passed / total`."""

    id: str
    env_id: str
    episode: int
    step: int
    reward: float
    passed: int
    total: int
    results: list[CheckOutcome]
    created_at: datetime | None = None
    failure: Failure = "none"
    """`verifier` when a check errored or timed out (docs/failures.md), else `none`."""
    mask: bool = False
    """True when `failure` is `verifier`: leave this reward out of training."""


class ExecResult(_ResponseModel):
    """`POST /v1/execute`: a snippet's output (each stream capped; `*_truncated` says so)."""

    status: Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float = 0.0


EpisodeStatus = Literal["running", "terminated", "truncated"]
ConstructionReason = Literal[
    "restored", "templates_off", "seeded", "no_config", "source_unsuitable", "import_effects", "nondeterministic",
    "module_state", "construction_failed", "no_verdict", "leaves_process", "template_failed", "first_open",
    "building", "no_room", "other"]


class EnvConstruction(_ResponseModel):
    """How an env's instance was made at create: `template` (forked from a sandbox process
    that constructed it from the same environment and config: the fast path) or
    `constructed` with `reason` (`nondeterministic`, `module_state`, `source_unsuitable`:
    refused; `first_open`, `building`: not yet; the server's docs list every one) and the
    sandbox's `detail` text."""

    path: Literal["template", "constructed"]
    reason: ConstructionReason | None = None
    detail: str | None = None


class Env(_ResponseModel):
    """A live instance (session) of an environment (`/v1/envs`) and its current episode.
    Right after create or reset this is EnvScaler's `reset()`: `observation` (the task,
    or the simulated user's first message), `tools` and `introduction`."""

    id: str
    environment_id: str | None = None
    step: int
    """Steps taken in the current episode (0 right after create, reset or a restore to 0)."""
    episode: int
    status: EnvStatus
    created_at: datetime
    expires_at: datetime | None = None
    init_config: dict[str, Any] = Field(default_factory=dict)
    scenario_id: str | None = None
    forked_from: str | None = None
    forked_at_step: int | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """OpenAI function-calling tool schemas (with `chat_with_user` when the episode uses it)."""
    episode_status: EpisodeStatus = "running"
    observation: str = ""
    task: str | None = None
    introduction: str | None = None
    reward: float | None = None
    """The episode's reward once it ended."""
    failure: Failure = "none"
    """The current episode's failure so far (the worst of its steps' and checks')."""
    mask: bool = False
    """True when the episode's reward does not reflect the policy (infrastructure or
    verifier failure): leave it out of training."""
    episode_config: dict[str, Any] = Field(default_factory=dict)
    argument_checking: Literal["off", "warn", "strict"] = "off"
    construction: EnvConstruction | None = None
    """How the instance was made (in the answer of create only)."""


class StepResult(_ResponseModel):
    """The outcome of one action (EnvScaler `step()`). A tool that raised is
    `status="error"` and a malformed action `status="rejected"`, not exceptions. Fields the
    server adds later are kept (as extra attributes)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    env_id: str
    episode: int = 1
    step: int
    """Step number of this action in the episode (1 for the first)."""
    action: dict[str, Any] | None = None
    """The action as the server parsed and recorded it: `{"name", "arguments"}`."""
    observation: str
    """`str(result)` of the tool, `Error: <Type>: <message>`, the simulated user's reply,
    `Task finished`, or EnvScaler's `Error: Invalid action` for a malformed action."""
    status: StepStatus
    observation_role: Literal["tool", "user"] = "tool"
    reward: float = 0.0
    """0.0 until the step that ends the episode; then the scenario's reward."""
    terminated: bool = False
    truncated: bool = False
    duration_ms: float
    """Wall time of the call in the sandbox, milliseconds."""
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    error: str | None = None
    """Why a `rejected` action was refused."""
    argument_findings: list[str] | None = None
    checks: list[CheckOutcome] | None = None
    """At the end of a scenario's episode: each check's outcome."""
    recovered: bool = False
    """The env was restored from its last snapshot into a new sandbox before this action."""
    failure: Failure = "none"
    """This step's failure (the server's verdict, never the environment code's)."""
    mask: bool = False
    """True when this step's outcome does not reflect the policy (`infrastructure`)."""
    episode_failure: Failure = "none"
    """The episode's failure so far, this step (and on its last step, the checks) included."""
    episode_mask: bool = False
    """True when the episode's reward does not reflect the policy: drop the episode."""
    state_diff: dict[str, Any] | None = None
    """EnvScaler `get_state_diff` (`{key: {"added"|"removed"|"changed"...}}`), if asked with include."""
    state: dict[str, Any] | None = None
    """The state after the action, if asked with include."""


class StateView(_ResponseModel):
    """EnvScaler's state (every non-dunder attribute) after a step; values JSON cannot
    carry are `$` tags (`{"$set": [...]}`, `{"$date": ...}`, `{"$object": {...}}`)."""

    env_id: str
    episode: int
    step: int
    state: dict[str, Any]
    truncated: bool = False
    """True when a value was cut (a `$truncated` tag is in `state`)."""


class ToolAction(_ResponseModel):
    """A tool call as recorded in a trajectory."""

    name: str
    arguments: Any = Field(default_factory=dict)
    """A dict for a well-formed call; for a `rejected` one, whatever the server recorded
    (e.g. the model's malformed JSON string)."""


class TrajectoryStep(_ResponseModel):
    """One recorded step of a trajectory; `duration_ms` in milliseconds."""

    step: int
    action: ToolAction | None = None
    """None where the server recorded no action."""
    observation: str
    status: StepStatus
    duration_ms: float
    reward: float | None = None
    done: EpisodeStatus | None = None
    """`terminated` or `truncated` on the step that ended the episode."""
    info: dict[str, Any] | None = None
    """`observation_role`, `error`, `argument_findings`, `traceback` when present."""
    created_at: datetime
    failure: Failure = "none"
    mask: bool = False


class Trajectory(_ResponseModel):
    """Steps of one episode of an env, in order (one page of them: `count` is the total)."""

    env_id: str
    episode: int
    steps: list[TrajectoryStep]
    count: int = 0
    status: EpisodeStatus = "running"
    reward: float | None = None
    failure: Failure = "none"
    """The episode's failure."""
    mask: bool = False


class Episode(_ResponseModel):
    """One episode of an env (`GET /v1/envs/{id}/episodes`)."""

    episode: int
    environment_id: str
    scenario_id: str | None = None
    status: EpisodeStatus
    steps: int
    observation: str = ""
    task: str | None = None
    reward: float | None = None
    checks: list[dict[str, Any]] | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    started_at: datetime
    ended_at: datetime | None = None
    failure: Failure = "none"
    mask: bool = False


class Page(_ResponseModel, Generic[T]):
    """One page of a listing: `data` (at most `limit` items) and `count` (the total)."""

    data: list[T]
    count: int


def every_item(listing: Callable[..., Page[T]], page_size: int = 500) -> Iterator[T]:
    """Every item of a paged listing (e.g. `client.scenarios.list`), page by page of
    `page_size`, until `count` items were seen or a page comes back empty."""
    offset = 0
    while True:
        page = listing(limit=page_size, offset=offset)
        yield from page.data
        offset += len(page.data)
        if not page.data or offset >= page.count:
            return


class EvaluationProgress(_ResponseModel):
    """Episode counts of a batch evaluation so far (`/v1/evaluations/{id}`)."""

    total: int
    done: int
    """Episodes scored."""
    errors: int
    """Episodes ended with an error status (no reward)."""
    running: int
    pending: int
    cancelled: int
    mean_reward: float | None = None
    """Mean over scored and errored episodes (an error counts 0.0); None before any finished."""
    success: int
    """Episodes with reward 1.0."""


class EvaluationSummary(_ResponseModel):
    """A finished evaluation: mean reward, success rate (reward == 1.0), per-environment
    breakdown (`{environment_id: {episodes, mean_reward, success_rate}}`), errors by
    status and token usage."""

    episodes: int
    scored: int
    mean_reward: float | None = None
    success_rate: float | None = None
    by_environment: dict[str, dict[str, Any]] = Field(default_factory=dict)
    by_scenario: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """`{scenario_id: {episodes, mean_reward, success_rate, overall_pass_rate,
    overall_finished}}`: this evaluation's figures and the scenario's over all episodes."""
    errors_by_status: dict[str, int] = Field(default_factory=dict)
    by_failure: dict[str, int] = Field(default_factory=dict)
    """Finished episodes per failure (`none`, `agent`, `environment`, `infrastructure`,
    `verifier`); those with a masked failure are not evidence about the model."""
    cancelled: int = 0
    usage: dict[str, int] = Field(default_factory=dict)


class EvaluationJob(_ResponseModel):
    """A batch evaluation (`/v1/evaluations`): replay or rollout over scenarios."""

    id: str
    mode: Literal["replay", "rollout"]
    status: Literal["queued", "running", "completed", "cancelled", "failed"]
    config: dict[str, Any] = Field(default_factory=dict)
    """Mode parameters (model, base_url, max_steps, ...); never the API key."""
    concurrency: int
    total: int
    progress: EvaluationProgress
    summary: EvaluationSummary | None = None
    """Set once the evaluation is completed, cancelled or failed."""
    error: str | None = None
    created_by: str | None = None
    """The id of the API key that created it."""
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        """True once no episode runs any more: completed, failed, or cancelled and its
        running episodes have stopped."""
        return self.status in ("completed", "cancelled", "failed") and self.progress.running == 0


class EpisodeResult(_ResponseModel):
    """One finished episode of an evaluation (a line of `/results`)."""

    index: int
    scenario_id: str
    environment_id: str | None = None
    status: Literal["done", "error", "cancelled", "pending", "running"]
    reward: float | None = None
    """EnvScaler reward: passed / total checks (None unless `status == "done"`)."""
    passed: int | None = None
    checks_total: int | None = None
    checks: list[dict[str, Any]] | None = None
    steps: int = 0
    """Tool calls attempted (rejected ones included)."""
    error_status: str | None = None
    """`model_error`, `model_unavailable`, `no_capacity`, `env_error`, ... when `status == "error"`."""
    error: str | None = None
    failure: Failure = "none"
    """The episode's failure: from `error_status` when it errored, else from its steps and checks."""
    mask: bool = False
    env_id: str | None = None
    attempt: int = 1
    trajectory: list[dict[str, Any]] | None = None
    """`[{step, action: {name, arguments}, observation, status, duration_ms}]`."""
    usage: dict[str, Any] | None = None
    transcript: list[dict[str, Any]] | None = None
    """Rollouts, when asked with `include_transcript=True`: every chat message."""


class Profile(BaseModel):
    """Resource overrides for a new env; each field may only lower the server's profile.

    Unknown fields are refused (a typo must not silently fall back to the default).
    """

    model_config = ConfigDict(extra="forbid")

    memory_mib: int | None = None
    """Memory limit of the env's sandbox, MiB."""
    cpus: float | None = None
    """CPU quota, in CPUs (0.5 = half a core)."""
    call_timeout_s: float | None = None
    """Wall-time limit of one tool call, seconds; past it the step has `status="timeout"`."""




# --------------------------------------------------------------------------- admin (operator key)


class ApiKey(_ResponseModel):
    """A tenant's API key (`/v1/admin/tenants/{id}/keys`): metadata, never its hash.
    `key` (the secret) is only in the response that created it."""

    id: str
    tenant: str
    name: str | None = None
    prefix: str
    """The key's first characters, to recognise it."""
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    key: str | None = None


class Tenant(_ResponseModel):
    """A tenant (`/v1/admin/tenants`): quota overrides and the effective quotas, the
    default rollout model endpoint (its key is stored encrypted, never returned)."""

    id: str
    display_name: str | None = None
    quota_overrides: dict[str, Any] = Field(default_factory=dict)
    quotas: dict[str, Any] = Field(default_factory=dict)
    """Effective quotas: the server's defaults with the overrides applied."""
    model_base_url: str | None = None
    has_model_api_key: bool = False
    created_at: datetime
    active_keys: int | None = None
    api_key: ApiKey | None = None
    """The first key, with its secret, in the creation response only."""


class AuditEvent(_ResponseModel):
    """One audit log entry (`/v1/admin/audit`), newest first in listings."""

    id: int
    at: datetime
    tenant: str
    actor: str
    """The key id (or `operator`) that acted."""
    action: str
    resource_id: str | None = None
    detail: dict[str, Any] | None = None
