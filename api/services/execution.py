"""Validation of generated code (``POST /v1/validate``) and code execution
(``POST /v1/execute[/batch]``); untrusted code runs only in sandboxes.

* ``validate``: the static policy report, then (``environment``) load + instantiate +
  derive tools + smoke calls in a sandbox, or (``check_function``) run the check against
  supplied state pairs in a sandbox; ``snippet`` is the static report only. Code that
  fails is a verdict (``invalid`` with reasons), not an HTTP error.
* ``execute``: a snippet as a script in a fresh sandbox process, within the tenant's
  ``max_profile`` (a limit asked above it is a 429; an unasked default above it is
  lowered).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..errors import InvalidRequest
from ..json_rules import json_size, text_size
from ..sandboxes import CodeFailed, Sandboxes, SandboxRefused
from ..schemas.validation import (
    ExecuteBatchRequest,
    ExecuteBatchResult,
    ExecuteRequest,
    ExecuteResult,
    SmokeResult,
    ValidateRequest,
    ValidateResult,
)
from ..settings import ApiSettings
from .checks import Checks
from .common import clean_text
from .diff import state_diff
from .limits import check_code, check_config
from .policy import check_source
from .quotas import QuotaService, TenantContext


class ExecutionService:
    """Validate and execute (see the module docstring)."""

    def __init__(self, settings: ApiSettings, sandboxes: Sandboxes, checks: Checks, quotas: QuotaService) -> None:
        self.settings = settings
        self.sandboxes = sandboxes
        self.checks = checks
        self.quotas = quotas

    # -- the HTTP contract -------------------------------------------------------------------
    def validate_request(self, caller: TenantContext, body: ValidateRequest) -> ValidateResult:
        """``POST /v1/validate``: the tenant's size quotas, then :meth:`validate` in a
        concurrent call."""
        self.quotas.check_size(caller, "max_code_bytes", text_size(body.source_code), "source_code")
        self.quotas.check_size(caller, "max_init_config_bytes", json_size(body.init_config), "init_config")
        with self.quotas.call(caller):
            return self.validate(caller.tenant, body)

    def execute_request(self, caller: TenantContext, body: ExecuteRequest) -> ExecuteResult:
        """``POST /v1/execute``: :meth:`capped`, then :meth:`execute` in a concurrent call."""
        body = self.capped(caller, body)
        with self.quotas.call(caller):
            return self.execute(caller.tenant, body)

    def execute_batch_request(self, caller: TenantContext, body: ExecuteBatchRequest) -> ExecuteBatchResult:
        """``POST /v1/execute/batch``: every snippet :meth:`capped`, then
        :meth:`execute_batch` holding ``concurrency`` of the tenant's concurrent calls."""
        snippets = [self.capped(caller, s, f"snippets.{i}.") for i, s in enumerate(body.snippets)]
        concurrency = min(body.concurrency, len(snippets))
        with self.quotas.call(caller, weight=concurrency):
            return ExecuteBatchResult(results=self.execute_batch(caller.tenant, snippets, concurrency))

    def capped(self, caller: TenantContext, body: ExecuteRequest, field_prefix: str = "") -> ExecuteRequest:
        """``body`` within the tenant's ``max_code_bytes`` and ``max_profile`` (a limit
        asked above the ceiling is a 429; an unasked default above it is lowered)."""
        self.quotas.check_size(caller, "max_code_bytes", text_size(body.code), f"{field_prefix}code")
        default = self.sandboxes.default_limits()
        overrides = QuotaService.profile_overrides(
            caller, {k: v for k, v in (("memory_mib", body.memory_mb), ("call_timeout_s", body.timeout_s)) if v},
            {"memory_mib": default["memory_mib"], "call_timeout_s": default["call_timeout_s"]})
        if not overrides:
            return body
        return body.model_copy(update={"memory_mb": overrides.get("memory_mib", body.memory_mb),
                                       "timeout_s": overrides.get("call_timeout_s", body.timeout_s)})

    # -- validate ------------------------------------------------------------------------------
    def validate(self, tenant: str, body: ValidateRequest) -> ValidateResult:
        """Static report plus, by kind, a sandbox run (see the module docstring). Raises
        InvalidRequest before anything runs when the kind's requirement is not met
        (``class_name`` for an environment, a case for a check function: the OpenAPI
        document's ``oneOf``), whatever the code."""
        check_code(self.settings, body.source_code)
        if body.kind == "environment" and body.class_name is None:
            raise InvalidRequest("class_name is required for kind=environment", field="class_name")
        if body.kind == "check_function" and not body.cases:
            raise InvalidRequest("kind=check_function needs at least one case {initial_state, final_state}",
                                 field="cases")
        report = check_source(body.source_code, body.policy)
        reasons = [f"policy {body.policy!r}: line {f.line} {f.rule}: {f.message}"
                   for f in report.findings if f.severity == "error"]
        result = ValidateResult(kind=body.kind, verdict="valid", reasons=[], policy_report=report.to_dict())
        if body.kind == "environment" and not reasons:
            reasons += self._validate_environment(tenant, body, result)
        elif body.kind == "check_function" and not reasons:
            reasons += self._validate_check(tenant, body, result)
        result.reasons = reasons
        result.verdict = "invalid" if reasons else "valid"
        return result

    def _validate_environment(self, tenant: str, body: ValidateRequest, result: ValidateResult) -> list[str]:
        assert body.class_name is not None  # validate() refused it
        check_config(self.settings, body.init_config)
        try:
            result.tools = self.sandboxes.describe(tenant=tenant, source=body.source_code, class_name=body.class_name)
        except CodeFailed as exc:
            return [f"loading {body.class_name} failed ({exc.status}): {clean_text(exc.observation)[:2000]}"]
        try:
            session = self.sandboxes.open_session(tenant=tenant, source=body.source_code, class_name=body.class_name,
                                                  init_config=body.init_config)
        except CodeFailed as exc:
            result.instantiation = {"status": exc.status, "observation": clean_text(exc.observation)[:4000]}
            return [f"instantiating {body.class_name} failed ({exc.status}): {clean_text(exc.observation)[:2000]}"]
        reasons: list[str] = []
        try:
            result.instantiation = {"status": "ok", "observation": ""}
            names = {t["function"]["name"] for t in result.tools}
            before = session.state()
            for call in body.smoke_calls:
                if call.name not in names:
                    result.smoke.append(SmokeResult(name=call.name, status="rejected",
                                                    observation=f"Error: {call.name!r} is not a tool"))
                    reasons.append(f"smoke call {call.name!r}: not a tool")
                    continue
                outcome = session.call(call.name, call.arguments)
                if session.closed:  # its sandbox was lost (the outcome says how): nothing more to run
                    result.smoke.append(SmokeResult(name=call.name, status=outcome.status,
                                                    observation=clean_text(outcome.observation), state_diff=None))
                    reasons.append(f"smoke call {call.name!r}: {outcome.status}: {clean_text(outcome.observation)[:300]}")
                    break
                after = session.state()
                result.smoke.append(SmokeResult(name=call.name, status=outcome.status,
                                                observation=clean_text(outcome.observation),
                                                state_diff=state_diff(before, after)))
                before = after
                if outcome.status not in ("ok",):
                    reasons.append(f"smoke call {call.name!r}: {outcome.status}: {clean_text(outcome.observation)[:300]}")
        finally:
            session.close()
        return reasons

    def _validate_check(self, tenant: str, body: ValidateRequest, result: ValidateResult) -> list[str]:
        reasons = []
        for index, case in enumerate(body.cases):
            outcome = self.checks.on_json(tenant, [{"check_item": f"case {index}", "check_func": body.source_code}],
                                          case.initial_state, case.final_state)[0]
            result.cases.append(outcome)
            if outcome.error is not None:  # returning False is a valid outcome; errors are not
                reasons.append(f"case {index}: {outcome.error}")
        return reasons

    # -- execute ---------------------------------------------------------------------------------
    def execute(self, tenant: str, body: ExecuteRequest) -> ExecuteResult:
        """Run a snippet as a script in a fresh sandbox process. Raises InvalidRequest
        (bad files, limits above the profile), PayloadTooLarge, NoCapacity (503 + Retry-After)."""
        check_code(self.settings, body.code)
        try:
            profile = self.sandboxes.profile({"memory_mib": body.memory_mb} if body.memory_mb else None)
        except SandboxRefused as exc:
            raise InvalidRequest(exc.message, field="memory_mb") from None
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="memory_mb") from None
        if body.timeout_s is not None and body.timeout_s > profile.call_timeout_s:
            raise InvalidRequest(f"timeout_s {body.timeout_s:g} is above the profile's {profile.call_timeout_s:g} s",
                                 field="timeout_s")
        try:
            out = self.sandboxes.execute(tenant=tenant, code=body.code, stdin=body.stdin, files=body.files or None,
                                         timeout_s=body.timeout_s, profile=profile)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="files") from None
        return ExecuteResult(status=out.status, exit_code=out.exit_code, stdout=clean_text(out.stdout),
                             stderr=clean_text(out.stderr), stdout_truncated=out.stdout_truncated,
                             stderr_truncated=out.stderr_truncated, duration_ms=out.duration_ms)

    def execute_batch(self, tenant: str, snippets: list[ExecuteRequest], concurrency: int) -> list[ExecuteResult]:
        """Snippets run concurrently (at most ``concurrency`` at once); results in order."""
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sandpit-exec") as workers:
            return list(workers.map(lambda body: self.execute(tenant, body), snippets))
