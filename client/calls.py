"""The API's endpoints as data, independent of any transport (sans-IO).

Each builder returns a :class:`Call`: method, path, query, JSON body, which key
authorises it, and how to read a 2xx answer. The sync and async clients hand the same
`Call`s to their transport, so what is sent and how it is parsed is written once; the
contract test validates these bodies and models against the server's OpenAPI document.
Builders check what can be checked before sending (`ValueError` / `TypeError`); the
server judges the rest.
"""

from __future__ import annotations

import json
import reprlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from .attempts import Attempt
from .batch import MAX_BATCH_STEPS, BatchStepReply
from .cluster_models import ClusterStatus, HostDrain, HostUndrain
from .errors import invalid_response
from .models import (
    ApiKey,
    AuditEvent,
    Env,
    Environment,
    EnvironmentStats,
    Episode,
    EpisodeResult,
    Evaluation,
    EvaluationJob,
    ExecResult,
    Include,
    Page,
    Profile,
    Scenario,
    ScenarioStats,
    StateView,
    StepResult,
    Tenant,
    Trajectory,
)

__all__ = ["Call", "step_action", "tool_call_body"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

INCLUDE_VALUES = frozenset({"state_diff", "state"})
Auth = Literal["tenant", "operator"]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call: what to send and how to read the answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str] | None = None
    retry_busy: bool = True
    """Retry 429/503 within the wait budget (off for readiness probes)."""
    auth: Auth = "tenant"
    """Which key the request carries: the tenant's API key, or the operator key (`/v1/admin`)."""
    model: type[BaseModel] | None = None
    """The model a 2xx body is read into (None: no body, or a plain JSON object)."""
    attempt: str | None = None
    """Sent as ``Sandpit-Attempt``: the env's attempt token (`EnvHandle.resume`); the
    server refuses the call (409 ``stale_attempt``) once the env was resumed again."""
    idempotency_key: str | None = None
    """Sent as ``Idempotency-Key`` (step, reset, create, fork: a new uuid4 per call,
    the same on its retries): the server runs the call at most once."""
    keyed_body: bool = False
    """Every action in the body carries its own idempotency key (the batched step): the
    server runs each at most once, so the call may be sent again."""

    @property
    def idempotent(self) -> bool:
        """Whether sending the call again cannot do anything twice (a GET, or a call with
        an idempotency key or keyed actions): the transport then retries it after a lost
        connection."""
        return self.method == "GET" or self.idempotency_key is not None or self.keyed_body


def _new_key() -> str:
    """A fresh idempotency key (uuid4): one per logical call."""
    return str(uuid.uuid4())


# --------------------------------------------------------------------------- parsers


def _model_parser(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        try:
            return model.model_validate_json(response.content)
        except ValidationError as exc:
            raise invalid_response(response, model.__name__, exc) from exc
    return parse


def _no_content(response: httpx.Response) -> None:
    return None


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError as exc:
        raise invalid_response(response, "JSON object", exc) from exc
    if not isinstance(body, dict):
        raise invalid_response(response, "JSON object", None)
    return body


def _ndjson_parser(response: httpx.Response) -> list[EpisodeResult]:
    results = []
    for number, line in enumerate(response.content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            results.append(EpisodeResult.model_validate_json(line))
        except ValidationError as exc:
            raise invalid_response(response, f"EpisodeResult (line {number})", exc) from exc
    return results


def _read(method: str, path: str, model: type[M], **fields: Any) -> Call[M]:
    """A call whose 2xx body is one `model`."""
    return Call(method, path, _model_parser(model), model=model, **fields)


# --------------------------------------------------------------------------- parameters


def _seg(value: str) -> str:
    """An id as one path segment: `/`, `..` and the like cannot change the route."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"id must be a non-empty string, not {value!r}")
    return quote(value, safe="")


def _query(**values: Any) -> dict[str, str] | None:
    params = {k: str(v) for k, v in values.items() if v is not None}
    return params or None


def _page_params(limit: int | None, offset: int | None) -> dict[str, str] | None:
    return _query(limit=limit, offset=offset)


def _include_params(include: Iterable[Include] | Include | None) -> dict[str, str] | None:
    if not include:
        return None
    values: list[str] = [include] if isinstance(include, str) else list(include)
    unknown = [v for v in values if v not in INCLUDE_VALUES]
    if unknown:
        raise ValueError(f"include accepts {sorted(INCLUDE_VALUES)}, not {unknown}")
    return {"include": ",".join(dict.fromkeys(values))}


NOT_A_TOOL_CALL = "<not a tool call>"
"""Name of the stand-in call sent for an action that cannot be sent as given (not a tool
name, so the server records it as a `rejected` step with `Error: Invalid action`)."""


def stand_in_body(action: object, why: str) -> tuple[dict[str, Any], str]:
    """The stand-in call for `action` that cannot be sent as given: `(body, why)` with
    `body` = `{"name": NOT_A_TOOL_CALL, "arguments": {"type", "repr"}}` (the repr cut to
    200 characters), which the server records as a `rejected` step. Never raises."""
    short = reprlib.Repr()
    short.maxstring = short.maxother = 200
    return {"name": NOT_A_TOOL_CALL, "arguments": {"type": type(action).__name__, "repr": short.repr(action)}}, why


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


def step_action(call: object, arguments: Mapping[str, Any]) -> object:
    """The action `EnvHandle.step(call, **arguments)` sends, in a shape `tool_call_body` takes.

    - `call` a string: the name of the tool, called with keyword `arguments` (any names,
      `text` and `name` included): `{"name": call, "arguments": arguments}`;
    - `call` a dict or an object (an OpenAI chat tool call `{"id", "type": "function",
      "function": {"name", "arguments": "<json string>"}}`, `{"name", "arguments"}`,
      `{"text"}`, an openai SDK tool call): that action as it is; its arguments are its own;
    - `call` None and `arguments` exactly `{"text": str}`: raw model output
      (`tool_call_body`'s string form: the server parses the `<tool_call>` format).

    Raises:
        TypeError, before anything is sent (so no step is recorded): keyword arguments
        beside a dict or object call (its arguments would be ambiguous); `text=` beside
        other keywords or not a string; neither a call nor `text=`; a `call` none of
        `tool_call_body`'s shapes.
    """
    if isinstance(call, str):
        return {"name": call, "arguments": dict(arguments)}
    if call is None:
        if set(arguments) != {"text"}:
            if not arguments:
                raise TypeError("step() needs a tool name, a tool call, or text=")
            raise TypeError("keyword arguments need a tool name: step('tool_name', **arguments); "
                            "text= (raw model output) goes alone")
        text = arguments["text"]
        if not isinstance(text, str):
            raise TypeError(f"text= must be a string (raw model output), not {type(text).__name__}")
        return text
    if arguments:
        raise TypeError(f"a tool call given as {type(call).__name__} carries its own arguments; "
                        f"keyword arguments ({', '.join(sorted(arguments))}) go with a tool name only")
    tool_call_body(call)  # its TypeError for a shape that is no tool call, before sending
    return call


def _tool_call_parts(name: object, arguments: object) -> tuple[str, dict[str, Any]]:
    name = "" if name is None else name if isinstance(name, str) else str(name)
    if isinstance(arguments, str):
        return name, {"type": "function", "function": {"name": name, "arguments": arguments}}
    if arguments is None:
        arguments = {}
    if isinstance(arguments, Mapping):
        arguments = dict(arguments)
    return name, {"name": name, "arguments": arguments}


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# --------------------------------------------------------------------------- service


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", _json_object)


def ready() -> Call[None]:
    return Call("GET", "/readyz", _no_content, retry_busy=False)


def validate(body: Mapping[str, Any]) -> Call[dict[str, Any]]:
    return Call("POST", "/v1/validate", _json_object, json=dict(body))


def execute(code: str, stdin: str | None, timeout_s: float | None, files: Mapping[str, str] | None) -> Call[ExecResult]:
    return _read("POST", "/v1/execute", ExecResult,
                 json={"code": code, "stdin": stdin, "timeout_s": timeout_s, "files": dict(files or {})})


# --------------------------------------------------------------------------- environments


def environment_create(source_code: str, class_name: str, name: str | None, description: str | None,
                       policy: str = "standard", extra: Mapping[str, Any] | None = None) -> Call[Environment]:
    body = {"name": name, "source_code": source_code, "class_name": class_name, "description": description,
            "policy": policy}
    body.update(_without_none(extra or {}))
    return _read("POST", "/v1/environments", Environment, json=body)


def environment_get(environment_id: str) -> Call[Environment]:
    return _read("GET", f"/v1/environments/{_seg(environment_id)}", Environment)


def environment_list(limit: int | None, offset: int | None) -> Call[Page[Environment]]:
    return _read("GET", "/v1/environments", Page[Environment], params=_page_params(limit, offset))


def _stats_params(kind: str | None, since: datetime | str | None, recent: int | None,
                  limit: int | None = None, offset: int | None = None) -> dict[str, str] | None:
    return _query(kind=kind, since=since.isoformat() if isinstance(since, datetime) else since, recent=recent,
                  limit=limit, offset=offset)


def environment_stats(environment_id: str, kind: str | None = None, since: datetime | str | None = None,
                      recent: int | None = None, limit: int | None = None,
                      offset: int | None = None) -> Call[EnvironmentStats]:
    return _read("GET", f"/v1/environments/{_seg(environment_id)}/stats", EnvironmentStats,
                 params=_stats_params(kind, since, recent, limit, offset))


def environment_delete(environment_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/environments/{_seg(environment_id)}", _no_content)


# --------------------------------------------------------------------------- scenarios


def scenario_create(body: Mapping[str, Any]) -> Call[Scenario]:
    return _read("POST", "/v1/scenarios", Scenario, json=dict(body))


def scenario_get(scenario_id: str) -> Call[Scenario]:
    return _read("GET", f"/v1/scenarios/{_seg(scenario_id)}", Scenario)


def scenario_list(limit: int | None, offset: int | None, environment_id: str | None = None) -> Call[Page[Scenario]]:
    return _read("GET", "/v1/scenarios", Page[Scenario],
                 params=_query(limit=limit, offset=offset, environment_id=environment_id))


def scenario_stats(scenario_id: str, kind: str | None = None, since: datetime | str | None = None,
                   recent: int | None = None) -> Call[ScenarioStats]:
    return _read("GET", f"/v1/scenarios/{_seg(scenario_id)}/stats", ScenarioStats,
                 params=_stats_params(kind, since, recent))


def scenario_delete(scenario_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/scenarios/{_seg(scenario_id)}", _no_content)


# --------------------------------------------------------------------------- envs


def env_create(environment_id: str | None, source_code: str | None, class_name: str | None,
               init_config: Mapping[str, Any] | None, profile: Profile | Mapping[str, Any] | None,
               scenario_id: str | None = None, episode: Mapping[str, Any] | None = None,
               argument_checking: str | None = None, seed: int | None = None) -> Call[Env]:
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
    if seed is not None:
        body["seed"] = seed
    return _read("POST", "/v1/envs", Env, json=body, idempotency_key=_new_key())


def env_get(env_id: str) -> Call[Env]:
    return _read("GET", f"/v1/envs/{_seg(env_id)}", Env)


def env_list(limit: int | None, offset: int | None) -> Call[Page[Env]]:
    return _read("GET", "/v1/envs", Page[Env], params=_page_params(limit, offset))


def env_delete(env_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/envs/{_seg(env_id)}", _no_content)


def env_step(env_id: str, call: object, include: Iterable[Include] | None) -> Call[StepResult]:
    _, body = tool_call_body(call)
    return _read("POST", f"/v1/envs/{_seg(env_id)}/step", StepResult, json=body, params=_include_params(include),
                 idempotency_key=_new_key())


def envs_step(steps: Sequence[tuple[str, object]], include: Iterable[Include] | None = None,
              attempts: Sequence[str | None] | None = None) -> Call[BatchStepReply]:
    """`POST /v1/envs:step` for `steps` (`(env id, action)`: an action as `env_step`
    takes it; each gets its own idempotency key), `attempts[i]` the i-th env's attempt
    token (None: unfenced).

    Raises:
        ValueError: no steps, more than `MAX_BATCH_STEPS`, an env twice, an unknown
            `include`, `attempts` of another length; TypeError: an action that is no
            tool call (before anything is sent).
    """
    if not steps:
        raise ValueError("a batch needs at least one step")
    if len(steps) > MAX_BATCH_STEPS:
        raise ValueError(f"a batch holds at most {MAX_BATCH_STEPS} steps, not {len(steps)}")
    if attempts is not None and len(attempts) != len(steps):
        raise ValueError(f"attempts has {len(attempts)} tokens for {len(steps)} steps")
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    for index, (env_id, action) in enumerate(steps):
        if env_id in seen:
            raise ValueError(f"env {env_id!r} is in the batch twice: one step per env")
        seen.add(env_id)
        item: dict[str, Any] = {"env_id": env_id, "action": tool_call_body(action)[1], "idempotency_key": _new_key()}
        if attempts is not None and attempts[index] is not None:
            item["attempt"] = attempts[index]
        items.append(item)
    body: dict[str, Any] = {"steps": items}
    params = _include_params(include)
    if params is not None:
        body["include"] = params["include"]
    return _read("POST", "/v1/envs:step", BatchStepReply, json=body, keyed_body=True)


def env_reset(env_id: str, init_config: Mapping[str, Any] | None, scenario_id: str | None = None,
              episode: Mapping[str, Any] | None = None, seed: int | None = None) -> Call[Env]:
    body: dict[str, Any] = {"init_config": None if init_config is None else dict(init_config)}
    if scenario_id is not None:
        body["scenario_id"] = scenario_id
    if episode is not None:
        body["episode"] = dict(episode)
    if seed is not None:
        body["seed"] = seed
    return _read("POST", f"/v1/envs/{_seg(env_id)}/reset", Env, json=body, idempotency_key=_new_key())


def env_state(env_id: str, step: int | None, episode: int | None = None) -> Call[StateView]:
    return _read("GET", f"/v1/envs/{_seg(env_id)}/state", StateView, params=_query(step=step, episode=episode))


def env_trajectory(env_id: str, episode: int | None = None, limit: int | None = None,
                   offset: int | None = None) -> Call[Trajectory]:
    return _read("GET", f"/v1/envs/{_seg(env_id)}/trajectory", Trajectory,
                 params=_query(episode=episode, limit=limit, offset=offset))


def env_episodes(env_id: str, limit: int | None, offset: int | None) -> Call[Page[Episode]]:
    return _read("GET", f"/v1/envs/{_seg(env_id)}/episodes", Page[Episode], params=_page_params(limit, offset))


def env_resume(env_id: str) -> Call[Attempt]:
    return _read("POST", f"/v1/envs/{_seg(env_id)}/attempts", Attempt)


def env_restore(env_id: str, step: int) -> Call[Env]:
    return _read("POST", f"/v1/envs/{_seg(env_id)}/restore", Env, json={"step": step})


def env_fork(env_id: str, step: int | None, count: int) -> Call[Page[Env]]:
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    return _read("POST", f"/v1/envs/{_seg(env_id)}/fork", Page[Env], json={"step": step, "count": count},
                 idempotency_key=_new_key())


def env_evaluate(env_id: str, checks: list[Mapping[str, str]] | None,
                 check_objects: str | None = None) -> Call[Evaluation]:
    body: dict[str, Any] = {"checks": [dict(c) for c in checks]} if checks is not None else {}
    if check_objects is not None:
        body["check_objects"] = check_objects
    return _read("POST", f"/v1/envs/{_seg(env_id)}/evaluate", Evaluation, json=body)


# --------------------------------------------------------------------------- evaluations


def replay_body(episodes: Iterable[Mapping[str, Any]], options: Mapping[str, Any]) -> dict[str, Any]:
    """`POST /v1/evaluations` body of a replay: `episodes` and the options given."""
    return {"mode": "replay", "episodes": [dict(e) for e in episodes], **_without_none(options)}


def rollout_body(scenario_ids: Iterable[str], model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`POST /v1/evaluations` body of a rollout: scenarios, model and the options given."""
    return {"mode": "rollout", "scenario_ids": list(scenario_ids), "model": model, **_without_none(options)}


def evaluation_create(body: Mapping[str, Any]) -> Call[EvaluationJob]:
    return _read("POST", "/v1/evaluations", EvaluationJob, json=dict(body))


def evaluation_get(evaluation_id: str) -> Call[EvaluationJob]:
    return _read("GET", f"/v1/evaluations/{_seg(evaluation_id)}", EvaluationJob)


def evaluation_list(limit: int | None, offset: int | None) -> Call[Page[EvaluationJob]]:
    return _read("GET", "/v1/evaluations", Page[EvaluationJob], params=_page_params(limit, offset))


def evaluation_cancel(evaluation_id: str) -> Call[EvaluationJob]:
    return _read("POST", f"/v1/evaluations/{_seg(evaluation_id)}/cancel", EvaluationJob)


def evaluation_results(evaluation_id: str, include_transcript: bool) -> Call[list[EpisodeResult]]:
    params = {"include": "transcript"} if include_transcript else None
    return Call("GET", f"/v1/evaluations/{_seg(evaluation_id)}/results", _ndjson_parser, params=params,
                model=EpisodeResult)


# --------------------------------------------------------------------------- admin (operator key)


def tenant_create(tenant_id: str, fields: Mapping[str, Any]) -> Call[Tenant]:
    return _read("POST", "/v1/admin/tenants", Tenant, json={"id": tenant_id, **_without_none(fields)},
                 auth="operator")


def tenant_list() -> Call[Page[Tenant]]:
    return _read("GET", "/v1/admin/tenants", Page[Tenant], auth="operator")


def tenant_get(tenant_id: str) -> Call[Tenant]:
    return _read("GET", f"/v1/admin/tenants/{_seg(tenant_id)}", Tenant, auth="operator")


def tenant_update(tenant_id: str, fields: Mapping[str, Any]) -> Call[Tenant]:
    return _read("PATCH", f"/v1/admin/tenants/{_seg(tenant_id)}", Tenant, json=_without_none(fields),
                 auth="operator")


def key_create(tenant_id: str, name: str | None, expires_in_s: float | None) -> Call[ApiKey]:
    return _read("POST", f"/v1/admin/tenants/{_seg(tenant_id)}/keys", ApiKey,
                 json=_without_none({"name": name, "expires_in_s": expires_in_s}), auth="operator")


def key_list(tenant_id: str) -> Call[Page[ApiKey]]:
    return _read("GET", f"/v1/admin/tenants/{_seg(tenant_id)}/keys", Page[ApiKey], auth="operator")


def key_revoke(key_id: str) -> Call[ApiKey]:
    return _read("POST", f"/v1/admin/keys/{_seg(key_id)}/revoke", ApiKey, auth="operator")


def cluster_status() -> Call[ClusterStatus]:
    return _read("GET", "/v1/admin/cluster", ClusterStatus, auth="operator")


def cluster_drain(host: str, force: bool) -> Call[HostDrain]:
    return _read("POST", f"/v1/admin/cluster/hosts/{_seg(host)}/drain", HostDrain,
                 params={"force": "true"} if force else None, auth="operator")


def cluster_undrain(host: str) -> Call[HostUndrain]:
    return _read("POST", f"/v1/admin/cluster/hosts/{_seg(host)}/undrain", HostUndrain, auth="operator")


def audit_list(tenant: str | None, action: str | None, limit: int | None,
               offset: int | None) -> Call[Page[AuditEvent]]:
    return _read("GET", "/v1/admin/audit", Page[AuditEvent], auth="operator",
                 params=_query(tenant=tenant, action=action, limit=limit, offset=offset))
