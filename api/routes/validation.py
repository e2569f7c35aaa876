"""``POST /v1/validate`` (generated code -> verdict) and ``POST /v1/execute`` (snippet ->
program output), both running untrusted code only in sandboxes."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import CallerDep, EvaluationDep, QuotasDep
from ..quotas import QuotaService, TenantContext
from ..schemas import (
    ExecuteBatchRequest,
    ExecuteBatchResult,
    ExecuteRequest,
    ExecuteResult,
    ValidateRequest,
    ValidateResult,
)
from ..strict_json import StrictJSONRoute
from ..tools import json_size, text_size

router = APIRouter(prefix="/v1", tags=["validation"], route_class=StrictJSONRoute)


def _capped(body: ExecuteRequest, caller: TenantContext, evaluation: EvaluationDep, quotas: QuotaService,
            field_prefix: str = "") -> ExecuteRequest:
    """``body`` within the tenant's ``max_code_bytes`` and ``max_profile`` (a limit asked
    above the ceiling is a 429; an unasked default above it is lowered)."""
    quotas.check_size(caller, "max_code_bytes", text_size(body.code),
                            f"{field_prefix}code")
    default = evaluation.pool.profile()
    overrides = QuotaService.profile_overrides(
        caller, {k: v for k, v in (("memory_mib", body.memory_mb), ("call_timeout_s", body.timeout_s)) if v},
        {"memory_mib": default.memory_mib, "call_timeout_s": default.call_timeout_s})
    if not overrides:
        return body
    return body.model_copy(update={"memory_mb": overrides.get("memory_mib", body.memory_mb),
                                   "timeout_s": overrides.get("call_timeout_s", body.timeout_s)})


@router.post("/validate", response_model=ValidateResult)
def validate(body: ValidateRequest, evaluation: EvaluationDep, caller: CallerDep, quotas: QuotasDep) -> ValidateResult:
    """Static policy report, plus a sandbox run for environments and check functions."""
    quotas.check_size(caller, "max_code_bytes", text_size(body.source_code), "source_code")
    quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
    with quotas.call(caller):
        return evaluation.validate(caller.tenant, body)


@router.post("/execute", response_model=ExecuteResult)
def execute(body: ExecuteRequest, evaluation: EvaluationDep, caller: CallerDep, quotas: QuotasDep) -> ExecuteResult:
    """Run a Python snippet as a script in a sandbox: stdout, stderr, exit code, status."""
    body = _capped(body, caller, evaluation, quotas)
    with quotas.call(caller):
        return evaluation.execute(caller.tenant, body)


@router.post("/execute/batch", response_model=ExecuteBatchResult)
def execute_batch(body: ExecuteBatchRequest, evaluation: EvaluationDep, caller: CallerDep,
                  quotas: QuotasDep) -> ExecuteBatchResult:
    """Several snippets concurrently (bounded); results in request order. Holds
    ``concurrency`` of the tenant's ``max_concurrent_calls``."""
    snippets = [_capped(s, caller, evaluation, quotas, f"snippets.{i}.") for i, s in enumerate(body.snippets)]
    concurrency = min(body.concurrency, len(snippets))
    with quotas.call(caller, weight=concurrency):
        return ExecuteBatchResult(results=evaluation.execute_batch(caller.tenant, snippets, concurrency))
