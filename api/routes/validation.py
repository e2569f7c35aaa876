"""``POST /v1/validate`` (generated code -> verdict) and ``POST /v1/execute`` (snippet ->
program output), both running untrusted code only in sandboxes."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import EvaluationDep, TenantDep
from ..schemas import (
    ExecuteBatchRequest,
    ExecuteBatchResult,
    ExecuteRequest,
    ExecuteResult,
    ValidateRequest,
    ValidateResult,
)
from ..strict_json import StrictJSONRoute

router = APIRouter(prefix="/v1", tags=["validation"], route_class=StrictJSONRoute)


@router.post("/validate", response_model=ValidateResult)
def validate(body: ValidateRequest, evaluation: EvaluationDep, tenant: TenantDep) -> ValidateResult:
    """Static policy report, plus a sandbox run for environments and check functions."""
    return evaluation.validate(tenant, body)


@router.post("/execute", response_model=ExecuteResult)
def execute(body: ExecuteRequest, evaluation: EvaluationDep, tenant: TenantDep) -> ExecuteResult:
    """Run a Python snippet as a script in a sandbox: stdout, stderr, exit code, status."""
    return evaluation.execute(tenant, body)


@router.post("/execute/batch", response_model=ExecuteBatchResult)
def execute_batch(body: ExecuteBatchRequest, evaluation: EvaluationDep, tenant: TenantDep) -> ExecuteBatchResult:
    """Several snippets concurrently (bounded); results in request order."""
    return ExecuteBatchResult(results=evaluation.execute_batch(tenant, body.snippets, body.concurrency))
