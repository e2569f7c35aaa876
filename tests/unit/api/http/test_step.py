"""The step door (:mod:`sandpit.api.http.step`): every ``POST /v1/envs/{env_id}/step``,
hostile ones included, is answered by the one handler, with the statuses, error codes and
field-naming messages of the rest of the app (the whole app over the executor's fake,
through httpx's ASGI transport, or raw ASGI where a client cannot send the request)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fakes import OPERATOR, Stepper, fake_app, with_app
from sandpit.api.envs.steps import Steps
from sandpit.api.http import step as door
from sandpit.executor.errors import CapacityError

SURROGATE = "a lone UTF-16 surrogate (\\ud800-\\udfff) is not valid Unicode"
NOT_AN_OBJECT = "Input should be a valid dictionary or object to extract fields from"
ONE_FORM = "Value error, give exactly one of name (+ arguments), function (an OpenAI tool call) or text"


DEEP = '{"name": "bump", "arguments": {"a": ' + "[" * 70 + "]" * 70 + "}}"
# (id, query, body, extra headers, status, error code or step status, field, text the message or observation holds)
CASES: list[tuple[str, str, str | bytes, dict[str, str], int, str, str | None, str]] = [
    ("plain", "", '{"name": "bump", "arguments": {"by": 2}}', {}, 200, "ok", None, "2"),
    ("null arguments", "", '{"name": "bump", "arguments": null}', {}, 200, "ok", None, "1"),
    ("tool call", "", '{"type": "function", "function": {"name": "bump", "arguments": "{\\"by\\": 5}"}}', {}, 200,
     "ok", None, "5"),
    ("raw text", "", '{"text": "<tool_call>{\\"name\\": \\"bump\\", \\"arguments\\": {}}</tool_call>"}', {}, 200,
     "ok", None, "1"),
    ("duplicate keys: the last counts", "", '{"name": "bump", "name": "fail", "arguments": {"message": "d"}}', {},
     200, "error", None, "ValueError: d"),
    ("a byte order mark", "", '\ufeff{"name": "bump"}', {}, 200, "ok", None, "1"),
    ("a paired surrogate", "", '{"name": "bump", "arguments": {"k": "\\ud83d\\ude00"}}', {}, 200, "error", None,
     "TypeError"),
    ("a long number is exact", "", '{"name": "bump", "arguments": {"by": 123456789012345678901234567890}}', {}, 200,
     "ok", None, "123456789012345678901234567890"),
    ("a malformed action is a recorded step", "", '{"name": "bump", "arguments": [1]}', {}, 200, "rejected", None,
     "Error: Failed to parse response to action"),
    ("a private name", "", '{"name": "_private"}', {}, 200, "rejected", None, "Error: Invalid action"),
    # the query
    ("include", "?include=state_diff,state", '{"name": "bump"}', {}, 200, "ok", None, "1"),
    ("an unknown include", "?include=bogus", '{"name": "bump"}', {}, 422, "invalid_request", "include",
     "include may name ['state', 'state_diff'], got ['bogus']"),
    ("the last include counts", "?include=state&include=bogus", '{"name": "bump"}', {}, 422, "invalid_request",
     "include", "got ['bogus']"),
    ("the last include counts (valid)", "?include=bogus&include=state", '{"name": "bump"}', {}, 200, "ok", None, "1"),
    ("include over 64 characters", "?include=" + "s" * 65, '{"name": "bump"}', {}, 422, "invalid_request",
     "include", "include: String should have at most 64 characters"),
    ("include first, then the body", "?include=" + "s" * 65, '{"name": "bump", "extra": 1}', {}, 422,
     "invalid_request", "include", "(and 1 more problem(s))"),
    ("include not UTF-8", "?include=%ff%fe", '{"name": "bump"}', {}, 422, "invalid_request", "include",
     "got ['\ufffd\ufffd']"),
    # bodies that are not strict JSON
    ("NaN", "", '{"name": "bump", "arguments": {"by": NaN}}', {}, 422, "invalid_request", None,
     "NaN is not valid JSON (numbers must be finite)"),
    ("-Infinity", "", '{"name": "bump", "arguments": {"by": -Infinity}}', {}, 422, "invalid_request", None,
     "-Infinity is not valid JSON"),
    ("a lone surrogate", "", '{"name": "bump", "arguments": {"k": ["a", "\\udfff"]}}', {}, 422, "invalid_request",
     "arguments.k.1", SURROGATE),
    ("a lone surrogate in a key", "", '{"name": "bump", "arguments": {"\\udfff": 1}}', {}, 422, "invalid_request",
     "arguments", SURROGATE),
    ("too deep", "", DEEP, {}, 422, "invalid_request", None, "JSON nested deeper than 64 levels"),
    ("brackets in a string are not depth", "", '{"name": "bump", "arguments": {"s": "' + "[" * 100 + '"}}', {}, 200,
     "error", None, "TypeError"),
    ("truncated", "", '{"name": ', {}, 422, "invalid_request", None, "body is not valid JSON: Expecting value"),
    ("trailing data", "", '{"name": "bump"} trailing', {}, 422, "invalid_request", None, "Extra data"),
    ("not UTF-8", "", b'{"name": "b\xffump"}', {}, 422, "invalid_request", None, "can't decode byte 0xff"),
    ("whitespace only", "", "   ", {}, 422, "invalid_request", None, "body is not valid JSON"),
    # bodies of the wrong shape
    ("empty", "", "", {}, 422, "invalid_request", None, "Field required"),
    ("null", "", "null", {}, 422, "invalid_request", None, NOT_AN_OBJECT),
    ("a list", "", "[1, 2]", {}, 422, "invalid_request", None, NOT_AN_OBJECT),
    ("a string", "", '"bump"', {}, 422, "invalid_request", None, NOT_AN_OBJECT),
    ("no form", "", "{}", {}, 422, "invalid_request", None, ONE_FORM),
    ("two forms", "", '{"name": "bump", "text": "hi"}', {}, 422, "invalid_request", None, ONE_FORM),
    ("an unknown field", "", '{"name": "bump", "extra": 1}', {}, 422, "invalid_request", "extra",
     "extra: Extra inputs are not permitted"),
    ("two unknown fields", "", '{"name": "bump", "extra": 1, "other": 2}', {}, 422, "invalid_request", "extra",
     "(and 1 more problem(s))"),
    ("a nested field", "", '{"type": "function", "function": {"name": 5}}', {}, 422, "invalid_request",
     "function.name", "function.name: Input should be a valid string"),
    ("a name over 1024", "", '{"name": "' + "n" * 1025 + '"}', {}, 422, "invalid_request", "name",
     "String should have at most 1024 characters"),
    ("arguments over the cap", "", '{"name": "bump", "arguments": {"pad": "' + "p" * 300_000 + '"}}', {}, 413,
     "payload_too_large", "arguments", "arguments over 262144 bytes"),
    # content types
    ("text/plain is not JSON", "", '{"name": "bump"}', {"content-type": "text/plain"}, 422, "invalid_request", None,
     NOT_AN_OBJECT),
    ("text/plain still parsed strictly", "", "not json", {"content-type": "text/plain"}, 422, "invalid_request", None,
     "body is not valid JSON"),
    ("JSON with a charset", "", '{"name": "bump"}', {"content-type": "application/json; charset=utf-8"}, 200, "ok",
     None, "1"),
    ("JSON in capitals", "", '{"name": "bump"}', {"content-type": "APPLICATION/JSON"}, 200, "ok", None, "1"),
    ("a +json type", "", '{"name": "bump"}', {"content-type": "application/vnd.api+json; x=1"}, 200, "ok", None, "1"),
    ("XML", "", '{"name": "bump"}', {"content-type": "application/xml"}, 422, "invalid_request", None, NOT_AN_OBJECT),
    ("a form", "", "name=bump", {"content-type": "application/x-www-form-urlencoded"}, 422, "invalid_request", None,
     "body is not valid JSON"),
    ("no content type", "", '{"name": "bump"}', {"content-type": ""}, 422, "invalid_request", None, NOT_AN_OBJECT),
    # keys
    ("an unknown key", "", '{"name": "bump"}', {"authorization": "Bearer not-a-key"}, 401, "unauthorized", None,
     "invalid API key"),
    ("no key", "", '{"name": "bump"}', {"authorization": ""}, 401, "unauthorized", None, "missing `Authorization"),
    ("not a bearer", "", '{"name": "bump"}', {"authorization": "Basic abc"}, 401, "unauthorized", None,
     "must be `Bearer <api key>`"),
    ("the operator key", "", '{"name": "bump"}', {"authorization": f"Bearer {OPERATOR}"}, 403, "forbidden", None,
     "only opens /v1/admin"),
    ("the key before the body's shape", "", '{"name": "bump", "extra": 1}', {"authorization": "Bearer x"}, 401,
     "unauthorized", None, "invalid API key"),
    ("strict JSON before the key", "", '{"by": NaN}', {"authorization": "Bearer x"}, 422, "invalid_request", None,
     "NaN is not valid JSON"),
]


@pytest.fixture(scope="module")
def replies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, httpx.Response]:
    """Every case of :data:`CASES`, each on an env of its own, in one app."""
    out: dict[str, httpx.Response] = {}

    async def test(stepper: Stepper) -> None:
        for name, query, body, headers, *_ in CASES:
            out[name] = await stepper.post(body, query, headers, env_id=await stepper.fresh_env())

    with_app(tmp_path_factory.mktemp("door"), test)
    return out


@pytest.mark.parametrize(("name", "status", "what", "field", "text"),
                         [(c[0], c[4], c[5], c[6], c[7]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_door_answers_every_request(replies: dict[str, httpx.Response], name: str, status: int, what: str,
                                        field: str | None, text: str) -> None:
    reply = replies[name]
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    if status == 200:
        assert body["status"] == what and text in body["observation"], body
        assert body["step"] == 1
    else:
        assert body["error"]["code"] == what and body["error"]["field"] == field, body
        assert text in body["error"]["message"], body
        assert set(body) == {"error"} and "connection" not in reply.headers  # the body was read whole


def test_include_adds_the_state_and_its_diff(replies: dict[str, httpx.Response]) -> None:
    body = replies["include"].json()
    assert body["state"]["count"] == 1 and body["state_diff"] == {"count": {"changed": {"old": 0, "new": 1}},
                                                                  "log": {"changed": {"old": [], "new": ["bump 1"]}}}
    assert replies["plain"].json()["state"] is None and replies["plain"].json()["state_diff"] is None


def test_unknown_and_other_tenants_envs_are_the_same_404(tmp_path: Path) -> None:
    seen: list[httpx.Response] = []

    async def test(stepper: Stepper) -> None:
        seen.append(await stepper.post('{"name": "bump"}', env_id="env_unknown"))
        seen.append(await stepper.post('{"name": "bump"}', who="team-b"))
        seen.append(await stepper.post('{"name": "bump"}', env_id="%ff"))

    with_app(tmp_path, test)
    assert [r.status_code for r in seen] == [404, 404, 404]
    assert seen[0].json()["error"] == {"code": "not_found", "message": "env 'env_unknown' not found", "field": None}
    assert "not found" in seen[1].json()["error"]["message"] and "team-a" not in seen[1].text


def test_repeated_headers_take_their_first_value(tmp_path: Path) -> None:
    seen: dict[str, httpx.Response] = {}

    async def test(stepper: Stepper) -> None:
        a, b = stepper.keys["team-a"]["authorization"], stepper.keys["team-b"]["authorization"]
        for name, headers in (("json first", [("content-type", "application/json"), ("content-type", "text/plain")]),
                              ("text first", [("content-type", "text/plain"), ("content-type", "application/json")]),
                              ("mine first", [("authorization", a), ("authorization", b)]),
                              ("theirs first", [("authorization", b), ("authorization", a)])):
            names = {n for n, _ in headers}
            base = [h for h in (("content-type", "application/json"), ("authorization", a)) if h[0] not in names]
            seen[name] = await stepper.client.post(f"/v1/envs/{await stepper.fresh_env()}/step",
                                                   headers=[*base, *headers], content=b'{"name": "bump"}')

    with_app(tmp_path, test)
    assert seen["json first"].status_code == 200 and seen["mine first"].status_code == 200
    assert seen["text first"].status_code == 422 and seen["text first"].json()["error"]["message"] == NOT_AN_OBJECT
    assert seen["theirs first"].status_code == 404


def test_a_chunked_body_is_read_whole(tmp_path: Path) -> None:
    seen: list[httpx.Response] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "bump", '
        yield b'"arguments": {"by": 4}}'

    async def test(stepper: Stepper) -> None:
        seen.append(await stepper.client.post(f"/v1/envs/{stepper.env_id}/step", content=chunks(),
                                              headers={"content-type": "application/json", **stepper.keys["team-a"]}))

    with_app(tmp_path, test)
    assert seen[0].status_code == 200 and seen[0].json()["observation"] == "4"


def asgi_call(app: Any, path: str, headers: list[tuple[bytes, bytes]], chunks: list[dict[str, Any]],
              stall_s: float = 30.0, **scope: Any) -> list[dict[str, Any]]:
    """One raw ASGI request to a running ``app``: ``chunks`` are the ``http.request``
    messages, then ``receive`` stalls for ``stall_s``; the messages sent back."""
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        async with app.router.lifespan_context(app):
            waiting = list(chunks)

            async def receive() -> dict[str, Any]:
                if waiting:
                    return waiting.pop(0)
                await asyncio.sleep(stall_s)
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            await asyncio.wait_for(app({
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                "server": ("sandpit", 80), "client": ("127.0.0.1", 1), "headers": headers, **scope}, receive, send),
                timeout=10)

    asyncio.run(main())
    return sent


def start_of(sent: list[dict[str, Any]]) -> tuple[int, dict[bytes, bytes], bytes]:
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def test_a_stalled_body_is_408_and_the_connection_closes(tmp_path: Path) -> None:
    app = fake_app(tmp_path, body_read_timeout_s=0.3)
    sent = asgi_call(app, "/v1/envs/env_x/step", [(b"content-type", b"application/json"),
                                                  (b"content-length", b"100"), (b"authorization", b"Bearer x")],
                     [{"type": "http.request", "body": b'{"name": "bu', "more_body": True}])
    status, headers, body = start_of(sent)
    assert status == 408 and headers[b"connection"] == b"close"
    assert b'"code":"request_timeout"' in body


def test_bodies_over_the_cap_are_413(tmp_path: Path) -> None:
    """Declared too large: 413 before the body is read (so the connection closes) and
    before the key is checked; sent too large without a length: 413 once read."""
    app = fake_app(tmp_path, max_body_bytes=2048)
    big = b'{"name": "bump", "arguments": {"p": "' + b"x" * 3000 + b'"}}'
    json_type = (b"content-type", b"application/json")
    declared = asgi_call(app, "/v1/envs/env_x/step", [json_type, (b"content-length", str(len(big)).encode())],
                         [{"type": "http.request", "body": big, "more_body": False}])
    streamed = asgi_call(app, "/v1/envs/env_x/step", [json_type, (b"authorization", b"Bearer x")],
                         [{"type": "http.request", "body": big[:1500], "more_body": True},
                          {"type": "http.request", "body": big[1500:], "more_body": False}])
    for sent, closes in ((declared, True), (streamed, False)):
        status, headers, body = start_of(sent)
        assert status == 413 and (b"connection" in headers) is closes
        assert b'"message":"request body over 2048 bytes"' in body


def test_a_client_gone_while_sending_is_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = fake_app(tmp_path)
    with caplog.at_level(logging.WARNING, logger="sandpit.api"):
        sent = asgi_call(app, "/v1/envs/env_x/step", [(b"content-type", b"application/json")],
                         [{"type": "http.request", "body": b'{"na', "more_body": True}, {"type": "http.disconnect"}])
    assert sent == []
    assert [r.getMessage() for r in caplog.records if "client disconnected" in r.getMessage()] == [
        "client disconnected: POST /v1/envs/env_x/step from 127.0.0.1:1 after 4 byte(s) of the request body"]


def test_behind_a_root_path_and_through_the_router_it_is_the_same_door(tmp_path: Path) -> None:
    """A step under the app's ``root_path`` is matched as the router matches it; a step that
    reaches the router (here: the route's own ASGI app) is the door's too; other methods
    get the router's 405."""
    seen: dict[str, Any] = {}

    async def test(stepper: Stepper) -> None:
        prefixed = httpx.ASGITransport(app=stepper.app, root_path="/prefix")
        async with httpx.AsyncClient(transport=prefixed, base_url="http://sandpit") as client:
            seen["root path"] = await client.post(f"/prefix/v1/envs/{stepper.env_id}/step", content=b'{"name": "bump"}',
                                                  headers={"content-type": "application/json", **stepper.keys["team-a"]})
        seen["get"] = await stepper.client.get(f"/v1/envs/{stepper.env_id}/step", headers=stepper.keys["team-a"])
        route = door.router.routes[0]
        assert isinstance(route, door.StepRoute)
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b'{"name": "bump", "arguments": {"by": 3}}', "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        key = stepper.keys["team-a"]["authorization"].encode()
        await route.handle({"type": "http", "method": "POST", "path": f"/v1/envs/{stepper.env_id}/step",
                            "path_params": {"env_id": stepper.env_id}, "query_string": b"", "app": stepper.app,
                            "headers": [(b"content-type", b"application/json"), (b"authorization", key)]},
                           receive, send)
        seen["router"] = start_of(sent)

    with_app(tmp_path, test)
    assert seen["root path"].status_code == 200 and seen["root path"].json()["observation"] == "1"
    assert seen["get"].status_code == 405 and seen["get"].headers["allow"] == "POST"
    status, _, body = seen["router"]
    assert status == 200 and b'"observation":"4"' in body  # 1 (the root path's step) + 3


def test_quota_rejections_and_phases_are_counted(tmp_path: Path) -> None:
    metrics: list[str] = []

    async def test(stepper: Stepper) -> None:
        await stepper.client.patch("/v1/admin/tenants/team-a", json={"quotas": {"steps_per_minute": 1, "step_burst": 2}},
                                   headers={"Authorization": f"Bearer {OPERATOR}"})
        replies = [await stepper.post('{"name": "bump"}') for _ in range(3)]
        assert [r.status_code for r in replies] == [200, 200, 429]
        assert replies[2].json()["error"]["limit"] == "steps_per_minute" and "retry-after" in replies[2].headers
        metrics.append((await stepper.client.get("/metrics")).text)

    with_app(tmp_path, test)
    text = metrics[0]
    assert 'sandpit_quota_rejections_total{limit="steps_per_minute"} 1.0' in text
    assert "sandpit_step_phase_steps_total 2.0" in text  # the 429 is no step
    for phase in ("parse", "auth", "sandbox", "persist", "serialize", "other"):
        value = re.search(rf'sandpit_step_phase_wall_seconds_total{{phase="{phase}"}} (\S+)', text)
        assert value is not None and float(value.group(1)) > 0, phase


def test_an_executor_error_is_translated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_args: Any, **_kwargs: Any) -> Any:
        raise CapacityError("no sandbox left")

    monkeypatch.setattr(Steps, "work", full)
    seen: list[httpx.Response] = []

    async def test(stepper: Stepper) -> None:
        seen.append(await stepper.post('{"name": "bump"}'))

    with_app(tmp_path, test, capacity_retry_after_s=7)
    assert seen[0].status_code == 503 and seen[0].headers["retry-after"] == "7"
    assert seen[0].json()["error"]["code"] == "no_capacity"


def fail_once(function: Any) -> Any:
    """``function``, raising a RuntimeError (a bug) on its first call only."""
    calls: list[int] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return function(*args, **kwargs)

    return broken


@pytest.mark.parametrize("where", ["step", "shape"])
def test_a_bug_is_the_catch_all_500_and_the_server_goes_on(tmp_path: Path, where: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug raised while stepping or while the door reads the request is answered 500
    ``internal`` with the catch-all handler's JSON body; the next step is served."""
    if where == "step":
        monkeypatch.setattr(Steps, "work", fail_once(Steps.work))
    else:
        monkeypatch.setattr(door, "_shape", fail_once(door._shape))
    seen: list[httpx.Response] = []

    async def test(stepper: Stepper) -> None:
        for _ in range(2):
            seen.append(await stepper.post('{"name": "bump"}'))

    with_app(tmp_path, test, raise_app_exceptions=False)
    assert [reply.status_code for reply in seen] == [500, 200], seen[-1].text
    assert seen[0].json() == {"error": {"code": "internal", "message": "internal error (logged)", "field": None}}


def test_an_ended_episode_is_409(tmp_path: Path) -> None:
    seen: list[httpx.Response] = []

    async def test(stepper: Stepper) -> None:
        seen.append(await stepper.post('{"name": "finish"}'))
        seen.append(await stepper.post('{"name": "bump"}'))
        seen.append(await stepper.post('{"name": "bump", "extra": 1}'))

    with_app(tmp_path, test)
    assert seen[0].status_code == 200 and seen[0].json()["terminated"] is True
    assert seen[1].status_code == 409 and seen[1].json()["error"]["code"] == "episode_ended"
    assert seen[2].status_code == 422  # the request's shape before the episode's state
