"""``/v1/scenarios`` (EnvScaler ScenGenerator records): ``ScenarioCreate`` ->
``ScenarioPublic`` / ``ScenariosPublic``; a checklist item with its check function
(``CheckSpec``) and a check's outcome (``CheckOutcome``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from .common import Status, Timestamp, _Request


class CheckSpec(_Request):
    """One checklist item with its check function (EnvScaler ``checklist_with_func``)."""

    check_item: Annotated[str, Field(max_length=4000)]
    check_func: Annotated[str, Field(min_length=1, max_length=64 * 1024)]
    """Python source defining ``check_func(final_state) -> bool`` (``initial_state`` is a global)."""

class CheckOutcome(BaseModel):
    check_item: str
    passed: bool
    error: str | None = None
    """Why it did not pass (raised, returned a non-bool, timed out...)."""
    status: Status = "ok"
    duration_ms: float = 0.0

class ScenarioCreate(_Request):
    environment_id: str
    task: Annotated[str, Field(max_length=100_000)]
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[Annotated[str, Field(max_length=4000)]] = Field(default_factory=list, max_length=256)
    checklist_with_func: list[CheckSpec] = Field(default_factory=list, max_length=256)
    external_id: Annotated[str | None, Field(max_length=200)] = None

class ScenarioPublic(BaseModel):
    id: str
    environment_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[str]
    checklist_with_func: list[dict[str, Any]]
    external_id: str | None
    created_at: Timestamp

class ScenariosPublic(BaseModel):
    data: list[ScenarioPublic]
    count: int
