"""The failure taxonomy (:mod:`sandpit.api.envs.failures`): every status under every case
the platform distinguishes, episode precedence, evaluation error statuses, and values a
corrupt record could hold."""

from __future__ import annotations

import itertools

import pytest
from sandpit.api.envs.failures import (
    ERROR_STATUS_FAILURES,
    FAILURES,
    MASKED,
    PRECEDENCE,
    check_failure,
    episode_failure,
    error_status_failure,
    evaluation_failure,
    masked,
    step_failure,
    worst,
)
from sandpit.executor.results import STATUSES

EXPECTED = {
    # (status, sandbox_lost, starved): failure, when the step did not re-open after a loss
    ("ok", False, False): "none",
    ("rejected", False, False): "agent",
    ("error", False, False): "environment",
    ("timeout", False, False): "environment",
    ("timeout", True, False): "infrastructure",
    ("timeout", False, True): "infrastructure",
    ("timeout", True, True): "infrastructure",
    ("oom", False, False): "environment",
    ("oom", True, False): "environment",
    ("crashed", False, False): "environment",
    ("crashed", True, False): "infrastructure",
    ("crashed", False, True): "infrastructure",
    ("crashed", True, True): "infrastructure",
}


@pytest.mark.parametrize(("status", "lost", "starved"), list(itertools.product(STATUSES, (False, True), (False, True))))
def test_every_status_under_every_case(status: str, lost: bool, starved: bool) -> None:
    got = step_failure(status, sandbox_lost=lost, starved=starved)
    key = (status, lost, starved)
    if key in EXPECTED:
        assert got == EXPECTED[key]
    elif status in ("ok", "rejected", "error", "oom"):  # a lost sandbox or starvation cannot change them
        assert got == EXPECTED[(status, False, False)]
    assert step_failure(status, sandbox_lost=lost, starved=starved, recovered=True) == "infrastructure"


def test_an_unknown_status_is_the_platforms() -> None:
    assert step_failure("exploded") == "infrastructure"
    assert step_failure("") == "infrastructure"


def test_mask_advice() -> None:
    assert {f for f in FAILURES if masked(f)} == MASKED == {"infrastructure", "verifier"}
    assert not masked("environment") and not masked("agent") and not masked("none")
    assert not masked("INFRASTRUCTURE ")


def test_checks_that_did_not_run_cleanly_are_the_verifiers() -> None:
    assert check_failure("ok") == "none"
    for status in set(STATUSES) - {"ok"}:
        assert check_failure(status) == "verifier"


@pytest.mark.parametrize(("steps", "checks", "expected"), [
    ([], [], "none"),
    (["none", "none"], ["ok", "ok"], "none"),
    (["agent", "none"], ["ok"], "agent"),
    (["agent", "environment"], [], "environment"),
    (["environment"], ["error"], "verifier"),
    (["agent"], ["timeout", "ok"], "verifier"),
    (["infrastructure", "agent"], ["error"], "infrastructure"),
    (["none", "infrastructure"], [], "infrastructure"),
    (["verifier", "environment"], [], "verifier"),
])
def test_episode_precedence(steps: list[str], checks: list[str], expected: str) -> None:
    assert episode_failure(steps, checks) == expected
    assert episode_failure(reversed(steps), reversed(checks)) == expected


def test_precedence_is_a_total_order() -> None:
    assert sorted(FAILURES, key=PRECEDENCE.__getitem__) == ["none", "agent", "environment", "verifier",
                                                             "infrastructure"]
    for a, b in itertools.product(FAILURES, repeat=2):
        assert worst([a, b]) == (a if PRECEDENCE[a] >= PRECEDENCE[b] else b)


def test_a_corrupt_stored_failure_counts_as_infrastructure() -> None:
    assert worst(["none", "forged-none"]) == "infrastructure"
    assert worst([]) == "none"


def test_evaluation_error_statuses() -> None:
    assert error_status_failure("model_error") == "agent"
    for status in ("model_unavailable", "no_capacity", "unavailable", "env_lost", "secret_unavailable", "internal",
                   "scenario_not_found"):
        assert error_status_failure(status) == "infrastructure"
    assert error_status_failure("env_error") == "environment"
    assert error_status_failure("check_error") == "verifier"
    assert error_status_failure(None) == error_status_failure("never-heard-of") == "infrastructure"
    assert set(ERROR_STATUS_FAILURES.values()) <= set(FAILURES)


def test_evaluation_episodes() -> None:
    steps = [{"status": "ok", "failure": "none"}, {"status": "rejected", "failure": "agent"}]
    assert evaluation_failure("done", None, steps, [{"status": "ok"}]) == "agent"
    assert evaluation_failure("done", None, steps, [{"status": "error"}]) == "verifier"
    assert evaluation_failure("done", None, [{"status": "timeout"}], []) == "environment"  # recorded before failures
    assert evaluation_failure("done", None, [{"status": "ok", "failure": "infrastructure"}], []) == "infrastructure"
    assert evaluation_failure("error", "model_unavailable", steps, None) == "infrastructure"
    for unfinished in ("pending", "running", "cancelled"):
        assert evaluation_failure(unfinished, None, None, None) == "none"
    # stored JSON of the wrong shape counts as empty, never raises
    assert evaluation_failure("done", None, {"status": "crashed"}, "ok") == "none"
    assert evaluation_failure("done", None, [1, None, {"status": 3}], [[], {"status": None}]) == "infrastructure"


def test_rows_recorded_before_failures_were_are_derived() -> None:
    from sandpit.api.db import models
    from sandpit.api.envs.history import stored_step_failure
    from sandpit.api.envs.rulebook import stored_failure

    def episode(failure: str | None, checks: object) -> models.Episode:
        return models.Episode(env_id="env_1", episode=1, failure=failure, checks=checks)

    assert stored_failure(episode(None, None)) == "none"  # an old running episode
    assert stored_failure(episode(None, [{"status": "ok", "passed": False}])) == "none"
    assert stored_failure(episode(None, [{"status": "ok"}, {"status": "timeout"}])) == "verifier"
    assert stored_failure(episode(None, "not a list")) == "none"
    assert stored_failure(episode("infrastructure", None)) == "infrastructure"
    assert stored_failure(episode("garbage", None)) == "infrastructure"
    assert stored_step_failure("timeout", None) == "environment"
    assert stored_step_failure("crashed", {"observation_role": "tool"}) == "environment"
    assert stored_step_failure("ok", {"failure": "infrastructure"}) == "infrastructure"
    assert stored_step_failure("ok", {"failure": 5}) == "none"
    assert stored_step_failure("rejected", ["failure"]) == "agent"
