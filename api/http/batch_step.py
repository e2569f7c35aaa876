"""The batched step's door: every ``POST /v1/envs:step`` is answered by
:class:`BatchStepDoor`, in front of FastAPI's stack, as :class:`~.step.StepDoor` answers
a single step.

Why: a batch is one request for up to 256 steps, and a trainer keeps one batch of its
vector env in flight, so everything the request costs before and after its steps is on
the batch's critical path. FastAPI's generic path (route matching over every route,
dependencies each on the thread pool, the body model validated on the event loop, the
middleware stack) costs about as much event-loop time as the batch's steps cost on their
thread. The door does exactly what that path does, on one worker thread:

1. The body as the step door reads it (:meth:`.step.StepDoor.read_body`): 413 over
   ``max_body_bytes``, 408 when it is not whole within ``body_read_timeout_s``.
2. On a step thread, in FastAPI's order: the JSON rules (:func:`~.strict_json.parse_body`:
   413, 422 for a body that is not strict JSON), then the API key (401/403), then the
   body as :class:`~sandpit.api.schemas.batch.BatchStepRequest` (a 422 naming the first
   field, as every route's: :func:`~.shapes.validated_body`), then
   :meth:`~sandpit.api.envs.batch.BatchSteps.step_many` and its JSON reply, which
   carries ``Server-Timing`` with the batch's ``total`` (``server_timing``: from its body
   read to its reply ready; an error reply carries none).

Errors are rendered from the one table (:mod:`.handlers`); executor errors are
translated as the app's handler does; anything else is the catch-all 500. The router
keeps the operation (``api/http/routes/envs.py``): it is what the OpenAPI document
describes and what answers other methods (405) and a request whose path reaches the app
only through the router.
"""

from __future__ import annotations

import time

from pydantic import TypeAdapter
from starlette.types import Receive, Scope, Send

from ..envs.batch import BatchSteps
from ..metrics import server_timing
from ..schemas.batch import BatchStepRequest
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .access_log import note_tenant
from .shapes import Invalid, validated_body
from .step import SERVER_TIMING_KEY, StepDoor, posts_to, text
from .strict_json import parse_body

BATCH_TEMPLATE = "/v1/envs:step"
"""The operation's path (no parameters: the router matches it literally)."""
_BODY = TypeAdapter(BatchStepRequest)


class BatchStepDoor:
    """The ASGI handler of ``POST /v1/envs:step`` (see the module docstring).

    Args:
        door: the step door, whose body reading, step threads, error rendering and
            executor-error translation this door shares.

    It reads the services from the app in the scope (``app.state``: ``settings``,
    ``tenants``, ``batch``), as the route's dependencies do.
    """

    def __init__(self, door: StepDoor) -> None:
        self.door = door

    @staticmethod
    def matches(scope: Scope) -> bool:
        """Whether ``scope`` is an HTTP ``POST`` to the batched step's path (:func:`.step.posts_to`)."""
        return posts_to(scope, BATCH_TEMPLATE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer the batched step request of ``scope`` (module docstring)."""
        request_read = await self.door.read_request(scope, receive, send, BATCH_TEMPLATE)
        if request_read is None:
            return
        headers, body = request_read
        received = time.perf_counter()
        state = scope["app"].state
        settings: ApiSettings = state.settings
        tenants: TenantService = state.tenants
        batch: BatchSteps = state.batch
        authorization = text(headers.get(b"authorization"))
        content_type = text(headers.get(b"content-type"))

        def work() -> bytes:
            parsed = parse_body(body, settings) if body else None  # the strict route's JSON rules come first
            caller = tenants.authenticate(authorization)
            note_tenant(scope, caller.tenant)
            validated = validated_body(_BODY, body, parsed, content_type)
            if validated[0] is None:
                raise Invalid(validated[1])
            data = batch.step_many(caller, validated[0])
            if settings.server_timing:
                scope[SERVER_TIMING_KEY] = server_timing({}, time.perf_counter() - received)
            return data

        await self.door.answer(work, scope, receive, send)
