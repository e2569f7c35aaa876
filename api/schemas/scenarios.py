"""``/v1/scenarios`` (EnvScaler ScenGenerator records): ``ScenarioCreate`` ->
``ScenarioPublic`` / ``ScenariosPublic``; a checklist item with its check function
(``CheckSpec``) and a check's outcome (``CheckOutcome``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from .common import Status, Timestamp, _Request

MAX_CHECKS = 4096
"""Checks of one checklist (``checklist``, ``checklist_with_func``, checks given to
``evaluate``). EnvScaler's release has scenarios of 445 checks; the sandbox runs at most
256 per job, so longer checklists are evaluated in consecutive jobs (same reward). Their
sources together may have at most the server's ``max_code_bytes`` (413) and the tenant's
(429), like an environment's source."""
MAX_CHECK_SOURCE_CHARS = 64 * 1024
"""Longest ``check_func`` source (characters; the sandbox's cap is 64 KiB of UTF-8)."""


class CheckSpec(_Request):
    """One checklist item with its check function (EnvScaler ``checklist_with_func``)."""

    check_item: Annotated[str, Field(max_length=4000)]
    check_func: Annotated[str, Field(min_length=1, max_length=MAX_CHECK_SOURCE_CHARS)]
    """Python source defining ``check_func(final_state) -> bool`` (``initial_state`` is a
    global). Refused (422 naming it) when it does not parse, fails the ``standard`` static
    policy, or binds no ``check_func`` at module level."""

class CheckOutcome(BaseModel):
    check_item: str
    passed: bool
    error: str | None = None
    """Why it did not pass (raised, returned a non-bool, timed out...)."""
    status: Status = "ok"
    duration_ms: float = 0.0

EpisodeProfile = Literal["sandpit", "envscaler"]
"""An episode rulebook: ``sandpit`` (a raising tool is an ``Error: Type: message``
observation and the episode goes on; calls are validated) or ``envscaler`` (EnvScaler's
RL environment byte for byte: its introduction, observation texts, termination and
reward rules)."""

CheckObjects = Literal["standins", "environment"]
"""How check functions see objects of the environment's own classes in a state:
``standins`` (the default: rebuilt as stand-ins carrying the same attributes; no
environment code runs in the process that computes a verdict) or ``environment`` (the
environment's module is loaded for the checks, so its classes' methods and ``isinstance``
work, and the environment's code takes part in the verdict)."""


class ScenarioCreate(_Request):
    environment_id: str
    task: Annotated[str, Field(max_length=100_000)]
    init_config: dict[str, Any] = Field(default_factory=dict)
    checklist: list[Annotated[str, Field(max_length=4000)]] = Field(default_factory=list, max_length=MAX_CHECKS)
    checklist_with_func: list[CheckSpec] = Field(default_factory=list, max_length=MAX_CHECKS)
    """At most :data:`MAX_CHECKS`; evaluated in sandbox jobs of 256 (same reward)."""
    external_id: Annotated[str | None, Field(max_length=200)] = None
    episode_profile: EpisodeProfile = "sandpit"
    """The rulebook of episodes of this scenario unless a create/reset names one."""
    check_objects: CheckObjects = "standins"
    """How its checks see objects of the environment's classes (:data:`CheckObjects`)."""

class ScenarioPublic(BaseModel):
    id: str
    environment_id: str
    task: str
    init_config: dict[str, Any]
    checklist: list[str]
    checklist_with_func: list[dict[str, Any]]
    external_id: str | None
    episode_profile: EpisodeProfile = "sandpit"
    check_objects: CheckObjects = "standins"
    created_at: Timestamp

    @field_validator("episode_profile", mode="before")
    @classmethod
    def _profile_default(cls, value: object) -> object:
        return "sandpit" if value is None else value

    @field_validator("check_objects", mode="before")
    @classmethod
    def _objects_default(cls, value: object) -> object:
        return "standins" if value is None else value

class ScenariosPublic(BaseModel):
    data: list[ScenarioPublic]
    count: int
