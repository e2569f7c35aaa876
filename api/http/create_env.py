"""The env create's door: every ``POST /v1/envs`` is answered by :class:`CreateDoor`, in
front of FastAPI's stack, as :class:`~.step.StepDoor` answers a step.

Why: a create from the warm pool is a few milliseconds of work (the sandbox's ``open``,
one write transaction), and FastAPI's generic path (route matching over every route,
each dependency on the thread pool, the body model validated on the event loop, the
middleware stack) costs about as much again. The door does exactly what the route
``create_env`` (``api/http/routes/envs.py``) and its dependencies do, with one hop to a
worker thread:

1. The body as the step door reads it (:meth:`.step.StepDoor.read_body`): 413 over
   ``max_body_bytes``, 408 when it is not whole within ``body_read_timeout_s``.
2. On the thread, in FastAPI's order: the JSON rules (:func:`~.strict_json.parse_body`:
   413, 422 for a body that is not strict JSON), then the API key (401/403, the tenant
   noted for the access log), then the request's shape: ``Idempotency-Key`` validated as
   the route's header parameter (:data:`~.deps.IdempotencyKeyHeader`) and the body as
   :class:`~sandpit.api.schemas.envs.EnvCreate` (:func:`~.shapes.validated_body`), a 422
   naming the first field (the header's before the body's, as FastAPI orders them).
3. :meth:`~sandpit.api.envs.lifecycle.EnvLifecycle.create` and its JSON reply, 201,
   under the ``Idempotency-Key`` semantics of :meth:`.deps.Idempotent.respond`: with a
   key, claimed first (the digest of :func:`.deps.idempotent`: method, the template
   ``/v1/envs``, query and body bytes): a replay of the stored reply (its status,
   ``Idempotent-Replayed: true``) or a 409 creates nothing; an error releases the key;
   the reply is stored on the key in the transaction that commits the env
   (:class:`~sandpit.api.db.idempotency.ReplyOnKey`: one transaction fewer than
   :meth:`.deps.Idempotent.respond`'s store after it, and no moment when the env is
   committed and its key has no reply).

The work runs on threads of the door's own (:class:`~.handoff.WorkerThreads`, at most
``http_threads`` creates at once; more wait for a free thread, in order): never the step
door's threads (a create from an empty pool waits seconds for a sandbox, and steps must
not queue behind it), nor AnyIO's, whose hop (backend look-up, capacity limiter, cancel
scope, and a result handed back to the event loop with the GIL held) cost 0.16 ms there
and 0.26 ms back (p50 in the server) of a create from the warm pool that takes a few
milliseconds.

The answer is rendered by the step door's :meth:`~.step.StepDoor.answer`: errors from the
one table (:mod:`.handlers`, 429s counted), executor errors translated as the app's
handler does, anything else logged and answered 500 ``internal``. The access log names the request by the route's template. The router
keeps the operation: it is what the OpenAPI document describes and what answers other
methods (``GET /v1/envs`` lists envs) and paths (``/v1/envs/``).
"""

from __future__ import annotations

from functools import partial

from pydantic import TypeAdapter
from starlette.types import Receive, Scope, Send

from ..db.idempotency import ReplyOnKey
from ..envs.lifecycle import EnvLifecycle
from ..schemas.envs import EnvCreate
from ..services.idempotency import KEY_HEADER, Idempotency, Replay, request_digest
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .access_log import note_tenant
from .deps import IdempotencyKeyHeader
from .handoff import WorkerThreads
from .shapes import Invalid, header_errors, validated_body
from .step import StepDoor, posts_to, text
from .strict_json import parse_body

CREATE_TEMPLATE = "/v1/envs"
"""The operation's path (no parameters: the router matches it literally)."""
CREATED = 201
"""The status of a new env (the route's ``status_code``)."""
_BODY = TypeAdapter(EnvCreate)
_KEY = TypeAdapter(IdempotencyKeyHeader)  # the route's header parameter: FastAPI's errors, word for word


class CreateDoor:
    """The ASGI handler of ``POST /v1/envs`` (see the module docstring).

    Args:
        door: the step door, whose body reading and executor-error translation this
            door shares (not its threads).
        threads: the door's worker threads (at most that many creates at once in this
            process; ``http_threads``). Raises ValueError below 1.

    It reads the services from the app in the scope (``app.state``: ``settings``,
    ``tenants``, ``envs``, ``idempotency``, ``metrics``), as the route's dependencies do.
    """

    def __init__(self, door: StepDoor, threads: int) -> None:
        self.door = door
        self._threads = WorkerThreads(threads, "sandpit-create")
        self.run = self._threads.run

    def close(self) -> None:
        """Let the door's threads end once the creates they run return (the app's
        lifespan calls it at shutdown; a later request makes new ones)."""
        self._threads.close()

    @staticmethod
    def matches(scope: Scope) -> bool:
        """Whether ``scope`` is an HTTP ``POST`` to exactly ``/v1/envs`` (:func:`.step.posts_to`)."""
        return posts_to(scope, CREATE_TEMPLATE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the create request of ``scope`` (module docstring): the work on
        :attr:`run`'s threads, the answer as the step door renders one (201, or a stored
        reply with ``Idempotent-Replayed: true`` first, where the route's response puts it)."""
        request_read = await self.door.read_request(scope, receive, send, CREATE_TEMPLATE)
        if request_read is None:
            return
        headers, body = request_read
        state = scope["app"].state
        settings: ApiSettings = state.settings
        authorization = text(headers.get(b"authorization"))
        content_type = text(headers.get(b"content-type"))
        key = text(headers.get(b"idempotency-key"))
        query: bytes = scope.get("query_string", b"")
        work = partial(_create, scope, state.tenants, state.envs, state.idempotency, settings, body, authorization,
                       content_type, key, query)
        await self.door.answer(work, scope, receive, send, status=CREATED, run=self.run, replayed_first=True)


def _create(scope: Scope, tenants: TenantService, envs: EnvLifecycle, keys: Idempotency, settings: ApiSettings,
            body: bytes, authorization: str | None, content_type: str | None, key: str | None,
            query: bytes) -> bytes | Replay:
    """The route's work on a worker thread, in FastAPI's order (module docstring): the
    new env's JSON bytes or the key's stored reply. Raises what the route raises (the
    JSON rules' ApiErrors, Unauthorized, Forbidden, :class:`Invalid`, the create's and
    the key's ApiErrors, executor errors)."""
    parsed = parse_body(body, settings) if body else None  # the strict route's JSON rules come first
    caller = tenants.authenticate(authorization)
    note_tenant(scope, caller.tenant)
    errors = header_errors(_KEY, KEY_HEADER, key)
    validated = validated_body(_BODY, body, parsed, content_type)
    request = validated[0]
    if errors or request is None:
        raise Invalid(errors + validated[1])
    if key is None:
        return envs.create(caller, request).json()
    claim = keys.begin(caller.tenant, key, request_digest("POST", CREATE_TEMPLATE, None, query, body))
    if isinstance(claim, Replay):
        return claim
    try:  # the reply is stored on the key by the transaction that commits the env
        return envs.create(caller, request, reply_on=ReplyOnKey(claim, CREATED)).json()
    except BaseException:
        keys.release(claim)
        raise
