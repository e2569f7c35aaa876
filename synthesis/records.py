"""Typed inputs and outputs of the stages (JSON in the run directory).

Field names follow EnvScaler's files (``environment_summary``, ``state_space_definition``,
``constraints_rules``, ``operation_list``, ``env_class_name``, ``env_class_code``,
``tools``, ``init_config``, ``checklist_with_func``...), so a stage output reads like the
corresponding EnvScaler ``temp_result`` file.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Rejected(Exception):
    """An item is dropped for good (the model's fault or the code's): ``reason`` is a short
    category for the final table, ``detail`` the specifics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class SeedTask(_Record):
    """One line of the seed file (``{"task": ..., "task_id"?: ...}``)."""

    task_id: str
    task: str


class Rejection(_Record):
    """A dropped item in a stage output."""

    key: str
    reason: str
    detail: str = ""


class ItemError(_Record):
    """An item a stage could not finish (model endpoint or API unavailable): the stage is
    ``partial`` and a rerun resumes it."""

    key: str
    error: str


class EnvDescription(_Record):
    """SkelBuilder stage 1 output (EnvScaler ``env_description.json`` item)."""

    env_id: str
    task_id: str
    task: str
    environment_summary: str
    environment_introduction: str
    usefulness: int | None = None
    modelability: int | None = None


class Operation(_Record):
    """One tool of an environment (EnvScaler ``operation_list`` item)."""

    operation_name: str
    operation_type: Literal["query", "modify"]
    description: str = ""
    code: str = ""


class EnvCandidate(_Record):
    """SkelBuilder stage 2 output: the assembled class, statically checked and with its
    tools derived through ``POST /v1/validate`` (EnvScaler ``env_with_code.json`` item)."""

    env_id: str
    task: str
    environment_summary: str
    environment_introduction: str
    state_space_definition: list[dict[str, Any]]
    constraints_rules: list[str]
    env_class_name: str
    env_class_def: str
    operation_list: list[Operation]
    env_class_code: str
    tools: list[dict[str, Any]]
    policy_findings: list[dict[str, Any]] = Field(default_factory=list)
    """Warnings of the static policy (errors reject the candidate)."""


class CallCase(_Record):
    """One judged tool call of the dual-agent quality check (EnvScaler stage 3 case)."""

    step: int
    function: str
    case_type: Literal["positive", "negative"]
    thought: str = ""
    parameters: Any = None
    status: str
    observation: str
    state_diff: dict[str, Any] | None = None
    result: Literal["pass", "warning", "fail"]
    check_reason: str = ""


class QualityReport(_Record):
    """SkelBuilder stage 3 output for one environment (EnvScaler ``func_test_result``)."""

    env_id: str
    init_config_list: list[dict[str, Any]]
    cases: list[CallCase]
    total_count: int
    pass_count: int
    warning_count: int
    fail_count: int
    pass_acc: float
    """pass / total (0.0 with no case)."""
    not_fail_acc: float
    """(pass + warning) / total (0.0 with no case)."""
    kept: bool


class CheckRecord(_Record):
    """One checklist item with its check function and how its validation went."""

    check_item: str
    expects_change: bool = False
    check_func: str | None = None
    valid: bool = False
    attempts: int = 0
    flags: list[str] = Field(default_factory=list)
    """``true_on_initial_state``: an ``expects_change`` check already passes before any step."""
    errors: list[str] = Field(default_factory=list)


class ScenarioDraft(_Record):
    """ScenGenerator output for one scenario, before conversion to EnvScaler's format."""

    env_id: str
    task_id: str
    task: str
    init_config: dict[str, Any]
    checks: list[CheckRecord]

    def envscaler(self, env_class_name: str) -> dict[str, Any]:
        """EnvScaler's scenario record: only valid check functions in ``checklist_with_func``."""
        valid = [c for c in self.checks if c.valid and c.check_func]
        record: dict[str, Any] = {
            "env_id": self.env_id, "env_class_name": env_class_name, "task_id": self.task_id, "task": self.task,
            "init_config": self.init_config, "checklist": [c.check_item for c in self.checks],
            "checklist_with_func": [{"check_item": c.check_item, "check_func": c.check_func} for c in valid]}
        flags = sorted({f"{c.check_item}: {f}" for c in valid for f in c.flags})
        if flags:
            record["flags"] = flags
        return record


class StageOutput(BaseModel):
    """What every stage writes: finished items, rejections, unfinished items."""

    items: list[dict[str, Any]] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    errors: list[ItemError] = Field(default_factory=list)
