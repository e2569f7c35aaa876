"""The batched step's reply (`POST /v1/envs:step`, built by `calls.envs_step`): one action
for each of several envs in one request; `client.envs.step_many` sends it.

Every action carries its own idempotency key (a new uuid4 per action, the same on a retry
of the request), so the transport resends a batch whose connection was lost: the steps
that committed are replayed from their stored results, the others run.
"""

from __future__ import annotations

from typing import Any

import httpx

from .errors import SandpitError, error_from_response
from .models import StepResult, _ResponseModel

MAX_BATCH_STEPS = 256
"""Most actions in one batch (the server's limit)."""


class BatchStepOutcome(_ResponseModel):
    """One env's outcome in a batch: `status` 200 with `result` (the step's `StepResult`),
    or the HTTP status and `error` object (`code`, `message`, `field`...) the step alone
    would have got. `replayed`: the result was stored by an earlier try of the same
    batch; nothing ran again."""

    env_id: str
    status: int
    result: StepResult | None = None
    error: dict[str, Any] | None = None
    replayed: bool = False

    @property
    def ok(self) -> bool:
        """The step ran and was recorded (any step `status`, `ok` or not)."""
        return self.status == 200 and self.result is not None

    def exception(self) -> SandpitError | None:
        """The step's refusal as the client error the step route would have raised
        (`Conflict`, `RateLimited`, `NotFound`...), or None when it ran."""
        if self.ok:
            return None
        headers = {}
        if isinstance(self.error, dict) and isinstance(self.error.get("retry_after"), int | float):
            headers["Retry-After"] = str(self.error["retry_after"])
        return error_from_response(httpx.Response(self.status, json={"error": self.error}, headers=headers))

    def unwrap(self) -> StepResult:
        """The `StepResult`, or raise the step's refusal (:meth:`exception`)."""
        error = self.exception()
        if error is not None:
            raise error
        assert self.result is not None
        return self.result


class BatchStepReply(_ResponseModel):
    """`POST /v1/envs:step`'s reply: `results[i]` is the outcome of the i-th action."""

    results: list[BatchStepOutcome]
