"""The batched step: one action for each of several envs in one request
(``POST /v1/envs:step``), each carried out exactly as ``POST /v1/envs/{id}/step`` carries
it out (:meth:`.steps.Steps.step`: the env's episode rules, quotas, attempt fence, group
commit), the envs concurrently.

What a batch adds is the fan-out and one transaction. The steps run vectorised on the
request's thread (:mod:`.step_work`): each step is :meth:`.steps.Steps.work`, the same
code as a single step's, and the batch advances all of them together, in waves of at
most the tenant's ``max_concurrent_calls`` (so a batch does not refuse its own steps
with 429s): whenever steps wait for their tool calls, all those calls are sent at once
(:meth:`~sandpit.api.sandboxes.SandboxSession.call_many`: one frame per sandbox each
way, each call in its own session with its own deadline and failure); blocking work of
several steps (re-attaching a session, scoring an ending episode, a simulated user's
reply) runs on the batch's threads at once; once no step waits for a call, the writes of the steps waiting to commit go to the group commit together
(:meth:`~sandpit.api.db.group_commit.GroupCommit.submit_many`: one transaction; a write
that fails there is retried alone, so one step's failure never undoes another's, and a
step is acknowledged only once its own write committed). A wave's steps start in the
order of their env ids, so the env locks they hold at once are taken in one order by
every batch (two batches naming the same envs never wait for each other in a cycle). The reply is each step's own reply (or error) in the request's order, spliced as the
bytes each step rendered. A step's ``idempotency_key`` is checked before it runs and
claimed with its result in that step's own transaction, exactly as the step route's
``Idempotency-Key`` (:meth:`~sandpit.api.services.idempotency.Idempotency.check`; a
retried batch replays the steps that committed and runs the others). One env appears at
most once in a batch (its steps are ordered by the caller, not by the batch). A step's refusal is that step's outcome (its status and
error object), never the batch's: the other steps run and commit as they would alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from ..db.idempotency import KeyClaim
from ..errors import ApiError, IdempotencyKeyInFlight, InvalidRequest, error_reply, internal_error_body
from ..schemas.batch import BatchStep, BatchStepRequest
from ..services.idempotency import Idempotency, Replay, request_digest
from ..services.quotas import TenantContext
from .outcomes import StepOutcome
from .step_work import BlockingNeed, CallNeed, CommitNeed, Need, Work
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
        threads: the most steps of one wave; the threads of blocking work (re-attaching
            sessions, scoring ending episodes, simulated users' replies) of all batches.
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
        wave = max(1, min(ctx.quotas.max_concurrent_calls, self.threads))
        parts: list[bytes] = []
        for first in range(0, len(request.steps), wave):
            parts.extend(self._wave(ctx, request.steps[first:first + wave], request.include))
        return b'{"results":[' + b",".join(parts) + b"]}"

    def _wave(self, ctx: TenantContext, items: list[BatchStep], include: str | None) -> list[bytes]:
        """The steps of ``items`` advanced together (module docstring): each step's
        outcome as the bytes of a :class:`~..schemas.batch.BatchStepOutcome`, in order."""
        parts: list[bytes | None] = [None] * len(items)
        running: dict[int, _Running] = {}
        for index, item in enumerate(items):
            try:
                started = self._start(ctx, item, include)
            except Exception as exc:  # noqa: BLE001 - that step's outcome
                parts[index] = self._failed(item, exc)
                continue
            if isinstance(started, bytes):
                parts[index] = started
            else:
                running[index] = started
        order = sorted(running, key=lambda i: items[i].env_id)  # env locks taken in one order by every batch
        try:
            while running:
                for index in order:
                    step = running.get(index)
                    if step is None:
                        continue
                    if step.ready and not step.advance():
                        del running[index]
                        parts[index] = step.reply if step.error is None else self._failed(step.item, step.error)
                blocking = [step for step in running.values() if isinstance(step.need, BlockingNeed)]
                if blocking:
                    for step, outcome in zip(blocking, self._run_blocking([s.need for s in blocking]), strict=True):
                        step.resume(outcome)
                    continue
                calls = [step for step in running.values() if isinstance(step.need, CallNeed)]
                if calls:
                    needs = [step.call() for step in calls]
                    outcomes = needs[0].session.call_many([(n.session, n.name, n.arguments, n.rules) for n in needs])
                    for step, outcome in zip(calls, outcomes, strict=True):
                        step.resume(outcome)
                    continue
                commits = [step for step in running.values() if isinstance(step.need, CommitNeed)]
                try:
                    errors = self.steps.commits.submit_many([step.commit().write for step in commits])
                except Exception as exc:  # noqa: BLE001 - every write of the flush fails with it
                    errors = [exc] * len(commits)
                for step, error in zip(commits, errors, strict=True):
                    step.resume(error)
        finally:
            for step in running.values():  # a failure of the driver itself: release what each step holds
                step.work.close()
                if step.claim is not None:
                    self.keys.release(step.claim)
        return [part if part is not None else b"" for part in parts]

    def _run_blocking(self, needs: list[Any]) -> list[object]:
        """Each :class:`BlockingNeed`'s value or error, on the batch's threads when several."""

        def run(need: BlockingNeed) -> object:
            try:
                return need.run()
            except Exception as exc:  # noqa: BLE001 - thrown into that step's work
                return exc

        if len(needs) == 1:
            return [run(needs[0])]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sandpit-batch")
            pool = self._pool
        return list(pool.map(run, needs))

    def _start(self, ctx: TenantContext, item: BatchStep, include: str | None) -> _Running | bytes:
        """The step of ``item`` ready to advance, or its reply when its idempotency key
        replays a committed one. Raises what claiming the key raises."""
        claim: KeyClaim | None = None
        if item.idempotency_key is not None:
            body = orjson.dumps(item.model_dump(mode="json", exclude={"idempotency_key"}),
                                option=orjson.OPT_SORT_KEYS)
            digest = request_digest("POST", ITEM_ROUTE, item.env_id, (include or "").encode(), body)
            begun = self.keys.check(ctx.tenant, item.idempotency_key, digest)
            if isinstance(begun, Replay):
                return _replayed(item, begun)
            claim = begun
        return _Running(item, self.steps.work(ctx, item.env_id, item.action, include, key=claim,
                                              attempt=item.attempt), claim, self.keys)

    def _failed(self, item: BatchStep, exc: BaseException) -> bytes:
        """A step's refusal as its outcome's bytes: an ApiError's status and error object,
        a foreign error translated (:attr:`translate`), else a logged 500."""
        env = orjson.dumps(item.env_id)
        if isinstance(exc, ApiError):
            return self._refused(env, exc)
        translated = self.translate(exc) if self.translate is not None and isinstance(exc, Exception) else None
        if translated is not None:
            return self._refused(env, translated)
        if not isinstance(exc, Exception):
            raise exc
        log.error("unhandled error in a batched step of env %s", item.env_id[:64], exc_info=exc)
        return b'{"env_id":' + env + b',"status":500,"error":' + orjson.dumps(internal_error_body()["error"]) + b"}"

    @staticmethod
    def _refused(env: bytes, exc: ApiError) -> bytes:
        reply = error_reply(exc)
        return b'{"env_id":' + env + b',"status":' + str(reply.status).encode() + b',"error":' + \
            orjson.dumps(reply.body["error"]) + b"}"

    def close(self) -> None:
        """Let the threads of blocking work end once their work returns (a later batch makes new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


class _Running:
    """One step of a wave: its work, what it waits for (:attr:`need`), its reply or error
    once it ended, and its idempotency claim (released if the step fails)."""

    def __init__(self, item: BatchStep, work: Work[StepOutcome], claim: KeyClaim | None, keys: Idempotency) -> None:
        self.item = item
        self.work = work
        self.claim = claim
        self.keys = keys
        self.need: Need | None = None
        self.ready = True
        """It may advance: not started yet, or what it waited for came (:meth:`resume`)."""
        self._value: Any = None
        self._error: BaseException | None = None
        self.reply = b""
        self.error: BaseException | None = None

    def call(self) -> CallNeed:
        assert isinstance(self.need, CallNeed)
        return self.need

    def commit(self) -> CommitNeed:
        assert isinstance(self.need, CommitNeed)
        return self.need

    def resume(self, outcome: object) -> None:
        """What the step waited for: a call's result or error, a write's error or None."""
        if isinstance(outcome, BaseException):
            self._value, self._error = None, outcome
        else:
            self._value, self._error = outcome, None
        self.ready = True

    def advance(self) -> bool:
        """Run the step to its next need (True) or to its end (False: :attr:`reply` or
        :attr:`error` set, the key's claim released on an error)."""
        self.ready = False
        try:
            if self._error is not None:
                error, self._error = self._error, None
                self.need = self.work.throw(error)
            else:
                value, self._value = self._value, None
                self.need = self.work.send(value)
            return True
        except StopIteration as stop:
            outcome: StepOutcome = stop.value
            env = orjson.dumps(self.item.env_id)
            self.reply = b'{"env_id":' + env + b',"status":200,"result":' + outcome.json() + b"}"
            if self.claim is not None:
                self.keys.forget(self.claim)
        except BaseException as exc:  # noqa: BLE001 - the step's outcome
            self.error = exc
            if self.claim is not None:
                self.keys.release(self.claim)
                if isinstance(exc, IdempotencyKeyInFlight) and self.claim.deferred is not None:
                    self._taken_meanwhile(self.claim, self.claim.deferred.digest)
        self.need = None
        return False

    def _taken_meanwhile(self, claim: KeyClaim, digest: str) -> None:
        """The step's commit found its key taken by another request (nothing committed):
        that request's stored reply when it has one by now, else the 409 the key's state
        gives, as the step's outcome
        (:meth:`~sandpit.api.services.idempotency.Idempotency.reply_of_taken`; a key free
        again keeps the commit's 409: a retry runs the step)."""
        try:
            replay = self.keys.reply_of_taken(claim.tenant, claim.key, digest)
        except ApiError as exc:
            self.error = exc
            return
        if replay is not None:
            self.reply, self.error = _replayed(self.item, replay), None


def _replayed(item: BatchStep, replay: Replay) -> bytes:
    """The outcome bytes of ``item`` when its key replays a committed step."""
    return b'{"env_id":' + orjson.dumps(item.env_id) + b',"status":200,"result":' + replay.body + b',"replayed":true}'
