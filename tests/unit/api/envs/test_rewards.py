"""Evaluations of an env (:mod:`sandpit.api.envs.rewards`) on the fake executor."""

from __future__ import annotations

import pytest
from env_calls import CHECK_COUNT, ME, step
from sandpit.api.app import Services
from sandpit.api.errors import Conflict, InvalidRequest
from sandpit.api.schemas.envs import (
    EnvCreate,
)
from sandpit.api.schemas.evaluations import EvaluateRequest
from sandpit.api.schemas.scenarios import CheckSpec
from sandpit.executor.fake import FakeExecutor


def test_evaluate_runs_the_scenarios_checks_on_the_current_state(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    step(services, env.id, "bump", by=2)
    result = services.rewards.evaluate(ME, env.id, None)
    assert (result.passed, result.total, result.reward) == (2, 2, 1.0)
    plain = services.envs.create(ME, EnvCreate(environment_id=services.scenarios.read(ME, scenario_id)
                                               .environment_id)).public
    with pytest.raises(Conflict):
        services.rewards.evaluate(ME, plain.id, None)


def test_evaluate_remembers_passing_check_sources_and_names_a_refused_one(services: Services, scenario_id: str,
                                                                          fake: FakeExecutor) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    step(services, env.id, "bump", by=2)
    good = [CheckSpec(check_item="count is 3", check_func=CHECK_COUNT)]
    for _ in range(2):  # the second time from memory: same verdict, same result
        assert services.rewards.evaluate(ME, env.id, EvaluateRequest(checks=good)).reward == 1.0
    refused = CheckSpec(check_item="escape", check_func="def check_func(s):\n    return ().__class__.__bases__\n")
    with pytest.raises(InvalidRequest) as caught:
        services.rewards.evaluate(ME, env.id, EvaluateRequest(checks=[*good, refused]))
    assert caught.value.field == "checks.1.check_func"
    with pytest.raises(InvalidRequest):  # a refused source is never remembered
        services.rewards.evaluate(ME, env.id, EvaluateRequest(checks=[refused]))
