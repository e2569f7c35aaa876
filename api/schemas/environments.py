"""``/v1/environments``: ``EnvironmentCreate`` (with ``DeclaredTool``) ->
``EnvironmentPublic`` (with ``ToolDifference``) / ``EnvironmentsPublic(data, count)``."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
from jsonschema.validators import Draft202012Validator
from pydantic import BaseModel, Field, field_validator, model_validator

from .common import NAME_PATTERN, ArgumentChecking, Timestamp, _Request

MAX_DECLARED_TOOLS = 512
"""Most declared tools of one environment (as many as the sandbox derives at most)."""
MAX_DECLARED_TOOLS_BYTES = 4 * 1024 * 1024
"""Most bytes of all declared tools together (compact JSON; the derived tools' cap)."""
MAX_TOOL_DESCRIPTION_CHARS = 16_000
"""Longest declared tool description (EnvScaler's are whole docstrings)."""
MAX_TOOL_PARAMETERS_BYTES = 64 * 1024
"""Most bytes of one declared tool's ``parameters`` schema (compact JSON)."""
MAX_TOOL_PARAMETERS = 128
"""Most parameters (``properties``) of one declared tool (the sandbox's derivation cap)."""
TOOL_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
"""A declared tool's name: an ASCII identifier of at most 64 characters, not private."""


def _compact_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


class DeclaredFunction(_Request):
    """The ``function`` of a declared tool: OpenAI's function object."""

    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    """The method the tool calls: an ASCII identifier of at most 64 characters that does
    not start with ``_`` (private names are not tools)."""
    description: Annotated[str | None, Field(max_length=MAX_TOOL_DESCRIPTION_CHARS)] = None
    """What the agent is told the tool does."""
    parameters: Annotated[dict[str, Any] | None, Field(json_schema_extra={  # what _json_schema_object states
        "required": ["type"], "properties": {"type": {"const": "object"},
                                             "properties": {"maxProperties": MAX_TOOL_PARAMETERS}}})] = None
    """A JSON Schema (draft 2020-12) of ``"type": "object"`` describing the keyword
    arguments: at most ``MAX_TOOL_PARAMETERS`` properties and ``MAX_TOOL_PARAMETERS_BYTES``
    bytes. Omitted: the agent is told of no parameters."""
    strict: bool | None = None
    """OpenAI's structured-outputs flag, passed through to the agent as given."""

    @field_validator("parameters")
    @classmethod
    def _json_schema_object(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if _compact_size(value) > MAX_TOOL_PARAMETERS_BYTES:
            raise ValueError(f"over {MAX_TOOL_PARAMETERS_BYTES} bytes")
        if value.get("type") != "object":
            raise ValueError('must be a JSON Schema with "type": "object" (the keyword arguments)')
        properties = value.get("properties", {})
        if isinstance(properties, dict) and len(properties) > MAX_TOOL_PARAMETERS:
            raise ValueError(f"{len(properties)} properties; at most {MAX_TOOL_PARAMETERS}")
        try:
            Draft202012Validator.check_schema(value)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            raise ValueError(f"not a JSON Schema: {exc.message[:300]}" + (f" (at {where})" if where else "")) from None
        except RecursionError:
            raise ValueError("not a JSON Schema: nested too deeply") from None
        return value


class DeclaredTool(_Request):
    """One declared tool: an OpenAI function-calling schema ``{"type": "function",
    "function": {"name", "description", "parameters"}}``. The bare function object
    ``{"name", "description", "parameters"}`` (and the flat ``{"type": "function",
    "name", ...}``) is accepted too and stored wrapped."""

    type: Literal["function"] = "function"
    function: DeclaredFunction

    @model_validator(mode="before")
    @classmethod
    def _wrap_bare(cls, value: Any) -> Any:
        if isinstance(value, dict) and "function" not in value and "name" in value:
            if "type" not in value:
                return {"type": "function", "function": value}
            if value["type"] == "function":
                return {"type": "function", "function": {k: v for k, v in value.items() if k != "type"}}
        return value


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
    tools: list[DeclaredTool] | None = None
    """Declared tools (e.g. an EnvScaler release's own ``tools``): what the agent is shown
    instead of the schemas derived from the class. At most ``MAX_DECLARED_TOOLS`` tools,
    ``MAX_DECLARED_TOOLS_BYTES`` in all, names unique. Each must name an attribute of the
    instance that is callable (EnvScaler's validity is ``hasattr``), else a 422 naming
    ``tools.<i>``; public methods not declared are listed as warnings in
    ``tool_differences``. A JSON list, never JSON text."""

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_count(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_DECLARED_TOOLS:
            raise ValueError(f"{len(value)} tools; at most {MAX_DECLARED_TOOLS}")
        return value

    @field_validator("tools")
    @classmethod
    def _tools_unique(cls, value: list[DeclaredTool] | None) -> list[DeclaredTool] | None:
        if value is None:
            return None
        seen: dict[str, int] = {}
        for index, tool in enumerate(value):
            first = seen.setdefault(tool.function.name, index)
            if first != index:
                raise ValueError(f"tools.{index}: {tool.function.name!r} is declared twice (also tools.{first})")
        size = _compact_size([t.function.model_dump(exclude_unset=True) for t in value])
        if size > MAX_DECLARED_TOOLS_BYTES:
            raise ValueError(f"{size} bytes of tools; at most {MAX_DECLARED_TOOLS_BYTES}")
        return value

    def declared_tools(self) -> list[dict[str, Any]] | None:
        """``tools`` as stored and shown: each wrapped, with the keys it was given."""
        if self.tools is None:
            return None
        return [{"type": "function", "function": t.function.model_dump(exclude_unset=True)} for t in self.tools]

ToolDifferenceKind = Literal["undeclared", "not_a_method", "description", "required", "type",
                             "parameter_missing", "parameter_extra", "truncated"]


class ToolDifference(BaseModel):
    """One way a declared tool differs from what the class offers (computed at
    registration on the host by comparing the two JSON schemas; no code runs)."""

    tool: str
    """The tool's name."""
    kind: ToolDifferenceKind
    """``undeclared``: a public method of the class that is not declared (the agent is not
    shown it); ``not_a_method``: declared, callable on the instance, but not a public
    method (Sandpit's own tool check refuses calls to it; EnvScaler's ``hasattr`` allows
    them); ``description``; ``required`` (of ``parameter``); ``type`` (of ``parameter``);
    ``parameter_missing`` (the method takes it, the declaration does not say);
    ``parameter_extra`` (declared, the method does not take it); ``truncated`` (more
    differences than are kept)."""
    severity: Literal["warning", "info"]
    """``warning`` for ``undeclared``, ``not_a_method`` and ``parameter_extra`` (calls
    the agent is led to make, or not, differ from what runs); ``info`` otherwise."""
    parameter: str | None = None
    declared: Any = None
    """The declared value (a description cut to 500 characters, ``true``/``false`` for
    ``required``, the JSON Schema type(s) for ``type``)."""
    derived: Any = None
    """The value derived from the class, in the same terms."""


class EnvironmentPublic(BaseModel):
    id: str
    name: str | None
    class_name: str
    code_sha256: str
    tools: list[dict[str, Any]]
    """What the agent is shown (OpenAI function-calling schemas): the declared tools when
    the environment was registered with ``tools``, else the derived ones."""
    derived_tools: list[dict[str, Any]] = Field(default_factory=list)
    """The schemas derived from the class in a sandbox (always; what argument checking
    compares calls with)."""
    tools_source: Literal["declared", "derived"] = "derived"
    """Whether ``tools`` are the declared tools or the derived ones."""
    tool_differences: list[ToolDifference] = Field(default_factory=list)
    """Where the declared tools differ from the class (empty without declared tools)."""
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
