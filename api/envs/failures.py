"""The failure taxonomy: who a step's, an episode's or an evaluation episode's outcome is
to blame on, and whether a trainer should keep it in the gradient.

Every step result and every episode carries ``failure`` (:data:`Failure`) and ``mask``.
The verdict is the platform's: it is computed on the host from the step's status and
what the executor measured (:class:`~sandpit.executor.results.CallResult`'s
``sandbox_lost`` and ``starved``), never from anything the environment code returns,
prints or raises. :func:`step_failure` is the one table; :func:`episode_failure` folds
steps and checks into an episode's verdict; :func:`error_status_failure` maps the
``error_status`` of an evaluation episode that could not be scored. The same table is in
docs/failures.md.

The functions are pure and cheap (no I/O): the step path calls :func:`step_failure` once
per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

Failure = Literal["none", "agent", "environment", "infrastructure", "verifier"]
FAILURES: tuple[Failure, ...] = ("none", "agent", "environment", "infrastructure", "verifier")

PRECEDENCE: dict[Failure, int] = {"none": 0, "agent": 1, "environment": 2, "verifier": 3, "infrastructure": 4}
"""An episode's failure is its worst part's: infrastructure > verifier > environment >
agent > none. Infrastructure ranks first because it can have corrupted everything after
it (the state the policy saw, the checks' final state); a verifier failure makes the
reward itself wrong; an environment failure is the environment's own behaviour."""

MASKED: frozenset[Failure] = frozenset({"infrastructure", "verifier"})
"""Failures whose reward does not reflect the policy: ``mask`` is True for them."""

ERROR_STATUS_FAILURES: dict[str, Failure] = {
    "model_error": "agent",
    "model_unavailable": "infrastructure",
    "no_capacity": "infrastructure",
    "unavailable": "infrastructure",
    "env_error": "environment",
    "env_lost": "infrastructure",
    "check_error": "verifier",
    "scenario_not_found": "infrastructure",
    "secret_unavailable": "infrastructure",
    "internal": "infrastructure",
}
"""An evaluation episode's ``error_status`` -> its failure (:func:`error_status_failure`)."""


def step_failure(status: str, *, sandbox_lost: bool = False, starved: bool = False,
                 recovered: bool = False) -> Failure:
    """The failure of one step, from its ``status`` and what the platform measured.

    ================  ===========================================================  ==================
    status            case                                                         failure
    ================  ===========================================================  ==================
    any               ``recovered``: the env was re-opened in a new sandbox after   infrastructure
                      its sandbox was lost (found dead, or the executor re-opened
                      it)
    ``ok``            (and ``chat_with_user``, the termination action)             none
    ``rejected``      malformed action, unknown tool, arguments refused            agent
    ``error``         the tool raised                                              environment
    ``timeout``       ``sandbox_lost``: the host's watchdog gave up on a sandbox    infrastructure
                      whose runner stopped answering
    ``timeout``       ``starved``: the call's process waited for a CPU its quota    infrastructure
                      allowed (host or sandbox overloaded), see
                      :func:`~sandpit.executor.results.starved`
    ``timeout``       otherwise: the runner's ``call_timeout_s`` stopped            environment
                      environment code that computed, slept or blocked
    ``oom``           the session's memory limit (or the container's)              environment
    ``crashed``       ``sandbox_lost``: the container died or was killed from       infrastructure
                      outside, the engine restarted
    ``crashed``       ``starved``: a new session process did not start within      infrastructure
                      ``session_startup_s`` (before any environment code ran)
    ``crashed``       otherwise: the session's process died (``os._exit``, a        environment
                      signal, a broken protocol, a state that cannot be restored)
    anything else     an unknown status                                            infrastructure
    ================  ===========================================================  ==================

    ``mask`` (:func:`masked`) is True for ``infrastructure`` and ``verifier``. Never
    raises."""
    if recovered:
        return "infrastructure"
    if status == "ok":
        return "none"
    if status == "rejected":
        return "agent"
    if status in ("error", "oom"):
        return "environment"
    if status in ("timeout", "crashed"):
        return "infrastructure" if sandbox_lost or starved else "environment"
    return "infrastructure"


def check_failure(status: str) -> Failure:
    """The failure a check function's outcome adds to its episode: ``none`` for a check
    that ran and returned a bool (passed or not), ``verifier`` for any other status (it
    raised or returned a non-bool: ``error``; ``timeout``; ``oom``; ``crashed``; it does
    not compile: ``rejected``)."""
    return "none" if status == "ok" else "verifier"


def worst(failures: Iterable[str]) -> Failure:
    """The highest-ranked of ``failures`` (:data:`PRECEDENCE`; ``none`` for none). A value
    that is no :data:`Failure` (a corrupt stored record) counts as ``infrastructure``."""
    found: Failure = "none"
    for failure in failures:
        known: Failure = failure if failure in PRECEDENCE else "infrastructure"
        if PRECEDENCE[known] > PRECEDENCE[found]:
            found = known
    return found


def episode_failure(step_failures: Iterable[str], check_statuses: Iterable[str] = ()) -> Failure:
    """An episode's failure: the worst (:data:`PRECEDENCE`) of its steps' failures and of
    its checks' (:func:`check_failure` of each check's ``status``)."""
    return worst([*step_failures, *(check_failure(s) for s in check_statuses)])


def error_status_failure(error_status: str | None) -> Failure:
    """The failure of an evaluation episode that ended with ``error_status``
    (:data:`ERROR_STATUS_FAILURES`; an unknown or missing one is ``infrastructure``: the
    platform could not score it)."""
    return ERROR_STATUS_FAILURES.get(error_status or "", "infrastructure")


def evaluation_failure(status: str, error_status: str | None, trajectory: object, checks: object) -> Failure:
    """An evaluation episode's failure: :func:`error_status_failure` when it ended with
    ``status`` ``error``; otherwise :func:`episode_failure` of its trajectory's steps (each
    entry's recorded ``failure``, else :func:`step_failure` of its ``status``) and its
    checks' statuses; ``none`` for an episode not finished (pending, running, cancelled).
    ``trajectory`` and ``checks`` are the stored JSON lists (anything else counts as
    empty). Never raises."""
    if status == "error":
        return error_status_failure(error_status)
    if status != "done":
        return "none"
    steps = [s for s in trajectory if isinstance(s, dict)] if isinstance(trajectory, list) else []
    outcomes = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
    return episode_failure([str(s["failure"]) if isinstance(s.get("failure"), str) else step_failure(str(s.get("status")))
                            for s in steps], [str(c.get("status", "ok")) for c in outcomes])


def masked(failure: str) -> bool:
    """``mask`` advice: True when the reward of a sample with ``failure`` does not reflect
    the policy (:data:`MASKED`: infrastructure, verifier), so a trainer drops it from the
    gradient."""
    return failure in MASKED
