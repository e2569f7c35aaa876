"""``POST /v1/validate`` (``ValidateRequest`` -> ``ValidateResult``) and
``POST /v1/execute[/batch]`` (``ExecuteRequest`` -> ``ExecuteResult``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .common import NAME_PATTERN, PolicyName, Status, _Request
from .profile_limits import profile_value
from .scenarios import CheckOutcome

_NAME_CHAR = r"[^\x00-\x1f\x7f\\/]"
_COMPONENT = rf"(\.{{0,2}}[^\x00-\x1f\x7f\\/.]{_NAME_CHAR}*|\.{{3,}}{_NAME_CHAR}*)"
FILE_PATH_PATTERN = rf"^({_COMPONENT}/){{0,15}}{_COMPONENT}$"
"""A key of ``files``: a relative POSIX path of 1 to 16 components, none empty, ``.`` or
``..``, without control characters or backslashes. The sandbox runner's
``check_file_path`` enforces it (``tests/unit/api/test_openapi_agrees.py`` checks that
the two agree)."""

class SmokeCall(_Request):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    arguments: dict[str, Any] = Field(default_factory=dict)

class StatePair(_Request):
    initial_state: dict[str, Any] = Field(default_factory=dict)
    final_state: dict[str, Any] = Field(default_factory=dict)

class ValidateRequest(_Request):
    """``environment``: policy + load, instantiate, derive tools, smoke calls in a sandbox
    (``class_name`` required). ``check_function``: policy + run against ``cases`` in a
    sandbox (at least one case). ``snippet``: policy only. The OpenAPI document states
    the per-kind requirements as a ``oneOf`` (the service refuses them with 422)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"properties": {"kind": {"const": "environment"}, "class_name": {"type": "string"}},
         "required": ["class_name"]},
        {"properties": {"kind": {"const": "check_function"}, "cases": {"type": "array", "minItems": 1}},
         "required": ["cases"]},
        {"properties": {"kind": {"const": "snippet"}}},
    ]})

    kind: Literal["environment", "check_function", "snippet"]
    source_code: Annotated[str, Field(min_length=1)]
    class_name: Annotated[str | None, Field(pattern=NAME_PATTERN)] = None
    init_config: dict[str, Any] = Field(default_factory=dict)
    smoke_calls: list[SmokeCall] = Field(default_factory=list, max_length=64)
    cases: list[StatePair] = Field(default_factory=list, max_length=64)
    policy: PolicyName = "standard"

class SmokeResult(BaseModel):
    name: str
    status: Status
    observation: str
    state_diff: dict[str, Any] | None = None

class ValidateResult(BaseModel):
    kind: str
    verdict: Literal["valid", "invalid"]
    reasons: list[str]
    """Why the verdict is ``invalid`` (empty when valid)."""
    policy_report: dict[str, Any]
    tools: list[dict[str, Any]] | None = None
    instantiation: dict[str, Any] | None = None
    """``{"status", "observation"}`` of creating the instance with ``init_config``."""
    smoke: list[SmokeResult] = Field(default_factory=list)
    cases: list[CheckOutcome] = Field(default_factory=list)

class ExecuteRequest(_Request):
    code: Annotated[str, Field(min_length=1)]
    stdin: Annotated[str | None, Field(max_length=1024 * 1024)] = None
    timeout_s: Annotated[float | None, profile_value("call_timeout_s")] = None
    memory_mb: Annotated[int | None, profile_value("memory_mib")] = None
    files: dict[Annotated[str, Field(max_length=255)], Annotated[str, Field(max_length=1024 * 1024)]] = Field(
        default_factory=dict, max_length=64,
        json_schema_extra={"propertyNames": {"maxLength": 255, "pattern": FILE_PATH_PATTERN}})
    """``{relative path: text}`` written into the working directory first. A path's
    component may have at most 255 bytes in UTF-8, and a path may not lie under another
    (``a`` and ``a/b``): refused with 422 though the document's pattern cannot say so."""

class ExecuteBatchRequest(_Request):
    snippets: list[ExecuteRequest] = Field(min_length=1, max_length=64)
    concurrency: Annotated[int, Field(ge=1, le=16)] = 4

class ExecuteResult(BaseModel):
    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: float

class ExecuteBatchResult(BaseModel):
    results: list[ExecuteResult]
