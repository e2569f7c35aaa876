"""Validation and execution (:mod:`sandpit.api.services.execution`) and scenarios on the
fake executor: verdicts (never HTTP errors for code that fails), check cases, scripts,
profile limits, and the checks' static policy."""

from __future__ import annotations

import pytest
from api_fakes import SOURCE, caller
from sandpit.api.app import Services
from sandpit.api.errors import InvalidRequest, NotFound, QuotaExceeded
from sandpit.api.schemas.scenarios import CheckSpec, ScenarioCreate
from sandpit.api.schemas.validation import (
    ExecuteBatchRequest,
    ExecuteRequest,
    SmokeCall,
    StatePair,
    ValidateRequest,
)
from sandpit.executor.fake import FakeExecutor

ME = caller()


def validate(services: Services, **body: object) -> object:
    return services.execution.validate_request(ME, ValidateRequest.model_validate(body))


def test_a_valid_environment_with_smoke_calls(services: Services) -> None:
    result = services.execution.validate_request(ME, ValidateRequest(
        kind="environment", source_code=SOURCE, class_name="Counter", init_config={"count": 1},
        smoke_calls=[SmokeCall(name="bump", arguments={"by": 2}), SmokeCall(name="nope")]))
    assert result.verdict == "invalid" and result.reasons == ["smoke call 'nope': not a tool"]
    assert result.instantiation == {"status": "ok", "observation": ""}
    assert {t["function"]["name"] for t in result.tools or []} == {"bump", "set_record", "fail"}
    bump = result.smoke[0]
    assert (bump.status, bump.observation) == ("ok", "3")
    assert bump.state_diff is not None and bump.state_diff["count"] == {"changed": {"old": 1, "new": 3}}


def test_code_that_fails_is_a_verdict(services: Services) -> None:
    broken = services.execution.validate_request(ME, ValidateRequest(
        kind="environment", source_code=SOURCE, class_name="Counter", init_config={"explode": True}))
    assert broken.verdict == "invalid" and broken.instantiation is not None
    assert broken.instantiation["status"] == "error" and "init refused" in broken.reasons[0]
    missing = services.execution.validate_request(ME, ValidateRequest(
        kind="environment", source_code=SOURCE, class_name="Missing"))
    assert missing.verdict == "invalid" and missing.reasons[0].startswith("loading Missing failed")
    refused = services.execution.validate_request(ME, ValidateRequest(
        kind="snippet", source_code="().__class__.__bases__[0].__subclasses__()"))
    assert refused.verdict == "invalid" and refused.reasons[0].startswith("policy 'standard'")
    with pytest.raises(InvalidRequest) as raised:
        services.execution.validate_request(ME, ValidateRequest(kind="environment", source_code=SOURCE))
    assert raised.value.field == "class_name"


def test_a_kind_s_requirement_is_refused_whatever_the_code(services: Services) -> None:
    """Before the policy runs: code that fails it does not turn a request the OpenAPI
    document refuses (its ``oneOf`` by kind) into a 200 ``invalid`` verdict."""
    for source in (SOURCE, "def (:"):
        with pytest.raises(InvalidRequest) as raised:
            validate(services, kind="environment", source_code=source)
        assert raised.value.field == "class_name"
        with pytest.raises(InvalidRequest) as raised:
            validate(services, kind="check_function", source_code=source, cases=[], class_name="Counter")
        assert raised.value.field == "cases"


CHECK = "def check_func(final_state):\n    return final_state['count'] > initial_state['count']\n"


def test_check_functions_run_on_the_given_cases(services: Services, fake: FakeExecutor) -> None:
    fake.script_check(CHECK, lambda initial, final: final["count"] > initial["count"])
    result = services.execution.validate_request(ME, ValidateRequest(
        kind="check_function", source_code=CHECK,
        cases=[StatePair(initial_state={"count": 1}, final_state={"count": 2}),
               StatePair(initial_state={"count": 2}, final_state={"count": 1})]))
    assert result.verdict == "valid" and [c.passed for c in result.cases] == [True, False]
    fake.script_check(CHECK, "error")
    failing = services.execution.validate_request(ME, ValidateRequest(
        kind="check_function", source_code=CHECK, cases=[StatePair()]))
    assert failing.verdict == "invalid" and failing.reasons[0].startswith("case 0:")
    with pytest.raises(InvalidRequest) as raised:
        services.execution.validate_request(ME, ValidateRequest(kind="check_function", source_code=CHECK))
    assert raised.value.field == "cases"


def test_scripts_run_within_the_profile(services: Services, fake: FakeExecutor) -> None:
    fake.script_exec("print(1)", "1\n")
    fake.script_exec("print(2)", "2\n")
    assert services.execution.execute_request(ME, ExecuteRequest(code="print(1)")).stdout == "1\n"
    batch = services.execution.execute_batch_request(ME, ExecuteBatchRequest(
        snippets=[ExecuteRequest(code="print(2)"), ExecuteRequest(code="print(1)")], concurrency=2))
    assert [r.stdout for r in batch.results] == ["2\n", "1\n"]
    roomy = caller(max_profile={"call_timeout_s": 3600, "memory_mib": 65536})  # past the tenant's ceiling
    with pytest.raises(InvalidRequest) as slow:
        services.execution.execute_request(roomy, ExecuteRequest(code="print(1)", timeout_s=3000))
    assert slow.value.field == "timeout_s"
    with pytest.raises(InvalidRequest) as big:
        services.execution.execute_request(roomy, ExecuteRequest(code="print(1)", memory_mb=60000))
    assert big.value.field == "memory_mb"
    with pytest.raises(QuotaExceeded) as capped:
        services.execution.execute_request(caller(max_profile={"memory_mib": 64}),
                                           ExecuteRequest(code="print(1)", memory_mb=128))
    assert capped.value.field == "profile.memory_mib"


def test_scenarios_check_their_environment_and_their_checks_policy(services: Services,
                                                                   environment_id: str) -> None:
    scenario = services.scenarios.create(ME, ScenarioCreate(
        environment_id=environment_id, task="t", checklist_with_func=[CheckSpec(check_item="c", check_func=CHECK)]))
    assert services.scenarios.page(ME, 10, 0, environment_id).count == 1
    with pytest.raises(InvalidRequest) as raised:
        services.scenarios.create(ME, ScenarioCreate(environment_id=environment_id, task="t", checklist_with_func=[
            CheckSpec(check_item="c", check_func="def check_func(s):\n    return s.__class__.__subclasses__()\n")]))
    assert raised.value.field == "checklist_with_func.0.check_func"
    with pytest.raises(NotFound):
        services.scenarios.create(caller("team-b"), ScenarioCreate(environment_id=environment_id, task="t"))
    services.scenarios.delete(ME, scenario.id)
    with pytest.raises(NotFound):
        services.scenarios.read(ME, scenario.id)
