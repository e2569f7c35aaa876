"""The access log of a real ``sandpit serve`` (``--log-level info``): one line per request
with the method, the route's path template, the status, the duration and the tenant, for
both the lean step path and FastAPI's router; never a key or a query string; off with
``SANDPIT_ACCESS_LOG=false``."""

from __future__ import annotations

import re
import secrets
import time

import httpx
import pytest
from api_server import COUNTER_SOURCE, ApiServer
from sandpit.client import Client

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}|-) "
                  r"(?P<ms>\d+\.\d\d)ms tenant=(?P<tenant>\S+)$")
SECRET = "sk-never-log-this-" + secrets.token_hex(8)


def access_lines(server: ApiServer, after: int = 0) -> list[dict[str, str]]:
    """Access log lines of ``server`` (its stdout and stderr file) from byte ``after`` on."""
    return parsed(server.log_path.read_bytes()[after:])


def parsed(data: bytes) -> list[dict[str, str]]:
    """The access log lines in ``data`` (bytes of the log)."""
    return [match.groupdict() for line in data.decode(errors="replace").splitlines() if (match := LINE.match(line))]


def wait_for(server: ApiServer, after: int, count: int, timeout_s: float = 10.0) -> list[dict[str, str]]:
    """At least ``count`` access lines after byte ``after`` (the line follows the response)."""
    deadline = time.monotonic() + timeout_s
    while len(lines := access_lines(server, after)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return lines


def end_after(server: ApiServer, method: str, path: str, status: str, timeout_s: float = 10.0) -> int:
    """The log's size in bytes once the line of a ``method path status`` request is in it:
    a line follows its response, so a client can hold the response before the line exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = server.log_path.read_bytes()  # one read: the line's presence and the size agree
        if any((line["method"], line["path"], line["status"]) == (method, path, status) for line in parsed(data)):
            return len(data)
        time.sleep(0.05)
    raise AssertionError(f"no access line for {method} {path} {status} within {timeout_s} s")


def test_one_line_per_request_with_template_status_duration_and_tenant(make_server) -> None:
    server = make_server(SANDPIT_LOG_LEVEL="info")
    with server.client() as api:
        environment = api.post("/v1/environments", json={"source_code": COUNTER_SOURCE, "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        env = api.post("/v1/envs", json={"environment_id": environment.json()["id"]})
        assert env.status_code == 201, env.text
        env_id = env.json()["id"]
        start = end_after(server, "POST", "/v1/envs", "201")
        sent = [
            ("GET", "/healthz", None, {}, 200),
            ("GET", "/v1/envs/env_doesnotexist", None, {}, 404),
            ("GET", "/v1/no/such/route", None, {}, 404),
            ("POST", "/v1/environments", {"source_code": 5}, {}, 422),
            ("POST", f"/v1/envs/{env_id}/step", {"name": "bump", "arguments": {"by": 2}}, {}, 200),  # the step door
            ("POST", f"/v1/envs/{env_id}/step?include=state&token={SECRET}", {"name": "bump"}, {}, 200),
            ("POST", f"/v1/envs/{env_id}/step", {"name": "bump", "bogus": 1}, {}, 422),  # the door's 422
            ("GET", f"/v1/envs/{env_id}/state?api_key={SECRET}", None, {}, 200),
            ("GET", "/v1/envs", None, {"Authorization": f"Bearer {SECRET}"}, 401),
        ]
        for method, path, body, headers, status in sent:
            response = api.request(method, path, json=body, headers=headers)
            assert response.status_code == status, (path, response.text)

    lines = wait_for(server, start, len(sent))
    assert [(line["method"], line["path"], line["status"], line["tenant"]) for line in lines] == [
        ("GET", "/healthz", "200", "-"),
        ("GET", "/v1/envs/{env_id}", "404", "default"),
        ("GET", "-", "404", "-"),
        ("POST", "/v1/environments", "422", "default"),
        ("POST", "/v1/envs/{env_id}/step", "200", "default"),
        ("POST", "/v1/envs/{env_id}/step", "200", "default"),
        ("POST", "/v1/envs/{env_id}/step", "422", "default"),
        ("GET", "/v1/envs/{env_id}/state", "200", "default"),
        ("GET", "/v1/envs", "401", "-"),
    ]
    assert all(0 < float(line["ms"]) < 60_000 for line in lines)
    log = server.log_path.read_text(errors="replace")
    for secret in (SECRET, server.api_key, server.operator_key, env_id):
        assert secret not in log, "a key, a query string or a raw path reached the log"

    # the Python client's steps (what a trainer sends) are lines too, at the step route's template
    start = server.log_path.stat().st_size
    with Client(server.url, api_key=server.api_key) as client:
        for _ in range(3):
            assert client.envs.get(env_id).step("bump", by=1).status == "ok"
    steps = [line for line in wait_for(server, start, 6) if line["path"] == "/v1/envs/{env_id}/step"]
    assert [(line["method"], line["status"], line["tenant"]) for line in steps] == [("POST", "200", "default")] * 3


def test_the_setting_turns_the_access_log_off(make_server) -> None:
    server = make_server(SANDPIT_LOG_LEVEL="info", SANDPIT_ACCESS_LOG="false")
    with server.client() as api:
        for path in ("/healthz", "/v1/envs", "/v1/no/such/route"):
            api.get(path)
    time.sleep(1.0)
    assert access_lines(server) == []
    assert "Application startup complete" in server.log_tail(), "the log level is info: uvicorn's lines are there"


def test_no_access_log_below_info(make_server) -> None:
    """``sandpit serve``'s default level (warning) writes no access lines."""
    server = make_server()
    httpx.get(f"{server.url}/healthz", timeout=10)
    time.sleep(0.5)
    assert access_lines(server) == []
