"""The env create's door (:mod:`sandpit.api.http.create_env`): every ``POST /v1/envs``,
hostile ones included, gets exactly the answer FastAPI's route ``create_env`` gives it
(status, headers and body bytes, ids and times aside; the access log's line), and the
door is what answers; other methods and paths stay with FastAPI. The whole app over the
executor's fake, through httpx's ASGI transport: one app with the door, one with it
taken away, each sent the same requests in the same order."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fakes import (
    OPERATOR,
    SOURCE,
    AccessLines,
    DoorSpy,
    IdNames,
    Stepper,
    door_and_route,
    fake_app,
    send_case,
    tenant_environment,
    with_app,
)
from sandpit.api.http import create_env
from sandpit.api.services.idempotency import request_digest
from sandpit.executor.errors import CapacityError

DEEP = "[" * 70 + "]" * 70
EPISODE = '"episode": {"max_steps": 7, "termination_action": "finish"}'
REGISTERED = '{"environment_id": "<env>", ' + EPISODE + "}"
INLINE = json.dumps({"source_code": SOURCE, "class_name": "Counter", "init_config": {"count": 3}})
# (name, query, body with <env> (team-a's environment), <scn> (its scenario), <b-env> (team-b's
# environment), extra headers ("who": the tenant whose key is sent; "claim": the key is taken
# first by a request still in flight), status); sent in this order
CASES: list[tuple[str, str, str | bytes, dict[str, str], int]] = [
    ("registered", "", REGISTERED, {}, 201),
    ("registered, defaults", "", '{"environment_id": "<env>"}', {}, 201),
    ("inline source", "", INLINE, {}, 201),
    ("scenario", "", '{"scenario_id": "<scn>"}', {}, 201),
    ("scenario with its own init_config", "", '{"scenario_id": "<scn>", "init_config": {"count": 9}}', {}, 201),
    ("profile, seed, argument checking", "", '{"environment_id": "<env>", "seed": 7, "argument_checking": "off", '
     '"profile": {"memory_mib": 128}}', {}, 201),
    ("a query is ignored", "?x=1", REGISTERED, {}, 201),
    ("a +json type", "", REGISTERED, {"content-type": "application/vnd.api+json; charset=utf-8"}, 201),
    ("unknown environment", "", '{"environment_id": "env_nope"}', {}, 404),
    ("unknown scenario", "", '{"scenario_id": "scn_nope"}', {}, 404),
    ("another tenant's environment", "", '{"environment_id": "<b-env>"}', {}, 404),
    ("init fails", "", '{"environment_id": "<env>", "init_config": {"explode": true}}', {}, 422),
    ("profile above the operator's", "", '{"environment_id": "<env>", "profile": {"memory_mib": 999999}}', {}, 422),
    ("no source", "", "{}", {}, 422),
    ("two sources", "", '{"environment_id": "<env>", "scenario_id": "<scn>"}', {}, 422),
    ("class_name without source", "", '{"environment_id": "<env>", "class_name": "Counter"}', {}, 422),
    ("an unknown field", "", '{"environment_id": "<env>", "extra": 1}', {}, 422),
    ("a wrong type", "", '{"environment_id": 5}', {}, 422),
    ("a wrong nested type", "", '{"environment_id": "<env>", "episode": {"max_steps": "many"}}', {}, 422),
    ("init_config not an object", "", '{"environment_id": "<env>", "init_config": [1]}', {}, 422),
    ("empty", "", "", {}, 422),
    ("null", "", "null", {}, 422),
    ("a list", "", "[1]", {}, 422),
    ("bad JSON", "", '{"environment_id": ', {}, 422),
    ("NaN", "", '{"environment_id": "<env>", "seed": NaN}', {}, 422),
    ("Infinity", "", '{"environment_id": "<env>", "init_config": {"x": -Infinity}}', {}, 422),
    ("trailing data", "", REGISTERED + " x", {}, 422),
    ("two documents", "", REGISTERED + REGISTERED, {}, 422),
    ("not UTF-8", "", b'{"environment_id": "\xff"}', {}, 422),
    ("a lone surrogate", "", '{"environment_id": "<env>", "init_config": {"k": "\\udfff"}}', {}, 422),
    ("too deep", "", '{"environment_id": "<env>", "init_config": {"x": ' + DEEP + "}}", {}, 422),
    ("text/plain is not JSON", "", REGISTERED, {"content-type": "text/plain"}, 422),
    ("no content type", "", REGISTERED, {"content-type": ""}, 422),
    ("form content type", "", "environment_id=x", {"content-type": "application/x-www-form-urlencoded"}, 422),
    ("no key", "", REGISTERED, {"authorization": ""}, 401),
    ("not a bearer key", "", REGISTERED, {"authorization": "Basic dXNlcjpwYXNz"}, 401),
    ("an unknown key", "", REGISTERED, {"authorization": "Bearer not-a-key"}, 401),
    ("the operator key", "", REGISTERED, {"authorization": f"Bearer {OPERATOR}"}, 403),
    ("the key before the body's shape", "", "{}", {"authorization": "Bearer x"}, 401),
    ("strict JSON before the key", "", '{"seed": NaN}', {"authorization": "Bearer x"}, 422),
    ("quota: max_live_envs", "", REGISTERED, {"who": "team-q"}, 429),
    ("quota: init_config bytes", "", '{"environment_id": "<q-env>", "init_config": {"p": "' + "x" * 2000 + '"}}',
     {"who": "team-r"}, 429),
    ("quota: code bytes", "", json.dumps({"source_code": SOURCE + "#" * 2000, "class_name": "Counter"}),
     {"who": "team-r"}, 429),
    ("idempotent: first", "", REGISTERED, {"idempotency-key": "k-1"}, 201),
    ("idempotent: replay", "", REGISTERED, {"idempotency-key": "k-1"}, 201),
    ("idempotent: replay with a query", "?q=1", REGISTERED, {"idempotency-key": "k-1"}, 409),
    ("idempotent: another body", "", REGISTERED.replace("7", "8"), {"idempotency-key": "k-1"}, 409),
    ("idempotent: another tenant's key", "", '{"environment_id": "<b-env>"}', {"idempotency-key": "k-1",
                                                                               "who": "team-b"}, 201),
    ("idempotent: an error is not stored", "", '{"environment_id": "env_nope"}', {"idempotency-key": "k-2"}, 404),
    ("idempotent: its retry runs again", "", '{"environment_id": "env_nope"}', {"idempotency-key": "k-2"}, 404),
    ("idempotent: in flight", "", REGISTERED, {"idempotency-key": "k-3", "claim": "yes"}, 409),
    ("idempotent: a space is a key", "", REGISTERED, {"idempotency-key": " "}, 201),
    ("idempotent: empty key", "", REGISTERED, {"idempotency-key": ""}, 422),
    ("idempotent: key too long", "", REGISTERED, {"idempotency-key": "k" * 256}, 422),
    ("idempotent: key not ASCII", "", REGISTERED, {"idempotency-key": "clé"}, 422),
    ("idempotent: key and body both bad", "", '{"extra": 1}', {"idempotency-key": ""}, 422),
    ("idempotent: bad key, no API key", "", REGISTERED, {"idempotency-key": "", "authorization": ""}, 401),
    ("idempotent: bad key, bad JSON", "", "{", {"idempotency-key": ""}, 422),
    ("idempotent: a key on a 422 body", "", "{}", {"idempotency-key": "k-4"}, 422),
]
async def _run_cases(stepper: Stepper, log: AccessLines) -> dict[str, Any]:
    """Every case of :data:`CASES`, in order (:func:`api_fakes.send_case`)."""
    b_env = await tenant_environment(stepper, "team-b")
    await tenant_environment(stepper, "team-q", max_live_envs=0)
    r_env = await tenant_environment(stepper, "team-r", max_init_config_bytes=1024, max_code_bytes=1024)
    scenario = await stepper.client.post("/v1/scenarios", headers=stepper.keys["team-a"], json={
        "environment_id": stepper.environment_id, "task": "count", "init_config": {"count": 5}})
    assert scenario.status_code == 201, scenario.text
    names = {"<env>": stepper.environment_id, "<scn>": scenario.json()["id"], "<b-env>": b_env, "<q-env>": r_env}
    ids = IdNames()
    out: dict[str, Any] = {}
    for name, query, body, headers, _ in CASES:
        out[name] = await send_case(stepper, log, ids, f"/v1/envs{query}", body, headers, names, lambda sent, q=query:
                                    request_digest("POST", "/v1/envs", None, q[1:].encode(), sent))
    rejections = stepper.app.state.metrics.registry.get_sample_value
    out["429s counted"] = tuple(rejections("sandpit_quota_rejections_total", {"limit": limit})
                                for limit in ("max_live_envs", "max_init_config_bytes", "max_code_bytes"))
    return out


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case of :data:`CASES` through the door and through FastAPI's route (in an
    app with the door taken away), the access log at INFO."""
    return door_and_route(tmp_path_factory.mktemp, "create_door", create_env.CreateDoor, _run_cases)


@pytest.mark.parametrize(("name", "status"), [(c[0], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_door_answers_as_the_route(answers: dict[str, dict[str, Any]], name: str, status: int) -> None:
    assert answers["door"][name] == answers["route"][name]
    assert answers["door"][name][0] == status, answers["door"][name]


def test_429s_are_counted(answers: dict[str, dict[str, Any]]) -> None:
    """Each 429 on ``sandpit_quota_rejections_total`` by its limit, as the route's handler counts it."""
    assert answers["door"]["429s counted"] == answers["route"]["429s counted"] == (1.0, 1.0, 1.0)


def test_what_the_answers_say(answers: dict[str, dict[str, Any]]) -> None:
    """Spot checks that the compared answers are the ones the API documents."""
    door = {}
    for name, *_ in CASES:
        status, headers, body, lines = answers["door"][name]
        door[name] = (status, dict(headers), json.loads(body), lines)
    created = door["registered"][2]
    assert created["id"].startswith("<id") and created["environment_id"].startswith("<id") and created["step"] == 0
    assert door["scenario"][2]["init_config"] == {"count": 5}
    assert door["scenario with its own init_config"][2]["init_config"] == {"count": 9}
    assert door["inline source"][2]["init_config"] == {"count": 3}
    assert door["registered"][3] == [("POST", "/v1/envs", 201, "team-a")]
    assert door["no key"][3] == [("POST", "/v1/envs", 401, "-")]
    assert door["idempotent: replay"][1]["idempotent-replayed"] == "true"
    assert door["idempotent: replay"][2] == door["idempotent: first"][2]
    assert "idempotent-replayed" not in door["idempotent: first"][1]
    assert door["idempotent: another body"][2]["error"]["code"] == "idempotency_key_reused"
    assert door["idempotent: in flight"][2]["error"]["code"] == "idempotency_key_in_flight"
    assert door["idempotent: in flight"][1]["retry-after"] == "1"
    assert door["idempotent: its retry runs again"][2]["error"]["code"] == "not_found"
    assert door["idempotent: empty key"][2]["error"]["field"] == "Idempotency-Key"
    assert door["idempotent: key and body both bad"][2]["error"]["message"].endswith("(and 1 more problem(s))")
    assert door["an unknown field"][2]["error"]["field"] == "extra"
    assert door["the operator key"][2]["error"]["code"] == "forbidden"
    assert "NaN" in door["strict JSON before the key"][2]["error"]["message"]
    assert door["quota: max_live_envs"][2]["error"]["code"] == "quota_exceeded"


def test_the_door_answers_creates_only(tmp_path: Path) -> None:
    """The door (not FastAPI) answers ``POST /v1/envs``, also behind a root path; the
    list (``GET /v1/envs``), other methods and other paths stay FastAPI's."""
    seen: dict[str, Any] = {}

    async def test(stepper: Stepper) -> None:
        spy = stepper.app.create_door = DoorSpy(stepper.app.create_door)
        body = '{"environment_id": "' + stepper.environment_id + '"}'
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}
        seen["plain"] = await stepper.client.post("/v1/envs", headers=headers, content=body)
        prefixed = httpx.ASGITransport(app=stepper.app, root_path="/prefix")
        async with httpx.AsyncClient(transport=prefixed, base_url="http://sandpit") as client:
            seen["root path"] = await client.post("/prefix/v1/envs", headers=headers, content=body)
        seen["list"] = await stepper.client.get("/v1/envs", headers=headers)
        seen["put"] = await stepper.client.put("/v1/envs", headers=headers, content=body)
        seen["slash"] = await stepper.client.post("/v1/envs/", headers=headers, content=body)
        seen["step"] = await stepper.post('{"name": "bump"}')
        seen["paths"] = spy.paths
        stepper.app.create_door = spy.door

    with_app(tmp_path, test)
    assert seen["plain"].status_code == 201 and seen["root path"].status_code == 201, seen["root path"].text
    assert seen["paths"] == ["/v1/envs", "/prefix/v1/envs"]
    assert seen["list"].status_code == 200 and seen["list"].json()["count"] == 3
    assert seen["put"].status_code == 405 and seen["put"].headers["allow"] == "GET, POST"
    assert seen["slash"].status_code == 307 and seen["slash"].headers["location"].endswith("/v1/envs")
    assert seen["step"].status_code == 200


def test_bodies_over_the_cap_are_413(tmp_path: Path) -> None:
    """A declared length over ``max_body_bytes`` (with ``Connection: close``) and a body
    read over it: 413, through the door as through the route."""
    seen: dict[str, list[httpx.Response]] = {"door": [], "route": []}

    async def test(stepper: Stepper) -> None:
        big = '{"environment_id": "' + stepper.environment_id + '", "init_config": {"p": "' + "x" * 3000 + '"}}'
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}

        async def chunks() -> Any:  # no Content-Length: read, then refused
            yield big.encode()

        door = stepper.app.create_door
        for way in ("door", "route"):
            stepper.app.create_door = door if way == "door" else None
            seen[way].append(await stepper.client.post("/v1/envs", headers=headers, content=big))
            seen[way].append(await stepper.client.post("/v1/envs", headers=headers, content=chunks()))
        stepper.app.create_door = door

    with_app(tmp_path, test, max_body_bytes=2048)
    for way in ("door", "route"):
        assert [r.status_code for r in seen[way]] == [413, 413]
        assert all(r.json()["error"]["code"] == "payload_too_large" for r in seen[way])
    assert [(r.headers.raw, r.content) for r in seen["door"]] == [(r.headers.raw, r.content) for r in seen["route"]]
    assert seen["door"][0].headers["connection"] == "close"


@pytest.mark.parametrize("failure", ["bug", "executor"])
def test_failures_of_the_create(tmp_path: Path, failure: str) -> None:
    """A bug in the create is the catch-all 500 ``internal``; an executor error that
    escapes the adapter is translated (503 with ``Retry-After``), as the app's handlers
    answer them on the route; no key stays claimed."""
    seen: dict[str, list[httpx.Response]] = {"door": [], "route": []}

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug") if failure == "bug" else CapacityError("no sandbox")

    async def test(stepper: Stepper) -> None:
        stepper.app.state.envs.create = broken
        body = '{"environment_id": "' + stepper.environment_id + '"}'
        door = stepper.app.create_door
        for way in ("door", "route"):
            stepper.app.create_door = door if way == "door" else None
            for _ in range(2):  # the second runs again: the key was released
                seen[way].append(await stepper.client.post("/v1/envs", content=body, headers={
                    "content-type": "application/json", "idempotency-key": f"{way}-k", **stepper.keys["team-a"]}))
        stepper.app.create_door = door

    with_app(tmp_path, test, raise_app_exceptions=False)
    status = 500 if failure == "bug" else 503
    assert [r.status_code for r in seen["door"]] == [status, status]
    assert [(r.status_code, r.headers.raw, r.content) for r in seen["door"]] == \
        [(r.status_code, r.headers.raw, r.content) for r in seen["route"]]


def _stalled(app: Any) -> tuple[int, dict[bytes, bytes], bytes]:
    """A create whose body stops arriving halfway, sent raw to ``app``: the response."""
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": b'{"environment_id": "en', "more_body": True}]

    async def main() -> None:
        async with app.router.lifespan_context(app):
            async def receive() -> dict[str, Any]:
                if chunks:
                    return chunks.pop(0)
                await asyncio.sleep(30)
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            await asyncio.wait_for(app({
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                "scheme": "http", "path": "/v1/envs", "raw_path": b"/v1/envs", "root_path": "", "query_string": b"",
                "server": ("sandpit", 80), "client": ("127.0.0.1", 1), "headers": [
                    (b"content-type", b"application/json"), (b"content-length", b"100"),
                    (b"authorization", b"Bearer x")]}, receive, send), timeout=10)

    asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_a_stalled_body_is_408_and_the_connection_closes(tmp_path: Path) -> None:
    """A body not whole within ``body_read_timeout_s``: 408 with ``Connection: close``,
    through the door as through the route."""
    app = fake_app(tmp_path, body_read_timeout_s=0.3)
    door = _stalled(app)
    app.create_door = None
    route = _stalled(app)
    assert door[0] == 408 and door[1][b"connection"] == b"close" and b'"code":"request_timeout"' in door[2]
    assert door == route


def test_creates_run_on_the_doors_own_threads_and_end_with_the_app(tmp_path: Path) -> None:
    """A create runs on a ``sandpit-create`` thread (not a step thread, not AnyIO's);
    creates and steps sent together are all answered; the door's threads end when the
    app shuts down."""
    seen: dict[str, Any] = {"threads": set()}

    async def test(stepper: Stepper) -> None:
        envs = stepper.app.state.envs
        create = envs.create

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen["threads"].add(threading.current_thread().name)
            return create(*args, **kwargs)

        envs.create = spy
        body = '{"environment_id": "' + stepper.environment_id + '"}'
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}
        try:
            replies = await asyncio.gather(*[stepper.client.post("/v1/envs", headers=headers, content=body)
                                             for _ in range(4)], *[stepper.post('{"name": "bump"}') for _ in range(4)])
        finally:
            envs.create = create
        seen["statuses"] = [reply.status_code for reply in replies]

    with_app(tmp_path, test)
    assert seen["statuses"] == [201] * 4 + [200] * 4
    assert seen["threads"] and all(name.startswith("sandpit-create_") for name in seen["threads"]), seen["threads"]
    deadline = time.monotonic() + 5
    while any(thread.name.startswith("sandpit-create_") for thread in threading.enumerate()):
        assert time.monotonic() < deadline, "the create door's threads outlived the app"
        time.sleep(0.01)
