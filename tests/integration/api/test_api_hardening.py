"""Issue 12 ("no 5xx under fuzzing"), the cases a schemathesis run found, on a real
server: profile values the executor refuses, the documented error statuses, ``/metrics``
as text, stalled and abandoned request bodies."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from sandpit.api.errors import ErrorBody

pytestmark = pytest.mark.docker


def _field_error(response: httpx.Response) -> str:
    assert response.status_code == 422, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["message"], error
    return error["field"]


@pytest.mark.parametrize("memory", [0, 16, 24, 31])
def test_memory_below_the_executor_floor_is_422_on_every_route(api: httpx.Client, counter_env_id: str,
                                                               memory: int) -> None:
    """16..31 MiB passed validation and made the executor raise (500)."""
    assert _field_error(api.post("/v1/envs", json={"environment_id": counter_env_id,
                                                   "profile": {"memory_mib": memory}})) == "profile.memory_mib"
    assert _field_error(api.post("/v1/execute", json={"code": "print(1)", "memory_mb": memory})) == "memory_mb"
    assert _field_error(api.post("/v1/execute/batch", json={"snippets": [{"code": "print(1)", "memory_mb": memory}]})
                        ) == "snippets.0.memory_mb"


def test_profile_values_at_the_executor_bounds_are_never_5xx(api: httpx.Client, counter_env_id: str) -> None:
    """Accepted by validation means accepted by the executor: the lowest memory runs, the
    highest is refused by the configured profile (422), not by a crash."""
    low = api.post("/v1/execute", json={"code": "print(1)", "memory_mb": 32, "timeout_s": 5})
    assert low.status_code == 200, low.text
    for body in ({"code": "print(1)", "memory_mb": 65536}, {"code": "print(1)", "timeout_s": 3600},
                 {"code": "print(1)", "timeout_s": 1e-300}):
        response = api.post("/v1/execute", json=body)
        assert response.status_code < 500, (body, response.status_code, response.text)
    for profile in ({"memory_mib": 65536}, {"cpus": 64}, {"call_timeout_s": 3600}):
        response = api.post("/v1/envs", json={"environment_id": counter_env_id, "profile": profile})
        assert response.status_code in (422, 429), (profile, response.status_code, response.text)


@pytest.mark.parametrize("path, body, field", [
    ("/v1/envs", '{"environment_id": "ENVIRONMENT", "init_config": {"count": "\\ud800"}}', "init_config.count"),
    ("/v1/envs", '{"environment_id": "\\ud800"}', "environment_id"),
    ("/v1/validate", '{"kind": "environment", "source_code": "class C:\\n    pass\\n", "class_name": "C", '
                     '"init_config": {"a": ["\\udfff"]}}', "init_config.a.0"),
    ("/v1/envs/ENV/reset", '{"init_config": {"count": "x\\ud800"}}', "init_config.count"),
    ("/v1/scenarios", '{"environment_id": "ENVIRONMENT", "task": "t", "init_config": {"\\udc00": 1}}', "init_config"),
    ("/v1/execute", '{"code": "print(1)", "files": {"a.txt": "\\ud800"}}', "files.a.txt"),
])
def test_lone_surrogates_in_bodies_are_422(api: httpx.Client, counter_env_id: str, path: str, body: str,
                                           field: str) -> None:
    """Free-form JSON (init_config, files) let a lone surrogate through to the database,
    the sandbox protocol or the response encoder, which cannot encode it: 500."""
    if "/ENV/" in path:
        path = path.replace("ENV", api.post("/v1/envs", json={"environment_id": counter_env_id}).json()["id"])
    body = body.replace("ENVIRONMENT", counter_env_id)
    response = api.post(path, content=body.encode(),
                        headers={"Content-Type": "application/json"})
    assert _field_error(response) == field
    assert "surrogate" in response.json()["error"]["message"]


def test_paired_surrogates_are_text(api: httpx.Client) -> None:
    """An escaped astral character (a surrogate pair) is ordinary text."""
    response = api.post("/v1/execute", content=b'{"code": "print(\'\\ud83d\\ude00\')"}',
                        headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["stdout"] == "\U0001F600\n", response.text


# -- what the server sends is what the OpenAPI document says --------------------------------------
def test_served_openapi_lists_the_error_statuses(server) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    step = spec["paths"]["/v1/envs/{env_id}/step"]["post"]["responses"]
    assert {"401", "403", "404", "408", "409", "413", "422", "429", "503"} <= set(step)
    assert step["422"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]


@pytest.mark.parametrize("request_args", [
    ("POST", "/v1/execute", {"json": {"code": 5}}),  # FastAPI's request validation
    ("POST", "/v1/execute", {"content": b'{"code": NaN}'}),  # strict JSON
    ("GET", "/v1/envs", {"params": {"limit": "many"}}),
    ("POST", "/v1/envs", {"json": {"environment_id": "x", "source_code": "y"}}),  # model validator
])
def test_validation_errors_have_the_documented_body(api: httpx.Client, request_args: tuple) -> None:
    method, path, kwargs = request_args
    response = api.request(method, path, **kwargs)
    assert response.status_code == 422 and response.headers["content-type"] == "application/json"
    ErrorBody.model_validate(response.json())


def test_auth_and_quota_errors_have_the_documented_headers(server) -> None:
    missing = httpx.get(f"{server.url}/v1/envs", timeout=30)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    ErrorBody.model_validate(missing.json())
    key = server.new_tenant("hardening-quota", quotas={"max_code_bytes": 10})
    with server.client(key) as client:
        limited = client.post("/v1/execute", json={"code": "print('more than ten bytes')"})
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    body = ErrorBody.model_validate(limited.json()).error
    assert body.limit == "max_code_bytes" and body.retry_after == int(limited.headers["retry-after"])


def test_metrics_is_prometheus_text(server) -> None:
    response = httpx.get(f"{server.url}/metrics", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "sandpit_step_seconds" in response.text


# -- request bodies: deadline and disconnects --------------------------------------------------
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def slow_server(make_module_server):
    """A server whose request bodies must arrive within BODY_TIMEOUT_S."""
    return make_module_server(SANDPIT_BODY_READ_TIMEOUT_S=str(BODY_TIMEOUT_S))


def _send_head(server, method: str, path: str, declared: int, body: bytes) -> socket.socket:
    """A raw connection that sent the headers (``Content-Length: declared``) and ``body``."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.api_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n")
    sock.sendall(head.encode() + body)
    return sock


def _read_to_close(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when that was
    (seconds from now); fails if the connection is still open after ``limit_s``."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"connection still open after {limit_s} s; received {data[:300]!r}")
    finally:
        sock.close()
    return data, time.monotonic() - started


def test_stalled_body_is_408_and_closed_within_the_timeout(slow_server) -> None:
    started = time.monotonic()
    sock = _send_head(slow_server, "POST", "/v1/execute", 1000, b'{"code": "pri')
    data, _ = _read_to_close(sock, BODY_TIMEOUT_S + 10)
    elapsed = time.monotonic() - started
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), data[:500]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert BODY_TIMEOUT_S - 0.5 <= elapsed <= BODY_TIMEOUT_S + 5, elapsed


def test_trickled_body_is_cut_at_the_deadline(slow_server) -> None:
    """One byte every 0.3 s never stalls for long, but the whole body has a deadline."""
    sock = _send_head(slow_server, "POST", "/v1/execute", 100, b"")
    started = time.monotonic()
    try:
        for _ in range(100):
            sock.sendall(b" ")
            time.sleep(0.3)
    except OSError:  # the server closed the connection: what we want
        pass
    data, _ = _read_to_close(sock, 10)
    assert data.startswith(b"HTTP/1.1 408 "), data[:300]
    assert time.monotonic() - started <= BODY_TIMEOUT_S + 5


def test_many_stalled_bodies_are_all_closed(slow_server) -> None:
    """The issue's slow-loris: many stalled uploads at once, every one cut off."""
    started = time.monotonic()
    socks = [_send_head(slow_server, "POST", "/v1/envs", 5000, b'{"environment_id"') for _ in range(50)]
    for sock in socks:
        data, _ = _read_to_close(sock, BODY_TIMEOUT_S + 20)
        assert data.startswith(b"HTTP/1.1 408 "), data[:300]
    assert time.monotonic() - started <= BODY_TIMEOUT_S + 20
    assert httpx.get(f"{slow_server.url}/healthz", timeout=10).status_code == 200


def test_unread_body_does_not_keep_the_connection(slow_server) -> None:
    """A route that answers without reading the body (a GET with a declared body)
    closes the connection instead of waiting for the rest of it."""
    sock = _send_head(slow_server, "GET", "/v1/environments", 1000, b"{")
    data, elapsed = _read_to_close(sock, BODY_TIMEOUT_S + 10)
    head = data.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200 ") and b"connection: close" in head, data[:300]
    assert elapsed <= BODY_TIMEOUT_S + 5


def test_complete_bodies_keep_the_connection_alive(slow_server) -> None:
    with slow_server.client() as client:
        for _ in range(3):
            response = client.post("/v1/execute", json={"code": "print(1)", "timeout_s": 5})
            assert response.status_code == 200 and "close" not in response.headers.get("connection", "")


def test_client_disconnect_is_one_log_line(slow_server) -> None:
    before = slow_server.log_path.read_text(errors="replace")
    for _ in range(3):
        sock = _send_head(slow_server, "POST", "/v1/execute", 1000, b'{"code": ')
        time.sleep(0.3)  # the route is reading the body now
        sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = slow_server.log_path.read_text(errors="replace")[len(before):]
        if new.count("client disconnected") >= 3:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    new = slow_server.log_path.read_text(errors="replace")[len(before):]
    lines = [line for line in new.splitlines() if line.strip()]
    assert len(lines) == 3 and all("client disconnected: POST /v1/execute" in line for line in lines), new
    assert "Traceback" not in new


@pytest.mark.parametrize("method, path, allow", [
    ("OPTIONS", "/v1/environments", "GET, POST"),
    ("PUT", "/v1/envs", "GET, POST"),
    ("PATCH", "/v1/envs/env_x", "DELETE, GET"),
    ("PUT", "/v1/admin/tenants/t", "GET, PATCH"),
    ("POST", "/v1/envs/env_x/state", "GET"),
])
def test_405_allow_lists_every_method_of_the_path(api: httpx.Client, method: str, path: str, allow: str) -> None:
    """RFC 9110: a 405's Allow lists the resource's methods (Starlette listed only those
    of the first route matching the path)."""
    response = api.request(method, path)
    assert response.status_code == 405 and response.headers["allow"] == allow
    ErrorBody.model_validate(response.json())
