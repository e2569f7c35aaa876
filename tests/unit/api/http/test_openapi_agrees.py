"""The OpenAPI document is exactly as strict as the server (issue 24, item 6): a request
the document allows is never refused for its shape, and one it refuses is refused.

Each rule is checked where it lives, against the served document (``create_app(...).openapi()``)
read with a JSON Schema validator: the ``oneOf`` of a request model against the model's
own validator over every combination of the fields involved (absent, null, a value); the
patterns against the code that enforces them (``check_base_url``, the runner's
``check_file_path``, the tenant id check, the ``include`` lists); ``QuotaOverrides``
against the tenant service's quota check; integral floats (``2.0``) as JSON Schema's
``integer``. The fuzz test (``tests/integration/api/test_api_fuzz.py``) checks the same
over HTTP with generated requests."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema.validators import Draft202012Validator
from pydantic import BaseModel, ValidationError
from sandpit.api.app import create_app
from sandpit.api.db.database import Database
from sandpit.api.envs.rulebook import EpisodeConfig
from sandpit.api.envs.steps import INCLUDES
from sandpit.api.errors import InvalidRequest
from sandpit.api.schemas.common import BASE_URL_PATTERN, list_pattern
from sandpit.api.schemas.environments import MAX_TOOL_PARAMETERS, DeclaredFunction
from sandpit.api.schemas.envs import (
    EnvCreate,
    EpisodeOptions,
    ForkRequest,
    RestoreRequest,
    StepRequest,
    UserSimulator,
)
from sandpit.api.schemas.evaluations import RESULT_INCLUDES, EvaluationCreate, check_base_url
from sandpit.api.schemas.tenants import TENANT_ID_PATTERN, TenantCreate
from sandpit.api.schemas.validation import FILE_PATH_PATTERN, ExecuteRequest, ValidateRequest
from sandpit.api.services.tenants import TENANT_ID, TenantService
from sandpit.api.settings import ApiSettings
from sandpit.executor.settings import ExecutorSettings
from sandpit.sandbox_images.runner.limits import MAX_NAME_BYTES, check_file_path

ABSENT = object()


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app(ApiSettings(max_fork_count=48), ExecutorSettings()).openapi()


def validator(spec: dict[str, Any], component: str) -> Draft202012Validator:
    """A validator of ``component`` whose ``$ref`` s resolve in the document."""
    return Draft202012Validator({"$ref": f"#/components/schemas/{component}", "components": spec["components"]})


def accepts(model: type[BaseModel], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


def combinations(fields: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every body made of ``fields``: each absent, or one of its values."""
    names = list(fields)
    bodies = []
    for values in itertools.product(*([ABSENT, *fields[name]] for name in names)):
        bodies.append({name: value for name, value in zip(names, values, strict=True) if value is not ABSENT})
    return bodies


ONE_OF_CASES = [
    ("StepRequest", StepRequest, {"name": ["bump", None], "arguments": [{"by": 1}, None],
                                  "function": [{"name": "bump", "arguments": "{}"}, None], "text": ["hi", None]}),
    ("EnvCreate", EnvCreate, {"environment_id": ["e1", None], "source_code": ["class A: pass", None],
                              "scenario_id": ["s1", None], "class_name": ["A", None]}),
    ("EpisodeOptions", EpisodeOptions, {"mode": ["non_conversational", "conversational"],
                                        "user": [{"model": "m"}, None]}),
    ("EvaluationCreate", EvaluationCreate, {
        "mode": ["replay", "rollout"], "episodes": [[{"scenario_id": "s1", "tool_calls": []}], None],
        "scenario_ids": [["s1"], None], "model": ["m", None], "base_url": ["http://127.0.0.1:9/v1", None],
        "api_key": ["k", None]}),
]


@pytest.mark.parametrize("component, model, fields", ONE_OF_CASES, ids=[c[0] for c in ONE_OF_CASES])
def test_one_of_is_the_model_validator(spec: dict[str, Any], component: str, model: type[BaseModel],
                                       fields: dict[str, list[Any]]) -> None:
    schema = validator(spec, component)
    bodies = combinations(fields)
    disagree = [body for body in bodies if schema.is_valid(body) != accepts(model, body)]
    assert not disagree, disagree[:5]
    assert any(schema.is_valid(body) for body in bodies) and not all(schema.is_valid(body) for body in bodies)


def test_episode_profiles_fix_what_the_service_says(spec: dict[str, Any]) -> None:
    """``EpisodeConfig.from_options``: options that name the ``envscaler`` profile may not
    contradict what it fixes (``on_tool_error``, ``termination_action``); a profile that
    comes from the scenario is a refusal the fuzz test lists as semantic."""
    schema = validator(spec, "EpisodeOptions")
    for body in combinations({"profile": ["sandpit", "envscaler", None], "on_tool_error": ["continue", "terminate"],
                              "termination_action": ["chat_with_user", "finish"]}):
        try:
            options = EpisodeOptions.model_validate(body)
            EpisodeConfig.from_options(options, None, options.profile or "sandpit")
            server = True
        except InvalidRequest:
            server = False
        assert schema.is_valid(body) == server, body


def test_integer_bounds_are_served_exactly(spec: dict[str, Any]) -> None:
    """FastAPI keeps bounds as floats; the document gets the models' integers back (a
    seed of 2**64 - 1 was served as at most 2**64)."""
    for component in ("EnvCreate", "ResetRequest"):
        bound = spec["components"]["schemas"][component]["properties"]["seed"]["anyOf"][0]["maximum"]
        assert type(bound) is int and bound == 2**64 - 1
    assert not validator(spec, "EnvCreate").is_valid({"scenario_id": "s", "seed": 2**64})


def test_validate_kinds_are_what_the_service_needs(spec: dict[str, Any]) -> None:
    """``ExecutionService.validate``: ``class_name`` for an environment, a case for a
    check function (422 otherwise); a snippet needs neither."""
    schema = validator(spec, "ValidateRequest")
    case = {"initial_state": {}, "final_state": {}}
    for body in combinations({"kind": ["environment", "check_function", "snippet"], "class_name": ["A", None],
                              "cases": [[], [case]]}):
        if "kind" not in body:
            continue
        body["source_code"] = "x = 1"
        needed = {"environment": body.get("class_name") is not None,
                  "check_function": bool(body.get("cases")), "snippet": True}[body["kind"]]
        assert schema.is_valid(body) == (needed and accepts(ValidateRequest, body)), body


@pytest.mark.parametrize("model, body", [
    (ForkRequest, {"step": 2.0, "count": 1.0}), (RestoreRequest, {"step": 0.0}), (RestoreRequest, {"step": 3e2}),
    (ExecuteRequest, {"code": "print(1)", "memory_mb": 64.0}),
    (EvaluationCreate, {"mode": "rollout", "scenario_ids": ["s"], "model": "m", "max_steps": 5.0}),
])
def test_integral_floats_are_integers(spec: dict[str, Any], model: type[BaseModel], body: dict[str, Any]) -> None:
    """JSON Schema's ``integer`` holds ``2.0``: the server takes it as 2."""
    assert validator(spec, model.__name__).is_valid(body)
    parsed = model.model_validate(body)
    assert all(type(getattr(parsed, name)) is int for name, value in body.items() if type(value) is float)


@pytest.mark.parametrize("value", [2.5, "2", True, float("inf"), float("nan"), [2], None])
def test_other_values_of_integer_fields_stay_refused(spec: dict[str, Any], value: Any) -> None:
    body = {"step": 0, "count": value}
    assert not accepts(ForkRequest, body)
    if value == value and value not in (float("inf"),):  # JSON has neither NaN nor infinities
        assert not validator(spec, "ForkRequest").is_valid(body)


def test_service_limits_are_in_the_document(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    assert schemas["ForkRequest"]["properties"]["count"]["maximum"] == 48
    default = ExecutorSettings().profiles[ExecutorSettings().default_profile]
    profile = schemas["ProfileRequest"]["properties"]
    assert profile["memory_mib"]["anyOf"][0]["maximum"] == default.memory_mib
    assert profile["cpus"]["anyOf"][0]["maximum"] == default.cpus
    execute = schemas["ExecuteRequest"]["properties"]
    assert execute["timeout_s"]["anyOf"][0]["maximum"] == default.call_timeout_s
    for component, field in (("ValidateRequest", "source_code"), ("ExecuteRequest", "code"),
                             ("EnvCreate", "source_code"), ("EnvironmentCreate", "source_code")):
        assert not validator(spec, component).is_valid(
            {"kind": "snippet", "code": "x\x00", "source_code": "x\x00", "class_name": "A", "name": "n"}), component
        assert schemas[component]["properties"][field]["pattern"] == r"^[^\x00]*$"


# -- patterns ---------------------------------------------------------------------------------

@settings(max_examples=500, deadline=None)
@given(st.from_regex(BASE_URL_PATTERN, fullmatch=True).filter(lambda url: len(url) <= 2000))
def test_every_base_url_of_the_pattern_passes_the_check(url: str) -> None:
    check_base_url(url)
    UserSimulator.model_validate({"model": "m", "base_url": url})


@pytest.mark.parametrize("url", [
    "ftp://host/v1", "http://", "http:///v1", "http://user:pw@host/v1", "http://host/v1?x=1", "http://host/v1#f",
    "http://ho st/v1", "http://host/v\n1", " http://host", "http://host\t/v1", "http://[zz]/v1", "http://[:::]/",
    "http://host:port/v1", "http://host/v1\u00e9", "//host/v1", "host/v1"])
def test_malformed_base_urls_are_refused_by_the_pattern_and_the_server(url: str) -> None:
    assert re.fullmatch(BASE_URL_PATTERN, url) is None
    for model, body in ((UserSimulator, {"model": "m", "base_url": url}),
                        (EvaluationCreate, {"mode": "rollout", "scenario_ids": ["s"], "model": "m", "base_url": url})):
        assert not accepts(model, body), (model.__name__, url)


def _components_fit(path: str) -> bool:
    return all(len(part.encode("utf-8")) <= MAX_NAME_BYTES for part in path.split("/"))


@settings(max_examples=400, deadline=None)
@given(st.from_regex(FILE_PATH_PATTERN, fullmatch=True).filter(lambda path: len(path) <= 255))
def test_every_file_path_of_the_pattern_passes_the_runner(path: str) -> None:
    if _components_fit(path):  # UTF-8 bytes per component: a 422 the fuzz test lists as semantic
        assert check_file_path(path) == path


PATH_TEXT = st.text(st.sampled_from(["a", "b", ".", "/", "\\", "\x00", "\x1f", "\x7f", " ", "\u00e9", "\n"]),
                    max_size=12)


@settings(max_examples=3000, deadline=None)
@given(PATH_TEXT)
def test_the_runner_accepts_exactly_the_file_paths_of_the_pattern(path: str) -> None:
    try:
        check_file_path(path)
        runner = True
    except ValueError:
        runner = False
    assert runner == (re.fullmatch(FILE_PATH_PATTERN, path) is not None), repr(path)


@pytest.mark.parametrize("tenant_id", ["a", "a-b_c9", "0" * 64, "", "A", "-a", "a\n", "a" * 65, "a.b", "\u00e9"])
def test_tenant_ids_of_the_pattern_are_the_server_s(tenant_id: str) -> None:
    server = TENANT_ID.fullmatch(tenant_id) is not None
    assert server == (re.fullmatch(TENANT_ID_PATTERN, tenant_id) is not None)
    assert server == accepts(TenantCreate, {"id": tenant_id})


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(["state", "state_diff", "transcript", "", " state", "x", "states"]), max_size=4),
       st.sampled_from([INCLUDES, RESULT_INCLUDES]))
def test_include_patterns_name_what_the_services_take(items: list[str], names: frozenset[str]) -> None:
    include = ",".join(items)
    taken = set(filter(None, include.split(","))) <= names  # envs.steps.wanted_parts, EvaluationJobs.result_lines
    assert taken == (re.fullmatch(list_pattern(names), include) is not None), include


def test_include_patterns_are_served(spec: dict[str, Any]) -> None:
    for path, method, names in (("/v1/envs/{env_id}/step", "post", INCLUDES),
                                ("/v1/evaluations/{evaluation_id}/results", "get", RESULT_INCLUDES)):
        params = {p["name"]: p for p in spec["paths"][path][method]["parameters"]}
        assert params["include"]["schema"]["pattern"] == list_pattern(names)


# -- quotas ------------------------------------------------------------------------------------

QUOTA_OVERRIDES = [
    {}, {"max_live_envs": 5}, {"max_live_envs": 5.0}, {"max_live_envs": 0}, {"max_live_envs": -1},
    {"max_live_envs": "5"}, {"max_live_envs": True}, {"max_live_envs": 5.5}, {"max_live_envs": None},
    {"step_burst": None}, {"step_burst": 20}, {"max_running_calls": None}, {"max_running_calls": 2},
    {"max_profile": {}}, {"max_profile": {"cpus": 2}}, {"max_profile": {"cpus": 0.25, "memory_mib": 512.0}},
    {"max_profile": {"cpus": "1"}}, {"max_profile": {"memory_mib": 31}}, {"max_profile": {"pids": 8}},
    {"max_profile": None}, {"max_profile": 1}, {"nope": 1}, {"": 1}, {"max_code_bytes": 2**40},
]


@pytest.mark.parametrize("overrides", QUOTA_OVERRIDES)
def test_quota_overrides_are_what_the_tenant_service_takes(spec: dict[str, Any], database: Database,
                                                          overrides: dict[str, Any]) -> None:
    tenants = TenantService(ApiSettings(), database)
    try:
        stored = tenants.check_quotas(overrides)
        server = True
    except InvalidRequest:
        server = False
    assert server == validator(spec, "QuotaOverrides").is_valid(overrides), overrides
    for component in ("TenantCreate", "TenantUpdate"):
        assert validator(spec, component).is_valid({"id": "t", "quotas": overrides} if component == "TenantCreate"
                                                   else {"quotas": overrides}) == server
    if server:
        assert stored == overrides


def test_quota_overrides_are_stored_with_integers(database: Database) -> None:
    stored = TenantService(ApiSettings(), database).check_quotas(
        {"max_live_envs": 5.0, "max_profile": {"memory_mib": 512.0, "cpus": 1.0}})
    assert stored is not None
    assert type(stored["max_live_envs"]) is int and type(stored["max_profile"]["memory_mib"]) is int
    assert type(stored["max_profile"]["cpus"]) is float


@pytest.mark.parametrize("parameters", [
    None, {}, {"type": "object"}, {"type": "string"}, {"properties": {}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {f"p{i}": {} for i in range(MAX_TOOL_PARAMETERS)}},
    {"type": "object", "properties": {f"p{i}": {} for i in range(MAX_TOOL_PARAMETERS + 1)}}])
def test_declared_tool_parameters_are_what_the_model_takes(spec: dict[str, Any], parameters: Any) -> None:
    """Of parameters that are valid JSON Schemas (the meta-schema check is a listed
    semantic refusal), the document allows exactly the ones ``DeclaredFunction`` takes."""
    body = {"name": "tool", "parameters": parameters}
    assert validator(spec, "DeclaredFunction").is_valid(body) == accepts(DeclaredFunction, body)
