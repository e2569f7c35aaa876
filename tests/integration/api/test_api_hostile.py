"""Hostile and malformed requests. A request that is not a step at all (broken JSON,
oversize, unknown fields) gets a 4xx in the error shape and nothing runs or is created; a
malformed *action* (unknown or private tool, arguments that are not an object or not
JSON) is a recorded ``rejected`` step with EnvScaler's observation, never a 422, and
arguments of the wrong type go to the method as given (Python decides). The env keeps
working throughout."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


@pytest.fixture(scope="module")
def env_id(server, counter_env_id: str) -> str:
    with server.client(timeout=60) as client:
        return client.post("/v1/envs", json={"environment_id": counter_env_id}).json()["id"]


def _error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()["error"]
    assert set(body) == {"code", "message", "field"} and body["message"]
    if code is not None:
        assert body["code"] == code, body
    return body


def _step(api: httpx.Client, env_id: str, body: dict) -> dict:
    # json.dumps escapes lone surrogates (\\ud800), which is valid JSON; httpx's own encoder cannot
    response = api.post(f"/v1/envs/{env_id}/step", content=json.dumps(body).encode(),
                        headers={"content-type": "application/json"})
    assert response.status_code == 200, (response.status_code, response.text)
    return response.json()


@pytest.mark.parametrize("body", [
    {"name": "__class__", "arguments": {}},
    {"name": "__init__", "arguments": {"init_config": {}}},
    {"name": "_secret", "arguments": {}},
    {"name": "total", "arguments": {}},  # a property: not a tool
    {"name": "records", "arguments": {}},  # an attribute: not a tool
    {"name": "no_such_tool", "arguments": {}},
    {"name": "__import__('os').system('id')", "arguments": {}},
    {"name": "", "arguments": {}},
    {"name": "x" * 1000, "arguments": {}},
])
def test_unknown_private_and_unusable_tool_names_are_rejected_steps(api: httpx.Client, env_id: str,
                                                                    body: dict) -> None:
    before = api.get(f"/v1/envs/{env_id}").json()["step"]
    result = _step(api, env_id, body)
    assert (result["status"], result["observation"]) == ("rejected", "Error: Invalid action"), result
    assert result["error"] and result["step"] == before + 1 and result["observation_role"] == "user"
    recorded = api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"][-1]
    assert recorded["status"] == "rejected" and recorded["info"]["error"] == result["error"]
    assert api.get(f"/v1/envs/{env_id}/trajectory").status_code == 200  # readable (no lone surrogate stored)


@pytest.mark.parametrize("body", [
    {"name": "bump", "arguments": [1, 2]},
    {"name": "bump", "arguments": "by=1"},
    {"name": "bump", "arguments": 7},
    {"type": "function", "function": {"name": "bump", "arguments": "{not json"}},
    {"type": "function", "function": {"name": "bump", "arguments": "[1]"}},
    {"type": "function", "function": {"name": "bump", "arguments": "NaN"}},
    {"type": "function", "function": {"name": "bump", "arguments": '{"by": Infinity}'}},
    {"text": "<tool_call>{not json}</tool_call>"},
    {"text": "<tool_call>{\"name\": \"bump\"}</tool_call>"},
    {"text": "<think>unclosed"},
    {"text": "   "},
])
def test_calls_that_do_not_parse_to_an_action_are_rejected_steps(api: httpx.Client, env_id: str, body: dict) -> None:
    result = _step(api, env_id, body)
    assert (result["status"], result["observation"]) == ("rejected", "Error: Failed to parse response to action")
    assert result["error"], result


@pytest.mark.parametrize("body, observation", [
    ({"name": "bump", "arguments": {"by": "one"}}, "Error: TypeError: unsupported operand"),
    ({"name": "bump", "arguments": {"by": 1, "extra": 2}}, "Error: TypeError: Counter.bump() got an unexpected"),
    ({"name": "set_record", "arguments": {"key": "k"}}, "Error: TypeError: Counter.set_record() missing"),
])
def test_arguments_of_the_wrong_shape_go_to_python(api: httpx.Client, env_id: str, body: dict,
                                                   observation: str) -> None:
    result = _step(api, env_id, body)
    assert result["status"] == "error" and result["observation"].startswith(observation), result
    assert result["argument_findings"] is None  # argument_checking is off by default


@pytest.mark.parametrize("body, field", [
    ({"name": 42, "arguments": {}}, "name"),
    ({"arguments": {}}, None),
    ({}, None),
    ({"name": "bump", "text": "x"}, None),
    ({"name": "bump", "arguments": {}, "surprise": 1}, "surprise"),
    ({"type": "function", "function": "bump"}, "function"),
    ({"name": "bump\ud800", "arguments": {}}, "name"),  # not text: no action at all
    ({"name": "bump", "arguments": {"by": "\ud800"}}, "arguments.by"),
])
def test_requests_that_are_not_a_step_are_422_naming_the_field(api: httpx.Client, env_id: str, body: dict,
                                                               field: str | None) -> None:
    before = api.get(f"/v1/envs/{env_id}").json()["step"]
    error = _error(api.post(f"/v1/envs/{env_id}/step", content=json.dumps(body).encode(),
                            headers={"content-type": "application/json"}), 422)
    if field is not None:
        assert error["field"] == field, error
    assert api.get(f"/v1/envs/{env_id}").json()["step"] == before  # nothing recorded


@pytest.mark.parametrize("raw", [
    b'{"name": "bump", "arguments": {"by": NaN}}',
    b'{"name": "bump", "arguments": {"by": -Infinity}}',
    b'{"name": "bump", "arguments": ' + b'{"a":' * 5000 + b'1' + b'}' * 5000 + b'}',
    b'{"name": "bump", "arguments": ' + b'[' * 100000 + b']' * 100000 + b'}',
    b'not json at all',
    b'{"name": "bump", "arguments": {}',
    b'\xff\xfe\x00garbage',
    b'',
])
def test_broken_json_bodies_are_4xx(api: httpx.Client, env_id: str, raw: bytes) -> None:
    response = api.post(f"/v1/envs/{env_id}/step", content=raw, headers={"content-type": "application/json"})
    assert response.status_code in (400, 422), (response.status_code, response.text)
    assert "error" in response.json()


def test_oversized_payloads_are_413(api: httpx.Client, env_id: str, counter_env_id: str) -> None:
    big = "x" * (300 * 1024)
    _error(api.post(f"/v1/envs/{env_id}/step", json={"name": "set_record", "arguments": {"key": "k", "value": big}}),
           413, "payload_too_large")
    _error(api.post("/v1/environments", json={"source_code": "#" * (3 * 1024 * 1024), "class_name": "C"}),
           413, "payload_too_large")
    _error(api.post("/v1/envs", json={"environment_id": counter_env_id, "init_config": {"blob": "y" * (5 * 1024 * 1024)}}),
           413)
    _error(api.post("/v1/envs", content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
                    headers={"content-type": "application/json"}), 413)


def test_unknown_ids_conflicts_and_bad_parameters(api: httpx.Client, env_id: str, counter_env_id: str) -> None:
    for path in ("/v1/envs/env_nope", "/v1/envs/env_nope/state", "/v1/envs/env_nope/trajectory",
                 "/v1/environments/envr_nope", "/v1/envs/" + "x" * 5000):
        _error(api.get(path), 404)
    _error(api.post("/v1/envs/env_nope/step", json={"name": "bump"}), 404)
    _error(api.post("/v1/envs", json={"environment_id": "envr_nope"}), 404)
    _error(api.post(f"/v1/envs/{env_id}/restore", json={"step": 10**6}), 409, "conflict")
    _error(api.post(f"/v1/envs/{env_id}/restore", json={"step": -1}), 422)
    _error(api.post(f"/v1/envs/{env_id}/fork", json={"count": 0}), 422)
    _error(api.post(f"/v1/envs/{env_id}/fork", json={"count": 10**6}), 422)
    _error(api.post(f"/v1/envs/{env_id}/fork", json={"step": 10**6, "count": 1}), 409)
    _error(api.get(f"/v1/envs/{env_id}/state", params={"step": 10**6}), 409)
    _error(api.get(f"/v1/envs/{env_id}/state", params={"step": "x"}), 422)
    _error(api.post(f"/v1/envs/{env_id}/step", json={"name": "bump"}, params={"include": "secrets"}), 422)
    _error(api.get("/v1/envs", params={"limit": 0}), 422)
    _error(api.post("/v1/envs", json={"source_code": "class C: pass"}), 422)
    _error(api.post("/v1/envs", json={"environment_id": "a", "source_code": "b", "class_name": "C"}), 422)
    assert _error(api.post("/v1/envs", json={"environment_id": counter_env_id, "profile": {"memory_mib": 10**9}}),
                  422)["field"] == "profile.memory_mib"
    # within the executor's bounds but above the configured profile: the executor refuses it
    assert _error(api.post("/v1/envs", json={"environment_id": counter_env_id, "profile": {"memory_mib": 65536}}),
                  422)["field"] == "profile"


@pytest.mark.parametrize("source, class_name", [
    ("def broken(:\n", "C"),
    ("raise RuntimeError('at import')\n", "C"),
    ("class D:\n    pass\n", "C"),
    ("C = 5\n", "C"),
    ("import os\nos._exit(3)\n", "C"),
    ("class C:\n    def __init__(self, init_config):\n        raise ValueError('no')\n", "C"),
])
def test_bad_environment_code_is_422_with_the_sandbox_observation(api: httpx.Client, source: str,
                                                                  class_name: str) -> None:
    body = {"source_code": source, "class_name": class_name}
    registered = api.post("/v1/environments", json=body)
    inline = api.post("/v1/envs", json=body)
    if "__init__" in source:  # importable and describable: registration instantiates it once
        assert _error(registered, 422)["field"] == "sample_init_config"
        assert "ValueError: no" in registered.json()["error"]["message"]
        assert _error(inline, 422)["field"] == "init_config"
    else:
        assert _error(registered, 422)["field"] == "source_code"
        _error(inline, 422)
    _error(api.post("/v1/environments", json={**body, "class_name": "not an identifier"}), 422)


def test_the_env_still_works_after_all_that(api: httpx.Client, env_id: str) -> None:
    before = api.get(f"/v1/envs/{env_id}").json()["step"]
    result = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 2}}).json()
    assert (result["status"], result["observation"], result["step"]) == ("ok", "2", before + 1)
    trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()
    assert trajectory["count"] == before + 1 and all(s["action"] is not None for s in trajectory["steps"])
