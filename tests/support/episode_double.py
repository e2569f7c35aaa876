"""An in-process stand-in for Sandpit's env and episode routes, for unit tests of the RL
adapters (never a real sandbox: the "environment" is a counter kept in a dict).

``EpisodeDouble().client()`` / ``.async_client()`` give real ``sandpit.client``
clients over an ``httpx.MockTransport`` whose handler imitates the HTTP contract: ``POST
/v1/envs`` (from a scenario or an environment, with ``episode`` options), ``/reset``,
``/step`` (``{"name","arguments"}``, an OpenAI tool call or ``{"text"}``), the batched
step ``POST /v1/envs:step`` (each step's outcome as the step route would answer it),
``GET``/``DELETE /v1/envs/{id}`` and ``GET /v1/scenarios``. Episode semantics follow the server
(``api/envs/episodes.py``): a malformed action is a recorded ``rejected`` step, ``chat_with_user``
ends a non-conversational episode with ``Task finished``, ``max_steps`` truncates, a step
after the end is 409 ``episode_ended``, and the reward is the mean of two checks on the
final state (``count == target``, ``count > 0``). A conversational episode's "user"
answers ``###STOP###`` to a message containing ``done``.

``requests`` logs ``(method, path, body)``; ``expire(env_id)`` makes an env expired (reset
answers 409, ``GET`` shows it closed); text actions over ``max_text_bytes`` answer 413.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sandpit.client import AsyncClient, Client

TOOLS = [
    {"type": "function", "function": {"name": "bump", "description": "Add `by` to the counter.",
                                      "parameters": {"type": "object", "properties": {"by": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "fail", "description": "Raise.",
                                      "parameters": {"type": "object", "properties": {}}}},
]
CHAT = {"type": "function", "function": {"name": "chat_with_user", "description": "Finish or talk.",
                                         "parameters": {"type": "object", "properties": {
                                             "content": {"type": "string"}}, "required": ["content"]}}}
DEFAULT_EPISODE = {"mode": "non_conversational", "max_steps": 30, "termination_action": "chat_with_user",
                   "on_tool_error": "continue", "score_truncated": True}
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass
class FakeScenario:
    id: str
    task: str
    target: int
    init_config: dict[str, Any] = field(default_factory=lambda: {"count": 0})
    created_at: str = "2026-01-01T00:00:00+00:00"


@dataclass
class FakeEnv:
    id: str
    environment_id: str
    scenario: FakeScenario | None
    config: dict[str, Any]
    init_config: dict[str, Any]
    episode: int = 1
    step: int = 0
    count: int = 0
    status: str = "running"
    reward: float | None = None
    closed: bool = False
    expires_at: datetime = field(default_factory=lambda: datetime.now(UTC) + timedelta(hours=1))


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class EpisodeDouble:
    def __init__(self, max_text_bytes: int = 10_000) -> None:
        self.max_text_bytes = max_text_bytes
        self.scenarios = {s.id: s for s in (FakeScenario("scn_a", "Make the counter 2.", 2),
                                              FakeScenario("scn_b", "Make the counter 3.", 3),
                                              FakeScenario("scn_c", "Make the counter 1.", 1))}
        self.envs: dict[str, FakeEnv] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()

    def client(self) -> Client:
        return Client("http://double", api_key="k", transport=httpx.MockTransport(self.handle), max_retry_wait_s=0)

    def async_client(self) -> AsyncClient:
        return AsyncClient("http://double", api_key="k", transport=httpx.MockTransport(self.handle),
                           max_retry_wait_s=0)

    def calls(self, method: str, suffix: str = "") -> list[Any]:
        return [body for m, path, body in self.requests if m == method and path.endswith(suffix)]

    def expire(self, env_id: str) -> None:
        self.envs[env_id].expires_at = datetime.now(UTC) - timedelta(seconds=1)

    # -- routing --------------------------------------------------------------------
    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        with self.lock:
            self.requests.append((request.method, request.url.path, body))
            try:
                status, payload = self._route(request.method, request.url.path.split("/")[2:], body)
            except ApiError as exc:
                status, payload = exc.status, {"error": {"code": exc.code, "message": exc.message, "field": None}}
        if status == 204:
            return httpx.Response(204)
        return httpx.Response(status, json=payload)

    def _route(self, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
        if parts == ["scenarios"] and method == "GET":
            data = [{"id": s.id, "environment_id": "environment_1", "task": s.task, "init_config": s.init_config,
                     "created_at": s.created_at} for s in self.scenarios.values()]
            return 200, {"data": data, "count": len(data)}
        if parts == ["envs"] and method == "POST":
            return 201, self._public(self._create(body))
        if parts == ["envs:step"] and method == "POST":
            return 200, {"results": [self._batched(item) for item in body["steps"]]}
        env = self.envs.get(parts[1]) if len(parts) > 1 else None
        if env is None:
            raise ApiError(404, "not_found", "no such env")
        if len(parts) == 2 and method == "GET":
            return 200, self._public(env)
        if len(parts) == 2 and method == "DELETE":
            del self.envs[env.id]
            return 204, None
        if parts[2] == "reset":
            return 200, self._public(self._reset(env, body or {}))
        if parts[2] == "step":
            return 200, self._step(env, body)
        raise ApiError(404, "not_found", "no such route")

    # -- episodes ---------------------------------------------------------------------
    def _scenario(self, scenario_id: str) -> FakeScenario:
        if scenario_id not in self.scenarios:
            raise ApiError(404, "not_found", f"scenario {scenario_id!r} not found")
        return self.scenarios[scenario_id]

    def _begin(self, env: FakeEnv, scenario: FakeScenario | None, init_config: dict[str, Any] | None,
               episode: dict[str, Any] | None, current: dict[str, Any] | None) -> None:
        env.scenario = scenario
        env.init_config = dict(init_config if init_config is not None else
                               scenario.init_config if scenario is not None else env.init_config)
        if episode is not None:
            if episode.get("mode") == "conversational" and not episode.get("user"):
                raise ApiError(422, "invalid", "a conversational episode needs `user`")
            profile = {"on_tool_error": "terminate", "max_steps": None, "score_truncated": False} \
                if episode.get("profile") == "envscaler" else {}  # what the server's envscaler profile fixes
            env.config = {**DEFAULT_EPISODE, **profile, **episode}
        elif current is None:
            env.config = dict(DEFAULT_EPISODE) if scenario is not None else {"termination_action": None,
                                                                             "max_steps": None}
        if isinstance(env.config.get("user"), dict):  # shown without its key, as the server does
            env.config["user"] = {k: v for k, v in env.config["user"].items() if k != "api_key"}
        env.count, env.step, env.status, env.reward = env.init_config.get("count", 0), 0, "running", None

    def _create(self, body: dict[str, Any]) -> FakeEnv:
        scenario = self._scenario(body["scenario_id"]) if body.get("scenario_id") else None
        env = FakeEnv(f"env_{uuid.uuid4().hex[:8]}", "environment_1", None, {}, {})
        self._begin(env, scenario, body.get("init_config"), body.get("episode"), None)
        self.envs[env.id] = env
        return env

    def _reset(self, env: FakeEnv, body: dict[str, Any]) -> FakeEnv:
        if env.closed or env.expires_at <= datetime.now(UTC):
            raise ApiError(409, "conflict", f"env {env.id!r} has expired")
        scenario = self._scenario(body["scenario_id"]) if body.get("scenario_id") else env.scenario
        self._begin(env, scenario, body.get("init_config"), body.get("episode"), env.config)
        env.episode += 1
        return env

    def _first_observation(self, env: FakeEnv) -> str:
        if env.scenario is None:
            return ""
        if env.config.get("mode") == "conversational":
            return "Hi, I need help with my counter."
        return env.scenario.task

    def _public(self, env: FakeEnv) -> dict[str, Any]:
        wants_chat = env.config.get("termination_action") == "chat_with_user" or \
            env.config.get("mode") == "conversational"
        now = datetime.now(UTC).isoformat()
        return {"id": env.id, "environment_id": env.environment_id, "episode": env.episode, "step": env.step,
                "status": "closed" if env.closed or env.expires_at <= datetime.now(UTC) else "live",
                "init_config": env.init_config, "created_at": now, "expires_at": env.expires_at.isoformat(),
                "scenario_id": env.scenario.id if env.scenario else None,
                "tools": [*TOOLS, CHAT] if wants_chat else list(TOOLS), "episode_status": env.status,
                "observation": self._first_observation(env), "task": env.scenario.task if env.scenario else None,
                "introduction": "# Environment\n\nA counter.", "reward": env.reward, "episode_config": env.config}

    def _parse(self, body: dict[str, Any]) -> tuple[str, Any, str | None]:
        if "text" in body:
            text = body["text"]
            if len(text.encode()) > self.max_text_bytes:
                raise ApiError(413, "payload_too_large", f"text over {self.max_text_bytes} bytes")
            match = _CALL.search(text)
            if match is None:
                return ("chat_with_user", {"content": text.strip()}, None) if text.strip() else \
                    ("", {"text": text}, "the reply is empty")
            try:
                call = json.loads(match.group(1))
                return call["name"], call["arguments"], None
            except (ValueError, KeyError, TypeError):
                return "", {"text": text}, "the <tool_call> is not valid"
        if "function" in body:
            name = body["function"]["name"]
            try:
                return name, json.loads(body["function"]["arguments"] or "{}"), None
            except ValueError:
                return name, body["function"]["arguments"], "function.arguments is not valid JSON"
        return body["name"], body.get("arguments") or {}, None

    def _batched(self, item: dict[str, Any]) -> dict[str, Any]:
        """One step of a batch: the step route's reply, or its status and error object."""
        try:
            env = self.envs.get(item["env_id"])
            if env is None:
                raise ApiError(404, "not_found", "no such env")
            return {"env_id": item["env_id"], "status": 200, "result": self._step(env, item["action"])}
        except ApiError as exc:
            return {"env_id": item["env_id"], "status": exc.status,
                    "error": {"code": exc.code, "message": exc.message, "field": None}}

    def _step(self, env: FakeEnv, body: dict[str, Any]) -> dict[str, Any]:
        if env.status != "running":
            raise ApiError(409, "episode_ended", f"episode {env.episode} has {env.status}; reset the env")
        name, arguments, problem = self._parse(body)
        status, role, terminated, observation, error = "ok", "tool", False, "", None
        conversational = env.config.get("mode") == "conversational"
        if problem is None and not isinstance(arguments, dict):
            problem = "arguments must be a JSON object"
        if problem is not None:
            status, role, observation, error = "rejected", "user", "Error: Failed to parse response to action", problem
        elif name == "chat_with_user" and (conversational or env.config.get("termination_action") == name):
            role = "user"
            if conversational:
                observation = "###STOP###" if "done" in str(arguments.get("content")) else "Please go on."
                terminated = observation == "###STOP###"
            else:
                observation, terminated = "Task finished", True
        elif name not in {"bump", "fail"}:
            status, role, observation, error = "rejected", "user", "Error: Invalid action", f"{name!r} is no tool"
        elif name == "bump":
            env.count += int(arguments.get("by", 1))
            observation = str(env.count)
        else:
            status, observation = "error", "Error: ValueError: boom"
            terminated = env.config.get("on_tool_error") == "terminate"
        env.step += 1
        max_steps = env.config.get("max_steps")
        truncated = not terminated and max_steps is not None and env.step >= max_steps
        reward, checks = 0.0, None
        scored = (terminated and status != "error") or (truncated and env.config.get("score_truncated", True))
        if (terminated or truncated) and env.scenario is not None:
            results = [env.count == env.scenario.target, env.count > 0]
            checks = [{"check_item": item, "passed": ok, "error": None, "status": "ok", "duration_ms": 1.0}
                      for item, ok in zip(("count is the target", "count is positive"), results, strict=True)]
            reward = round(sum(results) / len(results), 4) if scored else 0.0
        if terminated or truncated:
            env.status, env.reward = "terminated" if terminated else "truncated", reward
        return {"env_id": env.id, "episode": env.episode, "step": env.step, "action": {"name": name,
                "arguments": arguments}, "observation": observation, "status": status, "observation_role": role,
                "reward": reward, "terminated": terminated, "truncated": truncated, "duration_ms": 1.25,
                "error": error, "checks": checks}
