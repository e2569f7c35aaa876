"""The env reset's door: every ``POST /v1/envs/{env_id}/reset`` is answered by
:class:`ResetDoor`, in front of FastAPI's stack, as :class:`~.create_env.CreateDoor`
answers a create.

Why: a trainer resets every env at every episode's start, and a reset from the warm pool
is a few milliseconds of work (the previous session handed to a closer thread, the
sandbox's ``open``, one write transaction), about what a create is. FastAPI's generic
path (route matching over every route, four dependencies, two of them on the thread
pool, the body model validated on the event loop, the middleware stack) added about
1.1 ms to a reset of 6.5 ms at the client (p50, ``docs/performance.md``). The door does
exactly what the route ``reset`` (``api/http/routes/envs.py``) and its dependencies do,
with one hop to a worker thread:

1. The body as the step door reads it (:meth:`.step.StepDoor.read_body`): 413 over
   ``max_body_bytes``, 408 when it is not whole within ``body_read_timeout_s``.
2. On the thread, in FastAPI's order (the route's parameters: the caller, the
   ``Idempotency-Key`` dependency, the attempt fence, then the body): the JSON rules
   (:func:`~.strict_json.parse_body`, for a non-empty body: 413, 422 for a body that is
   not strict JSON), the API key (401/403, the tenant noted for the access log), the
   ``Idempotency-Key`` header validated as the route's header parameter
   (:data:`~.deps.IdempotencyKeyHeader`), the ``Sandpit-Attempt`` header validated as
   :data:`~.deps.AttemptHeader` and, when it is valid, the fence
   (:meth:`~sandpit.api.envs.attempts.Attempts.check`: 409 ``stale_attempt``, before any
   422 of the headers or the body, as FastAPI calls a dependency whose own parameters
   are valid), then the body: none (an empty body, or JSON ``null``) is a reset with the
   env's current scenario, config and options, else a
   :class:`~sandpit.api.schemas.envs.ResetRequest` (:func:`~.shapes.validated_body`); a
   422 names the headers' errors before the body's.
3. :meth:`~sandpit.api.envs.episodes.Episodes.reset` and its JSON reply, 200, under the
   ``Idempotency-Key`` semantics of :meth:`.deps.Idempotent.respond`: with a key,
   claimed first (the digest of :func:`.deps.idempotent`: method, the template
   ``/v1/envs/{env_id}/reset``, the env id, query and body bytes): a replay of the stored
   reply (its status, ``Idempotent-Replayed: true``) or a 409 starts no episode; an error
   releases the key; the reply is stored on the key in the transaction that starts the
   episode (:class:`~sandpit.api.db.idempotency.ReplyOnKey`, as the create's door does).

The work runs on the create door's threads (:attr:`.create_env.CreateDoor.run`): a reset
from an empty pool waits for a sandbox as a create does, and steps must not queue behind
it. The answer is rendered by the step door's :meth:`~.step.StepDoor.answer`, as the
create's is. The access log names the request by the route's template. The router keeps
the operation: it is what the OpenAPI document describes and what answers other methods
on the path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

from pydantic import TypeAdapter
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from ..db.idempotency import ReplyOnKey
from ..envs.attempts import Attempts
from ..envs.episodes import Episodes
from ..schemas.envs import ResetRequest
from ..services.idempotency import KEY_HEADER, Idempotency, Replay, request_digest
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .access_log import note_tenant
from .deps import ATTEMPT_HEADER, AttemptHeader, IdempotencyKeyHeader
from .shapes import Invalid, header_errors, reads_as_json, validated_body
from .step import StepDoor, posted_env_id, text
from .strict_json import parse_body

RESET_TEMPLATE = "/v1/envs/{env_id}/reset"
"""The operation's path template (what the access log and the key's digest name it by)."""
RESET_PATH = compile_path(RESET_TEMPLATE)[0]
"""The template as Starlette's router matches it (``{env_id}`` is one path segment)."""
RESET = 200
"""The status of a new episode (the route's)."""
_BODY = TypeAdapter(ResetRequest)
_KEY = TypeAdapter(IdempotencyKeyHeader)  # the route's header parameters: FastAPI's errors, word for word
_ATTEMPT = TypeAdapter(AttemptHeader)


class ResetDoor:
    """The ASGI handler of ``POST /v1/envs/{env_id}/reset`` (see the module docstring).

    Args:
        door: the step door, whose body reading and answer rendering this door shares
            (not its threads).
        run: runs the work on worker threads (the create door's
            :attr:`~.create_env.CreateDoor.run`).

    It reads the services from the app in the scope (``app.state``: ``settings``,
    ``tenants``, ``episodes``, ``attempts``, ``idempotency``, ``metrics``), as the route's
    dependencies do.
    """

    def __init__(self, door: StepDoor, run: Callable[[Callable[[], bytes | Replay]], Awaitable[bytes | Replay]]
                 ) -> None:
        self.door = door
        self.run = run

    @staticmethod
    def env_id(scope: Scope) -> str | None:
        """The env id of an HTTP ``POST`` to the reset path (matched as the router matches
        it), else None."""
        return posted_env_id(scope, RESET_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, env_id: str) -> None:
        """Answer the reset request of ``scope`` for ``env_id`` (module docstring): the work
        on :attr:`run`'s threads, the answer as the step door renders one (200, or a
        stored reply with ``Idempotent-Replayed: true`` first, where the route's response
        puts it)."""
        request_read = await self.door.read_request(scope, receive, send, RESET_TEMPLATE)
        if request_read is None:
            return
        headers, body = request_read
        state = scope["app"].state
        work = partial(_reset, scope, env_id, state.tenants, state.episodes, state.attempts, state.idempotency,
                       state.settings, body, text(headers.get(b"authorization")),
                       text(headers.get(b"content-type")), text(headers.get(b"idempotency-key")),
                       text(headers.get(b"sandpit-attempt")), scope.get("query_string", b""))
        await self.door.answer(work, scope, receive, send, status=RESET, run=self.run, replayed_first=True)


def _reset(scope: Scope, env_id: str, tenants: TenantService, episodes: Episodes, attempts: Attempts,
           keys: Idempotency, settings: ApiSettings, body: bytes, authorization: str | None,
           content_type: str | None, key: str | None, attempt: str | None, query: bytes) -> bytes | Replay:
    """The route's work on a worker thread, in FastAPI's order (module docstring): the
    env's JSON bytes after the reset, or the key's stored reply. Raises what the route
    raises (the JSON rules' ApiErrors, Unauthorized, Forbidden, StaleAttempt,
    :class:`Invalid`, the reset's and the key's ApiErrors, executor errors)."""
    parsed = parse_body(body, settings) if body else None  # the strict route's JSON rules come first
    caller = tenants.authenticate(authorization)
    note_tenant(scope, caller.tenant)
    errors = header_errors(_KEY, KEY_HEADER, key)
    attempt_errors = header_errors(_ATTEMPT, ATTEMPT_HEADER, attempt)
    if not attempt_errors:
        attempts.check(caller, env_id, attempt)  # the fence, called once its header is valid
    errors += attempt_errors
    request: ResetRequest | None = None
    if body and not (parsed is None and reads_as_json(content_type)):  # none, or JSON null: the default
        validated = validated_body(_BODY, body, parsed, content_type)
        request = validated[0]
        errors += validated[1]
    if errors:
        raise Invalid(errors)

    if key is None:
        return episodes.reset(caller, env_id, request).model_dump_json().encode("utf-8")
    claim = keys.begin(caller.tenant, key, request_digest("POST", RESET_TEMPLATE, env_id, query, body))
    if isinstance(claim, Replay):
        return claim
    reply_on = ReplyOnKey(claim, RESET)
    try:  # the reply is stored on the key by the transaction that starts the episode
        public = episodes.reset(caller, env_id, request, reply_on)
    except BaseException:
        keys.release(claim)
        raise
    return reply_on.body if reply_on.body is not None else public.model_dump_json().encode("utf-8")
