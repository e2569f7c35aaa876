"""Request and response models: the HTTP contract (OpenAPI is generated from these).

Requests forbid unknown fields; every field documents units and limits. Response
families per resource: ``EnvironmentPublic`` / ``EnvironmentsPublic(data, count)``,
``EnvPublic`` / ``EnvsPublic``, ``StepResult``, ``StateView``, ``Trajectory``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .profile_limits import profile_value

Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class _Request(BaseModel):
    # strict: a request is what the OpenAPI document says (no false -> 0, no "yes" -> True)
    model_config = ConfigDict(extra="forbid", strict=True)


class EnvironmentCreate(_Request):
    """Register environment code. Its tools are derived inside a sandbox."""

    name: Annotated[str | None, Field(max_length=200)] = None
    source_code: Annotated[str, Field(min_length=1)]
    """Python module source defining ``class_name`` (size cap: ``SANDPIT_MAX_CODE_BYTES``)."""
    class_name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: Annotated[str | None, Field(max_length=20000)] = None
    policy: Literal["strict", "standard", "audit"] = "standard"
    """Static policy: ``standard`` rejects errors and reports warnings (see /v1/validate)."""


class EnvironmentPublic(BaseModel):
    id: str
    name: str | None
    class_name: str
    code_sha256: str
    tools: list[dict[str, Any]]
    """OpenAI function-calling schemas (EnvScaler-compatible), derived in a sandbox."""
    description: str | None
    policy: str = "standard"
    policy_report: dict[str, Any] | None = None
    created_at: datetime


class EnvironmentsPublic(BaseModel):
    data: list[EnvironmentPublic]
    count: int
    """Total matching objects (not just this page)."""


class ProfileRequest(_Request):
    """Lowering overrides of the resource profile (raising is refused with 422)."""

    memory_mib: Annotated[int | None, profile_value("memory_mib")] = None
    cpus: Annotated[float | None, profile_value("cpus")] = None
    call_timeout_s: Annotated[float | None, profile_value("call_timeout_s")] = None


class EnvCreate(_Request):
    """Create an env from a registered environment, or from inline code."""

    environment_id: str | None = None
    source_code: Annotated[str | None, Field(min_length=1)] = None
    class_name: Annotated[str | None, Field(pattern=NAME_PATTERN)] = None
    scenario_id: str | None = None
    """Create from a scenario: its environment, and its ``init_config`` unless one is given."""
    init_config: dict[str, Any] | None = None
    """EnvScaler ``init_config``: ``cls(init_config)``, else ``cls()`` + setattr per key."""
    profile: ProfileRequest | None = None

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


class EnvPublic(BaseModel):
    id: str
    environment_id: str
    episode: int
    """Starts at 1; each reset begins the next episode."""
    step: int
    """Last acknowledged step of the episode (0 = just instantiated)."""
    status: Literal["live", "evicted", "closed"]
    """live: in a sandbox now; evicted: state in the database, restored on next use."""
    init_config: dict[str, Any]
    created_at: datetime
    expires_at: datetime
    forked_from: str | None = None
    forked_at_step: int | None = None
    scenario_id: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)


class EnvsPublic(BaseModel):
    data: list[EnvPublic]
    count: int


class FunctionCall(_Request):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    arguments: str | dict[str, Any] = "{}"
    """JSON string (as chat-completions emits it) or an object."""


class StepRequest(BaseModel):
    """A tool call: ``{"name", "arguments"}`` or an OpenAI tool call
    ``{"type": "function", "function": {"name", "arguments": "<json string>"}}`` (``id``
    is accepted and ignored)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str | None, Field(min_length=1, max_length=128)] = None
    arguments: Any = None
    type: Literal["function"] | None = None
    function: FunctionCall | None = None
    id: Annotated[str | None, Field(max_length=256)] = None

    @model_validator(mode="after")
    def _one_form(self) -> StepRequest:
        if self.function is not None:
            if self.name is not None or self.arguments is not None:
                raise ValueError("give either name/arguments or an OpenAI tool call, not both")
        elif self.name is None:
            raise ValueError("name is required")
        return self


class StepResult(BaseModel):
    env_id: str
    episode: int
    step: int
    observation: str
    status: Status
    duration_ms: float
    """Wall-clock time of the tool call in the sandbox round trip, milliseconds."""
    stdout: str = ""
    stderr: str = ""
    recovered: bool = False
    """The env was restored into a (new) sandbox from its last snapshot before this call."""
    state_diff: dict[str, Any] | None = None
    """With ``?include=state_diff``: EnvScaler ``get_state_diff`` shape."""
    state: dict[str, Any] | None = None
    """With ``?include=state``: the state after the step."""


class ResetRequest(_Request):
    init_config: dict[str, Any] | None = None
    """New ``init_config``; the env's current one when omitted."""


class RestoreRequest(_Request):
    step: Annotated[int, Field(ge=0)]


class ForkRequest(_Request):
    step: Annotated[int | None, Field(ge=0)] = None
    """Fork point in the current episode; the head when omitted."""
    count: Annotated[int, Field(ge=1)] = 1


class StateView(BaseModel):
    env_id: str
    episode: int
    step: int
    state: dict[str, Any]
    """Public attributes. Opaque values read from storage show as ``{"$opaque": "pickle",
    "bytes": n}``; the current state of a live env is rendered inside its sandbox."""


class TrajectoryStep(BaseModel):
    step: int
    action: dict[str, Any] | None
    observation: str
    status: Status
    duration_ms: float
    created_at: datetime


class Trajectory(BaseModel):
    env_id: str
    episode: int
    steps: list[TrajectoryStep]


class Health(BaseModel):
    status: Literal["ok", "not_ready"]
    checks: dict[str, str] = Field(default_factory=dict)



# -- validation, rewards, scenarios, execution (EnvScaler ScenGenerator formats) ----------
PolicyName = Literal["strict", "standard", "audit"]


class CheckSpec(_Request):
    """One checklist item with its check function (EnvScaler ``checklist_with_func``)."""

    check_item: Annotated[str, Field(max_length=4000)]
    check_func: Annotated[str, Field(min_length=1, max_length=64 * 1024)]
    """Python source defining ``check_func(final_state) -> bool`` (``initial_state`` is a global)."""


class ScenarioCreate(_Request):
    environment_id: str
    task: Annotated[str, Field(max_length=100_000)]
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[Annotated[str, Field(max_length=4000)]] = Field(default_factory=list, max_length=256)
    checklist_with_func: list[CheckSpec] = Field(default_factory=list, max_length=256)
    external_id: Annotated[str | None, Field(max_length=200)] = None


class ScenarioPublic(BaseModel):
    id: str
    environment_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[str]
    checklist_with_func: list[dict[str, Any]]
    external_id: str | None
    created_at: datetime


class ScenariosPublic(BaseModel):
    data: list[ScenarioPublic]
    count: int


class EvaluateRequest(_Request):
    """Checks to run; the env's scenario checklist when omitted."""

    checks: list[CheckSpec] | None = Field(default=None, max_length=256)


class CheckOutcome(BaseModel):
    check_item: str
    passed: bool
    error: str | None = None
    """Why it did not pass (raised, returned a non-bool, timed out...)."""
    status: Status = "ok"
    duration_ms: float = 0.0


class EvaluationPublic(BaseModel):
    id: str
    env_id: str
    episode: int
    step: int
    reward: float
    """EnvScaler ``calculate_reward``: passed / total (0.0 with no checks)."""
    passed: int
    total: int
    results: list[CheckOutcome]
    created_at: datetime


class SmokeCall(_Request):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class StatePair(_Request):
    initial_state: dict[str, Any] = Field(default_factory=dict)
    final_state: dict[str, Any] = Field(default_factory=dict)


class ValidateRequest(_Request):
    """``environment``: policy + load, instantiate, derive tools, smoke calls in a sandbox.
    ``check_function``: policy + run against ``cases`` in a sandbox. ``snippet``: policy only."""

    kind: Literal["environment", "check_function", "snippet"]
    source_code: Annotated[str, Field(min_length=1)]
    class_name: Annotated[str | None, Field(pattern=NAME_PATTERN)] = None
    init_config: dict[str, Any] = Field(default_factory=dict)
    smoke_calls: list[SmokeCall] = Field(default_factory=list, max_length=64)
    cases: list[StatePair] = Field(default_factory=list, max_length=64)
    policy: PolicyName = "standard"


class SmokeResult(BaseModel):
    name: str
    status: Status
    observation: str
    state_diff: dict[str, Any] | None = None


class ValidateResult(BaseModel):
    kind: str
    verdict: Literal["valid", "invalid"]
    reasons: list[str]
    """Why the verdict is ``invalid`` (empty when valid)."""
    policy_report: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    instantiation: dict[str, Any] | None = None
    """``{"status", "observation"}`` of creating the instance with ``init_config``."""
    smoke: list[SmokeResult] = Field(default_factory=list)
    cases: list[CheckOutcome] = Field(default_factory=list)


class ExecuteRequest(_Request):
    code: Annotated[str, Field(min_length=1)]
    stdin: Annotated[str | None, Field(max_length=1024 * 1024)] = None
    timeout_s: Annotated[float | None, profile_value("call_timeout_s")] = None
    memory_mb: Annotated[int | None, profile_value("memory_mib")] = None
    files: dict[Annotated[str, Field(max_length=255)], Annotated[str, Field(max_length=1024 * 1024)]] = Field(
        default_factory=dict, max_length=64)


class ExecuteBatchRequest(_Request):
    snippets: list[ExecuteRequest] = Field(min_length=1, max_length=64)
    concurrency: Annotated[int, Field(ge=1, le=16)] = 4


class ExecuteResult(BaseModel):
    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float


class ExecuteBatchResult(BaseModel):
    results: list[ExecuteResult]


# -- tenants, keys, audit (multi-tenancy) ------------------------------------------------
class TenantCreate(_Request):
    """``POST /v1/admin/tenants``: a tenant and (unless ``create_key`` is false) its first key."""

    id: Annotated[str, Field(min_length=1, max_length=64)]
    display_name: Annotated[str | None, Field(max_length=200)] = None
    quotas: dict[str, Any] | None = None
    """Overrides of the default quotas (fields of ``Quotas``; ``max_profile`` may be partial)."""
    create_key: bool = True
    key_name: Annotated[str | None, Field(max_length=200)] = None
    key_expires_in_s: Annotated[float | None, Field(gt=0, le=10 * 365 * 86400)] = None


class TenantUpdate(_Request):
    """``PATCH /v1/admin/tenants/{id}``: only the given fields change; ``quotas`` replaces
    the overrides; an empty ``model_api_key`` removes the stored one."""

    display_name: Annotated[str | None, Field(max_length=200)] = None
    quotas: dict[str, Any] | None = None
    model_base_url: Annotated[str | None, Field(max_length=2000)] = None
    model_api_key: Annotated[str | None, Field(max_length=4096)] = None


class KeyCreate(_Request):
    name: Annotated[str | None, Field(max_length=200)] = None
    expires_in_s: Annotated[float | None, Field(gt=0, le=10 * 365 * 86400)] = None
    """Seconds until the key stops working (never, when absent)."""


class ApiKeyPublic(BaseModel):
    """A key's metadata (never its hash). ``key`` is only present in the creation response."""

    id: str
    tenant: str
    name: str | None
    prefix: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    key: str | None = None


class TenantPublic(BaseModel):
    id: str
    display_name: str | None
    quota_overrides: dict[str, Any]
    quotas: dict[str, Any]
    """Effective quotas (defaults with the overrides applied)."""
    model_base_url: str | None
    has_model_api_key: bool
    created_at: datetime
    active_keys: int | None = None
    api_key: ApiKeyPublic | None = None
    """The first key, with its secret, in the creation response only."""


class TenantsPublic(BaseModel):
    data: list[TenantPublic]
    count: int


class KeysPublic(BaseModel):
    data: list[ApiKeyPublic]
    count: int


class TenantUsage(BaseModel):
    """``GET /v1/tenant``: the caller's tenant, quotas and current usage."""

    tenant: str
    key_id: str
    quotas: dict[str, Any]
    live_envs: int
    calls_in_flight: int


class AuditEventPublic(BaseModel):
    id: int
    at: datetime
    tenant: str
    actor: str
    action: str
    resource_id: str | None
    detail: dict[str, Any] | None


class AuditPublic(BaseModel):
    data: list[AuditEventPublic]
    count: int
