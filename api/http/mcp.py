"""Every env as an MCP server over Streamable HTTP, built on the official ``mcp`` SDK's
low-level :class:`~mcp.server.lowlevel.Server` and its
:class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager` (``stateless``,
``json_response``: one JSON reply per POST, no server-sent event stream).

``/v1/envs/{env_id}/mcp`` (:meth:`McpServer.env`): the env's MCP server.

- ``tools/list``: the tools the agent sees, the list ``GET /v1/envs/{id}`` and ``reset``
  give (:attr:`~sandpit.api.schemas.envs.EnvPublic.tools`), each OpenAI function schema
  as an MCP tool (``name``, ``description``, ``inputSchema`` = its ``parameters``).
- ``tools/call``: one recorded step, exactly ``POST /v1/envs/{id}/step`` with the action
  ``{"name", "arguments"}``, through the same :meth:`~sandpit.api.envs.steps.Steps.step`
  (the env's episode rules, quotas and argument checks; a tool that does not exist or
  arguments the tool refuses are a recorded ``rejected`` step, as there). The result's
  content is the observation as text; ``isError`` is true for every status but ``ok``;
  ``_meta["sandpit/step"]`` (:data:`META_KEY`) holds ``env_id``, ``episode``, ``step``,
  ``status``, ``reward``, ``terminated``, ``truncated``, ``duration_ms``, ``recovered``,
  ``error``, ``checks`` and the failure verdict (``failure``, ``mask``,
  ``episode_failure``, ``episode_mask``: docs/failures.md). A step that is refused and not recorded (409
  ``episode_ended``, 429, 503, 413, 422) is a JSON-RPC error whose ``data`` is
  ``{"status": <HTTP status>, "error": <the API's error object>}`` (:func:`rpc_error`).
- resources: ``sandpit://envs/{id}/state`` (``GET /v1/envs/{id}/state``'s JSON) and
  ``sandpit://envs/{id}/trajectory`` (``GET /v1/envs/{id}/trajectory``'s JSON, the
  current episode whole), both ``application/json``.

``/v1/scenarios/{scenario_id}/mcp`` (:meth:`McpServer.scenario`): a fresh env (and so a
fresh episode) of the scenario per MCP session. The ``initialize`` request (a POST
without ``Mcp-Session-Id``; one whose params the protocol refuses gets the SDK's error
and makes no env) creates the env as ``POST /v1/envs {"scenario_id"}`` does
(quotas included) and the reply's ``Mcp-Session-Id`` is the env's id; every later
request of the session names it and is served as the env's own endpoint. The session
lives in the database (the env row), never in a process, so any replica serves any
request of it. ``DELETE`` with the session id ends the session by deleting the env (as
``DELETE /v1/envs/{id}``: read the trajectory first, or keep the session open);
an initialize the SDK refuses deletes the env it made.

Both endpoints are stateless: no MCP session state is kept in the server (each request
runs on a transport of its own; a plain ``tools/call`` is answered directly with the SDK's
models, :mod:`.mcp_calls`), so any API replica serves any call. Every request
needs the tenant's ``Authorization: Bearer <api key>`` (401/403 as every route); an env
or session of another tenant, an unknown one, or (scenario endpoint) an env of another
scenario is 404 ``not_found``, never revealing that it exists. ``GET`` (the optional
server-to-client event stream) is 405. Malformed JSON-RPC gets the SDK's JSON-RPC
errors: a body that is not JSON -32700 (HTTP 400); a method the protocol does not know
-32602 (the SDK validates it as a request of every known method); a protocol method these
servers do not offer (``prompts/list``) -32601.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import orjson
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Receive, Scope, Send

from ..envs.history import EnvHistory
from ..envs.lifecycle import EnvLifecycle
from ..envs.steps import Steps
from ..errors import ApiError, NotFound, PayloadTooLarge, error_reply
from ..metrics import StepClock
from ..schemas.envs import EnvCreate, StepRequest
from ..services.quotas import TenantContext
from ..services.tenants import TenantService
from ..settings import ApiSettings
from . import mcp_calls
from .access_log import note_route, note_tenant
from .handlers import count_rejection, error_response
from .mcp_door import ENV_TEMPLATE, SCENARIO_TEMPLATE

META_KEY = "sandpit/step"
"""The ``_meta`` key of a ``tools/call`` result that holds the step's record."""
SESSION_HEADER = "mcp-session-id"
"""The Streamable HTTP session header (the scenario endpoint's env id)."""
SERVER_ERROR = -32000
"""JSON-RPC code of a refused request that is not the caller's parameters' fault (409,
429, 503, 404, 401...): its ``data.status`` says which."""
RESOURCE_NOT_FOUND = -32002
"""JSON-RPC code of ``resources/read`` for a URI this env does not have (the MCP
specification's)."""
_SCOPE_KEY = "sandpit.mcp"
_T = TypeVar("_T")


class BlockingRunner(Protocol):
    """``await run(work)``: ``work()``'s value, run on a worker thread."""

    def __call__(self, work: Callable[[], _T], /) -> Awaitable[_T]: ...
log = logging.getLogger("sandpit.api")


@dataclass(frozen=True)
class McpCall:
    """Who calls which env: what the endpoint checked before the SDK dispatched the
    request (kept on the ASGI scope, read by the handlers through the SDK's request
    context)."""

    caller: TenantContext
    env_id: str


def state_uri(env_id: str) -> str:
    """``sandpit://envs/{env_id}/state``: the env's state resource."""
    return f"sandpit://envs/{env_id}/state"


def trajectory_uri(env_id: str) -> str:
    """``sandpit://envs/{env_id}/trajectory``: the env's trajectory resource."""
    return f"sandpit://envs/{env_id}/trajectory"


def mcp_tool(schema: dict[str, Any]) -> types.Tool:
    """An OpenAI function-calling schema (``{"type": "function", "function": {"name",
    "description", "parameters"}}``, or the bare function object) as an MCP tool; the
    ``parameters`` object schema is the ``inputSchema`` (``{"type": "object"}`` when it
    has none, as MCP requires an object schema)."""
    function = schema.get("function", schema)
    parameters = function.get("parameters")
    input_schema = dict(parameters) if isinstance(parameters, dict) else {}
    input_schema.setdefault("type", "object")
    return types.Tool(name=str(function["name"]), description=function.get("description"), inputSchema=input_schema)


def tool_result(document: dict[str, Any]) -> types.CallToolResult:
    """A step (``StepResult``'s document) as a ``tools/call`` result: the observation as
    text, ``isError`` unless its status is ``ok``, its record under :data:`META_KEY`."""
    record = {name: document[name] for name in ("env_id", "episode", "step", "status", "reward", "terminated",
                                                 "truncated", "duration_ms", "recovered", "error", "checks",
                                                 "failure", "mask", "episode_failure", "episode_mask")}
    return types.CallToolResult(content=[types.TextContent(type="text", text=document["observation"])],
                                isError=document["status"] != "ok", **{"_meta": {META_KEY: record}})


def rpc_error(exc: ApiError) -> McpError:
    """An API error as a JSON-RPC error: code -32602 (invalid params) for 413 and 422,
    else :data:`SERVER_ERROR`; ``data`` is ``{"status": <HTTP status>, "error": <the
    API's error object (code, message, field, limit, retry_after)>}``."""
    reply = error_reply(exc)
    code = types.INVALID_PARAMS if reply.status in (413, 422) else SERVER_ERROR
    return McpError(types.ErrorData(code=code, message=exc.message, data={"status": reply.status, **reply.body}))


class McpServer:
    """The MCP face of the API: one SDK server whose handlers read the env of each
    request from its scope (:class:`McpCall`), and the two ASGI endpoints in front of it
    (see the module docstring).

    Args:
        settings: ``max_body_bytes`` (the largest MCP request body, bytes).
        tenants: API keys.
        envs: the env's existence and owner; the scenario endpoint's env creation and
            deletion.
        steps: ``tools/call``.
        history: the state and trajectory resources.
        translate: turns a foreign exception (the executor's) into an :class:`ApiError`,
            or None (then it is logged and answered as an internal error).
        version: the server version ``initialize`` reports.
        run_blocking: runs blocking work on a worker thread (the step door's threads,
            :meth:`.step.StepDoor.run`).

    :meth:`run` must be entered before requests are served: the app's MCP door
    (:class:`.mcp_door.McpDoor`) builds this server on the first MCP request and enters it.
    """

    def __init__(self, settings: ApiSettings, tenants: TenantService, envs: EnvLifecycle, steps: Steps,
                 history: EnvHistory, run_blocking: BlockingRunner,
                 translate: Callable[[Exception], ApiError | None] | None = None, version: str = "0.1.0") -> None:
        self.settings = settings
        self.tenants = tenants
        self.envs = envs
        self.steps = steps
        self.history = history
        self.translate = translate
        self.run_blocking = run_blocking
        self.server: Server[Any, Any] = Server("sandpit", version=version)
        handlers = self.server.request_handlers
        handlers[types.ListToolsRequest] = self._list_tools
        handlers[types.CallToolRequest] = self._call_tool
        handlers[types.ListResourcesRequest] = self._list_resources
        handlers[types.ReadResourceRequest] = self._read_resource
        self._manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve while entered: a new stateless session manager (the SDK's managers run
        once) whose task group holds the requests' server tasks."""
        manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True,
                                               max_request_body_size=self.settings.max_body_bytes)
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    # -- the endpoints ---------------------------------------------------------------------
    async def env(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/v1/envs/{env_id}/mcp`` (module docstring): the key and the env's owner are
        checked (on the event loop for a recently authenticated key and an env live in this
        process for its tenant, else one worker-thread hop with database reads), then the
        SDK answers."""
        note_route(scope, ENV_TEMPLATE)
        env_id: str = scope["path_params"]["env_id"]
        authorization = Headers(scope=scope).get("authorization")

        def check() -> TenantContext:
            caller = self.tenants.authenticate(authorization)
            note_tenant(scope, caller.tenant)
            self.envs.scenario_of(caller, env_id)
            return caller

        try:
            caller = self.tenants.authenticate_cached(authorization)  # a known key, a live env: no hop
            if caller is not None and self.envs.is_live_for(caller, env_id):
                note_tenant(scope, caller.tenant)
            else:
                caller = await self._blocking(check)
        except ApiError as exc:
            await self._error(exc, scope, receive, send)
            return
        if scope["method"] == "GET":
            await _no_stream(scope, receive, send)
            return
        await self._serve(McpCall(caller, env_id), scope, receive, send)

    async def scenario(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``/v1/scenarios/{scenario_id}/mcp`` (module docstring): ``initialize`` without a
        session opens a new env of the scenario whose id is the session id; a request with
        a session id is served as that env's endpoint (404 unless it is the caller's env
        of this scenario); ``DELETE`` deletes it."""
        note_route(scope, SCENARIO_TEMPLATE)
        scenario_id: str = scope["path_params"]["scenario_id"]
        headers = Headers(scope=scope)
        authorization, session = headers.get("authorization"), headers.get(SESSION_HEADER)
        method = scope["method"]
        try:
            caller = await self._blocking(lambda: self._caller(scope, authorization))
            if session is not None:
                if await self._blocking(lambda: self.envs.scenario_of(caller, session)) != scenario_id:
                    raise NotFound(f"session {session[:64]!r} not found")
                if method == "DELETE":
                    await self._blocking(lambda: self.envs.delete(caller, session))
                    await Response(status_code=204)(scope, receive, send)
                    return
        except ApiError as exc:
            await self._error(exc, scope, receive, send)
            return
        if method == "GET":
            await _no_stream(scope, receive, send)
            return
        if session is not None:
            await self._serve(McpCall(caller, session), scope, receive, send)
            return
        if method != "POST":
            await _bad_request("Bad Request: Missing session ID", scope, receive, send)
            return
        await self._open_session(caller, scenario_id, scope, receive, send)

    async def _open_session(self, caller: TenantContext, scenario_id: str, scope: Scope, receive: Receive,
                            send: Send) -> None:
        """A POST without a session: it must be ``initialize``; then a new env of the
        scenario, named in the reply's ``Mcp-Session-Id`` (deleted again when the SDK
        refuses the request)."""
        try:
            body = await _read_body(receive, self.settings.max_body_bytes)
        except PayloadTooLarge as exc:
            await self._error(exc, scope, receive, send)
            return
        initialize = _initialize(body)
        if initialize is None:
            await _bad_request("Bad Request: a request without Mcp-Session-Id must be initialize", scope,
                               _replay(body), send)
            return
        if not initialize:  # the SDK answers its JSON-RPC error; no env is made
            await self._serve(McpCall(caller, ""), scope, _replay(body), send)
            return
        try:
            created = await self._blocking(lambda: self.envs.create(caller, EnvCreate(scenario_id=scenario_id)))
        except ApiError as exc:
            await self._error(exc, scope, receive, send)
            return
        except ValidationError as exc:  # a scenario id the request model refuses
            await self._error(NotFound(f"scenario {scenario_id[:64]!r} not found: {exc.error_count()} error(s)"),
                              scope, receive, send)
            return
        env_id = created.public.id
        status: list[int] = []

        async def with_session(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message = {**message, "headers": [*message.get("headers", []),
                                                  (SESSION_HEADER.encode(), env_id.encode("ascii"))]}
            await send(message)

        try:
            await self._serve(McpCall(caller, env_id), scope, _replay(body), with_session)
        finally:
            if status[:1] != [200]:
                with anyio.CancelScope(shield=True):
                    try:
                        await self._blocking(lambda: self.envs.delete(caller, env_id))
                    except ApiError as exc:  # deleted already (a racing DELETE): nothing left to do
                        log.info("MCP session %s: its env is gone already: %s", env_id, exc.message)

    def _caller(self, scope: Scope, authorization: str | None) -> TenantContext:
        caller = self.tenants.authenticate(authorization)
        note_tenant(scope, caller.tenant)
        return caller

    async def _serve(self, call: McpCall, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a plain ``tools/call`` directly (:mod:`.mcp_calls`: the SDK's models and
        reply, without its per-request transport); hand anything else to the SDK with
        ``call`` on its scope."""
        manager = self._manager
        if manager is None:
            raise RuntimeError("McpServer.run() is not entered (the app's lifespan enters it)")
        if mcp_calls.takes_body(scope, Headers(scope=scope), self.settings.max_body_bytes):
            try:
                body = await _read_body(receive, self.settings.max_body_bytes)
            except PayloadTooLarge as exc:  # more bytes than its Content-Length said
                await self._error(exc, scope, receive, send)
                return
            direct = mcp_calls.direct_call(body)
            if direct is not None:
                request_id, request = direct
                try:
                    outcome: types.ServerResult | types.ErrorData = await self.step_result(call, request)
                except McpError as exc:
                    outcome = exc.error
                await Response(mcp_calls.reply(request_id, outcome), media_type=mcp_calls.JSON)(scope, receive, send)
                return
            receive = _replay(body)
        scope[_SCOPE_KEY] = call
        await manager.handle_request(scope, receive, send)

    async def _error(self, exc: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        count_rejection(exc, self.steps.metrics)
        await error_response(exc)(scope, receive, send)

    async def _blocking(self, work: Callable[[], _T]) -> _T:
        """``work()`` on a worker thread (``run_blocking``'s); a foreign exception the app
        translates (the executor's) is raised as its :class:`ApiError`."""
        try:
            return await self.run_blocking(work)
        except ApiError:
            raise
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is None:
                raise
            raise translated from exc

    # -- the SDK's handlers ----------------------------------------------------------------
    def _call(self) -> McpCall:
        """The :class:`McpCall` of the request being handled."""
        request = self.server.request_context.request
        call = request.scope.get(_SCOPE_KEY) if isinstance(request, Request) else None
        if not isinstance(call, McpCall):
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message="request without an env"))
        return call

    async def _rpc(self, work: Callable[[], _T]) -> _T:
        """:meth:`_blocking` with API errors as JSON-RPC errors (:func:`rpc_error`, 429s
        counted) and anything else logged and answered as an internal error without
        details."""
        try:
            return await self._blocking(work)
        except ApiError as exc:
            count_rejection(exc, self.steps.metrics)
            raise rpc_error(exc) from exc
        except Exception as exc:
            log.error("unhandled error in an MCP request", exc_info=exc)
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message="internal error")) from exc

    async def _list_tools(self, _request: types.ListToolsRequest) -> types.ServerResult:
        call = self._call()
        env = await self._rpc(lambda: self.envs.read(call.caller, call.env_id))
        return types.ServerResult(types.ListToolsResult(tools=[mcp_tool(tool) for tool in env.tools]))

    async def _call_tool(self, request: types.CallToolRequest) -> types.ServerResult:
        return await self.step_result(self._call(), request)

    async def step_result(self, call: McpCall, request: types.CallToolRequest) -> types.ServerResult:
        """The ``tools/call`` handler's work (module docstring): ``request`` as a recorded
        step of ``call``'s env, its result as :func:`tool_result`. Raises McpError
        (-32602 for a tool name the step request refuses; the API's refusals as
        :func:`rpc_error`; anything else as an internal error)."""
        try:
            action = StepRequest(name=request.params.name, arguments=request.params.arguments or {})
        except ValidationError as exc:  # a name over the step's length cap
            message = f"invalid tool call: {exc.errors()[0]['msg']}"
            raise McpError(types.ErrorData(code=types.INVALID_PARAMS, message=message)) from exc

        def work() -> dict[str, Any]:
            clock = StepClock()
            document = self.steps.step(call.caller, call.env_id, action, None, clock).document()
            clock.lap("serialize")
            clock.flush(self.steps.metrics)
            return document

        return types.ServerResult(tool_result(await self._rpc(work)))

    async def _list_resources(self, _request: types.ListResourcesRequest) -> types.ServerResult:
        env_id = self._call().env_id
        return types.ServerResult(types.ListResourcesResult(resources=[
            types.Resource(uri=state_uri(env_id), name="state", mimeType="application/json",  # type: ignore[arg-type]
                           description="The env's state at the head of its current episode (GET /state)."),
            types.Resource(uri=trajectory_uri(env_id), name="trajectory", mimeType="application/json",  # type: ignore[arg-type]
                           description="The current episode's steps (GET /trajectory)."),
        ]))

    async def _read_resource(self, request: types.ReadResourceRequest) -> types.ServerResult:
        call = self._call()
        uri = str(request.params.uri)
        reads: dict[str, Callable[[], str]] = {
            state_uri(call.env_id): lambda: self.history.state(call.caller, call.env_id, None, None).decode("utf-8"),
            trajectory_uri(call.env_id): lambda: self.history.trajectory(call.caller, call.env_id, None, None,
                                                                         0).model_dump_json(),
        }
        read = reads.get(uri)
        if read is None:
            raise McpError(types.ErrorData(code=RESOURCE_NOT_FOUND, message="resource not found",
                                           data={"uri": uri[:1024]}))
        text = await self._rpc(read)
        return types.ServerResult(types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=request.params.uri, mimeType="application/json", text=text)]))


def _initialize(body: bytes) -> bool | None:
    """Whether ``body`` is one valid JSON-RPC ``initialize`` request: True; an
    ``initialize`` whose params the protocol refuses: False; anything else (not JSON,
    another method, a batch): None."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    try:
        types.JSONRPCRequest.model_validate(message)
        types.InitializeRequest.model_validate({"method": "initialize", "params": message.get("params")})
    except ValidationError:
        return False
    return True


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body. Raises PayloadTooLarge over ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    """A ``receive`` that gives ``body`` once, then waits for the disconnect."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    return receive


async def _no_stream(scope: Scope, receive: Receive, send: Send) -> None:
    """405 for ``GET``: these servers offer no server-to-client event stream."""
    await JSONResponse({"error": {"code": "method_not_allowed", "message": "no event stream: POST JSON-RPC",
                                  "field": None}}, status_code=405, headers={"Allow": "POST, DELETE"})(
        scope, receive, send)


async def _bad_request(message: str, scope: Scope, receive: Receive, send: Send) -> None:
    """400 with a JSON-RPC error body (as the SDK answers a protocol error)."""
    error = types.JSONRPCError(jsonrpc="2.0", id="server-error",
                               error=types.ErrorData(code=types.INVALID_REQUEST, message=message))
    await Response(error.model_dump_json(by_alias=True, exclude_none=True), status_code=400,
                   media_type="application/json")(scope, receive, send)
