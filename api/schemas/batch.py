"""The batched step (``POST /v1/envs:step``): one request carrying one action for each of
several envs, one reply with each env's outcome in the request's order."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from .common import _Request, list_pattern
from .envs import ATTEMPT_PATTERN, StepRequest, StepResult

IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]{1,255}$"
"""A step's idempotency key: as the ``Idempotency-Key`` header (1 to 255 printable ASCII)."""
MAX_BATCH_STEPS = 256
"""Most steps in one batch (one per env)."""
INCLUDE_PARTS = ("state_diff", "state")
"""What a batch's ``include`` may name (as a step's ``?include=``)."""


class BatchStep(_Request):
    """One env's action in a batch: ``action`` is any of the step route's three forms
    (:class:`~.envs.StepRequest`); ``attempt`` is the env's attempt token, as the step
    route's ``Sandpit-Attempt`` header (a stale one is that step's 409 ``stale_attempt``);
    ``idempotency_key`` is this step's key, as the step route's ``Idempotency-Key``
    header: a retry of the step with the same key (in a batch) replays its stored result
    and runs nothing, the same key with another step is that step's 409."""

    env_id: Annotated[str, Field(min_length=1, max_length=64)]
    action: StepRequest
    attempt: Annotated[str | None, Field(pattern=ATTEMPT_PATTERN)] = None
    idempotency_key: Annotated[str | None, Field(pattern=IDEMPOTENCY_KEY_PATTERN)] = None


class BatchStepRequest(_Request):
    """``POST /v1/envs:step``: at most :data:`MAX_BATCH_STEPS` steps, each of another env;
    ``include`` names the parts every step's result adds (``state``, ``state_diff``)."""

    steps: Annotated[list[BatchStep], Field(min_length=1, max_length=MAX_BATCH_STEPS)]
    include: Annotated[str | None, Field(max_length=64, pattern=list_pattern(INCLUDE_PARTS))] = None


class BatchStepOutcome(BaseModel):
    """One env's outcome in a batch: ``status`` is the HTTP status its step alone would
    have got; 200 carries ``result`` (the step route's reply), any other ``error`` (the
    step route's error object: ``code``, ``message``, ``field``, and ``limit`` /
    ``retry_after`` where they apply; ``replayed`` is only present, true, on a replay)."""

    model_config = ConfigDict(extra="forbid")

    env_id: str
    status: int
    result: StepResult | None = None
    error: dict[str, Any] | None = None
    replayed: bool = False
    """The step's ``idempotency_key`` had a stored result: it is that result, nothing ran."""


class BatchStepResponse(BaseModel):
    """``POST /v1/envs:step``'s reply: ``results[i]`` is the outcome of ``steps[i]``."""

    model_config = ConfigDict(extra="forbid")

    results: list[BatchStepOutcome]
