"""What a step did: the record of one action before it is committed (:class:`StepRun`),
the committed step (:class:`StepOutcome`) and how it is shown (``StepResult``'s
document, as JSON bytes built without a model round trip) and stored
(:func:`step_info`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from ..sandboxes import CallResult
from ..schemas.common import Status
from ..schemas.envs import StepResult
from ..schemas.scenarios import CheckOutcome
from ..services.common import clean_text
from ..services.diff import state_diff
from .failures import Failure, masked


@dataclass
class StepRun:
    """What one action did (before it is committed): the step's record."""

    status: Status
    observation: str
    role: Literal["tool", "user"] = "tool"
    """EnvScaler's observation type: ``tool`` or ``user``."""
    duration_ms: float = 0.0
    result: CallResult | None = None
    """The sandbox's result, when a tool ran."""
    error: str | None = None
    findings: list[str] | None = None
    terminated: bool = False
    end_reason: str | None = None
    """``action``, ``user`` or ``tool_error`` when ``terminated``."""
    user_messages: list[dict[str, Any]] | None = None
    action: dict[str, Any] | None = None
    """The action to record when the profile parsed it differently from the request's
    Sandpit parse (``envscaler``); None: the parsed action's own record."""


@dataclass
class StepOutcome:
    """What :meth:`~.steps.Steps.step` returns: the committed step, and the parts of its
    reply that ``?include=`` asked for (``wanted``: ``state``, ``state_diff``)."""

    env_id: str
    episode: int
    step: int
    action: dict[str, Any]
    run: StepRun
    recovered: bool
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    checks: list[CheckOutcome] | None = None
    state_before: dict[str, Any] | None = None
    state_after: dict[str, Any] | None = None
    wanted: frozenset[str] = frozenset()
    failure: Failure = "none"
    """The step's failure (:func:`~.failures.step_failure`)."""
    episode_failure: Failure = "none"
    """The episode's failure with this step (:func:`~.failures.episode_failure`)."""
    rendered: bytes | None = None
    """The reply's bytes once rendered (:meth:`json` returns them as they are)."""

    @property
    def result(self) -> CallResult:
        """The step as an executor result (rejected and non-tool steps included)."""
        run = self.run
        if run.result is not None:
            return run.result
        return CallResult(status=run.status, observation=run.observation,
                          duration_ms=run.duration_ms)

    def diff(self) -> dict[str, Any] | None:
        """EnvScaler ``get_state_diff`` of the step (when both states were asked for)."""
        if self.state_before is None or self.state_after is None:
            return None
        return state_diff(self.state_before, self.state_after)

    def document(self) -> dict[str, Any]:
        """The step as the API shows it (:class:`StepResult`'s fields, in its order), with
        the ``?include=`` parts in ``wanted``: plain JSON data."""
        run, r, wanted = self.run, self.result, self.wanted
        return {"env_id": self.env_id, "episode": self.episode, "step": self.step, "action": self.action,
                "observation": run.observation, "status": run.status, "observation_role": run.role,
                "reward": float(self.reward), "terminated": self.terminated, "truncated": self.truncated,
                "duration_ms": float(run.duration_ms), "stdout": clean_text(r.stdout), "stderr": clean_text(r.stderr),
                "traceback": clean_text(r.traceback) if r.traceback else None, "error": run.error,
                "argument_findings": run.findings,
                "checks": [c.model_dump() for c in self.checks] if self.checks is not None else None,
                "recovered": self.recovered, "failure": self.failure, "mask": masked(self.failure),
                "episode_failure": self.episode_failure, "episode_mask": masked(self.episode_failure),
                "state_diff": self.diff() if "state_diff" in wanted else None,
                "state": self.state_after if "state" in wanted else None}

    def public(self) -> StepResult:
        """The step as the API shows it (:meth:`document` as the response model)."""
        return StepResult.model_validate(self.document())

    def json(self) -> bytes:
        """:meth:`public` as JSON bytes (orjson, without a model round trip; a value
        orjson refuses, such as an integer beyond 64 bits in a state, goes through the
        pydantic model instead). Rendered once: later calls return the same bytes."""
        if self.rendered is not None:
            return self.rendered
        document = self.document()
        try:
            self.rendered = orjson.dumps(document)
        except TypeError:
            self.rendered = StepResult.model_validate(document).model_dump_json().encode("utf-8")
        return self.rendered


def step_info(run: StepRun, failure: Failure = "none") -> dict[str, Any]:
    """The ``info`` stored with a step: its observation role, what explains it, its
    ``failure`` when it is not ``none``, and what that verdict rests on (``cpu_ms`` and
    ``wait_ms`` of a timed-out call, ``sandbox_lost``)."""
    info: dict[str, Any] = {"observation_role": run.role}
    if failure != "none":
        info["failure"] = failure
    if run.error:
        info["error"] = run.error[:2000]
    if run.findings:
        info["argument_findings"] = run.findings
    result = run.result
    if result is not None:
        if result.traceback:
            info["traceback"] = clean_text(result.traceback)
        if result.observation_truncated:
            info["observation_truncated"] = True
        if result.cpu_ms is not None and result.wait_ms is not None:  # what a timeout's verdict rests on
            info["cpu_ms"], info["wait_ms"] = round(result.cpu_ms, 3), round(result.wait_ms, 3)
        if result.sandbox_lost:
            info["sandbox_lost"] = True
    if run.end_reason:
        info["end_reason"] = run.end_reason
    return info
