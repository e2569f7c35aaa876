"""``/v1/environments``: ``EnvironmentCreate`` -> ``EnvironmentPublic`` /
``EnvironmentsPublic(data, count)``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from .common import NAME_PATTERN, ArgumentChecking, Timestamp, _Request


class EnvironmentCreate(_Request):
    """Register environment code. Its tools are derived inside a sandbox, and the class
    is instantiated there once (with ``sample_init_config``) so an ``__init__`` that fails
    is refused at registration."""

    name: Annotated[str | None, Field(max_length=200)] = None
    source_code: Annotated[str, Field(min_length=1)]
    """Python module source defining ``class_name`` (size cap: ``SANDPIT_MAX_CODE_BYTES``)."""
    class_name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: Annotated[str | None, Field(max_length=20000)] = None
    introduction: Annotated[str | None, Field(max_length=100_000)] = None
    """EnvScaler ``environment_introduction``: shown to the agent at the start of each episode."""
    rules: Annotated[list[Annotated[str, Field(max_length=4000)]] | None, Field(max_length=256)] = None
    """EnvScaler ``constraints_rules``: listed after the introduction."""
    policy: Literal["strict", "standard", "audit"] = "standard"
    """Static policy: ``standard`` rejects errors and reports warnings (see /v1/validate)."""
    argument_checking: ArgumentChecking = "off"
    """Default for this environment's envs: ``off`` (arguments go to the method as given:
    Python decides, EnvScaler's behaviour), ``warn`` (a call that does not fit the
    derived schema still runs; the step carries ``argument_findings``) or ``strict`` (it
    is recorded as a ``rejected`` step and does not run)."""
    sample_init_config: dict[str, Any] | None = None
    """``init_config`` for the one instantiation at registration (``{}`` when omitted;
    the instance is discarded). Its failure is a 422 naming ``sample_init_config``."""

class EnvironmentPublic(BaseModel):
    id: str
    name: str | None
    class_name: str
    code_sha256: str
    tools: list[dict[str, Any]]
    """OpenAI function-calling schemas (EnvScaler-compatible), derived in a sandbox."""
    description: str | None
    introduction: str | None = None
    rules: list[str] | None = None
    policy: str = "standard"
    policy_report: dict[str, Any] | None = None
    """The static policy report: ``passed``, ``counts`` by severity, every finding (rule,
    severity, line, column, message)."""
    argument_checking: ArgumentChecking = "off"
    created_at: Timestamp

class EnvironmentsPublic(BaseModel):
    data: list[EnvironmentPublic]
    count: int
    """Total matching objects (not just this page)."""
