"""Evaluations of an env (:mod:`sandpit.api.envs.rewards`) on the fake executor."""

from __future__ import annotations

from typing import Any

import pytest
from env_calls import CHECK_COUNT, ME, step
from sandpit.api.app import Services
from sandpit.api.errors import Conflict, InvalidRequest
from sandpit.api.schemas.envs import (
    EnvCreate,
)
from sandpit.api.schemas.evaluations import EvaluateRequest
from sandpit.api.schemas.scenarios import CheckSpec
from sandpit.api.services.checks import Checks
from sandpit.executor.fake import FakeExecutor
from sandpit.sandbox_images.runner import limits


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


def texts(services: Services) -> tuple[int, int]:
    """``sandpit_check_state_texts_total`` so far: (kept, made)."""
    sample = services.metrics.registry.get_sample_value
    kept, made = (int(sample("sandpit_check_state_texts_total", {"result": result}) or 0) for result in ("kept", "made"))
    return kept, made


def test_state_texts_are_kept_by_root_and_give_the_same_verdicts(services: Services, scenario_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    step(services, env.id, "bump", by=2)
    first = services.rewards.evaluate(ME, env.id, None)
    hits, misses = texts(services)
    again = services.rewards.evaluate(ME, env.id, None)  # both states by root: nothing loaded or encoded
    assert (texts(services)[0] - hits, texts(services)[1] - misses) == (2, 0)
    assert [r.passed for r in again.results] == [r.passed for r in first.results] == [True, True]
    step(services, env.id, "bump", by=1)  # a new final state: its text is new, the initial one is kept
    hits, misses = texts(services)
    assert services.rewards.evaluate(ME, env.id, None).passed == 0  # count 4, two bumps
    assert (texts(services)[0] - hits, texts(services)[1] - misses) == (1, 1)
    services.episodes.reset(ME, env.id, None)  # the next episode starts from the same state: same root
    step(services, env.id, "bump", by=2)
    hits = texts(services)[0]
    assert services.rewards.evaluate(ME, env.id, None).reward == 1.0
    assert texts(services)[0] - hits >= 1
    exposition = services.metrics.render().decode()
    assert f'sandpit_check_state_texts_total{{result="kept"}} {float(texts(services)[0])}' in exposition
    assert f'sandpit_check_state_texts_total{{result="made"}} {float(texts(services)[1])}' in exposition


def test_a_state_text_cache_too_small_for_a_state_keeps_nothing_and_loses_nothing(
        services: Services, scenario_id: str) -> None:
    services.checks = services.rewards.checks = Checks(services.sandboxes, services.metrics, texts_bytes=8)
    env = services.envs.create(ME, EnvCreate(scenario_id=scenario_id)).public
    step(services, env.id, "bump", by=2)
    before = texts(services)
    for _ in range(2):
        assert services.rewards.evaluate(ME, env.id, None).reward == 1.0
    assert (texts(services)[0] - before[0], texts(services)[1] - before[1]) == (0, 4)


class _State:
    """A loaded state as :meth:`Checks.prepared` reads it (its encoded attributes)."""

    def __init__(self, encoded: dict[str, Any]) -> None:
        self._encoded = encoded

    def encoded(self) -> dict[str, Any]:
        return self._encoded


@pytest.mark.parametrize(("state", "message"), [
    ({"big": ["j", "x" * limits.MAX_STATE_BYTES]}, "has .* bytes of JSON"),
    ({"a": ["j", float("nan")]}, "not JSON-encodable"),
    ({"a": ["j", "\udc80"]}, "not JSON-encodable"),
    ({"a": 5}, "is not an encoded value"),
])
def test_a_state_the_sandbox_cannot_take_is_a_clear_error_and_is_not_kept(
        services: Services, state: dict[str, Any], message: str) -> None:
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=message) as caught:
            services.checks.prepared("root-of-a-bad-state", lambda: _State(state))  # noqa: B023
        assert caught.value.field == "checks"
    assert texts(services)[0] == 0
    good = services.checks.prepared("root-of-a-good-state", lambda: _State({"a": ["j", 1]}))
    assert services.checks.prepared("root-of-a-good-state", lambda: _State({})) is good  # by root, not loaded
