"""Steps of several async envs sent as one batched request (`POST /v1/envs:step`).

`StepBatch.step(handle, action)` is awaited like `AsyncEnvHandle.step_call(action)` and
gives the same `StepResult` or raises the same client error; what differs is the wire:
the steps asked for in one turn of the event loop (the coroutines that
`asyncio.gather` starts together, each reaching `step` before its first suspension) go
out together, in requests of at most `MAX_BATCH_STEPS` steps (sent concurrently),
through `AsyncEnvs.step_many`. A step the server refused (its own status and error
object) raises that step's error (`outcome.exception()`: `PayloadTooLarge`, `NotFound`,
`Conflict`...) in that step's caller only; a request that failed as a whole (the server
unreachable after the transport's retries, a 422 for the batch) raises its error in
every caller of that request. Each step carries its own idempotency key, so the
transport's resend of a batch after a lost reply runs every step once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .batch import MAX_BATCH_STEPS
from .clients import AsyncClient
from .envs import AsyncEnvHandle
from .errors import SandpitError
from .models import StepResult


@dataclass
class _Pending:
    handle: AsyncEnvHandle
    action: object
    reply: asyncio.Future[StepResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class StepBatch:
    """Collects the steps of one event-loop turn into batched requests (the module
    docstring). Use one per vector step; an env appears at most once in it (the server
    takes one step per env in a batch: a second one raises `ValueError` in its caller).

    Args:
        client: the `AsyncClient` whose `envs.step_many` sends the steps.
    """

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._pending: dict[str, _Pending] = {}
        """This turn's steps by env id."""
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0
        """Batched requests sent so far."""

    async def step(self, handle: AsyncEnvHandle, action: object) -> StepResult:
        """`handle.step_call(action)` as one step of the batch (the handle's attempt
        token goes with it). Raises the step's own refusal or the batch request's error
        (module docstring); `ValueError` for an env already in this turn's batch."""
        if handle.id in self._pending:
            raise ValueError(f"env {handle.id!r} is in the batch twice: one step per env")
        pending = _Pending(handle, action)
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._send)
        self._pending[handle.id] = pending
        return await pending.reply

    def _send(self) -> None:
        """Send what this turn collected, `MAX_BATCH_STEPS` steps a request."""
        pending, self._pending = list(self._pending.values()), {}
        for start in range(0, len(pending), MAX_BATCH_STEPS):
            task = asyncio.get_running_loop().create_task(self._request(pending[start:start + MAX_BATCH_STEPS]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _request(self, pending: list[_Pending]) -> None:
        self.requests += 1
        try:
            outcomes = await self.client.envs.step_many([(p.handle, p.action) for p in pending])
            if len(outcomes) != len(pending):
                raise SandpitError(f"the batch of {len(pending)} steps got {len(outcomes)} outcomes", code="bad_reply")
        except BaseException as exc:  # noqa: BLE001 - every step of the request fails with it
            for p in pending:
                if not p.reply.done():
                    p.reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for p, outcome in zip(pending, outcomes, strict=True):
            if p.reply.done():  # its caller was cancelled
                continue
            try:
                p.reply.set_result(outcome.unwrap())
            except SandpitError as exc:
                p.reply.set_exception(exc)
