"""The Python client SDK against a loopback test double of the HTTP contract.

The double (`Double`, a small FastAPI app served by uvicorn in a thread on 127.0.0.1) keeps
envs in dicts and imitates tools with plain Python (`add`, `submit`, `boom`): it stands in
for the API, not for the sandbox. It records every request and can be told to answer the
next matching requests with an injected fault (status, headers, raw body, delay).
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import fnmatch
import json
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sandpit.client import (
    AsyncClient,
    AsyncEnvHandle,
    Client,
    Conflict,
    Env,
    EnvHandle,
    Environment,
    InvalidRequest,
    InvalidResponse,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestInFlight,
    SandpitConnectionError,
    SandpitError,
    ServerError,
    StateView,
    StepResult,
    Trajectory,
    Unauthorized,
    Unavailable,
    tool_call_body,
)
from sandpit.client.errors import error_from_response, error_from_transport, parse_retry_after

SOURCE = "class Counter:\n    def __init__(self, init_config):\n        self.total = 0\n"
MAX_SOURCE = 10_000
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name} tool",
                                      "parameters": {"type": "object", "properties": {}}}}
    for name in ("add", "submit", "boom")
]


# --------------------------------------------------------------------------- the test double


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}


@dataclass
class Recorded:
    method: str
    path: str
    raw_path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]


@dataclass
class Fault:
    method: str
    path: str  # fnmatch pattern
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    passthrough: bool = False  # after `delay`, let the real handler answer
    times: int = 1


@dataclass
class FakeEnv:
    id: str
    environment_id: str | None
    init_config: dict[str, Any]
    states: list[dict[str, Any]]
    steps: list[dict[str, Any]] = field(default_factory=list)
    episode: int = 1
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "environment_id": self.environment_id, "step": len(self.states) - 1,
                "episode": self.episode, "status": "live", "created_at": self.created_at,
                "tools": TOOLS, "server_added_field": "ignored by the client"}


def initial_state(init_config: dict[str, Any]) -> dict[str, Any]:
    return {"total": init_config.get("start", 0), "submitted": False}


class Double:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self.lock:
            self.environments: dict[str, dict[str, Any]] = {}
            self.envs: dict[str, FakeEnv] = {}
            self.requests: list[Recorded] = []
            self.faults: list[Fault] = []
            self.api_key: str | None = None
            self.ready = True

    def fault(self, method: str, path: str, **kwargs: Any) -> None:
        with self.lock:
            self.faults.append(Fault(method, path, **kwargs))

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.method == method and fnmatch.fnmatchcase(path, fault.path) and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    def calls(self, method: str, pattern: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and fnmatch.fnmatchcase(r.path, pattern)]

    def env(self, env_id: str) -> FakeEnv:
        if env_id not in self.envs:
            raise ApiError(404, "not_found", f"env {env_id} not found")
        return self.envs[env_id]

    def new_env(self, environment_id: str | None, init_config: dict[str, Any],
                states: list[dict[str, Any]] | None = None) -> FakeEnv:
        env = FakeEnv(f"env_{uuid.uuid4().hex[:8]}", environment_id, init_config,
                      states or [initial_state(init_config)])
        self.envs[env.id] = env
        return env

    def step(self, env: FakeEnv, body: dict[str, Any], include: set[str]) -> dict[str, Any]:
        if "function" in body:
            name = body["function"]["name"]
            try:
                arguments = json.loads(body["function"]["arguments"])
            except ValueError:
                arguments = None
        else:
            name, arguments = body["name"], body.get("arguments", {})
        before = env.states[-1]
        after = dict(before)
        status, observation = "ok", ""
        if not isinstance(arguments, dict):
            status, observation = "rejected", "Rejected: arguments must be a JSON object"
        elif name == "add":
            after["total"] = before["total"] + arguments.get("amount", 1)
            observation = str(after["total"])
        elif name == "submit":
            after["submitted"] = True
            observation = f"submitted {after['total']}"
        elif name == "boom":
            status, observation = "error", "Error: ValueError: boom"
        else:
            status, observation = "rejected", f"Rejected: no tool {name!r}"
        env.states.append(after)
        step = len(env.states) - 1
        env.steps.append({"step": step, "action": {"name": name, "arguments": arguments or {}},
                          "observation": observation, "status": status, "duration_ms": 1.5,
                          "created_at": datetime.now(UTC).isoformat()})
        diff = {"added": {}, "removed": {}, "changed": {
            k: {"old": before[k], "new": after[k]} for k in after if before.get(k) != after[k]}}
        return {"env_id": env.id, "step": step, "observation": observation, "status": status,
                "duration_ms": 1.5, "state_diff": diff if "state_diff" in include else None,
                "state": after if "state" in include else None}


def build_app(d: Double) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": {"code": exc.code, "message": exc.message, "field": exc.field}},
                            status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        return JSONResponse({"error": {"code": "invalid", "message": first["msg"],
                                       "field": ".".join(str(p) for p in first["loc"][1:])}},
                            status_code=422)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        if not d.ready:
            raise ApiError(503, "not_ready", "warming up", headers={"Retry-After": "1"})
        return {"status": "ready"}

    @app.post("/v1/environments", status_code=201)
    async def create_environment(request: Request) -> dict[str, Any]:
        body = await request.json()
        if len(body["source_code"]) > MAX_SOURCE:
            raise ApiError(413, "too_large", "source_code exceeds 10000 bytes", "source_code")
        if f"class {body['class_name']}" not in body["source_code"]:
            raise ApiError(422, "invalid", "class not defined in source_code", "class_name")
        environment = {"id": f"environment_{uuid.uuid4().hex[:8]}", "name": body["name"],
                       "class_name": body["class_name"], "code_sha256": "0" * 64, "tools": TOOLS,
                       "created_at": datetime.now(UTC).isoformat(), "description": body["description"]}
        d.environments[environment["id"]] = environment
        return environment

    @app.get("/v1/environments")
    async def list_environments(limit: int = 100, offset: int = 0) -> dict[str, Any]:
        items = list(d.environments.values())
        return {"data": items[offset:offset + limit], "count": len(items)}

    @app.get("/v1/environments/{environment_id}")
    async def get_environment(environment_id: str) -> dict[str, Any]:
        if environment_id not in d.environments:
            raise ApiError(404, "not_found", "no such environment")
        return d.environments[environment_id]

    @app.delete("/v1/environments/{environment_id}", status_code=204)
    async def delete_environment(environment_id: str) -> Response:
        if d.environments.pop(environment_id, None) is None:
            raise ApiError(404, "not_found", "no such environment")
        return Response(status_code=204)

    @app.post("/v1/envs", status_code=201)
    async def create_env(request: Request) -> dict[str, Any]:
        body = await request.json()
        environment_id = body.get("environment_id")
        if environment_id is not None and environment_id not in d.environments:
            raise ApiError(404, "not_found", "no such environment")
        return d.new_env(environment_id, body.get("init_config", {})).public()

    @app.get("/v1/envs")
    async def list_envs(limit: int = 100, offset: int = 0) -> dict[str, Any]:
        items = [e.public() for e in d.envs.values()]
        return {"data": items[offset:offset + limit], "count": len(items)}

    @app.get("/v1/envs/{env_id}")
    async def get_env(env_id: str) -> dict[str, Any]:
        return d.env(env_id).public()

    @app.delete("/v1/envs/{env_id}", status_code=204)
    async def delete_env(env_id: str) -> Response:
        d.envs.pop(d.env(env_id).id)
        return Response(status_code=204)

    @app.post("/v1/envs/{env_id}/step")
    async def step(env_id: str, request: Request, include: str = "") -> dict[str, Any]:
        return d.step(d.env(env_id), await request.json(), set(filter(None, include.split(","))))

    @app.post("/v1/envs/{env_id}/reset")
    async def reset(env_id: str, request: Request) -> dict[str, Any]:
        env = d.env(env_id)
        config = (await request.json())["init_config"]
        if config is not None:
            env.init_config = config
        env.episode += 1
        env.states, env.steps = [initial_state(env.init_config)], []
        return env.public()

    @app.get("/v1/envs/{env_id}/state")
    async def state(env_id: str, step: int | None = None) -> dict[str, Any]:
        env = d.env(env_id)
        k = len(env.states) - 1 if step is None else step
        if not 0 <= k < len(env.states):
            raise ApiError(404, "not_found", f"no step {k}", "step")
        return {"env_id": env.id, "episode": env.episode, "step": k, "state": env.states[k]}

    @app.get("/v1/envs/{env_id}/trajectory")
    async def trajectory(env_id: str) -> dict[str, Any]:
        env = d.env(env_id)
        return {"env_id": env.id, "episode": env.episode, "steps": env.steps}

    @app.post("/v1/envs/{env_id}/restore")
    async def restore(env_id: str, request: Request) -> dict[str, Any]:
        env = d.env(env_id)
        k = (await request.json())["step"]
        if not 0 <= k < len(env.states):
            raise ApiError(409, "conflict", f"step {k} is not in this episode", "step")
        env.states, env.steps = env.states[:k + 1], env.steps[:k]
        return env.public()

    @app.post("/v1/envs/{env_id}/fork", status_code=201)
    async def fork(env_id: str, request: Request) -> dict[str, Any]:
        env = d.env(env_id)
        body = await request.json()
        k = len(env.states) - 1 if body["step"] is None else body["step"]
        forks = [d.new_env(env.environment_id, env.init_config, [dict(s) for s in env.states[:k + 1]])
                 for _ in range(body["count"])]
        return {"data": [f.public() for f in forks], "count": len(forks)}

    return app


class Recorder:
    """ASGI wrapper: records each request, then serves an injected fault or the app."""

    def __init__(self, app: FastAPI, double: Double) -> None:
        self.app, self.double = app, double

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        request = Request(scope)
        d = self.double
        d.requests.append(Recorded(
            scope["method"], scope["path"], scope["raw_path"].decode(), dict(request.query_params),
            json.loads(raw) if raw else None, {k.lower(): v for k, v in request.headers.items()}))
        fault = d.take_fault(scope["method"], scope["path"])
        if fault is not None:
            await asyncio.sleep(fault.delay)
            if not fault.passthrough:
                response = Response(fault.body, status_code=fault.status, headers=fault.headers,
                                    media_type="application/json")
                return await response(scope, receive, send)
        if d.api_key is not None and request.headers.get("authorization") != f"Bearer {d.api_key}":
            response = JSONResponse({"error": {"code": "unauthorized", "message": "bad key", "field": None}},
                                    status_code=401)
            return await response(scope, receive, send)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self.app(scope, replay, send)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Double]]:
    double = Double()
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only then (proto 0
    # costs ~40 ms per request in delayed ACKs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(Recorder(build_app(double), double), log_level="warning", lifespan="off",
                            ws="none", http="h11", access_log=False, timeout_graceful_shutdown=2)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", double
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def double(server: tuple[str, Double]) -> Double:
    server[1].clear()
    return server[1]


@pytest.fixture
def client(server: tuple[str, Double], double: Double) -> Iterator[Client]:
    with Client(server[0], api_key="key-1", timeout=5.0, max_retry_wait_s=2.0) as c:
        yield c


def error_body(code: str, message: str, field: str | None = None) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "field": field}}).encode()


# --------------------------------------------------------------------------- request shapes and parsing


def test_environments_crud(client: Client, double: Double) -> None:
    created = client.environments.create(SOURCE, "Counter", name="counter", description="adds")
    assert isinstance(created, Environment) and created.name == "counter"
    assert created.tools == TOOLS and isinstance(created.created_at, datetime)
    (post,) = double.calls("POST", "/v1/environments")
    assert post.body == {"name": "counter", "source_code": SOURCE, "class_name": "Counter",
                         "description": "adds", "policy": "standard"}
    assert post.headers["authorization"] == "Bearer key-1"
    assert post.headers["content-type"] == "application/json"

    assert client.environments.get(created.id) == created
    page = client.environments.list(limit=5, offset=0)
    assert page.count == 1 and page.data == [created]
    assert double.calls("GET", "/v1/environments")[0].query == {"limit": "5", "offset": "0"}
    client.environments.list()
    assert double.calls("GET", "/v1/environments")[1].query == {}

    assert client.environments.delete(created.id) is None
    with pytest.raises(NotFound) as info:
        client.environments.get(created.id)
    assert info.value.status_code == 404 and info.value.code == "not_found"


def test_env_lifecycle_request_shapes(client: Client, double: Double) -> None:
    environment = client.environments.create(SOURCE, "Counter")
    env = client.envs.create(environment.id, init_config={"start": 10},
                             profile={"memory_mib": 128, "call_timeout_s": 2.5})
    assert isinstance(env.env, Env) and env.env.step == 0 and env.env.episode == 1
    assert env.env.status == "live" and env.tools == TOOLS and env.env.environment_id == environment.id
    assert double.calls("POST", "/v1/envs")[0].body == {
        "environment_id": environment.id, "init_config": {"start": 10},
        "profile": {"memory_mib": 128, "call_timeout_s": 2.5}}

    result = env.step("add", amount=5)
    assert isinstance(result, StepResult)
    assert (result.step, result.observation, result.status, result.duration_ms) == (1, "15", "ok", 1.5)
    assert result.state is None and result.state_diff is None
    step_req = double.calls("POST", f"/v1/envs/{env.id}/step")[0]
    assert step_req.body == {"name": "add", "arguments": {"amount": 5}} and step_req.query == {}

    result = env.step_call({"name": "add", "arguments": {"amount": 1}}, include=["state_diff", "state"])
    assert result.state == {"total": 16, "submitted": False}
    assert result.state_diff == {"added": {}, "removed": {}, "changed": {"total": {"old": 15, "new": 16}}}
    assert double.calls("POST", f"/v1/envs/{env.id}/step")[1].query == {"include": "state_diff,state"}

    assert env.state() == {"total": 16, "submitted": False}
    view = env.state_view(step=1)
    assert isinstance(view, StateView) and (view.step, view.episode, view.state["total"]) == (1, 1, 15)
    assert double.calls("GET", f"/v1/envs/{env.id}/state")[1].query == {"step": "1"}

    trajectory = env.trajectory()
    assert isinstance(trajectory, Trajectory) and [s.step for s in trajectory.steps] == [1, 2]
    assert trajectory.steps[0].action.name == "add" and trajectory.steps[0].action.arguments == {"amount": 5}

    restored = env.restore(1)
    assert restored.step == 1 and env.env is restored
    assert double.calls("POST", f"/v1/envs/{env.id}/restore")[0].body == {"step": 1}
    assert env.state() == {"total": 15, "submitted": False}

    forks = env.fork(step=0, count=2)
    assert len(forks) == 2 and all(isinstance(f, EnvHandle) for f in forks)
    assert double.calls("POST", f"/v1/envs/{env.id}/fork")[0].body == {"step": 0, "count": 2}
    assert forks[0].state() == {"total": 10, "submitted": False} and forks[0].id != env.id
    assert env.fork()[0].env.step == 1
    assert double.calls("POST", f"/v1/envs/{env.id}/fork")[1].body == {"step": None, "count": 1}

    reset = env.reset()
    assert (reset.episode, reset.step) == (2, 0)
    assert double.calls("POST", f"/v1/envs/{env.id}/reset")[0].body == {"init_config": None}
    env.reset({"start": 3})
    assert double.calls("POST", f"/v1/envs/{env.id}/reset")[1].body == {"init_config": {"start": 3}}
    assert env.state()["total"] == 3

    listed = client.envs.list(limit=2)
    assert listed.count == 4 and len(listed.data) == 2
    assert double.calls("GET", "/v1/envs")[0].query == {"limit": "2"}
    again = client.envs.get(env.id)
    assert again.id == env.id and again.env.episode == 3
    assert env.refresh().episode == 3

    env.delete()
    assert double.calls("DELETE", f"/v1/envs/{env.id}")
    with pytest.raises(NotFound):
        env.state()
    client.envs.delete(forks[0].id)
    assert forks[0].id not in double.envs


def test_env_from_source_and_context_manager(client: Client, double: Double) -> None:
    with client.envs.create(source_code=SOURCE, class_name="Counter") as env:
        assert env.env.environment_id is None
        assert double.calls("POST", "/v1/envs")[0].body == {
            "source_code": SOURCE, "class_name": "Counter", "init_config": {}}
        env_id = env.id
    assert env_id not in double.envs  # deleted on exit
    with client.envs.create(source_code=SOURCE, class_name="Counter") as env:
        env.delete()  # deleting inside the block is fine: exit ignores NotFound


def test_tool_arguments_may_be_called_name(client: Client, double: Double) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    env.step("add", name="x", include="y", amount=0)
    assert double.calls("POST", "/v1/envs/*/step")[0].body == {
        "name": "add", "arguments": {"name": "x", "include": "y", "amount": 0}}


def test_client_side_argument_errors(client: Client, double: Double) -> None:
    with pytest.raises(ValueError, match="exactly one of environment_id, scenario_id or source_code"):
        client.envs.create()
    with pytest.raises(ValueError, match="exactly one of environment_id, scenario_id or source_code"):
        client.envs.create("e", source_code=SOURCE, class_name="Counter")
    with pytest.raises(ValueError, match="needs class_name"):
        client.envs.create(source_code=SOURCE)
    with pytest.raises(ValueError, match="extra"):  # pydantic ValidationError is a ValueError
        client.envs.create("e", profile={"memory_mb": 64})
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    with pytest.raises(ValueError, match="include accepts"):
        env.step_call({"name": "add"}, include=["diff"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="count must be at least 1"):
        env.fork(count=0)
    with pytest.raises(ValueError, match="non-empty string"):
        client.envs.get("")
    assert double.calls("POST", "/v1/envs/*/step") == []


def test_ids_cannot_escape_their_path_segment(client: Client, double: Double) -> None:
    with pytest.raises(NotFound):
        client.envs.get("../environments")
    (request,) = double.requests
    assert request.raw_path == "/v1/envs/..%2Fenvironments"


def test_health_and_ready(client: Client, double: Double) -> None:
    assert client.health() == {"status": "ok"}
    assert client.ready() is True
    double.ready = False
    assert client.ready() is False
    assert len(double.calls("GET", "/readyz")) == 2  # a not-ready probe is not retried


def test_no_authorization_header_without_api_key(server: tuple[str, Double], double: Double) -> None:
    with Client(server[0]) as anonymous:
        anonymous.health()
        assert "authorization" not in double.requests[0].headers
        double.api_key = "secret"
        with pytest.raises(Unauthorized) as info:
            anonymous.envs.list()
    assert info.value.status_code == 401 and info.value.code == "unauthorized"


# --------------------------------------------------------------------------- OpenAI tool calls


def test_openai_tool_call_dict_and_object(client: Client, double: Double) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"amount": 2}'}}
    assert env.step_call(call).observation == "2"
    obj = SimpleNamespace(id="call_2", type="function",
                          function=SimpleNamespace(name="add", arguments='{"amount": 3}'))
    assert env.step_call(obj).observation == "5"
    responses_api = SimpleNamespace(type="function_call", call_id="c3", name="add", arguments='{"amount": 1}')
    assert env.step_call(responses_api).observation == "6"
    bodies = [r.body for r in double.calls("POST", "/v1/envs/*/step")]
    assert bodies == [
        {"type": "function", "function": {"name": "add", "arguments": '{"amount": 2}'}},
        {"type": "function", "function": {"name": "add", "arguments": '{"amount": 3}'}},
        {"type": "function", "function": {"name": "add", "arguments": '{"amount": 1}'}},
    ]
    # a model's malformed JSON is the server's to judge: a rejected step, not a client exception
    bad = {"type": "function", "function": {"name": "add", "arguments": "{amount: 2"}}
    assert env.step_call(bad).status == "rejected"


def test_step_takes_a_tool_call_dict_or_object(client: Client, double: Double) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"amount": 2}'}}
    assert env.step(call).observation == "2"
    assert env.step(SimpleNamespace(function=SimpleNamespace(name="add", arguments='{"amount": 3}'))).observation == "5"
    assert env.step({"name": "add", "arguments": {"amount": 1}}).observation == "6"
    env.step("add", text="a tool argument named text", amount=0)  # text= with a tool name: an argument
    assert [r.body for r in double.calls("POST", "/v1/envs/*/step")] == [
        {"type": "function", "function": {"name": "add", "arguments": '{"amount": 2}'}},
        {"type": "function", "function": {"name": "add", "arguments": '{"amount": 3}'}},
        {"name": "add", "arguments": {"amount": 1}},
        {"name": "add", "arguments": {"text": "a tool argument named text", "amount": 0}},
    ]


@pytest.mark.parametrize(("call", "arguments", "message"), [
    ({"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}, {"text": "hi"},
     "carries its own arguments"),
    ({"name": "add"}, {"amount": 1}, "carries its own arguments"),
    ({"id": "c", "type": "function"}, {}, "needs 'name'"),
    ({"function": "add"}, {}, "'function' must be an object"),
    (None, {}, "needs a tool name, a tool call, or text="),
    (None, {"amount": 1}, "keyword arguments need a tool name"),
    (None, {"text": "hi", "amount": 1}, "keyword arguments need a tool name"),
    (None, {"text": b"bytes"}, "text= must be a string"),
    (42, {}, "not a tool call"),
])
def test_step_refuses_ambiguous_actions_before_sending(server: tuple[str, Double], client: Client, double: Double,
                                                       call: Any, arguments: dict[str, Any], message: str) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    with pytest.raises(TypeError, match=message):
        env.step(call, **arguments)

    async def run() -> None:
        async with AsyncClient(server[0], api_key="key-1", timeout=5.0) as async_client:
            handle = await async_client.envs.get(env.id)
            with pytest.raises(TypeError, match=message):
                await handle.step(call, **arguments)

    asyncio.run(run())
    assert double.calls("POST", "/v1/envs/*/step") == []


def test_tool_call_body_shapes() -> None:
    assert tool_call_body({"name": "a"}) == ("a", {"name": "a", "arguments": {}})
    assert tool_call_body({"function": {"name": "a", "arguments": {"x": 1}}}) == (
        "a", {"name": "a", "arguments": {"x": 1}})
    # malformed calls are sent as they are: the server records them as rejected steps
    assert tool_call_body({"name": 3}) == ("3", {"name": "3", "arguments": {}})
    assert tool_call_body({"name": "a", "arguments": [1]}) == ("a", {"name": "a", "arguments": [1]})
    assert tool_call_body({"function": {"name": "a", "arguments": "{bad"}})[1] == {
        "type": "function", "function": {"name": "a", "arguments": "{bad"}}
    assert tool_call_body("<tool_call>{}</tool_call>") == ("", {"text": "<tool_call>{}</tool_call>"})
    assert tool_call_body({"text": "hello"}) == ("", {"text": "hello"})
    for bad in ({}, {"function": "a"}, object(), None):
        with pytest.raises(TypeError):
            tool_call_body(bad)


# --------------------------------------------------------------------------- errors and retries


@pytest.mark.parametrize(("status", "cls"), [
    (400, InvalidRequest), (404, NotFound), (409, Conflict), (413, PayloadTooLarge), (422, InvalidRequest),
    (401, Unauthorized), (403, Unauthorized), (500, ServerError), (502, ServerError), (418, SandpitError),
])
def test_status_mapping(client: Client, double: Double, status: int, cls: type[SandpitError]) -> None:
    double.fault("GET", "/v1/envs", status=status, body=error_body("some_code", "went wrong", "limit"))
    with pytest.raises(cls) as info:
        client.envs.list()
    error = info.value
    assert type(error) is cls
    assert (error.status_code, error.code, error.message, error.field) == (status, "some_code", "went wrong", "limit")
    assert "went wrong" in str(error) and str(status) in str(error)
    assert len(double.calls("GET", "/v1/envs")) == 1  # none of these is retried


def test_real_422_413_409_from_the_double(client: Client, double: Double) -> None:
    with pytest.raises(InvalidRequest) as invalid:
        client.environments.create(SOURCE, "Missing")
    assert invalid.value.field == "class_name" and invalid.value.status_code == 422
    with pytest.raises(PayloadTooLarge) as large:
        client.environments.create(SOURCE + "#" * MAX_SOURCE, "Counter")
    assert large.value.field == "source_code"
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    with pytest.raises(Conflict) as conflict:
        env.restore(7)
    assert conflict.value.field == "step" and conflict.value.code == "conflict"


def test_429_with_retry_after_is_retried_then_succeeds(client: Client, double: Double) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    double.fault("POST", "/v1/envs/*/step", status=429, body=error_body("quota", "slow down"),
                 headers={"Retry-After": "0.05"}, times=2)
    started = time.monotonic()
    assert env.step("add").status == "ok"  # step is retried on 429: nothing was done
    assert time.monotonic() - started >= 0.1
    assert len(double.calls("POST", "/v1/envs/*/step")) == 3
    assert env.state()["total"] == 1


def test_503_retried_until_max_wait_then_unavailable(server: tuple[str, Double], double: Double) -> None:
    double.fault("GET", "/v1/envs", status=503, body=error_body("no_capacity", "full"),
                 headers={"Retry-After": "0.125"}, times=100)
    with Client(server[0], max_retry_wait_s=0.3) as c:
        started = time.monotonic()
        with pytest.raises(Unavailable) as info:
            c.envs.list()
    # sleeps 0.125 + 0.125; a third would exceed 0.3 s in total
    assert len(double.calls("GET", "/v1/envs")) == 3
    assert 0.25 <= time.monotonic() - started < 2
    assert info.value.retry_after == 0.125 and info.value.code == "no_capacity"


def test_retry_after_beyond_budget_raises_at_once(client: Client, double: Double) -> None:
    double.fault("POST", "/v1/envs", status=429, body=error_body("quota", "later"),
                 headers={"Retry-After": "120"}, times=5)
    with pytest.raises(RateLimited) as info:
        client.envs.create(source_code=SOURCE, class_name="Counter")
    assert info.value.retry_after == 120.0
    assert len(double.calls("POST", "/v1/envs")) == 1


def test_zero_budget_disables_retries(server: tuple[str, Double], double: Double) -> None:
    double.fault("GET", "/healthz", status=503, body=error_body("busy", "busy"), times=5)
    with Client(server[0], max_retry_wait_s=0) as c, pytest.raises(Unavailable) as info:
        c.health()
    assert info.value.retry_after is None and len(double.requests) == 1


def test_errors_survive_pickling() -> None:
    for error in (Unavailable("full", status_code=503, code="busy", field=None, retry_after=2.0),
                  SandpitConnectionError("gone", request_sent=True, retry_safe=False),
                  InvalidRequest("bad", status_code=422, code="invalid", field="init_config")):
        copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
        assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    future = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < (parse_retry_after(future) or 0) <= 30


def test_a_step_lost_after_sending_is_retried_with_its_key(server: tuple[str, Double], double: Double) -> None:
    with Client(server[0], timeout=0.3) as c:
        env = c.envs.create(source_code=SOURCE, class_name="Counter")
        double.fault("POST", "/v1/envs/*/step", delay=0.8, passthrough=True)
        env.step("add")  # the first attempt timed out after sending; the retry answered
        first, retry = double.calls("POST", "/v1/envs/*/step")
        assert first.headers["idempotency-key"] == retry.headers["idempotency-key"]
        env.step("add")
        assert double.calls("POST", "/v1/envs/*/step")[2].headers["idempotency-key"] != first.headers[
            "idempotency-key"]  # a new call, a new key
        create = double.calls("POST", "/v1/envs")[0]
        assert str(uuid.UUID(create.headers["idempotency-key"])) == create.headers["idempotency-key"]


def test_restore_is_not_retried_after_a_read_timeout(server: tuple[str, Double], double: Double) -> None:
    with Client(server[0], timeout=0.3) as c:
        env = c.envs.create(source_code=SOURCE, class_name="Counter")
        env.step("add")
        double.fault("POST", "/v1/envs/*/restore", delay=0.8, passthrough=True)
        with pytest.raises(SandpitConnectionError) as info:
            env.restore(0)
        assert info.value.request_sent is True and info.value.retry_safe is False
        assert info.value.status_code is None and isinstance(info.value.__cause__, httpx.ReadTimeout)
        assert len(double.calls("POST", "/v1/envs/*/restore")) == 1
        assert "idempotency-key" not in double.calls("POST", "/v1/envs/*/restore")[0].headers
        # a GET is safe to repeat: the same delay is retried and the second attempt answers
        double.fault("GET", "/v1/envs/*/state", delay=0.8, passthrough=True)
        deadline = time.monotonic() + 10  # the timed-out restore still happens on the server
        while double.envs[env.id].steps:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert env.state() == {"total": 0, "submitted": False}
        assert len(double.calls("GET", "/v1/envs/*/state")) == 2


def test_a_key_in_flight_is_retried_after_retry_after(server: tuple[str, Double], double: Double) -> None:
    with Client(server[0]) as c:
        env = c.envs.create(source_code=SOURCE, class_name="Counter")
        double.fault("POST", "/v1/envs/*/step", status=409, headers={"Retry-After": "0.05"}, times=2,
                     body=b'{"error": {"code": "idempotency_key_in_flight", "message": "running", "field": null}}')
        assert env.step("add").step == 1
        keys = {r.headers["idempotency-key"] for r in double.calls("POST", "/v1/envs/*/step")}
        assert len(double.calls("POST", "/v1/envs/*/step")) == 3 and len(keys) == 1
        double.fault("POST", "/v1/envs/*/step", status=409,
                     body=b'{"error": {"code": "idempotency_key_reused", "message": "other", "field": null}}')
        with pytest.raises(Conflict) as reused:
            env.step("add")
        assert not isinstance(reused.value, RequestInFlight) and reused.value.code == "idempotency_key_reused"


def mock_client(handler: Any, **kwargs: Any) -> Client:
    return Client("http://127.0.0.1:9", transport=httpx.MockTransport(handler), **kwargs)


def test_transport_error_retries_by_phase() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if len(seen) == 1:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path.endswith("/restore"):
            raise httpx.RemoteProtocolError("server hung up", request=request)
        return httpx.Response(200, json={"env_id": "e1", "episode": 1, "step": 0, "state": {}})

    with mock_client(handler) as c:
        env = EnvHandle(c._t, Env(id="e1", step=0, episode=1, status="live",
                                     created_at=datetime.now(UTC)))
        assert env.state() == {}  # connect error: never sent, retried
        with pytest.raises(SandpitConnectionError) as info:
            env.restore(0)
    assert info.value.request_sent is True
    assert seen == ["GET /v1/envs/e1/state", "GET /v1/envs/e1/state", "POST /v1/envs/e1/restore"]


def test_connect_errors_are_retried_three_times_even_for_step() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.ConnectTimeout("no route", request=request)

    with mock_client(handler) as c:
        env = EnvHandle(c._t, Env(id="e1", step=0, episode=1, status="live",
                                     created_at=datetime.now(UTC)))
        with pytest.raises(SandpitConnectionError) as info:
            env.step("add")
    assert attempts == 3 and info.value.request_sent is False and info.value.retry_safe is True


def test_closed_port_raises_connection_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with Client(f"http://127.0.0.1:{port}", max_retry_wait_s=0) as c, pytest.raises(SandpitConnectionError):
        c.health()


# --------------------------------------------------------------------------- hostile responses


@pytest.mark.parametrize("body", [
    b"<html>proxy says hi</html>",
    b"",
    b"[1, 2]",
    b'{"env_id": "e", "step": "seven", "observation": 3, "status": "ok", "duration_ms": 1}',
    b'{"env_id": "e", "step": 1, "observation": "x", "status": "exploded", "duration_ms": 1}',
    b'{"env_id": null}',
])
def test_malformed_step_response_is_invalid_response(client: Client, double: Double, body: bytes) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    double.fault("POST", "/v1/envs/*/step", status=200, body=body)
    with pytest.raises(InvalidResponse) as info:
        env.step("add")
    assert info.value.status_code == 200 and info.value.code == "invalid_response"
    assert "StepResult" in str(info.value) and "/step" in str(info.value)


def test_wrong_types_name_the_field(client: Client, double: Double) -> None:
    env = client.envs.create(source_code=SOURCE, class_name="Counter")
    double.fault("POST", "/v1/envs/*/step", body=b'{"env_id": "e", "step": "seven", "observation": "o", '
                                                 b'"status": "ok", "duration_ms": 1}')
    with pytest.raises(InvalidResponse, match="step: Input should be a valid integer"):
        env.step("add")
    double.fault("GET", "/v1/envs", body=b'{"data": [{"id": 1}], "count": "many"}')
    with pytest.raises(InvalidResponse, match=r"Page\[Env\]"):
        client.envs.list()
    double.fault("GET", "/healthz", body=b'"ok"')
    with pytest.raises(InvalidResponse, match="JSON object"):
        client.health()


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
    (b'{"error": "flat string"}', "flat string"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b'{"error": {"code": 7, "message": ["x"], "field": {}}}', "Not Found"),
    (b"x" * 10_000, "x" * 100),
])
def test_malformed_error_bodies_still_map_by_status(client: Client, double: Double, body: bytes,
                                                    message: str) -> None:
    double.fault("GET", "/v1/envs/*", status=404, body=body)
    with pytest.raises(NotFound) as info:
        client.envs.get("e1")
    error = info.value
    assert error.code == "http_404" and error.field is None and message in error.message
    assert len(error.message) <= 2003


def test_trajectory_tolerates_rejected_actions(client: Client, double: Double) -> None:
    now = datetime.now(UTC).isoformat()
    step = {"observation": "Rejected", "status": "rejected", "duration_ms": 0, "created_at": now}
    body = {"env_id": "e1", "episode": 1, "new_server_field": 1, "steps": [
        {**step, "step": 1, "action": None},
        {**step, "step": 2, "action": {"name": "add", "arguments": "{amount: 2"}}]}
    double.fault("GET", "/v1/envs/e1/trajectory", body=json.dumps(body).encode())
    handle = EnvHandle(client._t, Env(id="e1", step=2, episode=1, status="live", created_at=datetime.now(UTC)))
    trajectory = handle.trajectory()
    assert trajectory.steps[0].action is None
    assert trajectory.steps[1].action is not None and trajectory.steps[1].action.arguments == "{amount: 2"


def test_500_with_html_is_server_error(client: Client, double: Double) -> None:
    double.fault("POST", "/v1/envs", status=500, body=b"<h1>Internal Server Error</h1>")
    with pytest.raises(ServerError, match="Internal Server Error"):
        client.envs.create(source_code=SOURCE, class_name="Counter")
    assert len(double.calls("POST", "/v1/envs")) == 1


# --------------------------------------------------------------------------- async parity


def test_async_client_parity(server: tuple[str, Double], double: Double) -> None:
    async def scenario() -> None:
        async with AsyncClient(server[0], api_key="key-1", max_retry_wait_s=1.0) as c:
            assert await c.health() == {"status": "ok"} and await c.ready() is True
            environment = await c.environments.create(SOURCE, "Counter", name="n")
            assert (await c.environments.get(environment.id)) == environment
            assert (await c.environments.list(limit=1)).count == 1
            env = await c.envs.create(environment.id, init_config={"start": 1})
            assert isinstance(env, AsyncEnvHandle) and env.tools == TOOLS
            double.fault("POST", "/v1/envs/*/step", status=503, body=error_body("busy", "busy"),
                         headers={"Retry-After": "0.05"})
            assert (await env.step("add", amount=2)).observation == "3"
            obj = SimpleNamespace(function=SimpleNamespace(name="add", arguments='{"amount": 1}'))
            result = await env.step_call(obj, include=["state"])
            assert result.state == {"total": 4, "submitted": False}
            assert (await env.state(step=1)) == {"total": 3, "submitted": False}
            assert (await env.state_view()).step == 2
            assert len((await env.trajectory()).steps) == 2
            assert (await env.restore(1)).step == 1
            forks = await env.fork(count=2)
            assert len(forks) == 2 and (await forks[1].state())["total"] == 3
            assert (await env.reset({"start": 9})).episode == 2
            assert (await env.refresh()).step == 0
            assert (await c.envs.get(env.id)).id == env.id
            assert (await c.envs.list()).count == 3
            await c.envs.delete(forks[0].id)
            async with forks[1]:
                pass
            await env.delete()
            with pytest.raises(NotFound):
                await env.state()
            double.fault("GET", "/v1/envs", status=409, body=error_body("conflict", "no"))
            with pytest.raises(Conflict):
                await c.envs.list()
            double.fault("GET", "/v1/envs", body=b"not json")
            with pytest.raises(InvalidResponse):
                await c.envs.list()
            await c.environments.delete(environment.id)
            double.ready = False
            assert await c.ready() is False

    asyncio.run(scenario())
    assert double.envs == {}
    steps = double.calls("POST", "/v1/envs/*/step")
    assert len(steps) == 3 and steps[2].query == {"include": "state"}


def test_async_step_is_retried_with_its_key_after_read_timeout() -> None:
    keys: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        raise httpx.ReadTimeout("slow", request=request)

    async def scenario() -> None:
        async with AsyncClient("http://127.0.0.1:9", transport=httpx.MockTransport(handler)) as c:
            env = AsyncEnvHandle(c._t, Env(id="e1", step=0, episode=1, status="live",
                                              created_at=datetime.now(UTC)))
            with pytest.raises(SandpitConnectionError) as info:
                await env.step("add")
            assert info.value.retry_safe is True

    asyncio.run(scenario())
    assert len(keys) == 3 and len(set(keys)) == 1  # TRANSPORT_ATTEMPTS, one key


def test_clients_are_shared_not_copied(server: tuple[str, Double]) -> None:
    # gymnasium deep-copies an env's constructor kwargs (`spec.make()`), which carry the client
    with Client(server[0]) as client:
        assert copy.deepcopy({"client": client})["client"] is client
    async_client = AsyncClient(server[0])
    assert copy.deepcopy([async_client])[0] is async_client
    asyncio.run(async_client.aclose())


def test_a_resumed_handle_fences_its_mutating_calls_only() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers.get("sandpit-attempt")))
        if request.url.path.endswith("/attempts"):
            return httpx.Response(201, json={"env_id": "e1", "attempt": 1, "token": "tok_1"})
        if request.url.path.endswith("/state"):
            return httpx.Response(200, json={"env_id": "e1", "episode": 1, "step": 0, "state": {}})
        return httpx.Response(500, json={"error": {"code": "internal", "message": "x", "field": None}})

    with mock_client(handler, max_retry_wait_s=0) as c:
        env = EnvHandle(c._t, Env(id="e1", step=0, episode=1, status="live", created_at=datetime.now(UTC)))
        with pytest.raises(ServerError):
            env.step("add")  # before resume: no token
        resumed = env.resume()
        assert (resumed.attempt, resumed.env_id, env.attempt) == (1, "e1", resumed.token)
        env.state()
        for call in (lambda: env.step("add"), env.reset, lambda: env.restore(0), env.delete):
            with pytest.raises(ServerError):
                call()
    assert seen == [("POST", "/v1/envs/e1/step", None), ("POST", "/v1/envs/e1/attempts", None),
                    ("GET", "/v1/envs/e1/state", None), ("POST", "/v1/envs/e1/step", "tok_1"),
                    ("POST", "/v1/envs/e1/reset", "tok_1"), ("POST", "/v1/envs/e1/restore", "tok_1"),
                    ("DELETE", "/v1/envs/e1", "tok_1")]


@pytest.mark.parametrize(("status", "cls", "failure"), [
    (429, RateLimited, "infrastructure"), (503, Unavailable, "infrastructure"), (500, ServerError, "infrastructure"),
    (502, ServerError, "infrastructure"), (404, NotFound, None), (409, Conflict, None), (422, InvalidRequest, None),
    (413, PayloadTooLarge, None), (401, Unauthorized, None)])
def test_the_platforms_errors_say_infrastructure(status: int, cls: type[SandpitError], failure: str | None) -> None:
    # a body that claims another verdict changes nothing: the class decides
    response = httpx.Response(status, json={"error": {"code": "x", "message": "m", "failure": "none"}},
                              request=httpx.Request("POST", "http://sandpit/v1/envs/e1/step"))
    error = error_from_response(response)
    assert type(error) is cls and error.failure == failure
    assert pickle.loads(pickle.dumps(error)).failure == failure  # noqa: S301 - our own bytes


def test_a_lost_connection_is_infrastructure() -> None:
    error = error_from_transport(httpx.ReadTimeout("slow"), "POST", "/v1/envs/e1/step")
    assert isinstance(error, SandpitConnectionError) and error.failure == "infrastructure"
    assert SandpitError("bad").failure is None
