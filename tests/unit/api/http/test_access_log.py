"""The access log middleware (``sandpit.api.http.access_log``) on the edges a real server
rarely shows: an exception no handler took, a client gone before any response, a logger
below INFO, hostile request paths. The whole app's lines are tested over HTTP in
``tests/integration/api/test_access_log.py``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sandpit.api.http.access_log import AccessLog, note_route, note_tenant, template
from starlette.types import Message, Receive, Scope, Send


def http_scope(path: str = "/v1/envs/abc/step", method: str = "POST", **extra: Any) -> Scope:
    return {"type": "http", "method": method, "path": path, "query_string": b"api_key=secret", "headers": [
        (b"authorization", b"Bearer sk-secret")], **extra}


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def run(app: Any, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(AccessLog(app)(scope, receive, send))
    return sent


async def answers_201(scope: Scope, _receive: Receive, send: Send) -> None:
    note_route(scope, "/v1/envs/{env_id}/step")
    note_tenant(scope, "acme")
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "sandpit.access"]


def test_one_line_with_the_template_status_and_tenant(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sandpit.access")
    sent = run(answers_201, http_scope())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    [line] = lines(caplog)
    method, path, status, ms, tenant = line.split(" ")
    assert (method, path, status, tenant) == ("POST", "/v1/envs/{env_id}/step", "201", "tenant=acme")
    assert ms.endswith("ms") and float(ms[:-2]) >= 0
    assert "secret" not in line


def test_an_exception_no_handler_took_is_a_500_line_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sandpit.access")

    async def broken(_scope: Scope, _receive: Receive, _send: Send) -> None:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        run(broken, http_scope("/healthz", "GET"))
    assert [line.split(" ")[:3] for line in lines(caplog)] == [["GET", "-", "500"]]


def test_a_client_gone_before_any_response_has_no_status(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sandpit.access")

    async def silent(_scope: Scope, _receive: Receive, _send: Send) -> None:
        return None

    run(silent, http_scope())
    assert [line.split(" ")[2] for line in lines(caplog)] == ["-"]


def test_below_info_nothing_is_written_and_send_is_not_wrapped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sandpit.access")
    seen: list[Send] = []

    async def app(scope: Scope, _receive: Receive, send: Send) -> None:
        seen.append(send)
        await answers_201(scope, _receive, send)

    async def send(_message: Message) -> None:
        return None

    asyncio.run(AccessLog(app)(http_scope(), receive, send))
    assert seen == [send] and lines(caplog) == []


@pytest.mark.parametrize("path", ["/v1/envs/x\nFAKE 200 1.00ms tenant=root/step", "/\x1b[31mred", "/" + "a" * 10000,
                                  "/v1/envs/%0a/step"])
def test_a_raw_path_never_reaches_the_line(path: str, caplog: pytest.LogCaptureFixture) -> None:
    """No route matched: the line says ``-`` (a raw path is text the client chose)."""
    caplog.set_level(logging.INFO, logger="sandpit.access")

    async def not_found(_scope: Scope, _receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    run(not_found, http_scope(path, "GET"))
    assert lines(caplog) == [lines(caplog)[0]] and lines(caplog)[0].split(" ")[1] == "-"
    assert "\n" not in lines(caplog)[0] and "\x1b" not in lines(caplog)[0]


def test_template_prefers_the_routers_route() -> None:
    class Route:
        path = "/v1/envs/{env_id}"

    scope = http_scope()
    assert template(scope) == "-"
    note_route(scope, "/v1/envs/{env_id}/step")
    assert template(scope) == "/v1/envs/{env_id}/step"
    scope["route"] = Route()
    assert template(scope) == "/v1/envs/{env_id}"
    scope["route"] = object()  # a route without a string path: the noted one
    assert template(scope) == "/v1/envs/{env_id}/step"


def test_other_scopes_pass_through(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sandpit.access")
    called: list[str] = []

    async def app(scope: Scope, _receive: Receive, _send: Send) -> None:
        called.append(scope["type"])

    async def send(_message: Message) -> None:
        return None

    asyncio.run(AccessLog(app)({"type": "lifespan"}, receive, send))
    assert called == ["lifespan"] and lines(caplog) == []
