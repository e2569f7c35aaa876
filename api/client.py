"""Python client for Sandpit's HTTP API: `Client` (sync) and `AsyncClient` (async).

The RL adapters over it (gymnasium `RLEnv`, `AsyncRLEnv`, `SandpitVectorEnv`) are in
`sandpit.api.rl`, the GEM environments in `sandpit.api.gem_env`.

Both clients share everything but the transport: request builders (`_Call`: method, path,
query, JSON body, response parser) and the error mapping live once in this module; the
sync and async surfaces are one-line methods that hand a `_Call` to their transport.

Exception tree (every error the client raises on purpose is a `SandpitError`)::

    SandpitError                status_code (None without a response), code, message, field
    ├── SandpitConnectionError  no HTTP response: connect/read failure or timeout; request_sent
    ├── InvalidResponse         a 2xx body that is not JSON or not the documented shape
    ├── InvalidRequest          400, 422 (field names the offending input)
    ├── Unauthorized            401, 403
    ├── NotFound                404 (unknown id, or another tenant's)
    ├── Conflict                409
    ├── PayloadTooLarge         413
    ├── RateLimited             429; retry_after (seconds)
    ├── Unavailable             503; retry_after (seconds)
    └── ServerError             any other 5xx

Retries (tenacity): 429 and 503 are retried for every call, since the server guarantees it
did nothing, sleeping what `Retry-After` says, until the total sleep would exceed
`max_retry_wait_s`; then the last error is raised. Transport failures before the request was
sent (connect error or timeout, pool timeout) are retried for every call, at most 3 attempts.
Failures after it was sent (read timeout, dropped connection) are retried only for GET: a
step, create, reset, restore or fork may have happened, so it raises `SandpitConnectionError`
with `request_sent=True` instead of risking doing it twice.

Usage::

    with Client("http://127.0.0.1:8000", api_key="...") as client:
        environment = client.environments.create(source_code, "OrderDesk")
        env = client.envs.create(environment.id, init_config={"products": {}})
        result = env.step("add_to_cart", customer_id="C1", product_id="P1")
        result.status, result.observation
        env.delete()
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar
from urllib.parse import quote

import httpx
import tenacity
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "AsyncClient",
    "AsyncEnvHandle",
    "Client",
    "Conflict",
    "Env",
    "EnvHandle",
    "EpisodeResult",
    "Environment",
    "Episode",
    "EvaluationJob",
    "EvaluationProgress",
    "EvaluationSummary",
    "InvalidRequest",
    "InvalidResponse",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "Profile",
    "RateLimited",
    "SandpitConnectionError",
    "SandpitError",
    "ServerError",
    "StateView",
    "StepResult",
    "ToolAction",
    "tool_call_body",
    "Trajectory",
    "TrajectoryStep",
    "Unauthorized",
    "Unavailable",
]

USER_AGENT = "sandpit-python-client/0.1"
_MAX_MESSAGE_CHARS = 2000
_MIN_RETRY_SLEEP_S = 0.05  # floor for `Retry-After: 0`, so a busy server is not hammered
_MAX_BACKOFF_S = 5.0  # without Retry-After: 0.25 s, 0.5 s, 1 s, ... capped here
_TRANSPORT_ATTEMPTS = 3

StepStatus = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
EnvStatus = Literal["live", "evicted", "closed"]
Include = Literal["state_diff", "state"]
_INCLUDE_VALUES = frozenset({"state_diff", "state"})

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------- errors


class SandpitError(Exception):
    """Base of every error the client raises on purpose.

    Attributes:
        status_code: HTTP status of the response, or None when there was no response.
        code: machine-readable code from the error body (`{"error": {"code", ...}}`), or
            `http_<status>` when the body did not have one.
        message: human-readable text from the server (capped at 2000 characters).
        field: the request field the error is about (422), else None.
    """

    def __init__(self, message: str, *, status_code: int | None = None, code: str = "error",
                 field: str | None = None) -> None:
        self.status_code = status_code
        self.code = code
        self.message = message
        self.field = field
        where = f" (field {field!r})" if field else ""
        prefix = f"HTTP {status_code} {code}" if status_code is not None else code
        super().__init__(f"{prefix}: {message}{where}")

    def __reduce__(self) -> tuple[Any, ...]:
        # keyword-only constructors: rebuild without __init__ so errors survive pickling
        # (multiprocessing / Ray rollout workers send them across processes)
        return (_unpickle_error, (type(self), self.args, dict(self.__dict__)))


def _unpickle_error(cls: type[SandpitError], args: tuple[Any, ...], state: dict[str, Any]) -> SandpitError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class SandpitConnectionError(SandpitError):
    """No HTTP response: the connection failed, dropped or timed out.

    Attributes:
        request_sent: False when the request certainly never reached the server (connect
            error or timeout); True when it may have been processed (read timeout, dropped
            connection) — for a step, the step may or may not have happened.
        retry_safe: True when repeating the request cannot do anything twice (it was never
            sent, or it is a GET).
    """

    def __init__(self, message: str, *, request_sent: bool, retry_safe: bool) -> None:
        super().__init__(message, code="connection_error")
        self.request_sent = request_sent
        self.retry_safe = retry_safe


class InvalidResponse(SandpitError):
    """A 2xx response whose body is not JSON or does not match the documented shape."""


class InvalidRequest(SandpitError):
    """400 or 422: the request was refused as invalid; `field` names the offending input."""


class Unauthorized(SandpitError):
    """401 or 403: missing, unknown or revoked API key."""


class NotFound(SandpitError):
    """404: unknown id (ids of other tenants are reported the same way)."""


class Conflict(SandpitError):
    """409: the resource is not in a state that allows the call (e.g. a closed env)."""


class PayloadTooLarge(SandpitError):
    """413: the request body (source code, init_config, arguments) exceeds a server limit."""


class _RetryAfterError(SandpitError):
    """An error the server asks to retry later; `retry_after` is in seconds (None if not sent)."""

    def __init__(self, message: str, *, status_code: int | None = None, code: str = "error",
                 field: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status_code=status_code, code=code, field=field)
        self.retry_after = retry_after


class RateLimited(_RetryAfterError):
    """429: a tenant quota was hit; nothing was done. `retry_after`: seconds, or None."""


class Unavailable(_RetryAfterError):
    """503: no capacity right now; nothing was done. `retry_after`: seconds, or None."""


class ServerError(SandpitError):
    """Any 5xx other than 503: a failure of Sandpit itself."""


_STATUS_ERRORS: dict[int, type[SandpitError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 422: InvalidRequest, 429: RateLimited, 503: Unavailable,
}


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "..."


def _parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds (fractions accepted) or an HTTP date."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def _error_from_response(response: httpx.Response) -> SandpitError:
    """Map a non-2xx response to the exception tree, whatever its body looks like."""
    status = response.status_code
    code, message, field = f"http_{status}", "", None
    try:
        body: Any = json.loads(response.content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        if isinstance(error.get("code"), str):
            code = error["code"]
        if isinstance(error.get("message"), str):
            message = error["message"]
        if isinstance(error.get("field"), str):
            field = error["field"]
    elif isinstance(error, str):
        message = error
    elif isinstance(body, dict) and "detail" in body:  # a framework default error body
        message = str(body["detail"])
    elif response.content:
        message = response.content.decode("utf-8", "replace").strip()
    message = _clip(message or response.reason_phrase or "no message")
    cls = _STATUS_ERRORS.get(status) or (ServerError if status >= 500 else SandpitError)
    if issubclass(cls, _RetryAfterError):
        return cls(message, status_code=status, code=code, field=field,
                   retry_after=_parse_retry_after(response.headers.get("Retry-After")))
    return cls(message, status_code=status, code=code, field=field)


# --------------------------------------------------------------------------- models


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
    """OpenAI function-calling tool schemas, ready to pass as `tools=` to a chat completion."""
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
    created_at: datetime


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
    episode_config: dict[str, Any] = Field(default_factory=dict)
    argument_checking: Literal["off", "warn", "strict"] = "off"


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


class Trajectory(_ResponseModel):
    """Steps of one episode of an env, in order (one page of them: `count` is the total)."""

    env_id: str
    episode: int
    steps: list[TrajectoryStep]
    count: int = 0
    status: EpisodeStatus = "running"
    reward: float | None = None


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
    errors_by_status: dict[str, int] = Field(default_factory=dict)
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


# --------------------------------------------------------------------------- requests (shared)


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One API call, independent of the transport: what to send and how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    retry_busy: bool = True
    """Retry 429/503 within the wait budget (off for readiness probes)."""

    @property
    def idempotent(self) -> bool:
        return self.method == "GET"


def _model_parser(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise _invalid_response(response, model.__name__, exc) from exc
    return parse


def _page_parser(model: type[M]) -> Callable[[httpx.Response], Page[M]]:
    return _model_parser(Page[model])  # type: ignore[valid-type]


def _no_content(response: httpx.Response) -> None:
    return None


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise _invalid_response(response, "JSON object", exc) from exc
    if not isinstance(body, dict):
        raise _invalid_response(response, "JSON object", None)
    return body


def _invalid_response(response: httpx.Response, expected: str, exc: Exception | None) -> InvalidResponse:
    request = response.request
    detail = ""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_url=False, include_input=False)
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<body>'}: {e['msg']}" for e in errors[:5])
        if len(errors) > 5:
            detail += f"; and {len(errors) - 5} more"
    elif exc is not None:
        detail = str(exc)
    else:
        detail = "wrong JSON type"
    return InvalidResponse(
        _clip(f"{request.method} {request.url.path}: response is not a valid {expected}: {detail}"),
        status_code=response.status_code, code="invalid_response")


def _seg(value: str) -> str:
    """An id as one path segment: `/`, `..` and the like cannot change the route."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"id must be a non-empty string, not {value!r}")
    return quote(value, safe="")


def _page_params(limit: int | None, offset: int | None) -> dict[str, str] | None:
    params = {k: str(v) for k, v in (("limit", limit), ("offset", offset)) if v is not None}
    return params or None


def _include_params(include: Iterable[Include] | None) -> dict[str, str] | None:
    if not include:
        return None
    values = [include] if isinstance(include, str) else list(include)
    unknown = [v for v in values if v not in _INCLUDE_VALUES]
    if unknown:
        raise ValueError(f"include accepts {sorted(_INCLUDE_VALUES)}, not {unknown}")
    return {"include": ",".join(dict.fromkeys(values))}


def tool_call_body(call: object) -> tuple[str, dict[str, Any]]:
    """Turn an action into a step request body; returns `(tool name, body)`.

    Accepted shapes:
      - `{"name": str, "arguments": dict}` (arguments optional);
      - an OpenAI chat tool call `{"type": "function", "function": {"name", "arguments"}}`;
      - a Responses-API function call `{"name": str, "arguments": "<json string>"}`;
      - any object with `.function.name` / `.function.arguments` (openai SDK
        `ChatCompletionMessageToolCall`) or with `.name` / `.arguments`;
      - a string, or `{"text": str}`: raw model output in the `<tool_call>` prompt format
        (the server parses it; plain text is `chat_with_user`); the name returned is "".

    Nothing is judged here: a malformed action (arguments that are not JSON or not an
    object, a name that is no tool) is sent as it is, and the server records it as a
    `rejected` step the episode can go on from.

    Raises:
        TypeError: `call` is none of the shapes above.
    """
    if isinstance(call, str):
        return "", {"text": call}
    if isinstance(call, Mapping):
        if set(call) == {"text"}:
            return "", {"text": str(call["text"])}
        function = call.get("function")
        if function is not None:
            if not isinstance(function, Mapping):
                raise TypeError("tool call 'function' must be an object with 'name' and 'arguments'")
            return _tool_call_parts(function.get("name"), function.get("arguments"))
        if "name" not in call:
            raise TypeError("a tool call needs 'name' (or 'function', or 'text')")
        return _tool_call_parts(call.get("name"), call.get("arguments"))
    function = getattr(call, "function", None)
    if function is not None:
        return _tool_call_parts(getattr(function, "name", None), getattr(function, "arguments", None))
    if hasattr(call, "name") and hasattr(call, "arguments"):
        return _tool_call_parts(call.name, call.arguments)
    raise TypeError(f"not a tool call: {type(call).__name__} has neither .function nor .name/.arguments")


def _tool_call_parts(name: object, arguments: object) -> tuple[str, dict[str, Any]]:
    name = "" if name is None else name if isinstance(name, str) else str(name)
    if isinstance(arguments, str):
        return name, {"type": "function", "function": {"name": name, "arguments": arguments}}
    if arguments is None:
        arguments = {}
    if isinstance(arguments, Mapping):
        arguments = dict(arguments)
    return name, {"name": name, "arguments": arguments}


def _health() -> _Call[dict[str, Any]]:
    return _Call("GET", "/healthz", _json_object)


def _ready() -> _Call[None]:
    return _Call("GET", "/readyz", _no_content, retry_busy=False)


def _environment_create(source_code: str, class_name: str, name: str | None,
                        description: str | None, policy: str = "standard",
                        extra: Mapping[str, Any] | None = None) -> _Call[Environment]:
    body = {"name": name, "source_code": source_code, "class_name": class_name, "description": description,
            "policy": policy}
    body.update({k: v for k, v in (extra or {}).items() if v is not None})
    return _Call("POST", "/v1/environments", _model_parser(Environment), json=body)


def _scenario_create(body: Mapping[str, Any]) -> _Call[Scenario]:
    return _Call("POST", "/v1/scenarios", _model_parser(Scenario), json=dict(body))


def _scenario_get(scenario_id: str) -> _Call[Scenario]:
    return _Call("GET", f"/v1/scenarios/{_seg(scenario_id)}", _model_parser(Scenario))


def _scenario_list(limit: int | None, offset: int | None) -> _Call[Page[Scenario]]:
    return _Call("GET", "/v1/scenarios", _page_parser(Scenario), params=_page_params(limit, offset))


def _scenario_delete(scenario_id: str) -> _Call[None]:
    return _Call("DELETE", f"/v1/scenarios/{_seg(scenario_id)}", _no_content)


def _env_evaluate(env_id: str, checks: list[Mapping[str, str]] | None) -> _Call[Evaluation]:
    body = {"checks": [dict(c) for c in checks]} if checks is not None else {}
    return _Call("POST", f"/v1/envs/{_seg(env_id)}/evaluate", _model_parser(Evaluation), json=body)


def _validate(body: Mapping[str, Any]) -> _Call[dict[str, Any]]:
    return _Call("POST", "/v1/validate", _json_object, json=dict(body))


def _execute(body: Mapping[str, Any]) -> _Call[ExecResult]:
    return _Call("POST", "/v1/execute", _model_parser(ExecResult), json=dict(body))


def _environment_get(environment_id: str) -> _Call[Environment]:
    return _Call("GET", f"/v1/environments/{_seg(environment_id)}", _model_parser(Environment))


def _environment_list(limit: int | None, offset: int | None) -> _Call[Page[Environment]]:
    return _Call("GET", "/v1/environments", _page_parser(Environment), params=_page_params(limit, offset))


def _environment_delete(environment_id: str) -> _Call[None]:
    return _Call("DELETE", f"/v1/environments/{_seg(environment_id)}", _no_content)


def _env_create(environment_id: str | None, source_code: str | None, class_name: str | None,
                init_config: Mapping[str, Any] | None,
                profile: Profile | Mapping[str, Any] | None, scenario_id: str | None = None,
                episode: Mapping[str, Any] | None = None, argument_checking: str | None = None) -> _Call[Env]:
    if sum(x is not None for x in (environment_id, source_code, scenario_id)) != 1:
        raise ValueError("give exactly one of environment_id, scenario_id or source_code (with class_name)")
    if source_code is not None and not class_name:
        raise ValueError("source_code needs class_name")
    body: dict[str, Any] = (
        {"environment_id": environment_id} if environment_id is not None
        else {"scenario_id": scenario_id} if scenario_id is not None
        else {"source_code": source_code, "class_name": class_name})
    if init_config is not None or scenario_id is None:  # a scenario brings its own init_config
        body["init_config"] = dict(init_config or {})
    if profile is not None:
        checked = profile if isinstance(profile, Profile) else Profile.model_validate(profile)
        body["profile"] = checked.model_dump(exclude_none=True)
    if episode is not None:
        body["episode"] = dict(episode)
    if argument_checking is not None:
        body["argument_checking"] = argument_checking
    return _Call("POST", "/v1/envs", _model_parser(Env), json=body)


def _env_get(env_id: str) -> _Call[Env]:
    return _Call("GET", f"/v1/envs/{_seg(env_id)}", _model_parser(Env))


def _env_list(limit: int | None, offset: int | None) -> _Call[Page[Env]]:
    return _Call("GET", "/v1/envs", _page_parser(Env), params=_page_params(limit, offset))


def _env_delete(env_id: str) -> _Call[None]:
    return _Call("DELETE", f"/v1/envs/{_seg(env_id)}", _no_content)


def _env_step(env_id: str, call: object, include: Iterable[Include] | None) -> _Call[StepResult]:
    _, body = tool_call_body(call)
    return _Call("POST", f"/v1/envs/{_seg(env_id)}/step", _model_parser(StepResult), json=body,
                 params=_include_params(include))


def _env_reset(env_id: str, init_config: Mapping[str, Any] | None, scenario_id: str | None = None,
               episode: Mapping[str, Any] | None = None) -> _Call[Env]:
    body: dict[str, Any] = {"init_config": None if init_config is None else dict(init_config)}
    if scenario_id is not None:
        body["scenario_id"] = scenario_id
    if episode is not None:
        body["episode"] = dict(episode)
    return _Call("POST", f"/v1/envs/{_seg(env_id)}/reset", _model_parser(Env), json=body)


def _query(**values: Any) -> dict[str, str] | None:
    params = {k: str(v) for k, v in values.items() if v is not None}
    return params or None


def _env_state(env_id: str, step: int | None, episode: int | None = None) -> _Call[StateView]:
    return _Call("GET", f"/v1/envs/{_seg(env_id)}/state", _model_parser(StateView),
                 params=_query(step=step, episode=episode))


def _env_trajectory(env_id: str, episode: int | None = None, limit: int | None = None,
                    offset: int | None = None) -> _Call[Trajectory]:
    return _Call("GET", f"/v1/envs/{_seg(env_id)}/trajectory", _model_parser(Trajectory),
                 params=_query(episode=episode, limit=limit, offset=offset))


def _env_episodes(env_id: str, limit: int | None, offset: int | None) -> _Call[Page[Episode]]:
    return _Call("GET", f"/v1/envs/{_seg(env_id)}/episodes", _page_parser(Episode),
                 params=_page_params(limit, offset))


def _env_restore(env_id: str, step: int) -> _Call[Env]:
    return _Call("POST", f"/v1/envs/{_seg(env_id)}/restore", _model_parser(Env), json={"step": step})


def _env_fork(env_id: str, step: int | None, count: int) -> _Call[Page[Env]]:
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    return _Call("POST", f"/v1/envs/{_seg(env_id)}/fork", _page_parser(Env),
                 json={"step": step, "count": count})


def _evaluation_create(body: Mapping[str, Any]) -> _Call[EvaluationJob]:
    return _Call("POST", "/v1/evaluations", _model_parser(EvaluationJob), json=dict(body))


def _evaluation_get(evaluation_id: str) -> _Call[EvaluationJob]:
    return _Call("GET", f"/v1/evaluations/{_seg(evaluation_id)}", _model_parser(EvaluationJob))


def _evaluation_list(limit: int | None, offset: int | None) -> _Call[Page[EvaluationJob]]:
    return _Call("GET", "/v1/evaluations", _page_parser(EvaluationJob), params=_page_params(limit, offset))


def _evaluation_cancel(evaluation_id: str) -> _Call[EvaluationJob]:
    return _Call("POST", f"/v1/evaluations/{_seg(evaluation_id)}/cancel", _model_parser(EvaluationJob))


def _ndjson_parser(response: httpx.Response) -> list[EpisodeResult]:
    results = []
    for number, line in enumerate(response.content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            results.append(EpisodeResult.model_validate_json(line))
        except ValidationError as exc:
            raise _invalid_response(response, f"EpisodeResult (line {number})", exc) from exc
    return results


def _evaluation_results(evaluation_id: str, include_transcript: bool) -> _Call[list[EpisodeResult]]:
    params = {"include": "transcript"} if include_transcript else None
    return _Call("GET", f"/v1/evaluations/{_seg(evaluation_id)}/results", _ndjson_parser, params=params)


def _replay_body(episodes: Iterable[Mapping[str, Any]], options: Mapping[str, Any]) -> dict[str, Any]:
    return {"mode": "replay", "episodes": [dict(e) for e in episodes],
            **{k: v for k, v in options.items() if v is not None}}


def _rollout_body(scenario_ids: Iterable[str], model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"mode": "rollout", "scenario_ids": list(scenario_ids), "model": model,
            **{k: v for k, v in options.items() if v is not None}}


# --------------------------------------------------------------------------- transports


def _connection_error(exc: httpx.RequestError, call: _Call[Any]) -> SandpitError:
    if isinstance(exc, httpx.DecodingError):
        return InvalidResponse(_clip(f"{call.method} {call.path}: undecodable response body: {exc}"),
                               code="invalid_response")
    unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    after_send = isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.ReadError
                            | httpx.WriteError | httpx.RemoteProtocolError | httpx.CloseError)
    retry_safe = unsent or (after_send and call.idempotent)
    what = "could not connect" if unsent else "no response"
    return SandpitConnectionError(
        _clip(f"{call.method} {call.path}: {what}: {type(exc).__name__}: {exc}"),
        request_sent=not unsent, retry_safe=retry_safe)


def _retry_sleep(state: tenacity.RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, _RetryAfterError) and exc.retry_after is not None:
        return max(exc.retry_after, _MIN_RETRY_SLEEP_S)
    return float(min(0.25 * 2 ** (state.attempt_number - 1), _MAX_BACKOFF_S))


class _RetryPolicy:
    """What to retry and for how long; shared by both transports."""

    def __init__(self, max_retry_wait_s: float) -> None:
        if max_retry_wait_s < 0:
            raise ValueError("max_retry_wait_s must be >= 0")
        self.max_retry_wait_s = max_retry_wait_s

    def kwargs(self, call: _Call[Any]) -> dict[str, Any]:
        def should_retry(exc: BaseException) -> bool:
            if isinstance(exc, RateLimited | Unavailable):
                return call.retry_busy
            return isinstance(exc, SandpitConnectionError) and exc.retry_safe

        def stop(state: tenacity.RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, SandpitConnectionError) and state.attempt_number >= _TRANSPORT_ATTEMPTS:
                return True
            return state.idle_for + _retry_sleep(state) > self.max_retry_wait_s

        return {"retry": tenacity.retry_if_exception(should_retry), "stop": stop,
                "wait": _retry_sleep, "reraise": True}


def _result(call: _Call[T], response: httpx.Response) -> T:
    if response.is_success:
        return call.parse(response)
    raise _error_from_response(response)


DEFAULT_URL = "http://127.0.0.1:8600"
"""Where `sandpit serve` listens by default."""


def _from_environment(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """`base_url`/`api_key`, or `SANDPIT_URL` (else :data:`DEFAULT_URL`) / `SANDPIT_API_KEY`."""
    return (base_url or os.environ.get("SANDPIT_URL") or DEFAULT_URL,
            api_key if api_key is not None else (os.environ.get("SANDPIT_API_KEY") or None))


def _http_kwargs(base_url: str, api_key: str | None, timeout: float,
                 headers: Mapping[str, str] | None) -> dict[str, Any]:
    merged = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
    if api_key:
        merged["Authorization"] = f"Bearer {api_key}"
    return {"base_url": base_url, "headers": merged, "timeout": httpx.Timeout(timeout),
            "follow_redirects": False}


class _SyncTransport:
    def __init__(self, http: httpx.Client, policy: _RetryPolicy) -> None:
        self.http = http
        self.policy = policy

    def run(self, call: _Call[T]) -> T:
        result: T = tenacity.Retrying(**self.policy.kwargs(call))(self._once, call)
        return result

    def _once(self, call: _Call[T]) -> T:
        try:
            response = self.http.request(call.method, call.path, params=call.params, json=call.json)
        except httpx.RequestError as exc:
            raise _connection_error(exc, call) from exc
        return _result(call, response)


class _AsyncTransport:
    def __init__(self, http: httpx.AsyncClient, policy: _RetryPolicy) -> None:
        self.http = http
        self.policy = policy

    async def run(self, call: _Call[T]) -> T:
        result: T = await tenacity.AsyncRetrying(**self.policy.kwargs(call))(self._once, call)
        return result

    async def _once(self, call: _Call[T]) -> T:
        try:
            response = await self.http.request(call.method, call.path, params=call.params, json=call.json)
        except httpx.RequestError as exc:
            raise _connection_error(exc, call) from exc
        return _result(call, response)


# --------------------------------------------------------------------------- sync surface


class _HandleBase:
    """What sync and async env handles share: the transport, the `Env`, and its id and tools."""

    def __init__(self, transport: _SyncTransport | _AsyncTransport, env: Env) -> None:
        self._t = transport  # type: ignore[assignment]
        self.env = env

    @property
    def id(self) -> str:
        """The env id (`/v1/envs/{id}`)."""
        return self.env.id

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas of the env's tools."""
        return self.env.tools

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, environment_id={self.env.environment_id!r})"


class EnvHandle(_HandleBase):
    """A live env on the server; every method is one HTTP call.

    `env` is the `Env` as of create/get/reset/restore/refresh (its `step` is not advanced by
    `step()`; use the `StepResult`). All methods raise `SandpitError` subclasses: `NotFound`
    once the env is deleted, `Conflict` for a closed/evicted env, `SandpitConnectionError`
    without a response (see the module docstring for what is retried).
    """

    _t: _SyncTransport

    def step(self, name: str, /, **arguments: Any) -> StepResult:
        """Call tool `name` with keyword `arguments` (any names, including `name`).

        Returns the `StepResult`; a tool that raised, timed out or was refused is a result
        with that `status`, not an exception. Never retried after the request was sent.
        """
        return self._t.run(_env_step(self.id, {"name": name, "arguments": arguments}, None))

    def step_call(self, call: object, *, include: Iterable[Include] | None = None) -> StepResult:
        """Run a tool call given as a dict or an openai SDK object (see `tool_call_body`).

        Args:
            call: `{"name", "arguments"}`, an OpenAI tool call dict, or an object with
                `.function.name` / `.function.arguments`.
            include: any of `"state_diff"`, `"state"`: also return the diff / the state
                after the call.

        Raises:
            TypeError: `call` is not a tool call; ValueError: unknown `include` value.
        """
        return self._t.run(_env_step(self.id, call, include))

    def reset(self, init_config: Mapping[str, Any] | None = None, *, scenario_id: str | None = None,
              episode: Mapping[str, Any] | None = None) -> Env:
        """Start a new episode (EnvScaler `reset()`): the returned `Env` has the initial
        `observation`, `tools` and `introduction`. `init_config` None: the scenario's, else
        the env's current one; `scenario_id` None: the current scenario; `episode` None:
        the current episode options. The previous episode stays readable."""
        self.env = self._t.run(_env_reset(self.id, init_config, scenario_id, episode))
        return self.env

    def state(self, step: int | None = None, *, episode: int | None = None) -> dict[str, Any]:
        """The state after `step` of the current episode or of `episode` (None: the latest)."""
        return self.state_view(step, episode=episode).state

    def state_view(self, step: int | None = None, *, episode: int | None = None) -> StateView:
        """Like `state()`, with the episode and step the state belongs to."""
        return self._t.run(_env_state(self.id, step, episode))

    def trajectory(self, episode: int | None = None, *, limit: int | None = None,
                   offset: int | None = None) -> Trajectory:
        """Steps of the current episode (or `episode`): action, observation, status,
        reward, duration (ms); `limit`/`offset` give one page (`count` is the total)."""
        return self._t.run(_env_trajectory(self.id, episode, limit, offset))

    def episodes(self, limit: int | None = None, offset: int | None = None) -> Page[Episode]:
        """Every episode of the env, oldest first (scenario, status, steps, reward)."""
        return self._t.run(_env_episodes(self.id, limit, offset))

    def restore(self, step: int) -> Env:
        """Rewind the current episode to right after `step` (0: the initial state)."""
        self.env = self._t.run(_env_restore(self.id, step))
        return self.env

    def fork(self, step: int | None = None, count: int = 1) -> list[EnvHandle]:
        """`count` new envs, each a copy of this one as of `step` (None: the latest step).

        Raises:
            ValueError: `count` < 1 (checked before sending).
        """
        page = self._t.run(_env_fork(self.id, step, count))
        return [EnvHandle(self._t, env) for env in page.data]

    def refresh(self) -> Env:
        """Re-read the env (`GET /v1/envs/{id}`) and return it."""
        self.env = self._t.run(_env_get(self.id))
        return self.env

    def evaluate(self, checks: list[Mapping[str, str]] | None = None) -> Evaluation:
        """Run check functions (`[{"check_item", "check_func"}]`, or the env's scenario's
        when None) on its initial and current state. Raises `Conflict` (no scenario)."""
        return self._t.run(_env_evaluate(self.id, checks))

    def delete(self) -> None:
        """Close and delete the env; afterwards every call raises `NotFound`."""
        self._t.run(_env_delete(self.id))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.delete()
        except NotFound:
            pass


class _Environments:
    """`client.environments`: registered environment code."""

    def __init__(self, transport: _SyncTransport) -> None:
        self._t = transport

    def create(self, source_code: str, class_name: str, *, name: str | None = None,
               description: str | None = None, policy: str = "standard", introduction: str | None = None,
               rules: Iterable[str] | None = None, argument_checking: str | None = None,
               sample_init_config: Mapping[str, Any] | None = None) -> Environment:
        """Register `source_code` whose class `class_name` is the environment, checked with
        the static `policy` (`strict` | `standard` | `audit`; the returned `policy_report`
        lists every finding, warnings included), its tools derived and the class
        instantiated once with `sample_init_config` in a sandbox. `introduction` and
        `rules` are EnvScaler's `environment_introduction` / `constraints_rules`;
        `argument_checking` (`off` | `warn` | `strict`) the default for its envs.

        Raises:
            InvalidRequest: the code is refused (the field and the reason are in the error).
            PayloadTooLarge: the code exceeds the server's size limit.
        """
        extra = {"introduction": introduction, "rules": list(rules) if rules is not None else None,
                 "argument_checking": argument_checking,
                 "sample_init_config": dict(sample_init_config) if sample_init_config is not None else None}
        return self._t.run(_environment_create(source_code, class_name, name, description, policy, extra))

    def get(self, environment_id: str) -> Environment:
        """One environment. Raises `NotFound`."""
        return self._t.run(_environment_get(environment_id))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[Environment]:
        """A page of the tenant's environments (server default limit when None)."""
        return self._t.run(_environment_list(limit, offset))

    def delete(self, environment_id: str) -> None:
        """Delete an environment. Raises `NotFound`; `Conflict` if the server refuses."""
        self._t.run(_environment_delete(environment_id))


class _Scenarios:
    """`client.scenarios`: EnvScaler scenarios. `create(body)` takes the server's
    `ScenarioCreate` fields (`environment_id`, `task`, `init_config`, `checklist`,
    `checklist_with_func`, `external_id`)."""

    def __init__(self, transport: _SyncTransport) -> None:
        self._t = transport

    def create(self, body: Mapping[str, Any]) -> Scenario:
        """Store a scenario. Raises `NotFound` (environment), `InvalidRequest`."""
        return self._t.run(_scenario_create(body))

    def get(self, scenario_id: str) -> Scenario:
        """One scenario. Raises `NotFound`."""
        return self._t.run(_scenario_get(scenario_id))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[Scenario]:
        """A page of scenarios."""
        return self._t.run(_scenario_list(limit, offset))

    def delete(self, scenario_id: str) -> None:
        """Delete a scenario. Raises `NotFound`."""
        self._t.run(_scenario_delete(scenario_id))


class _AsyncScenarios:
    """`AsyncClient.scenarios`: see `_Scenarios`."""

    def __init__(self, transport: _AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: Mapping[str, Any]) -> Scenario:
        return await self._t.run(_scenario_create(body))

    async def get(self, scenario_id: str) -> Scenario:
        return await self._t.run(_scenario_get(scenario_id))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[Scenario]:
        return await self._t.run(_scenario_list(limit, offset))

    async def delete(self, scenario_id: str) -> None:
        await self._t.run(_scenario_delete(scenario_id))


class _Envs:
    """`client.envs`: live env instances."""

    def __init__(self, transport: _SyncTransport) -> None:
        self._t = transport

    def create(self, environment_id: str | None = None, *, source_code: str | None = None,
               class_name: str | None = None, init_config: Mapping[str, Any] | None = None,
               profile: Profile | Mapping[str, Any] | None = None, scenario_id: str | None = None,
               episode: Mapping[str, Any] | None = None, argument_checking: str | None = None) -> EnvHandle:
        """Start an env from a registered environment, a scenario (`scenario_id`: its
        environment and, unless given, its `init_config`; the env is an episode of it), or
        `source_code` + `class_name`.

        Args:
            init_config: the environment's initial configuration (default `{}`).
            profile: lowered limits (`Profile` or a dict of its fields).
            episode: episode options (`mode`, `max_steps`, `termination_action`,
                `on_tool_error`, `score_truncated`, `user`); see the server's `EpisodeOptions`.
            argument_checking: `off` | `warn` | `strict` (default: the environment's).

        Raises:
            ValueError: neither or both of environment_id / source_code.
            pydantic.ValidationError: `profile` has unknown or mistyped fields.
            NotFound, InvalidRequest, PayloadTooLarge, Unavailable (after retries), ...
        """
        return EnvHandle(self._t, self._t.run(_env_create(environment_id, source_code, class_name,
                                                          init_config, profile, scenario_id, episode,
                                                          argument_checking)))

    def get(self, env_id: str) -> EnvHandle:
        """A handle on an existing env. Raises `NotFound`."""
        return EnvHandle(self._t, self._t.run(_env_get(env_id)))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[Env]:
        """A page of the tenant's envs; `client.envs.get(env.id)` gives a handle."""
        return self._t.run(_env_list(limit, offset))

    def delete(self, env_id: str) -> None:
        """Close and delete an env. Raises `NotFound`."""
        self._t.run(_env_delete(env_id))


class _Evaluations:
    """`client.evaluations`: batch evaluations that run on the server (replay or rollout).

    Usage::

        job = client.evaluations.rollout(scenario_ids, model="qwen3-8b", base_url="http://.../v1",
                                         api_key=key, max_steps=30)
        job = client.evaluations.wait(job.id)
        job.summary.mean_reward, client.evaluations.results(job.id)
    """

    def __init__(self, transport: _SyncTransport) -> None:
        self._t = transport

    def create(self, body: Mapping[str, Any]) -> EvaluationJob:
        """Start an evaluation from the server's `EvaluationCreate` fields. Raises
        `NotFound` (a scenario id; `field` names the index), `InvalidRequest`,
        `RateLimited` (`max_active_evaluations`, `max_evaluation_concurrency`)."""
        return self._t.run(_evaluation_create(body))

    def replay(self, episodes: Iterable[Mapping[str, Any]], *, concurrency: int | None = None,
               keep_envs: bool | None = None) -> EvaluationJob:
        """Score given trajectories: `episodes` are `{"scenario_id", "tool_calls": [...]}`
        (tool calls as `{"name", "arguments"}` or OpenAI tool calls)."""
        return self.create(_replay_body(episodes, {"concurrency": concurrency, "keep_envs": keep_envs}))

    def rollout(self, scenario_ids: Iterable[str], *, model: str, base_url: str | None = None,
                api_key: str | None = None, **options: Any) -> EvaluationJob:
        """Let the server run the agent loop with `model` at `base_url` (default: the
        tenant's) on each scenario. `options`: `max_steps`, `temperature`, `max_tokens`,
        `request_timeout_s`, `retries`, `retry_initial_s`, `retry_max_s`, `concurrency`,
        `keep_envs`. The API key is sent once and never returned."""
        return self.create(_rollout_body(scenario_ids, model, {"base_url": base_url, "api_key": api_key, **options}))

    def get(self, evaluation_id: str) -> EvaluationJob:
        """Status and progress (`summary` once finished). Raises `NotFound`."""
        return self._t.run(_evaluation_get(evaluation_id))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[EvaluationJob]:
        """A page of the tenant's evaluations, newest first."""
        return self._t.run(_evaluation_list(limit, offset))

    def cancel(self, evaluation_id: str) -> EvaluationJob:
        """Cancel (pending episodes are dropped, running ones stop at their next step).
        Raises `NotFound`, `Conflict` (already completed)."""
        return self._t.run(_evaluation_cancel(evaluation_id))

    def results(self, evaluation_id: str, *, include_transcript: bool = False) -> list[EpisodeResult]:
        """Every finished episode, in index order. Raises `NotFound`."""
        return self._t.run(_evaluation_results(evaluation_id, include_transcript))

    def wait(self, evaluation_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None,
             on_progress: Callable[[EvaluationJob], None] | None = None) -> EvaluationJob:
        """Poll every `poll_s` seconds until the evaluation is finished; returns it.
        `on_progress(job)` sees every poll. Raises `TimeoutError` after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get(evaluation_id)
            if on_progress is not None:
                on_progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"evaluation {evaluation_id} not finished after {timeout_s} s "
                                   f"({job.progress.done + job.progress.errors}/{job.total} episodes)")
            time.sleep(poll_s)


class Client:
    """Synchronous Sandpit client over one `httpx.Client` (a context manager closes it).

    Args:
        base_url: e.g. `http://127.0.0.1:8000` (paths `/v1/...` are appended); default the
            `SANDPIT_URL` environment variable, else `http://127.0.0.1:8600`.
        api_key: sent as `Authorization: Bearer <api_key>`; default `SANDPIT_API_KEY`.
        timeout: seconds for connect, read, write and pool each; a step that takes longer
            raises `SandpitConnectionError(request_sent=True)` and is not retried.
        max_retry_wait_s: total seconds one call may spend sleeping between retries (429/503
            honoring Retry-After; transport failures that are safe to repeat); 0 disables.
        transport: an httpx transport (tests, proxies); default a normal connection pool.
        headers: extra headers for every request.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retry_wait_s: float = 30.0, *, transport: httpx.BaseTransport | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        policy = _RetryPolicy(max_retry_wait_s)
        base_url, api_key = _from_environment(base_url, api_key)
        self._http = httpx.Client(transport=transport, **_http_kwargs(base_url, api_key, timeout, headers))
        self._t = _SyncTransport(self._http, policy)
        self.environments = _Environments(self._t)
        self.envs = _Envs(self._t)
        self.scenarios = _Scenarios(self._t)
        self.evaluations = _Evaluations(self._t)

    def validate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`POST /v1/validate` (fields as the server's `ValidateRequest`); the verdict dict."""
        return self._t.run(_validate(body))

    def execute(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None,
                files: Mapping[str, str] | None = None) -> ExecResult:
        """Run `code` as a script in a sandbox (`POST /v1/execute`)."""
        return self._t.run(_execute({"code": code, "stdin": stdin, "timeout_s": timeout_s, "files": dict(files or {})}))

    def health(self) -> dict[str, Any]:
        """`GET /healthz`: the process is up. Raises `SandpitError` otherwise."""
        return self._t.run(_health())

    def ready(self) -> bool:
        """`GET /readyz`: True when the server can take work, False on 503 (not retried)."""
        try:
            self._t.run(_ready())
        except Unavailable:
            return False
        return True

    def close(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        self._http.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        # a connection pool is shared, never copied: gymnasium deep-copies an env's
        # constructor kwargs (`spec.make()`), which carry the client
        return self

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --------------------------------------------------------------------------- async surface


class AsyncEnvHandle(_HandleBase):
    """Async `EnvHandle`: the same methods, awaited; same results and errors."""

    _t: _AsyncTransport

    async def step(self, name: str, /, **arguments: Any) -> StepResult:
        """See `EnvHandle.step`."""
        return await self._t.run(_env_step(self.id, {"name": name, "arguments": arguments}, None))

    async def step_call(self, call: object, *, include: Iterable[Include] | None = None) -> StepResult:
        """See `EnvHandle.step_call`."""
        return await self._t.run(_env_step(self.id, call, include))

    async def reset(self, init_config: Mapping[str, Any] | None = None, *, scenario_id: str | None = None,
                    episode: Mapping[str, Any] | None = None) -> Env:
        """See `EnvHandle.reset`."""
        self.env = await self._t.run(_env_reset(self.id, init_config, scenario_id, episode))
        return self.env

    async def state(self, step: int | None = None, *, episode: int | None = None) -> dict[str, Any]:
        """See `EnvHandle.state`."""
        return (await self.state_view(step, episode=episode)).state

    async def state_view(self, step: int | None = None, *, episode: int | None = None) -> StateView:
        """See `EnvHandle.state_view`."""
        return await self._t.run(_env_state(self.id, step, episode))

    async def trajectory(self, episode: int | None = None, *, limit: int | None = None,
                         offset: int | None = None) -> Trajectory:
        """See `EnvHandle.trajectory`."""
        return await self._t.run(_env_trajectory(self.id, episode, limit, offset))

    async def episodes(self, limit: int | None = None, offset: int | None = None) -> Page[Episode]:
        """See `EnvHandle.episodes`."""
        return await self._t.run(_env_episodes(self.id, limit, offset))

    async def restore(self, step: int) -> Env:
        """See `EnvHandle.restore`."""
        self.env = await self._t.run(_env_restore(self.id, step))
        return self.env

    async def fork(self, step: int | None = None, count: int = 1) -> list[AsyncEnvHandle]:
        """See `EnvHandle.fork`."""
        page = await self._t.run(_env_fork(self.id, step, count))
        return [AsyncEnvHandle(self._t, env) for env in page.data]

    async def refresh(self) -> Env:
        """See `EnvHandle.refresh`."""
        self.env = await self._t.run(_env_get(self.id))
        return self.env

    async def delete(self) -> None:
        """See `EnvHandle.delete`."""
        await self._t.run(_env_delete(self.id))

    async def evaluate(self, checks: list[Mapping[str, str]] | None = None) -> Evaluation:
        """See `EnvHandle.evaluate`."""
        return await self._t.run(_env_evaluate(self.id, checks))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.delete()
        except NotFound:
            pass


class _AsyncEnvironments:
    """`async_client.environments`; see `Client.environments` for arguments and errors."""

    def __init__(self, transport: _AsyncTransport) -> None:
        self._t = transport

    async def create(self, source_code: str, class_name: str, *, name: str | None = None,
                     description: str | None = None, policy: str = "standard", introduction: str | None = None,
                     rules: Iterable[str] | None = None, argument_checking: str | None = None,
                     sample_init_config: Mapping[str, Any] | None = None) -> Environment:
        """See `Client.environments.create`."""
        extra = {"introduction": introduction, "rules": list(rules) if rules is not None else None,
                 "argument_checking": argument_checking,
                 "sample_init_config": dict(sample_init_config) if sample_init_config is not None else None}
        return await self._t.run(_environment_create(source_code, class_name, name, description, policy, extra))

    async def get(self, environment_id: str) -> Environment:
        """See `Client.environments.get`."""
        return await self._t.run(_environment_get(environment_id))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[Environment]:
        """See `Client.environments.list`."""
        return await self._t.run(_environment_list(limit, offset))

    async def delete(self, environment_id: str) -> None:
        """See `Client.environments.delete`."""
        await self._t.run(_environment_delete(environment_id))


class _AsyncEnvs:
    """`async_client.envs`; see `Client.envs` for arguments and errors."""

    def __init__(self, transport: _AsyncTransport) -> None:
        self._t = transport

    async def create(self, environment_id: str | None = None, *, source_code: str | None = None,
                     class_name: str | None = None, init_config: Mapping[str, Any] | None = None,
                     profile: Profile | Mapping[str, Any] | None = None,
                     scenario_id: str | None = None, episode: Mapping[str, Any] | None = None,
                     argument_checking: str | None = None) -> AsyncEnvHandle:
        """See `Client.envs.create`."""
        call = _env_create(environment_id, source_code, class_name, init_config, profile, scenario_id, episode,
                           argument_checking)
        return AsyncEnvHandle(self._t, await self._t.run(call))

    async def get(self, env_id: str) -> AsyncEnvHandle:
        """See `Client.envs.get`."""
        return AsyncEnvHandle(self._t, await self._t.run(_env_get(env_id)))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[Env]:
        """See `Client.envs.list`."""
        return await self._t.run(_env_list(limit, offset))

    async def delete(self, env_id: str) -> None:
        """See `Client.envs.delete`."""
        await self._t.run(_env_delete(env_id))


class _AsyncEvaluations:
    """`AsyncClient.evaluations`: see `_Evaluations`."""

    def __init__(self, transport: _AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: Mapping[str, Any]) -> EvaluationJob:
        return await self._t.run(_evaluation_create(body))

    async def replay(self, episodes: Iterable[Mapping[str, Any]], *, concurrency: int | None = None,
                     keep_envs: bool | None = None) -> EvaluationJob:
        return await self.create(_replay_body(episodes, {"concurrency": concurrency, "keep_envs": keep_envs}))

    async def rollout(self, scenario_ids: Iterable[str], *, model: str, base_url: str | None = None,
                      api_key: str | None = None, **options: Any) -> EvaluationJob:
        return await self.create(_rollout_body(scenario_ids, model,
                                               {"base_url": base_url, "api_key": api_key, **options}))

    async def get(self, evaluation_id: str) -> EvaluationJob:
        return await self._t.run(_evaluation_get(evaluation_id))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[EvaluationJob]:
        return await self._t.run(_evaluation_list(limit, offset))

    async def cancel(self, evaluation_id: str) -> EvaluationJob:
        return await self._t.run(_evaluation_cancel(evaluation_id))

    async def results(self, evaluation_id: str, *, include_transcript: bool = False) -> list[EpisodeResult]:
        return await self._t.run(_evaluation_results(evaluation_id, include_transcript))

    async def wait(self, evaluation_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None,
                   on_progress: Callable[[EvaluationJob], None] | None = None) -> EvaluationJob:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.get(evaluation_id)
            if on_progress is not None:
                on_progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"evaluation {evaluation_id} not finished after {timeout_s} s")
            await asyncio.sleep(poll_s)


class AsyncClient:
    """Asynchronous Sandpit client over one `httpx.AsyncClient`; arguments as `Client`.

    Use `async with AsyncClient(...) as client:` or `await client.aclose()`.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retry_wait_s: float = 30.0, *, transport: httpx.AsyncBaseTransport | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        policy = _RetryPolicy(max_retry_wait_s)
        base_url, api_key = _from_environment(base_url, api_key)
        self._http = httpx.AsyncClient(transport=transport,
                                       **_http_kwargs(base_url, api_key, timeout, headers))
        self._t = _AsyncTransport(self._http, policy)
        self.environments = _AsyncEnvironments(self._t)
        self.envs = _AsyncEnvs(self._t)
        self.scenarios = _AsyncScenarios(self._t)
        self.evaluations = _AsyncEvaluations(self._t)

    async def validate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """See `Client.validate`."""
        return await self._t.run(_validate(body))

    async def execute(self, code: str, *, stdin: str | None = None, timeout_s: float | None = None,
                      files: Mapping[str, str] | None = None) -> ExecResult:
        """See `Client.execute`."""
        return await self._t.run(_execute({"code": code, "stdin": stdin, "timeout_s": timeout_s,
                                            "files": dict(files or {})}))

    async def health(self) -> dict[str, Any]:
        """See `Client.health`."""
        return await self._t.run(_health())

    async def ready(self) -> bool:
        """See `Client.ready`."""
        try:
            await self._t.run(_ready())
        except Unavailable:
            return False
        return True

    async def aclose(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        await self._http.aclose()

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        return self  # shared, never copied (see `Client.__deepcopy__`)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
