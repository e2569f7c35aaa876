"""``POST /v1/validate`` (generated code -> verdict) and ``POST /v1/execute`` (snippet ->
program output), both running untrusted code only in sandboxes."""

from __future__ import annotations

from ...schemas.validation import (
    ExecuteBatchRequest,
    ExecuteBatchResult,
    ExecuteRequest,
    ExecuteResult,
    ValidateRequest,
    ValidateResult,
)
from ..deps import METERED, CallerDep, ExecutionDep, json_router

router = json_router(prefix="/v1", tags=["validation"])


@router.post("/validate", response_model=ValidateResult, responses=METERED)
def validate(body: ValidateRequest, execution: ExecutionDep, caller: CallerDep) -> ValidateResult:
    """Static policy report, plus a sandbox run for environments and check functions."""
    return execution.validate_request(caller, body)


@router.post("/execute", response_model=ExecuteResult, responses=METERED)
def execute(body: ExecuteRequest, execution: ExecutionDep, caller: CallerDep) -> ExecuteResult:
    """Run a Python snippet as a script in a sandbox: stdout, stderr, exit code, status."""
    return execution.execute_request(caller, body)


@router.post("/execute/batch", response_model=ExecuteBatchResult, responses=METERED)
def execute_batch(body: ExecuteBatchRequest, execution: ExecutionDep, caller: CallerDep) -> ExecuteBatchResult:
    """Several snippets concurrently (bounded); results in request order. Holds
    ``concurrency`` of the tenant's ``max_concurrent_calls``."""
    return execution.execute_batch_request(caller, body)
