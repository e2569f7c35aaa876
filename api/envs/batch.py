"""The batched step: one action for each of several envs in one request
(``POST /v1/envs:step``), each carried out exactly as ``POST /v1/envs/{id}/step`` carries
it out (:meth:`.steps.Steps.step`: the env's episode rules, quotas, attempt fence, group
commit), the envs concurrently.

What a batch adds is the fan-out and one transaction: the steps of different envs run at
once on the batch's threads (as many at once as the tenant's ``max_concurrent_calls``
allows, so a batch does not refuse its own steps with 429s), and their writes are
committed together (:class:`~sandpit.api.db.group_commit.BatchCommit`: once every step
still running has its write ready, all of them go to the group commit as one
transaction; a write that fails there is retried alone, so one step's failure never
undoes another's, and a step is acknowledged only once its own write committed). The reply is each step's own reply (or error) in the request's order, spliced as the
bytes each step rendered. A step's ``idempotency_key`` is claimed and its result stored
in that step's own transaction, exactly as the step route's ``Idempotency-Key`` (a retried
batch replays the steps that committed and runs the others). One env appears at most once in a batch (its steps are ordered
by the caller, not by the batch). A step's refusal is that step's outcome (its status and
error object), never the batch's: the other steps run and commit as they would alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import orjson

from ..db.group_commit import BatchCommit
from ..db.step_writes import StepWrite
from ..errors import ApiError, InvalidRequest, error_reply, internal_error_body
from ..schemas.batch import BatchStep, BatchStepRequest
from ..services.idempotency import Idempotency, Replay, request_digest
from ..services.quotas import TenantContext
from .steps import Steps, wanted_parts

ITEM_ROUTE = "/v1/envs:step"
"""The route a batched step's idempotency digest names (its own: a step sent alone with the
same key is another request)."""

log = logging.getLogger("sandpit.api")


class BatchSteps:
    """Carries out batches of steps (see the module docstring).

    Args:
        steps: the one step implementation.
        keys: idempotency keys (a step's ``idempotency_key``).
        threads: the most steps of all batches running at once in this process.
        translate: turns a foreign exception a step raised (the executor's) into an
            :class:`ApiError`, or None (then it is logged and that step is a 500).
    """

    def __init__(self, steps: Steps, keys: Idempotency, threads: int,
                 translate: Callable[[Exception], ApiError | None] | None = None) -> None:
        self.steps = steps
        self.keys = keys
        self.threads = threads
        self.translate = translate
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def step_many(self, ctx: TenantContext, request: BatchStepRequest) -> bytes:
        """``POST /v1/envs:step``: every step of ``request`` for ``ctx``'s tenant, the
        reply's JSON bytes (``{"results": [{"env_id", "status", "result" | "error"}]}`` in
        the request's order). Raises InvalidRequest (an env named twice: field
        ``steps.<i>.env_id``; ``include`` naming an unknown part) before any step runs."""
        seen: dict[str, int] = {}
        for index, item in enumerate(request.steps):
            if item.env_id in seen:
                raise InvalidRequest(f"env {item.env_id[:64]!r} is in the batch twice (steps {seen[item.env_id]} "
                                     f"and {index}): one step per env in a batch", field=f"steps.{index}.env_id")
            seen[item.env_id] = index
        wanted_parts(request.include)
        at_once = threading.BoundedSemaphore(max(1, min(ctx.quotas.max_concurrent_calls, self.threads)))
        commits = BatchCommit(self.steps.commits)

        def one(item: BatchStep) -> bytes:
            with at_once:
                return self._one(ctx, item, request.include, commits)

        items = request.steps
        if len(items) == 1:
            parts = [one(items[0])]
        else:
            parts = list(self._threads().map(one, items))
        return b'{"results":[' + b",".join(parts) + b"]}"

    def _one(self, ctx: TenantContext, item: BatchStep, include: str | None, commits: BatchCommit[StepWrite]) -> bytes:
        """One step's outcome as the bytes of a :class:`~..schemas.batch.BatchStepOutcome`
        (its write committed through ``commits``, with the batch's other steps)."""
        env = orjson.dumps(item.env_id)
        try:
            if item.idempotency_key is None:
                outcome = self.steps.step(ctx, item.env_id, item.action, include, attempt=item.attempt,
                                          batch=commits)
                return b'{"env_id":' + env + b',"status":200,"result":' + outcome.json() + b"}"
            body = orjson.dumps(item.model_dump(mode="json", exclude={"idempotency_key"}),
                                option=orjson.OPT_SORT_KEYS)
            claim = self.keys.begin(ctx.tenant, item.idempotency_key,
                                    request_digest("POST", ITEM_ROUTE, item.env_id, (include or "").encode(), body))
            if isinstance(claim, Replay):
                return b'{"env_id":' + env + b',"status":200,"result":' + claim.body + b',"replayed":true}'
            try:
                data = self.steps.step(ctx, item.env_id, item.action, include, None, claim, item.attempt,
                                       commits).json()
            except BaseException:
                self.keys.release(claim)
                raise
            return b'{"env_id":' + env + b',"status":200,"result":' + data + b"}"
        except ApiError as exc:
            return self._refused(env, exc)
        except Exception as exc:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is not None:
                return self._refused(env, translated)
            log.error("unhandled error in a batched step of env %s", item.env_id[:64], exc_info=exc)
            return b'{"env_id":' + env + b',"status":500,"error":' + orjson.dumps(internal_error_body()["error"]) + b"}"

    @staticmethod
    def _refused(env: bytes, exc: ApiError) -> bytes:
        reply = error_reply(exc)
        return b'{"env_id":' + env + b',"status":' + str(reply.status).encode() + b',"error":' + \
            orjson.dumps(reply.body["error"]) + b"}"

    def _threads(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sandpit-batch")
            return self._pool

    def close(self) -> None:
        """Let the batch threads end once their steps return (a later batch makes new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
