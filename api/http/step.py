"""The step door: every ``POST /v1/envs/{env_id}/step`` is answered by :class:`StepDoor`, one
ASGI handler in front of FastAPI's stack.

Why a door of its own: steps are nearly all of an RL trainer's traffic, and FastAPI's
generic path (route matching over every route, each dependency on the thread pool, the
request and response models, the error and exception middleware) costs several times
the server CPU of the step itself. The door does, for this one operation, exactly what
that path did, with at most one hop to a worker thread:

1. The body: a ``Content-Length`` over ``max_body_bytes`` is 413 at once; the body must
   arrive whole within ``body_read_timeout_s`` of the request's start, else 408 (a
   response sent before the body was read whole carries ``Connection: close``); a
   client gone while it sends is one log line (:mod:`.body_timeout`).
2. The JSON rules (:func:`~.strict_json.parse_body`): 413 over ``max_body_bytes``, 422
   for a body that is not strict JSON, too deep, or holds a lone surrogate.
3. On a worker thread: the API key (401/403), then the request's shape: the body as
   :class:`~sandpit.api.schemas.envs.StepRequest` (JSON when the content type is
   ``application/json`` or ``application/*+json``, as FastAPI reads it) and ``include``
   (at most :data:`INCLUDE_MAX_CHARS`; the last one given counts), a 422 naming the
   first field as every route's (:func:`~sandpit.api.errors.invalid_request_body`);
   then the step (:meth:`~sandpit.api.envs.steps.Steps.step`) and its JSON reply.
   On a server answering no other step (``step_inline_wait_s`` above 0), a step
   without ``Sandpit-Attempt`` whose API key was authenticated recently runs on the
   event loop instead (its ``Idempotency-Key`` checked there too), saving the hop there
   and back: the same step (:func:`~sandpit.api.envs.step_work.run_inline`), which moves
   to a worker thread as soon as it would wait (its call not answered within
   ``step_inline_wait_s``, a busy slot, session or database writer, blocking work);
   ``sandpit_step_runs_total`` counts where steps ran.
4. ``Idempotency-Key`` (:mod:`sandpit.api.services.idempotency`): a malformed key is a
   422 naming the header (with the request's other shape errors, as FastAPI reports
   them); after the API key, the key is checked (a read:
   :meth:`~sandpit.api.services.idempotency.Idempotency.check`): a replay of the stored
   reply (``Idempotent-Replayed: true``) or a 409 runs nothing; otherwise the step's own
   transaction claims the key and stores the reply, and an error leaves the key free.
   A step whose commit finds the key taken by another request meanwhile commits
   nothing and answers that request's stored reply, or the 409.
5. ``Sandpit-Attempt`` (:mod:`sandpit.api.envs.attempts`): a malformed token is a 422
   naming the header; a token that is not the env's current attempt's is 409
   ``stale_attempt``, checked before the action runs and in the step's transaction.
6. The reply of a step that ran carries ``Server-Timing`` (``server_timing``): the
   wall-clock milliseconds of its phases in this process and ``total``, from its body
   read to its reply ready (:meth:`~sandpit.api.metrics.StepClock.server_timing`). A
   replay, an error reply and a request refused before the step ran carry none.

Errors are rendered from the one table (:mod:`.handlers`, 429s counted); executor
errors are translated as the app's handler does; anything else is logged and answered
500 ``internal``. The access log names the request by the route's template.

The router keeps the operation too (:class:`StepRoute`, built from :func:`step`'s
signature): it is what the OpenAPI document describes and what answers other methods
(405); a POST that reaches it is handed to the door as well, so there is one
implementation whichever way a step comes in.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, TypeVar, cast
from urllib.parse import parse_qsl

from fastapi import Query, Response
from fastapi.responses import JSONResponse
from pydantic import Field, TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import Message, Receive, Scope, Send

from ..db.idempotency import KeyClaim
from ..envs.outcomes import StepOutcome
from ..envs.step_work import Handoff, Work, run_inline
from ..envs.steps import INCLUDES, Steps
from ..errors import ApiError, IdempotencyKeyInFlight, invalid_request_body
from ..metrics import Metrics, StepClock
from ..schemas.common import list_pattern
from ..schemas.envs import ATTEMPT_PATTERN, StepRequest, StepResult
from ..services.idempotency import (
    IN_FLIGHT_RETRY_AFTER_S,
    KEY_HEADER,
    Idempotency,
    Replay,
    request_digest,
    valid_key,
)
from ..services.quotas import TenantContext
from ..services.tenants import TenantService
from ..settings import ApiSettings
from .access_log import note_route, note_tenant
from .body_timeout import body_timed_out, log_disconnect, with_connection_close
from .deps import (
    ATTEMPT_HEADER,
    METERED,
    REPLAYED_HEADER,
    AttemptHeader,
    CallerDep,
    IdempotencyKeyHeader,
    json_router,
)
from .handlers import count_rejection, error_response, internal_error_response
from .handoff import WorkerThreads
from .shapes import Invalid, validated_body
from .spare_cpu import SpareCpu
from .strict_json import StrictJSONRoute, declared_too_large, parse_body

STEP_TEMPLATE = "/v1/envs/{env_id}/step"
"""The operation's path template (what the access log names it by)."""
STEP_PATH = compile_path(STEP_TEMPLATE)[0]
"""The template as Starlette's router matches it (``{env_id}`` is one path segment)."""
_T = TypeVar("_T")
_W = TypeVar("_W")
SERVER_TIMING_KEY = "sandpit.server_timing"
"""Where a step keeps its ``Server-Timing`` header value (bytes) in the request's ASGI
scope until :meth:`StepDoor.answer` sends it (``server_timing``)."""
INCLUDE_MAX_CHARS = 64
"""Longest ``include`` query value (characters)."""
Include = Annotated[str | None, Query(max_length=INCLUDE_MAX_CHARS,
                                      json_schema_extra={"pattern": list_pattern(INCLUDES)})]
"""The ``include`` query parameter as the OpenAPI document states it."""
_INCLUDE = TypeAdapter(Annotated[str, Field(max_length=INCLUDE_MAX_CHARS)])
_BODY = TypeAdapter(StepRequest)
_READ_HEADERS = (b"content-length", b"content-type", b"authorization", b"idempotency-key", b"sandpit-attempt")
_ATTEMPT = re.compile(ATTEMPT_PATTERN)


class StepDoor:
    """The ASGI handler of ``POST /v1/envs/{env_id}/step`` (see the module docstring).

    Args:
        body_timeout_s: seconds from the request's start for its whole body
            (``body_read_timeout_s``).
        threads: worker threads that run steps (at most that many steps at once in this
            process; more wait for a free thread; ``http_threads``).
        translate: turns a foreign exception raised by a step into an :class:`ApiError`
            (the app gives the executor errors' translation), or None to answer it 500.

    It reads the services from the app in the scope (``app.state``: ``settings``,
    ``tenants``, ``steps``, ``metrics``), as the routes' dependencies do.
    """

    def __init__(self, body_timeout_s: float, threads: int,
                 translate: Callable[[Exception], ApiError | None] | None = None) -> None:
        self.body_timeout_s = body_timeout_s
        self.max_threads = threads
        self.translate = translate
        self._threads = WorkerThreads(threads, "sandpit-step")
        self._open = 0
        """Step requests this door is answering now (changed on the event loop only)."""
        self._spare_cpu = SpareCpu()
        """Whether an inline step may poll for its reply (asked on the event loop only)."""

    def env_id(self, scope: Scope) -> str | None:
        """The env id of an HTTP ``POST`` to the step path (matched as the router matches
        it), else None."""
        return posted_env_id(scope, STEP_PATH)

    async def run(self, work: Callable[[], _T]) -> _T:
        """``work()`` on one of the step threads (other doors' blocking work: the MCP
        endpoints'); its exception propagates. The threads are a
        :class:`~.handoff.WorkerThreads` of their own: anyio's ``to_thread`` (backend
        look-up, capacity limiter, cancel scope per call) costs about as much again as
        the hop itself, and ``run_in_executor`` wakes the loop with the GIL held."""
        return await self._threads.run(work)

    def close(self) -> None:
        """Let the step threads end once the steps they run return (the app's lifespan
        calls it at shutdown; a later request makes new ones)."""
        self._threads.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send, env_id: str) -> None:
        """Answer the step request of ``scope`` for ``env_id`` (module docstring)."""
        self._open += 1
        try:
            await self._answer_step(scope, receive, send, env_id)
        finally:
            self._open -= 1

    async def _answer_step(self, scope: Scope, receive: Receive, send: Send, env_id: str) -> None:
        state = scope["app"].state
        settings: ApiSettings = state.settings
        request_read = await self.read_request(scope, receive, send, STEP_TEMPLATE)
        if request_read is None:
            return
        headers, body = request_read
        received, started = time.perf_counter(), time.thread_time()
        timed = (scope, received) if settings.server_timing else None
        try:
            request, include, invalid = _shape(body, text(headers.get(b"content-type")),
                                               scope.get("query_string", b""), settings)
        except ApiError as exc:
            await self._error(exc, scope, receive, send)
            return
        except Exception as exc:  # a bug, not the request's fault: the catch-all's 500
            await internal_error_response(exc)(scope, receive, send)
            return
        key = text(headers.get(b"idempotency-key"))
        if key is not None and not valid_key(key):
            invalid.insert(_first_body_error(invalid), {
                "type": "string_pattern_mismatch", "loc": ("header", KEY_HEADER),
                "msg": f"must be 1 to 255 printable ASCII characters (got {len(key)} character(s))"})
        attempt = text(headers.get(b"sandpit-attempt"))
        if attempt is not None and _ATTEMPT.fullmatch(attempt) is None:
            invalid.insert(_first_body_error(invalid), {
                "type": "string_pattern_mismatch", "loc": ("header", ATTEMPT_HEADER),
                "msg": "must be an attempt token: 1 to 64 of A-Z a-z 0-9 _ -"})
        digest = request_digest("POST", STEP_TEMPLATE, env_id, scope.get("query_string", b""), body) if key else ""
        parse_cpu = time.thread_time() - started
        authorization = text(headers.get(b"authorization"))
        tenants: TenantService = state.tenants
        steps: Steps = state.steps
        keys: Idempotency = state.idempotency
        caller = None
        if attempt is None and not invalid and request is not None \
                and settings.step_inline_wait_s > 0 and self._alone():
            await asyncio.sleep(0)  # requests that came with this one start first, and are counted
            caller = self._inline_caller(tenants, steps, env_id, authorization)
        if caller is not None:
            assert request is not None
            step_request = request

            def start() -> bytes | Replay | Handoff[bytes | Replay]:
                clock = StepClock()
                clock.cpu["parse"] = parse_cpu
                note_tenant(scope, caller.tenant)
                clock.lap("auth")
                claim: KeyClaim | None = None
                if key is not None:
                    checked = keys.check(caller.tenant, key, digest)
                    if isinstance(checked, Replay):
                        return checked
                    claim = checked
                work = _replied(steps.work(caller, env_id, step_request, include, clock, claim), clock, steps, timed)
                run = partial(run_inline, work, steps.commits, settings.step_inline_wait_s,
                              *self._spin(settings.step_inline_spin_s, steps.metrics))
                outcome = run() if claim is None else _keyed(keys, claim, digest, run)
                if isinstance(outcome, Replay):
                    return outcome
                if not isinstance(outcome, Handoff):
                    steps.metrics.step_runs["event_loop"].inc()
                    return outcome
                steps.metrics.step_runs["handed_off"].inc()
                clock.leave()
                resume: Callable[[], bytes | Replay] = outcome.resume if claim is None else \
                    partial(_keyed, keys, claim, digest, outcome.resume)
                return Handoff(partial(_arrived, clock, resume))

            await self.answer(start, scope, receive, send, run=self._run_inline)
            return

        def work() -> bytes | Replay:
            steps.metrics.step_runs["worker_thread"].inc()
            clock = StepClock()
            clock.cpu["parse"] = parse_cpu
            caller = tenants.authenticate(authorization)
            note_tenant(scope, caller.tenant)
            if invalid:
                raise Invalid(invalid)
            clock.lap("auth")
            assert request is not None
            if key is None:
                data = steps.step(caller, env_id, request, include, clock, attempt=attempt).json()
            else:
                claim = keys.check(caller.tenant, key, digest)
                if isinstance(claim, Replay):
                    return claim
                keyed = _keyed(keys, claim, digest,
                               lambda: steps.step(caller, env_id, request, include, clock, claim, attempt).json())
                if isinstance(keyed, Replay):
                    return keyed
                data = keyed
            _serialized(clock, steps, timed)
            return data

        await self.answer(work, scope, receive, send)

    def _inline_caller(self, tenants: TenantService, steps: Steps, env_id: str,
                       authorization: str | None) -> TenantContext | None:
        """The caller of a step that may start on the event loop, else None: this door
        answers no other step request and runs no other work on its threads (a batch,
        an MCP call), the API key was authenticated within ``auth_cache_ttl_s``, the env
        is not busy and the database's writer is free (never on databases other than
        SQLite, whose commits are round trips to a server: there the step could not end
        on the event loop). The caller checks ``step_inline_wait_s`` and that the request
        carries no ``Sandpit-Attempt`` (its check reads the database before the action
        and its fence may wait for the writer; an ``Idempotency-Key``'s check is one
        read of its row, on the event loop). Under concurrent requests steps stay on
        threads:
        steps run one after another on the event loop would hold the GIL from the
        threads' steps, whose every wake-up then waits for it."""
        if not self._alone() or steps.live.busy(env_id) or not steps.db.write_free():
            return None
        try:
            return tenants.authenticate_cached(authorization)
        except ApiError:  # the worker thread's authentication gives the same error
            return None

    def _spin(self, spin_s: float, metrics: Metrics) -> tuple[float, Callable[[float, bool], None] | None]:
        """The ``spin_s`` and ``spun`` of an inline step (:func:`~sandpit.api.envs.step_work.run_inline`):
        ``spin_s`` (``step_inline_spin_s``) while the host has a CPU to spare
        (:class:`~sandpit.api.http.spare_cpu.SpareCpu`), else 0; ``spun`` counts the poll's time
        as idle and its outcome in ``sandpit_step_spins_total``."""
        if spin_s <= 0:
            return 0.0, None
        if not self._spare_cpu.spare():
            metrics.step_spins["no_spare_cpu"].inc()
            return 0.0, None

        def spun(seconds: float, caught: bool) -> None:
            self._spare_cpu.spun(seconds)
            metrics.step_spins["caught" if caught else "missed"].inc()

        return spin_s, spun

    def _alone(self) -> bool:
        """Whether the step request being answered is the only one this door answers and
        its threads run nothing (asked before and after the other requests that came with
        it had their turn)."""
        return self._open == 1 and not self._threads.running

    async def _run_inline(self, start: Callable[[], bytes | Replay | Handoff[bytes | Replay]]
                          ) -> bytes | Replay:
        """``start()`` on the event loop; what it hands off goes on on a step thread
        (:func:`~sandpit.api.envs.step_work.run_inline`)."""
        outcome = start()
        if isinstance(outcome, Handoff):
            return await self._threads.run(outcome.resume)
        return outcome

    async def read_request(self, scope: Scope, receive: Receive, send: Send,
                           template: str) -> tuple[dict[bytes, bytes], bytes] | None:
        """What every door does first: note ``template`` as the request's route (the access
        log's), then its headers (:func:`first_headers`) and whole body
        (:meth:`read_body`); None once the request is answered (413, 408, client gone)."""
        note_route(scope, template)
        headers = first_headers(scope)
        body = await self.read_body(scope, receive, send, headers)
        return None if body is None else (headers, body)

    async def read_body(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]) -> bytes | None:
        """The request's whole body (``headers`` as :func:`first_headers` gives them), or
        None once the request is answered: 413 for a ``Content-Length`` over
        ``max_body_bytes`` (the body is not read), 408 when it is not whole within
        ``body_timeout_s`` (both with ``Connection: close``), nothing when the client left
        while sending (one log line)."""
        too_large = declared_too_large(text(headers.get(b"content-length")), scope["app"].state.settings)
        if too_large is not None:  # the body is not read: the connection closes after the answer
            await self._error(too_large, scope, receive, _closing(send))
            return None
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await _read(receive, chunks)
        except TimeoutError:
            await self._error(body_timed_out(scope, sum(map(len, chunks)), self.body_timeout_s), scope, receive,
                              _closing(send))
        except ClientDisconnect:
            log_disconnect(scope, sum(map(len, chunks)))
        return None

    async def answer(self, work: Callable[[], _W], scope: Scope, receive: Receive, send: Send, *,
                     status: int = 200, run: Callable[[Callable[[], _W]], Awaitable[bytes | Replay]]
                     | None = None, replayed_first: bool = False) -> None:
        """Run ``work`` on a step thread (or with ``run``: another door's worker threads)
        and send its JSON bytes (``status``, or a :class:`Replay`'s stored status with
        ``Idempotent-Replayed: true``, that header last, or first when
        ``replayed_first``: where the door's route puts it), with the ``Server-Timing``
        value ``work`` left in the scope (:data:`SERVER_TIMING_KEY`), if any; what it
        raises is the answer instead: an ApiError's response (429s counted), 422 for
        :class:`~.shapes.Invalid`, a foreign error translated (:attr:`translate`) or the catch-all
        500."""
        try:
            data = await (run(work) if run is not None
                          else self._threads.run(cast(Callable[[], bytes | Replay], work)))
        except ApiError as exc:
            await self._error(exc, scope, receive, send)
            return
        except Invalid as exc:
            await JSONResponse(invalid_request_body(exc.errors), status_code=422)(scope, receive, send)
            return
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is None:
                await internal_error_response(exc)(scope, receive, send)
                return
            await self._error(translated, scope, receive, send)
            return
        replayed: list[tuple[bytes, bytes]] = []
        if isinstance(data, Replay):
            status, data, replayed = data.status, data.body, [(REPLAYED_HEADER.lower().encode("ascii"), b"true")]
        headers = [(b"content-length", str(len(data)).encode("ascii")), (b"content-type", b"application/json")]
        timing = scope.get(SERVER_TIMING_KEY)
        if timing is not None:
            headers.append((b"server-timing", timing))
        await send({"type": "http.response.start", "status": status,
                    "headers": [*replayed, *headers] if replayed_first else [*headers, *replayed]})
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _error(exc: ApiError, scope: Scope, receive: Receive, send: Send) -> None:
        """The response of ``exc`` (the table's; a 429 counted on the app's metrics)."""
        count_rejection(exc, getattr(scope["app"].state, "metrics", None))
        await error_response(exc)(scope, receive, send)


def posts_to(scope: Scope, path: str) -> bool:
    """Whether ``scope`` is an HTTP ``POST`` to exactly ``path`` (as the router matches
    it: after the app's ``root_path``)."""
    return scope["type"] == "http" and scope["method"] == "POST" and route_path(scope) == path


def posted_env_id(scope: Scope, path: re.Pattern[str]) -> str | None:
    """The ``env_id`` of an HTTP ``POST`` whose path (as the router reads it:
    :func:`route_path`) matches ``path``, a compiled route template; else None."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    match = path.match(route_path(scope))
    return match.group("env_id") if match is not None else None


def route_path(scope: Scope) -> str:
    """The request's path without the app's ``root_path``, as Starlette's router reads it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


def first_headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header a door reads (as ``request.headers.get`` gives it)."""
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in _READ_HEADERS and name not in found:
            found[name] = value
    return found


def text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


def _shape(body: bytes, content_type: str | None, query: bytes,
           settings: ApiSettings) -> tuple[StepRequest | None, str | None, list[dict[str, Any]]]:
    """``(request, include, errors)`` of a step request: a non-empty body is parsed by the
    JSON rules whatever its content type (raises PayloadTooLarge, InvalidRequest), then
    read as FastAPI reads it and validated; ``errors`` (query first, then body) are what
    FastAPI would report, empty when both are valid."""
    errors: list[dict[str, Any]] = []
    include: str | None = None
    if query:
        values = [v for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k == "include"]
        if values:
            try:
                include = _INCLUDE.validate_python(values[-1])
            except ValidationError as exc:
                errors += [{**e, "loc": ("query", "include", *e["loc"])} for e in exc.errors(include_url=False)]
    parsed = parse_body(body, settings) if body else None
    validated = validated_body(_BODY, body, parsed, content_type)
    return validated[0], include, errors + validated[1]


def _first_body_error(errors: list[dict[str, Any]]) -> int:
    """Where a header's error goes in ``errors``: after the query's, before the body's (FastAPI's order)."""
    return next((i for i, e in enumerate(errors) if e["loc"][:1] == ("body",)), len(errors))


def _closing(send: Send) -> Send:
    """``send`` with ``Connection: close`` on the response (the body was not read whole)."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = with_connection_close(message)
        await send(message)

    return closing_send


async def _read(receive: Receive, chunks: list[bytes]) -> bytes:
    """The whole request body, gathered in ``chunks`` (what arrived so far, when the
    caller's timeout cancels it). Raises ClientDisconnect (logged by the caller)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replied(work: Work[StepOutcome], clock: StepClock, steps: Steps,
             timed: tuple[Scope, float] | None) -> Work[bytes]:
    """``work`` (a step), then its JSON reply (:func:`_serialized`)."""
    outcome = yield from work
    data = outcome.json()
    _serialized(clock, steps, timed)
    return data


def _keyed(keys: Idempotency, claim: KeyClaim, digest: str, run: Callable[[], _T]) -> _T | Replay:
    """``run()``: a step keyed by ``claim`` (request ``digest``), the claim ended with it
    (:meth:`~sandpit.api.services.idempotency.Idempotency.forget`) whatever its end, except
    a :class:`~sandpit.api.envs.step_work.Handoff`: the step goes on on a thread, and
    keeps its claim until it ends there (the caller runs its ``resume`` through here). A
    commit that found the key taken by another request meanwhile answers that request's
    reply (:func:`_taken_meanwhile`). Raises what ``run`` raises."""
    try:
        data = run()
    except IdempotencyKeyInFlight:
        keys.forget(claim)
        return _taken_meanwhile(keys, claim.tenant, claim.key, digest)
    except BaseException:
        keys.forget(claim)
        raise
    if not isinstance(data, Handoff):
        keys.forget(claim)
    return data


def _taken_meanwhile(keys: Idempotency, tenant: str, key: str, digest: str) -> Replay:
    """The answer to ``tenant``'s step of ``digest`` whose commit found its key ``key``
    taken by another request (:func:`~sandpit.api.db.idempotency.claim_with_response_core`:
    nothing was committed): that request's stored reply when it has one by now, else the
    409 the key's state gives (:meth:`~sandpit.api.services.idempotency.Idempotency.reply_of_taken`).
    Raises IdempotencyKeyInFlight, IdempotencyKeyReused, ServiceUnavailable."""
    replay = keys.reply_of_taken(tenant, key, digest)
    if replay is not None:
        return replay
    raise IdempotencyKeyInFlight(f"another request with {KEY_HEADER} {key!r} ran at the same time; retry "
                                 "to get its response", field=KEY_HEADER, retry_after=IN_FLIGHT_RETRY_AFTER_S)


def _serialized(clock: StepClock, steps: Steps, timed: tuple[Scope, float] | None) -> None:
    """A step's reply is serialized: its clock's last phase lapped and the phases flushed
    to the metrics; with ``timed`` (the request's scope and ``time.perf_counter`` when its
    body had been read), its ``Server-Timing`` value kept in the scope
    (:data:`SERVER_TIMING_KEY`), which :meth:`StepDoor.answer` sends: the clock's phases
    and the total since then."""
    clock.lap("serialize")
    clock.flush(steps.metrics)
    if timed is not None:
        scope, received = timed
        scope[SERVER_TIMING_KEY] = clock.server_timing(time.perf_counter() - received)


def _arrived(clock: StepClock, resume: Callable[[], bytes | Replay]) -> bytes | Replay:
    """A step handed off the event loop, on the thread it goes on on (its clock moved there)."""
    clock.arrive()
    return resume()


class StepRoute(StrictJSONRoute):
    """The step operation in the router: FastAPI documents it from :func:`step`'s
    signature; a ``POST`` the router gives it is answered by the step door
    (``app.state.step_door``), any other method by the router's 405."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await super().handle(scope, receive, send)
            return
        door: StepDoor = scope["app"].state.step_door
        await door(scope, receive, send, scope["path_params"]["env_id"])


router = json_router(prefix="/v1/envs", tags=["envs"])


def step(env_id: str, body: StepRequest, caller: CallerDep, include: Include = None,
         idempotency_key: IdempotencyKeyHeader = None, sandpit_attempt: AttemptHeader = None) -> Response:
    """One action (``{"name","arguments"}``, an OpenAI tool call, or raw model ``text``):
    EnvScaler ``step()``. Returns the observation, ``reward``, ``terminated`` and
    ``truncated``; committed before the reply. A malformed action is a recorded
    ``rejected`` step (200). 409 ``episode_ended`` after the episode ended; 429 over the
    tenant's ``steps_per_minute``, ``max_concurrent_calls``, ``max_running_calls`` (queue
    wait) or ``max_arguments_bytes`` (nothing is recorded). With ``Idempotency-Key``, a
    retry gets the first reply and runs nothing; with ``Sandpit-Attempt``, 409
    ``stale_attempt`` once the env was resumed by a newer attempt (nothing is recorded)."""
    raise AssertionError("answered by the step door (StepRoute's app), never called")  # pragma: no cover


router.add_api_route("/{env_id}/step", step, methods=["POST"], response_model=StepResult, response_class=Response,
                     responses=METERED, route_class_override=StepRoute)
