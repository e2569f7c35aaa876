"""The batched step's door (:mod:`sandpit.api.http.batch_step`): every ``POST
/v1/envs:step``, hostile ones included, gets exactly the answer FastAPI's route gives it
(the same app with the door taken away), and the door is what answers (the whole app
over the executor's fake, through httpx's ASGI transport)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fakes import OPERATOR, DoorSpy, Stepper, with_app
from sandpit.api.http import batch_step

BATCH = batch_step.BATCH_TEMPLATE
DEEP = "[" * 70 + "]" * 70
STEP = '{"env_id": "<a>", "action": {"name": "bump", "arguments": {"by": 2}}}'
TWO = '{"steps": [' + STEP + ', {"env_id": "<b>", "action": {"name": "bump"}}]}'
# (id, query, body with <a>/<b> for two fresh envs of team-a, extra headers, status)
CASES: list[tuple[str, str, str | bytes, dict[str, str], int]] = [
    ("two envs", "", TWO, {}, 200),
    ("include", "", TWO[:-1] + ', "include": "state,state_diff"}', {}, 200),
    ("a query is ignored", "?include=bogus", TWO, {}, 200),
    ("per-step refusals", "", '{"steps": [{"env_id": "env_unknown", "action": {"name": "bump"}}, '
     '{"env_id": "<a>", "action": {"name": "bump", "arguments": [1]}}, {"env_id": "<b>", "action": '
     '{"name": "_private"}}]}', {}, 200),
    ("an env twice", "", '{"steps": [' + STEP + ", " + STEP + "]}", {}, 422),
    ("no steps", "", '{"steps": []}', {}, 422),
    ("too many steps", "", '{"steps": [' + ", ".join(STEP.replace("<a>", f"env_{i}") for i in range(257)) + "]}",
     {}, 422),
    ("an unknown include", "", TWO[:-1] + ', "include": "bogus"}', {}, 422),
    ("an unknown field", "", TWO[:-1] + ', "extra": 1}', {}, 422),
    ("an unknown field in a step", "", '{"steps": [{"env_id": "<a>", "action": {"name": "bump"}, "x": 1}]}', {}, 422),
    ("an action of two forms", "", '{"steps": [{"env_id": "<a>", "action": {"name": "bump", "text": "t"}}]}', {},
     422),
    ("an env id not a string", "", '{"steps": [{"env_id": 5, "action": {"name": "bump"}}]}', {}, 422),
    ("empty", "", "", {}, 422),
    ("null", "", "null", {}, 422),
    ("a list", "", "[1]", {}, 422),
    ("NaN", "", '{"steps": NaN}', {}, 422),
    ("trailing data", "", TWO + " x", {}, 422),
    ("truncated", "", TWO[:20], {}, 422),
    ("not UTF-8", "", b'{"steps": "\xff"}', {}, 422),
    ("a lone surrogate", "", '{"steps": [{"env_id": "\\udfff", "action": {"name": "bump"}}]}', {}, 422),
    ("too deep", "", '{"steps": ' + DEEP + "}", {}, 422),
    ("text/plain is not JSON", "", TWO, {"content-type": "text/plain"}, 422),
    ("no content type", "", TWO, {"content-type": ""}, 422),
    ("a +json type", "", TWO, {"content-type": "application/vnd.api+json"}, 200),
    ("no key", "", TWO, {"authorization": ""}, 401),
    ("an unknown key", "", TWO, {"authorization": "Bearer not-a-key"}, 401),
    ("the operator key", "", TWO, {"authorization": f"Bearer {OPERATOR}"}, 403),
    ("the key before the body's shape", "", '{"steps": []}', {"authorization": "Bearer x"}, 401),
    ("strict JSON before the key", "", '{"steps": NaN}', {"authorization": "Bearer x"}, 422),
    ("another tenant's envs", "", TWO, {"who": "team-b"}, 200),
]


async def _send(stepper: Stepper, query: str, body: str | bytes, headers: dict[str, str]) -> tuple[int, Any]:
    """The case on two fresh envs: (status, JSON reply with the env ids as ``<a>``/``<b>``
    and no durations)."""
    a, b = await stepper.fresh_env(), await stepper.fresh_env()
    if isinstance(body, str):
        body = body.replace("<a>", a).replace("<b>", b)
    headers = dict(headers)
    who = headers.pop("who", "team-a")
    reply = await stepper.post(body, query, headers, who=who, path=BATCH)
    return reply.status_code, _timeless(json.loads(reply.text.replace(a, "<a>").replace(b, "<b>")))


def _timeless(value: Any) -> Any:
    """``value`` with every ``duration_ms`` (a step's measured time) set to None."""
    if isinstance(value, dict):
        return {k: None if k == "duration_ms" else _timeless(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[int, Any]]]:
    """Every case of :data:`CASES` through the door and through FastAPI's route (the door
    taken away), each on envs of its own, in one app."""
    out: dict[str, dict[str, tuple[int, Any]]] = {"door": {}, "route": {}}

    async def test(stepper: Stepper) -> None:
        door = stepper.app.batch_door
        assert isinstance(door, batch_step.BatchStepDoor)
        for way in ("door", "route"):
            stepper.app.batch_door = door if way == "door" else None
            for name, query, body, headers, _ in CASES:
                out[way][name] = await _send(stepper, query, body, headers)
        stepper.app.batch_door = door

    with_app(tmp_path_factory.mktemp("batch-door"), test)
    return out


@pytest.mark.parametrize(("name", "status"), [(c[0], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_door_answers_as_the_route(answers: dict[str, dict[str, tuple[int, Any]]], name: str, status: int) -> None:
    assert answers["door"][name] == answers["route"][name]
    assert answers["door"][name][0] == status, answers["door"][name]


def test_what_the_answers_say(answers: dict[str, dict[str, tuple[int, Any]]]) -> None:
    """Spot checks that the compared answers are the ones the API documents."""
    door = answers["door"]
    results = door["two envs"][1]["results"]
    assert [(r["env_id"], r["status"], r["result"]["observation"]) for r in results] == [("<a>", 200, "2"),
                                                                                         ("<b>", 200, "1")]
    assert set(door["include"][1]["results"][0]["result"]) >= {"state", "state_diff"}
    refused = door["per-step refusals"][1]["results"]
    assert [r["status"] for r in refused] == [404, 200, 200]
    assert [r["result"]["status"] for r in refused[1:]] == ["rejected", "rejected"]
    assert door["an env twice"][1]["error"]["field"] == "steps.1.env_id"
    assert [r["status"] for r in door["another tenant's envs"][1]["results"]] == [404, 404]
    assert door["the operator key"][1]["error"]["code"] == "forbidden"
    assert "NaN is not valid JSON" in door["strict JSON before the key"][1]["error"]["message"]


def test_the_door_answers_also_behind_a_root_path(tmp_path: Path) -> None:
    """The door (not FastAPI) answers a batch, also behind a root path; other methods
    are the router's 405."""
    seen: dict[str, Any] = {}

    async def test(stepper: Stepper) -> None:
        spy = stepper.app.batch_door = DoorSpy(stepper.app.batch_door)
        body = TWO.replace("<a>", stepper.env_id).replace("<b>", await stepper.fresh_env())
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}
        seen["plain"] = await stepper.post(body, path=BATCH)
        prefixed = httpx.ASGITransport(app=stepper.app, root_path="/prefix")
        async with httpx.AsyncClient(transport=prefixed, base_url="http://sandpit") as client:
            seen["root path"] = await client.post("/prefix/v1/envs:step", headers=headers, content=body)
        seen["get"] = await stepper.client.get("/v1/envs:step", headers=headers)
        seen["paths"] = spy.paths
        stepper.app.batch_door = spy.door

    with_app(tmp_path, test)
    assert seen["plain"].status_code == 200 and seen["root path"].status_code == 200, seen["root path"].text
    assert seen["paths"] == ["/v1/envs:step", "/prefix/v1/envs:step"]
    assert seen["get"].status_code == 405


def test_bodies_over_the_cap_are_413(tmp_path: Path) -> None:
    """A declared length over ``max_body_bytes`` and a body read over it: 413, as the route."""
    seen: list[httpx.Response] = []

    async def test(stepper: Stepper) -> None:
        big = '{"steps": [{"env_id": "' + stepper.env_id + '", "action": {"name": "bump", "arguments": {"p": "' + \
            "x" * 3000 + '"}}}]}'
        seen.append(await stepper.post(big, path=BATCH))

        async def chunks() -> Any:  # no Content-Length: read, then refused
            yield big.encode()

        seen.append(await stepper.client.post(BATCH, content=chunks(),
                                              headers={"content-type": "application/json", **stepper.keys["team-a"]}))

    with_app(tmp_path, test, max_body_bytes=2048)
    assert [r.status_code for r in seen] == [413, 413]
    assert all(r.json()["error"]["code"] == "payload_too_large" for r in seen)
    assert re.search("over 2048 bytes", seen[0].json()["error"]["message"])


def test_idempotency_keys_replay_through_the_door(tmp_path: Path) -> None:
    """A step's ``idempotency_key`` replays its committed result when the batch is sent again."""
    seen: list[Any] = []

    async def test(stepper: Stepper) -> None:
        body = '{"steps": [{"env_id": "' + stepper.env_id + '", "idempotency_key": "k-1", "action": {"name": "bump"}}]}'
        for _ in range(2):
            seen.append((await stepper.post(body, path=BATCH)).json())

    with_app(tmp_path, test)
    first, again = (reply["results"][0] for reply in seen)
    assert first["status"] == again["status"] == 200 and again.get("replayed") is True
    assert first["result"] == again["result"]
