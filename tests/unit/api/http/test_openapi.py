"""The OpenAPI document lists every status an operation sends, with the server's real
error body (issue 12: it showed only 2xx and FastAPI's 422 ``{"detail": [...]}``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sandpit.api.app import create_app
from sandpit.api.errors import ErrorBody, QuotaExceeded, Unauthorized
from sandpit.api.http.handlers import error_response
from sandpit.api.settings import ApiSettings


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app(ApiSettings()).openapi()


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_every_v1_operation_documents_auth_and_unavailability(spec: dict[str, Any]) -> None:
    v1 = [(m, p, op) for m, p, op in _operations(spec) if p.startswith("/v1/")]
    assert len(v1) >= 35
    for method, path, op in v1:
        responses = op["responses"]
        assert {"401", "403", "503"} <= set(responses), (method, path, sorted(responses))
        assert "WWW-Authenticate" in responses["401"]["headers"]
        assert "Retry-After" in responses["503"]["headers"]
        assert op["security"] == [{"bearer": []}]
        if "{" in path:
            assert "404" in responses, (method, path)
        if method in ("POST", "PATCH"):
            assert {"408", "413", "422"} <= set(responses), (method, path, sorted(responses))


def test_error_responses_carry_the_real_error_body(spec: dict[str, Any]) -> None:
    for method, path, op in _operations(spec):
        for status, response in op["responses"].items():
            if int(status) >= 400 and path != "/readyz":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    detail = schemas["ErrorDetail"]
    assert set(detail["properties"]) == {"code", "message", "field", "limit", "retry_after"}
    assert set(detail["required"]) == {"code", "message", "field"}


@pytest.mark.parametrize("method, path, statuses", [
    ("POST", "/v1/envs", {"201", "401", "403", "404", "408", "409", "413", "422", "429", "503"}),
    ("POST", "/v1/envs/{env_id}/step", {"200", "401", "403", "404", "408", "409", "413", "422", "429", "503"}),
    ("POST", "/v1/execute", {"200", "401", "403", "408", "413", "422", "429", "503"}),
    ("POST", "/v1/execute/batch", {"200", "401", "403", "408", "413", "422", "429", "503"}),
    ("GET", "/v1/envs/{env_id}/state", {"200", "401", "403", "404", "409", "413", "422", "503"}),
    ("DELETE", "/v1/environments/{environment_id}", {"204", "401", "403", "404", "409", "413", "503"}),
    ("POST", "/v1/admin/tenants", {"201", "401", "403", "408", "409", "413", "422", "503"}),
    ("GET", "/v1/tenant", {"200", "401", "403", "413", "503"}),
    ("GET", "/healthz", {"200"}),
    ("GET", "/readyz", {"200", "503"}),
    ("GET", "/metrics", {"200", "401", "403"}),
])
def test_statuses_of_operations(spec: dict[str, Any], method: str, path: str, statuses: set[str]) -> None:
    assert set(spec["paths"][path][method.lower()]["responses"]) == statuses


@pytest.mark.parametrize("method, path", [("POST", "/v1/envs"), ("POST", "/v1/envs/{env_id}/step"),
                                          ("POST", "/v1/envs/{env_id}/reset"), ("POST", "/v1/envs/{env_id}/fork")])
def test_idempotency_key_header_and_its_409s_are_documented(spec: dict[str, Any], method: str, path: str) -> None:
    op = spec["paths"][path][method.lower()]
    header = next(p for p in op["parameters"] if p["in"] == "header")
    assert header["name"] == "Idempotency-Key" and not header.get("required", False)
    schema = header["schema"]["anyOf"][0]
    assert (schema["minLength"], schema["maxLength"]) == (1, 255)
    assert "idempotency_key_reused" in op["responses"]["409"]["description"]
    assert "Retry-After" in op["responses"]["409"]["headers"]


def test_only_the_mutating_env_routes_take_keys_and_attempts(spec: dict[str, Any]) -> None:
    keyed = {("POST", "/v1/envs"), ("POST", "/v1/envs/{env_id}/reset"), ("POST", "/v1/envs/{env_id}/fork"),
             ("POST", "/v1/envs/{env_id}/step")}
    fenced = {("POST", "/v1/envs/{env_id}/step"), ("POST", "/v1/envs/{env_id}/reset"),
              ("POST", "/v1/envs/{env_id}/restore"), ("DELETE", "/v1/envs/{env_id}")}
    for method, path, op in _operations(spec):
        named = {p["name"] for p in op.get("parameters", []) if p["in"] == "header"}
        expected = ({"Idempotency-Key"} if (method, path) in keyed else set()) | (
            {"Sandpit-Attempt"} if (method, path) in fenced else set())
        assert named == expected, (method, path)
        if "Sandpit-Attempt" in named:
            assert "stale_attempt" in op["responses"]["409"]["description"]
        if named:  # a malformed header is a 422
            assert "422" in op["responses"], (method, path)


def test_resume_is_documented(spec: dict[str, Any]) -> None:
    op = spec["paths"]["/v1/envs/{env_id}/attempts"]["post"]
    assert op["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AttemptPublic"}
    assert set(op["responses"]) == {"201", "401", "403", "404", "408", "409", "413", "422", "503"}


def test_quota_and_capacity_errors_document_retry_after(spec: dict[str, Any]) -> None:
    for _method, path, op in _operations(spec):
        for status in ("429", "503"):
            if status in op["responses"] and path != "/readyz":
                assert op["responses"][status]["headers"]["Retry-After"]["schema"]["type"] == "integer"


def test_metrics_is_text_and_step_is_json(spec: dict[str, Any]) -> None:
    assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    step = spec["paths"]["/v1/envs/{env_id}/step"]["post"]["responses"]["200"]["content"]
    assert step == {"application/json": {"schema": {"$ref": "#/components/schemas/StepResult"}}}


def test_error_responses_validate_against_the_model() -> None:
    for exc in (Unauthorized("no key"), QuotaExceeded("over", limit="max_live_envs", retry_after=5)):
        response = error_response(exc)
        ErrorBody.model_validate(json.loads(response.body))
    quota = json.loads(error_response(QuotaExceeded("over", limit="max_live_envs", retry_after=5)).body)
    assert quota["error"]["limit"] == "max_live_envs" and quota["error"]["retry_after"] == 5
