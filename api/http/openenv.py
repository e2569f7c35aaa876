"""Every scenario as an OpenEnv environment server: the HTTP and WebSocket protocol of
``openenv-core`` (its ``EnvClient``/``GenericEnvClient`` and their ``.sync()`` wrapper),
under ``/v1/scenarios/{scenario_id}/openenv`` (:data:`BASE_TEMPLATE`), so OpenEnv's own
client class drives a Sandpit scenario unchanged. This module does not import
``openenv-core``: the wire shapes are restated here (``openenv.core.env_server.types``).

WebSocket ``.../openenv/ws`` (:meth:`OpenEnvServer.websocket`), what the client speaks: one
connection is one session, and the session is one env of the scenario, created on the
first message that needs it (``reset``, ``step`` or ``state``) as ``POST /v1/envs
{"scenario_id"}`` does (quotas included) and deleted when the connection ends (``close``,
a disconnect, an error), as ``DELETE /v1/envs/{id}``: the steps are committed as on the
step route, but read the trajectory through the plain API before closing if it is wanted.
Messages are JSON text, one reply per request, in order:

- ``{"type": "reset", "data": {"seed"?: int >= 0, "episode_id"?: str}}``: the first reset
  creates the env (``seed`` seeds it as ``POST /v1/envs``' ``seed``); a later one starts
  the env's next episode (``POST /v1/envs/{id}/reset``). ``episode_id`` is accepted and
  ignored (Sandpit numbers episodes). Reply ``{"type": "observation", "data":
  {"observation": <EnvPublic>, "reward": null, "done": false}}``: the env as
  ``GET /v1/envs/{id}`` shows it (``observation`` the task, ``tools``, ``introduction``).
- ``{"type": "step", "data": <action>}``: the action is one of ``POST /v1/envs/{id}/step``'s
  three forms (``{"name", "arguments"}``, an OpenAI tool call ``{"type": "function",
  "function": {...}}``, or ``{"text": ...}``; a ``metadata`` object, which OpenEnv's typed
  actions carry, is dropped), run through the same :meth:`~sandpit.api.envs.steps.Steps.step`.
  Reply ``{"type": "observation", "data": {"observation": <StepResult>, "reward": <float>,
  "done": terminated or truncated}}``.
- ``{"type": "state"}``: reply ``{"type": "state", "data": {"episode_id": "<env id>:<episode>",
  "step_count": <step>, ...GET /v1/envs/{id}/state's StateView}}``.
- ``{"type": "close"}``: the server deletes the env and closes the connection.

An error is ``{"type": "error", "data": {"message", "code", ...}}`` and the session stays
open: ``INVALID_JSON``, ``VALIDATION_ERROR`` (with pydantic's ``errors``), ``UNKNOWN_TYPE``
(also ``mcp``: use ``/v1/envs/{id}/mcp``) as OpenEnv's server names them; a refused request
carries the API's error code (``episode_ended``, ``quota_exceeded``, ``no_capacity``...) with
``status`` (the HTTP status the plain API would answer) and ``error`` (its error object);
``EXECUTION_ERROR`` for anything unexpected (logged, no details). A binary frame is
``VALIDATION_ERROR``; a frame over the server's WebSocket size limit closes the connection.

Authentication: ``EnvClient`` cannot send headers, but the ``websockets`` library it uses
sends the URL's user information as HTTP Basic credentials. So the handshake takes
``Authorization: Bearer <api key>`` or ``Basic`` with the API key as the password (any user
name): ``base_url="http://sandpit:<api key>@host:8000/v1/scenarios/<id>/openenv"``. A bad
key (401), the operator key (403) or a scenario that is unknown or another tenant's (404)
refuses the handshake with the API's error (as an HTTP denial response where the server
supports it, else a close with code 1008 before accepting).

HTTP, the same key (Bearer or Basic): ``GET .../health`` (``{"status": "healthy"}``),
``GET .../schema`` (JSON schemas of action, observation and state), ``GET .../metadata``;
and ``POST .../reset``, ``POST .../step``, ``GET .../state``, stateful where OpenEnv's are
not: OpenEnv's ``episode_id`` names the env (``POST .../reset`` without it creates one,
whose id is ``observation.id``; with it, resets that env; ``POST .../step`` needs it beside
``action``; ``GET .../state?episode_id=``). These envs are ordinary envs: deleted by
``DELETE /v1/envs/{id}`` or their lifetime. An env of another tenant or another scenario
is 404. Errors are the API's error responses (never a 500).
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import Scope
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..envs.episodes import Episodes
from ..envs.history import EnvHistory
from ..envs.lifecycle import EnvLifecycle
from ..envs.steps import Steps
from ..errors import ApiError, InvalidRequest, NotFound, PayloadTooLarge, error_reply
from ..metrics import StepClock
from ..schemas.envs import EnvCreate, EnvPublic, ResetRequest, Seed, StateView, StepRequest, StepResult
from ..services.quotas import TenantContext
from ..services.scenarios import ScenarioService
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .access_log import note_route, note_tenant
from .handlers import count_rejection, error_response

BASE_TEMPLATE = "/v1/scenarios/{scenario_id}/openenv"
"""The path every OpenEnv route of a scenario is under (the client's ``base_url``)."""
WS_TEMPLATE = BASE_TEMPLATE + "/ws"
"""The WebSocket session's path (``EnvClient`` appends ``/ws`` to its base URL)."""
POLICY_VIOLATION = 1008
"""WebSocket close code of a refused handshake where no HTTP denial response can be sent."""
_T = TypeVar("_T")
log = logging.getLogger("sandpit.api")


class OpenEnvReset(BaseModel):
    """OpenEnv's ``ResetRequest`` (HTTP body, WebSocket ``reset`` data): ``seed`` seeds the
    new episode; ``episode_id`` names the env to reset over HTTP (ignored over WebSocket)."""

    model_config = ConfigDict(extra="forbid")
    seed: Seed | None = None
    episode_id: str | None = Field(default=None, max_length=255)


class OpenEnvStep(BaseModel):
    """OpenEnv's HTTP ``StepRequest``: ``action`` (a step action, :func:`step_action`) and,
    for Sandpit, ``episode_id``: the env to step. ``timeout_s`` and ``request_id`` are
    accepted and ignored (the env's profile sets the call's timeout)."""

    model_config = ConfigDict(extra="forbid")
    action: dict[str, Any]
    episode_id: str = Field(max_length=255)
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


class _Message(BaseModel):
    """A WebSocket request: OpenEnv's ``WSResetMessage | WSStepMessage | WSStateMessage |
    WSCloseMessage`` (``data`` is an object; no other keys)."""

    model_config = ConfigDict(extra="forbid")
    type: str
    data: dict[str, Any] | None = None


def key_authorization(authorization: str | None) -> str | None:
    """The ``Authorization`` header as the API's ``Bearer <key>``: a ``Basic`` credential
    (what ``websockets`` sends for ``user:key@`` in a URL) becomes ``Bearer <its password>``;
    anything else is returned as it is (the tenant service refuses it). A ``Basic`` value
    that is not base64 of ``user:password`` becomes ``Bearer`` with no key (refused: 401)."""
    if authorization is None:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic":
        return authorization
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return "Bearer "
    _, colon, password = decoded.partition(":")
    return f"Bearer {password}" if colon else "Bearer "


def step_action(data: dict[str, Any]) -> StepRequest:
    """An OpenEnv action as a step request: ``metadata`` (OpenEnv's ``Action`` field) is
    dropped when it is an object, the rest must be one of :class:`StepRequest`'s forms.
    Raises ValidationError."""
    if isinstance(data.get("metadata"), dict):
        data = {k: v for k, v in data.items() if k != "metadata"}
    return StepRequest.model_validate(data)


def reset_reply(env: EnvPublic) -> dict[str, Any]:
    """OpenEnv's ``ResetResponse`` of a fresh episode: the env's document as observation."""
    return {"observation": env.model_dump(mode="json"), "reward": None, "done": env.episode_status != "running"}


def step_reply(document: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's ``StepResponse`` of a step (``StepResult``'s document): ``reward`` the
    step's (0.0 until the episode ends), ``done`` when it terminated or was truncated."""
    return {"observation": document, "reward": document["reward"],
            "done": bool(document["terminated"] or document["truncated"])}


def state_reply(view: dict[str, Any]) -> dict[str, Any]:
    """OpenEnv's ``State`` (``episode_id``, ``step_count``) over ``GET /state``'s StateView."""
    return {"episode_id": f"{view['env_id']}:{view['episode']}", "step_count": view["step"], **view}


def ws_error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """OpenEnv's ``WSErrorResponse``: ``{"type": "error", "data": {"message", "code", ...}}``."""
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def api_ws_error(exc: ApiError) -> dict[str, Any]:
    """An API error as a WebSocket error: the API's code, ``status`` (what the plain API
    answers) and ``error`` (its error object)."""
    reply = error_reply(exc)
    return ws_error(reply.body["error"]["code"], exc.message, status=reply.status, error=reply.body["error"])


def validation_ws_error(exc: ValidationError) -> dict[str, Any]:
    """A message pydantic refused: ``VALIDATION_ERROR`` with its errors (inputs left out)."""
    errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()[:20]]
    return ws_error("VALIDATION_ERROR", "Invalid message", errors=errors)


def schemas() -> dict[str, Any]:
    """``GET .../schema``: OpenEnv's ``SchemaResponse`` (action, observation, state)."""
    return {"action": StepRequest.model_json_schema(), "observation": StepResult.model_json_schema(),
            "state": StateView.model_json_schema()}


@dataclass
class _Session:
    """One WebSocket session: its caller, scenario, and env once made."""

    caller: TenantContext
    scenario_id: str
    env_id: str | None = None
    fresh: bool = False
    """The env was just made and its first episode is not yet reported by a ``reset``."""


class OpenEnvServer:
    """The OpenEnv face of the API (the module docstring): the WebSocket session and the
    HTTP routes of :data:`BASE_TEMPLATE`, over the env verbs.

    Args:
        settings: ``max_body_bytes`` (the largest HTTP request body, bytes).
        tenants: API keys.
        scenarios: the scenario's existence and owner, ``metadata``.
        envs: creation, deletion and ownership of the sessions' envs.
        episodes: ``reset`` of an existing env.
        steps: ``step``.
        history: ``state``.
        translate: turns a foreign exception (the executor's) into an :class:`ApiError`,
            or None (then it is logged and answered as an internal error).
    """

    def __init__(self, settings: ApiSettings, tenants: TenantService, scenarios: ScenarioService,
                 envs: EnvLifecycle, episodes: Episodes, steps: Steps, history: EnvHistory,
                 translate: Callable[[Exception], ApiError | None] | None = None) -> None:
        self.settings = settings
        self.tenants = tenants
        self.scenarios = scenarios
        self.envs = envs
        self.episodes = episodes
        self.steps = steps
        self.history = history
        self.translate = translate

    # -- shared ----------------------------------------------------------------------------
    async def _blocking(self, work: Callable[[], _T]) -> _T:
        """``work()`` on a worker thread; a foreign exception the app translates (the
        executor's) is raised as its :class:`ApiError`."""
        try:
            return await anyio.to_thread.run_sync(work)
        except ApiError:
            raise
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is None:
                raise
            raise translated from exc

    def _caller(self, scope: Scope, scenario_id: str) -> TenantContext:
        """The caller of ``scope`` once its key is known and the scenario is its own.
        Raises Unauthorized, Forbidden, NotFound."""
        caller = self.tenants.authenticate(key_authorization(Headers(scope=scope).get("authorization")))
        note_tenant(scope, caller.tenant)
        self.scenarios.read(caller, scenario_id)
        return caller

    def _env_of(self, caller: TenantContext, scenario_id: str, env_id: str) -> str:
        """``env_id`` once it is the caller's env of this scenario. Raises NotFound."""
        if self.envs.scenario_of(caller, env_id) != scenario_id:
            raise NotFound(f"env {env_id[:64]!r} not found")
        return env_id

    def _create(self, caller: TenantContext, scenario_id: str, seed: int | None) -> EnvPublic:
        try:
            body = EnvCreate(scenario_id=scenario_id, seed=seed)
        except ValidationError as exc:  # a scenario id the request model refuses
            raise NotFound(f"scenario {scenario_id[:64]!r} not found") from exc
        return self.envs.create(caller, body).public

    def _step(self, caller: TenantContext, env_id: str, action: StepRequest) -> dict[str, Any]:
        clock = StepClock()
        document = self.steps.step(caller, env_id, action, None, clock).document()
        clock.lap("serialize")
        clock.flush(self.steps.metrics)
        return document

    def _state(self, caller: TenantContext, env_id: str) -> dict[str, Any]:
        view: dict[str, Any] = orjson.loads(self.history.state(caller, env_id, None, None))
        return state_reply(view)

    # -- the WebSocket session -------------------------------------------------------------
    async def websocket(self, socket: WebSocket) -> None:
        """``.../openenv/ws`` (module docstring): the key and the scenario are checked
        before the handshake is accepted; then one reply per message until ``close`` or
        a disconnect; the session's env is deleted however the session ends."""
        scope = socket.scope
        note_route(scope, WS_TEMPLATE)
        scenario_id: str = socket.path_params["scenario_id"]
        try:
            caller = await self._blocking(lambda: self._caller(scope, scenario_id))
        except ApiError as exc:
            await self._deny(socket, exc)
            return
        await socket.accept()
        session = _Session(caller, scenario_id)
        try:
            while True:
                message = await socket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    await socket.send_text(orjson.dumps(ws_error(
                        "VALIDATION_ERROR", "messages are JSON text frames, not binary")).decode())
                    continue
                reply = await self._answer(session, text)
                if reply is None:
                    await socket.close()
                    break
                await socket.send_text(orjson.dumps(reply).decode())
        except WebSocketDisconnect:
            pass
        finally:
            await self._end(session)

    async def _deny(self, socket: WebSocket, exc: ApiError) -> None:
        """Refuse the handshake with the API's error response (a close where the server
        cannot send one)."""
        count_rejection(exc, self.steps.metrics)
        if "websocket.http.response" in socket.scope.get("extensions", {}):
            await socket.send_denial_response(error_response(exc))
        else:
            await socket.close(code=POLICY_VIOLATION, reason=exc.message[:120])

    async def _end(self, session: _Session) -> None:
        """Delete the session's env (shielded: runs even when the session is cancelled)."""
        env_id = session.env_id
        if env_id is None:
            return
        session.env_id = None
        with anyio.CancelScope(shield=True):
            try:
                await self._blocking(lambda: self.envs.delete(session.caller, env_id))
            except ApiError as exc:  # deleted already through the plain API
                log.info("OpenEnv session %s: its env is gone already: %s", env_id, exc.message)
            except Exception as exc:
                log.error("OpenEnv session %s: deleting its env failed", env_id, exc_info=exc)

    async def _answer(self, session: _Session, text: str) -> dict[str, Any] | None:
        """The reply to one message (None: ``close``)."""
        try:
            raw = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            return ws_error("INVALID_JSON", f"Invalid JSON: {exc}")
        try:
            message = _Message.model_validate(raw)
            kind = message.type
            if kind == "close":
                return None
            if kind == "reset":
                reset = OpenEnvReset.model_validate(message.data or {})
                return {"type": "observation", "data": reset_reply(await self._ws_reset(session, reset.seed))}
            if kind == "step":
                if message.data is None:
                    raise InvalidRequest("a step message needs data: the action", field="data")
                action = step_action(message.data)
                env_id = await self._ws_env(session)
                session.fresh = False
                document = await self._blocking(lambda: self._step(session.caller, env_id, action))
                return {"type": "observation", "data": step_reply(document)}
            if kind == "state":
                env_id = await self._ws_env(session)
                return {"type": "state", "data": await self._blocking(lambda: self._state(session.caller, env_id))}
            hint = ": use /v1/envs/{env_id}/mcp" if kind == "mcp" else ""
            return ws_error("UNKNOWN_TYPE", f"Unknown message type: {kind[:64]}{hint}")
        except ValidationError as exc:
            return validation_ws_error(exc)
        except ApiError as exc:
            count_rejection(exc, self.steps.metrics)
            return api_ws_error(exc)
        except Exception as exc:
            log.error("unhandled error in an OpenEnv session", exc_info=exc)
            return ws_error("EXECUTION_ERROR", "internal error")

    async def _ws_env(self, session: _Session) -> str:
        """The session's env, made now when it has none."""
        if session.env_id is None:
            await self._ws_reset(session, None)
        assert session.env_id is not None
        return session.env_id

    async def _ws_reset(self, session: _Session, seed: int | None) -> EnvPublic:
        """``reset``: the session's first makes its env; a later one (or a seeded one
        after an unseeded env was made for ``step``/``state``) starts the next episode."""
        caller, env_id = session.caller, session.env_id
        if env_id is None:
            def create() -> EnvPublic:  # the id is kept in the worker thread: a cancelled wait still deletes it
                made = self._create(caller, session.scenario_id, seed)
                session.env_id, session.fresh = made.id, True
                return made

            return await self._blocking(create)
        if session.fresh and seed is None:
            session.fresh = False
            return await self._blocking(lambda: self.envs.read(caller, env_id))
        session.fresh = False
        return await self._blocking(lambda: self.episodes.reset(caller, env_id, ResetRequest(seed=seed)))

    # -- HTTP ------------------------------------------------------------------------------
    async def _http(self, request: Request, template: str,
                    work: Callable[[TenantContext, str], Any], status: int = 200) -> Response:
        """Authenticate, check the scenario, run ``work(caller, scenario_id)`` on a worker
        thread and answer its JSON; an API error is the API's error response (so a
        malformed request whose ``work`` raises its error is 401/404 before it is 422)."""
        note_route(request.scope, BASE_TEMPLATE + template)
        scenario_id: str = request.path_params["scenario_id"]

        def run() -> Any:
            return work(self._caller(request.scope, scenario_id), scenario_id)

        try:
            return JSONResponse(await self._blocking(run), status_code=status)
        except ApiError as exc:
            count_rejection(exc, self.steps.metrics)
            return error_response(exc)

    async def _body(self, request: Request, model: type[BaseModel], empty: bool) -> Any:
        """The request's JSON body as ``model`` (``empty``: no body is ``{}``), or the
        ApiError it makes: PayloadTooLarge (413) over ``max_body_bytes``, InvalidRequest
        (422) for a body that is not JSON or does not fit."""
        limit, chunks, size = self.settings.max_body_bytes, [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return PayloadTooLarge(f"request body over {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            data = orjson.loads(raw) if raw or not empty else {}
            return model.model_validate(data)
        except orjson.JSONDecodeError as exc:
            return InvalidRequest(f"the body is not JSON: {exc}")
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            return InvalidRequest(f"{field or 'body'}: {first['msg']}", field=field)

    async def health(self, request: Request) -> Response:
        """``GET .../health``: ``{"status": "healthy"}`` (OpenEnv's ``HealthResponse``) for
        the caller's scenario. Raises (as responses) 401, 403, 404."""
        return await self._http(request, "/health", lambda _c, _s: {"status": "healthy"})

    async def schema(self, request: Request) -> Response:
        """``GET .../schema``: :func:`schemas`. 401, 403, 404 as :meth:`health`."""
        return await self._http(request, "/schema", lambda _c, _s: schemas())

    async def metadata(self, request: Request) -> Response:
        """``GET .../metadata``: OpenEnv's ``EnvironmentMetadata`` of the scenario: ``name``
        its id, ``description`` its task, ``version`` the environment's id."""

        def work(caller: TenantContext, scenario_id: str) -> dict[str, Any]:
            scenario = self.scenarios.read(caller, scenario_id)
            return {"name": scenario.id, "description": scenario.task, "readme_content": None,
                    "version": scenario.environment_id, "author": None, "documentation_url": None}

        return await self._http(request, "/metadata", work)

    async def reset(self, request: Request) -> Response:
        """``POST .../reset`` (:class:`OpenEnvReset`, the body optional): a new env of the
        scenario, or with ``episode_id`` the next episode of that env; :func:`reset_reply`.
        Errors: 413, 422 (malformed body), 404 (an env not of this scenario or tenant), and
        ``POST /v1/envs``' (429, 503, ...)."""
        body = await self._body(request, OpenEnvReset, empty=True)

        def work(caller: TenantContext, scenario_id: str) -> dict[str, Any]:
            if isinstance(body, ApiError):
                raise body
            if body.episode_id is None:
                return reset_reply(self._create(caller, scenario_id, body.seed))
            env_id = self._env_of(caller, scenario_id, body.episode_id)
            return reset_reply(self.episodes.reset(caller, env_id, ResetRequest(seed=body.seed)))

        return await self._http(request, "/reset", work)

    async def step(self, request: Request) -> Response:
        """``POST .../step`` (:class:`OpenEnvStep`): one step of the env ``episode_id``;
        :func:`step_reply`. Errors: 413, 422 (malformed body or action), 404, and
        ``POST /v1/envs/{id}/step``'s (409 ``episode_ended``, 429, 503, ...)."""
        body = await self._body(request, OpenEnvStep, empty=False)

        def work(caller: TenantContext, scenario_id: str) -> dict[str, Any]:
            if isinstance(body, ApiError):
                raise body
            try:
                action = step_action(body.action)
            except ValidationError as exc:
                raise InvalidRequest(f"action: {exc.errors()[0]['msg']}", field="action") from exc
            return step_reply(self._step(caller, self._env_of(caller, scenario_id, body.episode_id), action))

        return await self._http(request, "/step", work)

    async def state(self, request: Request) -> Response:
        """``GET .../state?episode_id=<env id>``: :func:`state_reply`. Errors: 422 without
        ``episode_id``, 404."""
        episode_id = request.query_params.get("episode_id")

        def work(caller: TenantContext, scenario_id: str) -> dict[str, Any]:
            if not episode_id:
                raise InvalidRequest("episode_id (the env's id) is required", field="episode_id")
            return self._state(caller, self._env_of(caller, scenario_id, episode_id[:255]))

        return await self._http(request, "/state", work)



def routes() -> list[BaseRoute]:
    """The Starlette routes of every endpoint, each served by the app's
    :class:`OpenEnvServer` (``app.state.openenv``, made in the lifespan)."""

    def server(connection: HTTPConnection) -> OpenEnvServer:
        found: OpenEnvServer = connection.app.state.openenv
        return found

    async def websocket(socket: WebSocket) -> None:
        await server(socket).websocket(socket)

    def endpoint(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            handler: Callable[[Request], Awaitable[Response]] = getattr(server(request), name)
            return await handler(request)
        return serve

    http = [("/health", "GET", "health"), ("/schema", "GET", "schema"), ("/metadata", "GET", "metadata"),
            ("/reset", "POST", "reset"), ("/step", "POST", "step"), ("/state", "GET", "state")]
    found: list[BaseRoute] = [Route(BASE_TEMPLATE + path, endpoint(name), methods=[method])
                              for path, method, name in http]
    return [WebSocketRoute(WS_TEMPLATE, websocket), *found]
