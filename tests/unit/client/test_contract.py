"""The client's side of the HTTP contract, checked against the server's OpenAPI document
(built in-process from `create_app(...).openapi()`: no server, no Docker).

For every endpoint description in `sandpit.client.calls` (each builder, called with sample
arguments):

* the operation exists (method and path template);
* the JSON body it sends validates against the documented request schema (jsonschema,
  OpenAPI 3.1 = JSON Schema 2020-12), and its query parameters are documented ones;
* the model it reads a 2xx answer into accepts everything the documented response schema
  allows: every field the server documents is a field of the client model, with a type
  that accepts every value the server's type does, and no field the client requires is
  optional on the server.

The server's schemas may move between modules (they are being restructured); the HTTP
contract, which is what this reads, does not.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel
from sandpit.api.app import create_app
from sandpit.api.settings import ApiSettings
from sandpit.client import calls
from sandpit.client.calls import Call
from sandpit.client.models import Profile

Schema = dict[str, Any]

NARROWER = {
    "Trajectory.steps[].action": "the server documents a free object; it always records {name, arguments} "
                                 "(Action.record in api/services/tools.py), which the client reads as a ToolAction",
}
"""Client fields deliberately narrower than the server's documented type, with the reason
(each is a gap in the OpenAPI document, not in the data)."""

CHECK = "def check_func(final_state):\n    return True\n"
SAMPLES: list[tuple[str, Callable[[], Call[Any]]]] = [
    ("health", lambda: calls.health()),
    ("ready", lambda: calls.ready()),
    ("validate", lambda: calls.validate({"kind": "snippet", "source_code": "x = 1", "policy": "standard"})),
    ("validate", lambda: calls.validate({"kind": "check_function", "source_code": CHECK,
                                         "cases": [{"initial_state": {}, "final_state": {"a": 1}}]})),
    ("execute", lambda: calls.execute("print(1)", None, None, None)),
    ("execute", lambda: calls.execute("print(1)", "in", 5.0, {"data/x.txt": "payload"})),
    ("environment_create", lambda: calls.environment_create("class A:\n    pass\n", "A", None, None)),
    ("environment_create", lambda: calls.environment_create(
        "class A:\n    pass\n", "A", "a", "an A", "strict",
        {"introduction": "intro", "rules": ["be nice"], "argument_checking": "warn",
         "sample_init_config": {"count": 1}})),
    ("environment_get", lambda: calls.environment_get("env_1")),
    ("environment_list", lambda: calls.environment_list(10, 5)),
    ("environment_delete", lambda: calls.environment_delete("env_1")),
    ("environment_stats", lambda: calls.environment_stats("envr_1")),
    ("environment_stats", lambda: calls.environment_stats("envr_1", "training", "2026-01-01T00:00:00+00:00", 5,
                                                          10, 20)),
    ("scenario_create", lambda: calls.scenario_create({
        "environment_id": "e", "task": "t", "init_config": {"a": 1}, "checklist": ["c"],
        "checklist_with_func": [{"check_item": "c", "check_func": CHECK}], "external_id": "x"})),
    ("scenario_get", lambda: calls.scenario_get("scn_1")),
    ("scenario_list", lambda: calls.scenario_list(None, None)),
    ("scenario_delete", lambda: calls.scenario_delete("scn_1")),
    ("scenario_stats", lambda: calls.scenario_stats("scn_1")),
    ("scenario_stats", lambda: calls.scenario_stats("scn_1", "evaluation", datetime(2026, 1, 1, tzinfo=UTC), 0)),
    ("env_create", lambda: calls.env_create("e", None, None, None, None)),
    ("env_create", lambda: calls.env_create(None, "class A:\n    pass\n", "A", {"a": 1},
                                            Profile(memory_mib=128, cpus=0.5, call_timeout_s=2), None,
                                            {"mode": "non_conversational", "max_steps": 5}, "strict")),
    ("env_create", lambda: calls.env_create(None, None, None, None, {"memory_mib": 64}, "scn_1")),
    ("env_get", lambda: calls.env_get("env_1")),
    ("env_list", lambda: calls.env_list(1, 0)),
    ("env_delete", lambda: calls.env_delete("env_1")),
    ("env_step", lambda: calls.env_step("env_1", {"name": "bump", "arguments": {"by": 1}}, ["state", "state_diff"])),
    ("env_step", lambda: calls.env_step("env_1", {"type": "function", "function": {"name": "bump",
                                                                                  "arguments": "{oops"}}, None)),
    ("env_step", lambda: calls.env_step("env_1", "<tool_call>{}</tool_call>", None)),
    ("envs_step", lambda: calls.envs_step([("env_1", {"name": "bump", "arguments": {"by": 1}}),
                                           ("env_2", {"text": "done"})], ["state"], ["tok_1", None])),
    ("envs_step", lambda: calls.envs_step([("env_1", "<tool_call>{}</tool_call>")])),
    ("env_reset", lambda: calls.env_reset("env_1", None)),
    ("env_reset", lambda: calls.env_reset("env_1", {"a": 1}, "scn_1", {"max_steps": 3})),
    ("env_state", lambda: calls.env_state("env_1", 2, 1)),
    ("env_trajectory", lambda: calls.env_trajectory("env_1", 1, 10, 0)),
    ("env_episodes", lambda: calls.env_episodes("env_1", 10, 0)),
    ("env_restore", lambda: calls.env_restore("env_1", 0)),
    ("env_resume", lambda: calls.env_resume("env_1")),
    ("env_fork", lambda: calls.env_fork("env_1", None, 2)),
    ("env_fork", lambda: calls.env_fork("env_1", 3, 1)),
    ("env_evaluate", lambda: calls.env_evaluate("env_1", None)),
    ("env_evaluate", lambda: calls.env_evaluate("env_1", [{"check_item": "c", "check_func": CHECK}])),
    ("evaluation_create", lambda: calls.evaluation_create(calls.replay_body(
        [{"scenario_id": "scn_1", "tool_calls": [{"name": "bump", "arguments": {"by": 1}}]}],
        {"concurrency": 2, "keep_envs": None}))),
    ("evaluation_create", lambda: calls.evaluation_create(calls.rollout_body(
        ["scn_1", "scn_1"], "qwen3-8b", {"base_url": "http://127.0.0.1:8000/v1", "api_key": "sk-x", "max_steps": 5,
                                         "temperature": 0.2, "concurrency": 4}))),
    ("evaluation_get", lambda: calls.evaluation_get("evl_1")),
    ("evaluation_list", lambda: calls.evaluation_list(20, None)),
    ("evaluation_cancel", lambda: calls.evaluation_cancel("evl_1")),
    ("evaluation_results", lambda: calls.evaluation_results("evl_1", True)),
    ("tenant_create", lambda: calls.tenant_create("team-a", {"display_name": None, "quotas": {"max_live_envs": 5},
                                                             "create_key": True, "key_name": "first",
                                                             "key_expires_in_s": 3600.0})),
    ("tenant_list", lambda: calls.tenant_list()),
    ("tenant_get", lambda: calls.tenant_get("team-a")),
    ("tenant_update", lambda: calls.tenant_update("team-a", {"display_name": "A", "quotas": {},
                                                             "model_base_url": "http://m/v1", "model_api_key": ""})),
    ("key_create", lambda: calls.key_create("team-a", "ci", 60.0)),
    ("key_create", lambda: calls.key_create("team-a", None, None)),
    ("key_list", lambda: calls.key_list("team-a")),
    ("key_revoke", lambda: calls.key_revoke("key_1")),
    ("audit_list", lambda: calls.audit_list("team-a", "env.create", 10, 0)),
    ("cluster_status", lambda: calls.cluster_status()),
    ("cluster_drain", lambda: calls.cluster_drain("sandpit-host-0123abcd", True)),
    ("cluster_undrain", lambda: calls.cluster_undrain("sandpit-host-0123abcd")),
]


@pytest.fixture(scope="module")
def spec() -> Schema:
    return create_app(ApiSettings()).openapi()


def _operation(spec: Schema, call: Call[Any]) -> Schema:
    for template, operations in spec["paths"].items():
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, call.path) and call.method.lower() in operations:
            operation: Schema = operations[call.method.lower()]
            return operation
    raise AssertionError(f"{call.method} {call.path}: no such operation in the OpenAPI document")


def _with_components(schema: Schema, spec: Schema) -> Schema:
    return {**schema, "components": spec["components"]}


# --------------------------------------------------------------------------- schema comparison


def _resolve(schema: Schema, defs: dict[str, Schema]) -> Schema:
    while "$ref" in schema:
        schema = {**defs[schema["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _branches(schema: Schema, defs: dict[str, Schema]) -> list[Schema]:
    schema = _resolve(schema, defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return [b for branch in schema[key] for b in _branches(branch, defs)]
    return [schema]


def _is_any(schema: Schema) -> bool:
    return not any(k in schema for k in ("type", "anyOf", "oneOf", "$ref", "enum", "const", "properties", "items"))


def _values(schema: Schema) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    return list(schema["enum"]) if "enum" in schema else None


def _type(schema: Schema) -> str | None:
    if "type" in schema:
        return str(schema["type"])
    if "properties" in schema or "additionalProperties" in schema:
        return "object"
    values = _values(schema)
    if values:
        kinds = {type(v) for v in values}
        return {str: "string", int: "integer", bool: "boolean", float: "number"}.get(kinds.pop()) if len(kinds) == 1 else None
    return None


class Comparison:
    """Does the client's schema accept every value the server's may produce?"""

    def __init__(self, client_defs: dict[str, Schema], server_defs: dict[str, Schema]) -> None:
        self.client_defs, self.server_defs = client_defs, server_defs
        self.problems: list[str] = []

    def accepts(self, client: Schema, server: Schema, where: str) -> bool:
        client_branches = _branches(client, self.client_defs)
        if any(_is_any(b) for b in client_branches):
            return True
        ok = True
        for server_branch in _branches(server, self.server_defs):
            if _is_any(server_branch):
                self.problems.append(f"{where}: the server may send anything, the client takes {client_branches}")
                ok = False
                continue
            attempts = []
            for client_branch in client_branches:
                sub = Comparison(self.client_defs, self.server_defs)
                if sub.accepts_one(client_branch, server_branch, where):
                    break
                attempts += sub.problems
            else:
                self.problems += attempts or [f"{where}: no client type accepts {server_branch}"]
                ok = False
        return ok

    def accepts_one(self, client: Schema, server: Schema, where: str) -> bool:
        server_type, client_type = _type(server), _type(client)
        server_values, client_values = _values(server), _values(client)
        if client_values is not None:
            if server_values is None or not set(map(repr, server_values)) <= set(map(repr, client_values)):
                self.problems.append(f"{where}: the client accepts only {client_values}, the server sends "
                                     f"{server_values or server_type}")
                return False
            return True
        if server_type == "integer" and client_type in ("integer", "number"):
            return True
        if server_type != client_type:
            self.problems.append(f"{where}: server type {server_type}, client type {client_type}")
            return False
        if server_type == "string":
            if client.get("format") and client.get("format") != server.get("format"):
                self.problems.append(f"{where}: the client wants format {client['format']}, the server "
                                     f"sends {server.get('format') or 'any string'}")
                return False
            return True
        if server_type == "array":
            return self.accepts(client.get("items", {}), server.get("items", {}), f"{where}[]")
        if server_type == "object":
            return self._object(client, server, where)
        return True

    def _object(self, client: Schema, server: Schema, where: str) -> bool:
        server_properties: dict[str, Schema] = server.get("properties", {})
        if "properties" not in client:  # a dict on the client side
            values = client.get("additionalProperties", True)
            if values is True or values == {}:
                return True
            extra = server.get("additionalProperties", True)
            extra_ok = self.accepts(values, {} if extra is True else extra, f"{where}{{*}}") if extra is not False else True
            return all([self.accepts(values, s, f"{where}.{n}") for n, s in server_properties.items()] + [extra_ok])
        if "properties" not in server:
            self.problems.append(f"{where}: the client reads a model, the server sends a free object")
            return False
        ok = True
        client_properties: dict[str, Schema] = client["properties"]
        for name, schema in server_properties.items():
            if name not in client_properties:
                self.problems.append(f"{where}.{name}: documented by the server, missing in the client model")
                ok = False
            elif not self.accepts(client_properties[name], schema, f"{where}.{name}"):
                ok = False
        optional_on_server = set(client.get("required", [])) - set(server.get("required", []))
        for name in sorted(optional_on_server):
            self.problems.append(f"{where}.{name}: required by the client, optional on the server")
            ok = False
        return ok


def _client_schema(model: type[BaseModel]) -> tuple[Schema, dict[str, Schema]]:
    schema = model.model_json_schema(mode="validation", ref_template="#/$defs/{model}")
    return schema, schema.pop("$defs", {})


# --------------------------------------------------------------------------- tests


def test_every_builder_has_a_sample() -> None:
    builders = {name for name, fn in inspect.getmembers(calls, inspect.isfunction)
                if fn.__module__ == calls.__name__ and not name.startswith("_")
                and str(inspect.signature(fn).return_annotation).startswith("Call[")}
    assert builders == {name for name, _ in SAMPLES}


@pytest.mark.parametrize(("name", "make"), SAMPLES, ids=[f"{i}-{name}" for i, (name, _) in enumerate(SAMPLES)])
def test_requests_are_what_the_server_documents(spec: Schema, name: str, make: Callable[[], Call[Any]]) -> None:
    call = make()
    operation = _operation(spec, call)
    documented = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "query"}
    for key, value in (call.params or {}).items():
        assert key in documented, f"{name}: query parameter {key!r} is not documented"
        jsonschema.validate(_coerce(value, documented[key]["schema"]), _with_components(documented[key]["schema"], spec))
    body = operation.get("requestBody")
    if call.json is None:
        assert body is None or not body.get("required"), f"{name}: the server requires a body"
        return
    assert body is not None, f"{name}: sends a body the operation does not take"
    schema = body["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator(_with_components(schema, spec)).validate(call.json)


def _coerce(value: str, schema: Schema) -> Any:
    types = {b.get("type") for b in schema.get("anyOf", [schema])}
    if "integer" in types and re.fullmatch(r"-?\d+", value):
        return int(value)
    if "boolean" in types and value in ("true", "false"):
        return value == "true"
    return value


@pytest.mark.parametrize(("name", "make"), SAMPLES, ids=[f"{i}-{name}" for i, (name, _) in enumerate(SAMPLES)])
def test_response_models_accept_what_the_server_documents(spec: Schema, name: str,
                                                          make: Callable[[], Call[Any]]) -> None:
    call = make()
    operation = _operation(spec, call)
    status, response = next((s, r) for s, r in operation["responses"].items() if s.startswith("2"))
    content = response.get("content") or {}
    if call.model is None:
        assert status == "204" or "application/json" in content, f"{name}: {status} {sorted(content)}"
        return
    media = "application/x-ndjson" if "application/x-ndjson" in content else "application/json"
    assert media in content, f"{name}: the server documents no JSON body for {status}"
    if "schema" not in content[media]:
        pytest.skip(f"{call.method} {call.path}: the server documents no schema for its {media} body")
    client_schema, client_defs = _client_schema(call.model)
    comparison = Comparison(client_defs, spec["components"]["schemas"])
    comparison.accepts(client_schema, content[media]["schema"], call.model.__name__)
    assert [p for p in comparison.problems if not any(p.startswith(k + ":") for k in NARROWER)] == []


def test_the_comparison_finds_what_it_should() -> None:
    server = {"X": {"type": "object", "properties": {"a": {"type": "string", "format": "date-time"},
                                                      "b": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                                      "c": {"type": "string"}},
                    "required": ["a", "c"]}}
    good = {"type": "object", "properties": {"a": {"type": "string", "format": "date-time"},
                                              "b": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                                              "c": {}}, "required": ["a"]}
    missing = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
               "required": ["b"]}
    assert not _check(good, server)
    problems = _check(missing, server)
    assert any(".c: documented by the server" in p for p in problems)
    assert any(".b: no client type accepts {'type': 'null'}" in p or "null" in p for p in problems)
    assert any(".b: required by the client" in p for p in problems)
    assert _check({"type": "object", "properties": {"a": {"enum": ["x"]}, "b": {}, "c": {}}},
                  server) != []


def _check(client: Schema, server_defs: dict[str, Schema]) -> list[str]:
    comparison = Comparison({}, server_defs)
    comparison.accepts(client, {"$ref": "#/components/schemas/X"}, "X")
    return comparison.problems


def test_the_request_check_refuses_what_the_server_would(spec: Schema) -> None:
    schema = _operation(spec, calls.env_create("e", None, None, None, None))["requestBody"]["content"][
        "application/json"]["schema"]
    validator = jsonschema.Draft202012Validator(_with_components(schema, spec))
    assert validator.is_valid({"environment_id": "e"})
    assert not validator.is_valid({"environment_id": "e", "bogus": 1})  # strict request models
    assert not validator.is_valid({"environment_id": "e", "profile": {"memory_mb": 64}})
