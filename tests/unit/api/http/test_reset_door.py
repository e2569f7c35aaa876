"""The env reset's door (:mod:`sandpit.api.http.reset_env`): every ``POST
/v1/envs/{env_id}/reset``, hostile ones included, gets exactly the answer FastAPI's route
``reset`` gives it (status, headers and body bytes, ids and times aside; the access log's
line), and the door is what answers; other methods and paths stay with FastAPI. The
whole app over the executor's fake, through httpx's ASGI transport: one app with the
door, one with it taken away, each sent the same requests in the same order."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fakes import (
    OPERATOR,
    AccessLines,
    IdNames,
    Stepper,
    door_and_route,
    send_case,
    tenant_environment,
    with_app,
)
from sandpit.api.http import reset_env
from sandpit.api.services.idempotency import request_digest
from sandpit.executor.errors import CapacityError

DEEP = "[" * 70 + "]" * 70
EPISODE = '{"episode": {"max_steps": 7, "termination_action": "finish"}}'
# (name, env (a placeholder or an id), query, body, extra headers ("who": the tenant whose
# key is sent; "claim": the key is taken first by a request still in flight), status); sent
# in this order. Placeholders: <env> (team-a's env), <b-env> (team-b's), <f-env> (team-a's
# env with two attempts: <tok> the current one's token, <stale> the first one's), <gone>
# (deleted), <r-env> (team-r's: 1,024 bytes of init_config at most), <scn> (team-a's
# scenario), <b-scn> (team-b's)
CASES: list[tuple[str, str, str, str | bytes, dict[str, str], int]] = [
    ("no body", "<env>", "", "", {}, 200),
    ("no body, no content type", "<env>", "", "", {"content-type": ""}, 200),
    ("an empty object", "<env>", "", "{}", {}, 200),
    ("null", "<env>", "", "null", {}, 200),
    ("a new init_config", "<env>", "", '{"init_config": {"count": 9}}', {}, 200),
    ("a scenario", "<env>", "", '{"scenario_id": "<scn>"}', {}, 200),
    ("episode options", "<env>", "", EPISODE, {}, 200),
    ("a seed", "<env>", "", '{"seed": 7}', {}, 200),
    ("the largest seed", "<env>", "", '{"seed": 18446744073709551615}', {}, 200),
    ("a query is ignored", "<env>", "?x=1", "{}", {}, 200),
    ("a +json type", "<env>", "", "{}", {"content-type": "application/vnd.api+json; charset=utf-8"}, 200),
    ("unknown env", "env_0000000000000000", "", "{}", {}, 404),
    ("not an env id", "x" * 300, "", "{}", {}, 404),
    ("a NUL in the id", "env_%00", "", "{}", {}, 404),
    ("another tenant's env", "<b-env>", "", "{}", {}, 404),
    ("a deleted env", "<gone>", "", "{}", {}, 404),
    ("unknown scenario", "<env>", "", '{"scenario_id": "scn_nope"}', {}, 404),
    ("another tenant's scenario", "<env>", "", '{"scenario_id": "<b-scn>"}', {}, 404),
    ("init fails", "<env>", "", '{"init_config": {"explode": true}}', {}, 422),
    ("an unknown field", "<env>", "", '{"extra": 1}', {}, 422),
    ("a wrong type", "<env>", "", '{"seed": "seven"}', {}, 422),
    ("a negative seed", "<env>", "", '{"seed": -1}', {}, 422),
    ("a seed too large", "<env>", "", '{"seed": 18446744073709551616}', {}, 422),
    ("a wrong nested type", "<env>", "", '{"episode": {"max_steps": "many"}}', {}, 422),
    ("init_config not an object", "<env>", "", '{"init_config": [1]}', {}, 422),
    ("a list", "<env>", "", "[1]", {}, 422),
    ("a string", "<env>", "", '"reset"', {}, 422),
    ("bad JSON", "<env>", "", '{"seed": ', {}, 422),
    ("NaN", "<env>", "", '{"seed": NaN}', {}, 422),
    ("Infinity", "<env>", "", '{"init_config": {"x": -Infinity}}', {}, 422),
    ("trailing data", "<env>", "", "{} x", {}, 422),
    ("two documents", "<env>", "", "{}{}", {}, 422),
    ("not UTF-8", "<env>", "", b'{"scenario_id": "\xff"}', {}, 422),
    ("a lone surrogate", "<env>", "", '{"init_config": {"k": "\\udfff"}}', {}, 422),
    ("too deep", "<env>", "", '{"init_config": {"x": ' + DEEP + "}}", {}, 422),
    ("text/plain is not JSON", "<env>", "", "{}", {"content-type": "text/plain"}, 422),
    ("text/plain null", "<env>", "", "null", {"content-type": "text/plain"}, 422),
    ("form content type", "<env>", "", "seed=1", {"content-type": "application/x-www-form-urlencoded"}, 422),
    ("no key", "<env>", "", "{}", {"authorization": ""}, 401),
    ("not a bearer key", "<env>", "", "{}", {"authorization": "Basic dXNlcjpwYXNz"}, 401),
    ("an unknown key", "<env>", "", "{}", {"authorization": "Bearer not-a-key"}, 401),
    ("the operator key", "<env>", "", "{}", {"authorization": f"Bearer {OPERATOR}"}, 403),
    ("the key before the body's shape", "<env>", "", '{"extra": 1}', {"authorization": "Bearer x"}, 401),
    ("the key before the env", "env_nope", "", "{}", {"authorization": "Bearer x"}, 401),
    ("strict JSON before the key", "<env>", "", '{"seed": NaN}', {"authorization": "Bearer x"}, 422),
    ("quota: init_config bytes", "<r-env>", "", '{"init_config": {"p": "' + "x" * 2000 + '"}}', {"who": "team-r"},
     429),
    ("attempt: the current token", "<f-env>", "", "{}", {"sandpit-attempt": "<tok>"}, 200),
    ("attempt: a stale token", "<f-env>", "", "{}", {"sandpit-attempt": "<stale>"}, 409),
    ("attempt: no token is not fenced", "<f-env>", "", "{}", {}, 200),
    ("attempt: another env's token", "<env>", "", "{}", {"sandpit-attempt": "<tok>"}, 409),
    ("attempt: an unknown env", "env_nope", "", "{}", {"sandpit-attempt": "<tok>"}, 404),
    ("attempt: not a token", "<f-env>", "", "{}", {"sandpit-attempt": "a b"}, 422),
    ("attempt: too long", "<f-env>", "", "{}", {"sandpit-attempt": "t" * 65}, 422),
    ("attempt: empty", "<f-env>", "", "{}", {"sandpit-attempt": ""}, 422),
    ("attempt: bad token and bad body", "<f-env>", "", '{"extra": 1}', {"sandpit-attempt": "a b"}, 422),
    ("attempt: the fence before the body's shape", "<f-env>", "", '{"extra": 1}', {"sandpit-attempt": "<stale>"},
     409),
    ("attempt: the fence before a bad key", "<f-env>", "", "{}", {"sandpit-attempt": "<stale>",
                                                                  "idempotency-key": ""}, 409),
    ("attempt: strict JSON before the fence", "<f-env>", "", "{", {"sandpit-attempt": "<stale>"}, 422),
    ("idempotent: first", "<env>", "", EPISODE, {"idempotency-key": "k-1"}, 200),
    ("idempotent: replay", "<env>", "", EPISODE, {"idempotency-key": "k-1"}, 200),
    ("idempotent: replay with a query", "<env>", "?q=1", EPISODE, {"idempotency-key": "k-1"}, 409),
    ("idempotent: another body", "<env>", "", "{}", {"idempotency-key": "k-1"}, 409),
    ("idempotent: another env", "<f-env>", "", EPISODE, {"idempotency-key": "k-1"}, 409),
    ("idempotent: another tenant's key", "<b-env>", "", EPISODE, {"idempotency-key": "k-1", "who": "team-b"}, 200),
    ("idempotent: an error is not stored", "<env>", "", '{"scenario_id": "scn_nope"}', {"idempotency-key": "k-2"},
     404),
    ("idempotent: its retry runs again", "<env>", "", '{"scenario_id": "scn_nope"}', {"idempotency-key": "k-2"},
     404),
    ("idempotent: no body", "<env>", "", "", {"idempotency-key": "k-5"}, 200),
    ("idempotent: no body, replayed", "<env>", "", "", {"idempotency-key": "k-5"}, 200),
    ("idempotent: in flight", "<env>", "", "{}", {"idempotency-key": "k-3", "claim": "yes"}, 409),
    ("idempotent: a space is a key", "<env>", "", "{}", {"idempotency-key": " "}, 200),
    ("idempotent: empty key", "<env>", "", "{}", {"idempotency-key": ""}, 422),
    ("idempotent: key too long", "<env>", "", "{}", {"idempotency-key": "k" * 256}, 422),
    ("idempotent: key not ASCII", "<env>", "", "{}", {"idempotency-key": "clé"}, 422),
    ("idempotent: key and body both bad", "<env>", "", '{"extra": 1}', {"idempotency-key": ""}, 422),
    ("idempotent: key and attempt both bad", "<f-env>", "", "{}", {"idempotency-key": "", "sandpit-attempt": "a b"},
     422),
    ("idempotent: bad key, no API key", "<env>", "", "{}", {"idempotency-key": "", "authorization": ""}, 401),
    ("idempotent: bad key, bad JSON", "<env>", "", "{", {"idempotency-key": ""}, 422),
    ("idempotent: a key on a 422 body", "<env>", "", '{"extra": 1}', {"idempotency-key": "k-4"}, 422),
]


async def _tenant_env(stepper: Stepper, tenant: str, **quotas: Any) -> str:
    """A new env of ``tenant`` (made with ``quotas`` unless it is there), of a new environment."""
    environment_id = await tenant_environment(stepper, tenant, **quotas)
    env = await stepper.client.post("/v1/envs", headers=stepper.keys[tenant], json={"environment_id": environment_id})
    assert env.status_code == 201, env.text
    return str(env.json()["id"])


async def _names(stepper: Stepper) -> dict[str, str]:
    """The placeholders of :data:`CASES` made in the app (attempt tokens are not ids, so
    they are the same in both apps' answers only where an answer does not show them)."""
    a = stepper.keys["team-a"]
    names = {"<env>": stepper.env_id, "<b-env>": await _tenant_env(stepper, "team-b"),
             "<r-env>": await _tenant_env(stepper, "team-r", max_init_config_bytes=1024),
             "<f-env>": await stepper.fresh_env(), "<gone>": await stepper.fresh_env()}
    assert (await stepper.client.delete(f"/v1/envs/{names['<gone>']}", headers=a)).status_code == 204
    for tenant, placeholder in (("team-a", "<scn>"), ("team-b", "<b-scn>")):
        scenario = await stepper.client.post("/v1/scenarios", headers=stepper.keys[tenant], json={
            "environment_id": await tenant_environment(stepper, tenant), "task": "count",
            "init_config": {"count": 5}})
        assert scenario.status_code == 201, scenario.text
        names[placeholder] = scenario.json()["id"]
    for placeholder in ("<stale>", "<tok>"):
        attempt = await stepper.client.post(f"/v1/envs/{names['<f-env>']}/attempts", headers=a)
        assert attempt.status_code == 201, attempt.text
        names[placeholder] = attempt.json()["token"]
    return names


async def _run_cases(stepper: Stepper, log: AccessLines) -> dict[str, tuple[int, list[tuple[str, str]], str, Any]]:
    """Every case of :data:`CASES`, in order (:func:`api_fakes.send_case`); then each
    env's episode and step after them all."""
    names = await _names(stepper)
    ids = IdNames()
    out: dict[str, Any] = {}
    for name, env, query, body, headers, _ in CASES:
        env = names.get(env, env)
        out[name] = await send_case(stepper, log, ids, f"/v1/envs/{env}/reset{query}", body, headers, names,
                                    lambda sent, e=env, q=query: request_digest("POST", reset_env.RESET_TEMPLATE, e,
                                                                                 q[1:].encode(), sent))
    for placeholder in ("<env>", "<f-env>", "<b-env>", "<r-env>"):
        who = {"<b-env>": "team-b", "<r-env>": "team-r"}.get(placeholder, "team-a")
        env = await stepper.client.get(f"/v1/envs/{names[placeholder]}", headers=stepper.keys[who])
        out[f"episodes of {placeholder}"] = (env.json()["episode"], env.json()["step"])
    rejections = stepper.app.state.metrics.registry.get_sample_value
    out["429s counted"] = rejections("sandpit_quota_rejections_total", {"limit": "max_init_config_bytes"})
    return out


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case of :data:`CASES` through the door and through FastAPI's route (in an
    app with the door taken away), the access log at INFO."""
    return door_and_route(tmp_path_factory.mktemp, "reset_door", reset_env.ResetDoor, _run_cases)


@pytest.mark.parametrize(("name", "status"), [(c[0], c[5]) for c in CASES], ids=[c[0] for c in CASES])
def test_the_door_answers_as_the_route(answers: dict[str, dict[str, Any]], name: str, status: int) -> None:
    assert answers["door"][name] == answers["route"][name]
    assert answers["door"][name][0] == status, answers["door"][name]


def test_the_same_episodes_were_started(answers: dict[str, dict[str, Any]]) -> None:
    """After every case, each env is at the same episode through the door as through the
    route: the refused resets started none, a replay none; the 429 counted once."""
    for placeholder in ("<env>", "<f-env>", "<b-env>", "<r-env>"):
        assert answers["door"][f"episodes of {placeholder}"] == answers["route"][f"episodes of {placeholder}"]
    started = sum(1 for c in CASES if c[1] == "<env>" and c[5] == 200 and "replay" not in c[0])
    assert answers["door"]["episodes of <env>"] == (1 + started, 0)
    assert answers["door"]["episodes of <r-env>"] == (1, 0)
    assert answers["door"]["429s counted"] == answers["route"]["429s counted"] == 1.0


def test_what_the_answers_say(answers: dict[str, dict[str, Any]]) -> None:
    """Spot checks that the compared answers are the ones the API documents."""
    door = {}
    for name, *_ in CASES:
        status, headers, body, lines = answers["door"][name]
        door[name] = (status, dict(headers), json.loads(body), lines)
    assert door["no body"][2]["step"] == 0 and door["no body"][2]["status"] == "live"
    assert door["a new init_config"][2]["init_config"] == {"count": 9}
    assert door["a scenario"][2]["init_config"] == {"count": 5}
    assert door["episode options"][2]["episode_config"]["max_steps"] == 7
    assert door["no body"][3] == [("POST", "/v1/envs/{env_id}/reset", 200, "team-a")]
    assert door["no key"][3] == [("POST", "/v1/envs/{env_id}/reset", 401, "-")]
    assert door["attempt: a stale token"][2]["error"]["code"] == "stale_attempt"
    assert door["attempt: the fence before the body's shape"][2]["error"]["code"] == "stale_attempt"
    assert door["attempt: not a token"][2]["error"]["field"] == "Sandpit-Attempt"
    assert door["idempotent: replay"][1]["idempotent-replayed"] == "true"
    assert door["idempotent: replay"][2] == door["idempotent: first"][2]
    assert door["idempotent: no body, replayed"][2] == door["idempotent: no body"][2]
    assert "idempotent-replayed" not in door["idempotent: first"][1]
    assert door["idempotent: another body"][2]["error"]["code"] == "idempotency_key_reused"
    assert door["idempotent: in flight"][2]["error"]["code"] == "idempotency_key_in_flight"
    assert door["idempotent: empty key"][2]["error"]["field"] == "Idempotency-Key"
    assert door["idempotent: key and attempt both bad"][2]["error"]["message"].endswith("(and 1 more problem(s))")
    assert door["an unknown field"][2]["error"]["field"] == "extra"
    assert door["the operator key"][2]["error"]["code"] == "forbidden"
    assert "NaN" in door["strict JSON before the key"][2]["error"]["message"]
    assert door["quota: init_config bytes"][2]["error"]["code"] == "quota_exceeded"


def test_the_door_answers_resets_only(tmp_path: Path) -> None:
    """The door (not FastAPI) answers ``POST /v1/envs/{env_id}/reset``, on the create
    door's threads, also behind a root path; other methods, a trailing slash and the
    env's other operations stay FastAPI's."""
    seen: dict[str, Any] = {"threads": []}

    async def test(stepper: Stepper) -> None:
        episodes = stepper.app.state.episodes
        reset = episodes.reset

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen["threads"].append(threading.current_thread().name)
            return reset(*args, **kwargs)

        episodes.reset = spy
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}
        path = f"/v1/envs/{stepper.env_id}/reset"
        seen["plain"] = await stepper.client.post(path, headers=headers)
        prefixed = httpx.ASGITransport(app=stepper.app, root_path="/prefix")
        async with httpx.AsyncClient(transport=prefixed, base_url="http://sandpit") as client:
            seen["root path"] = await client.post(f"/prefix{path}", headers=headers)
        seen["get"] = await stepper.client.get(path, headers=headers)
        seen["slash"] = await stepper.client.post(f"{path}/", headers=headers)
        seen["two segments"] = await stepper.client.post(f"/v1/envs/{stepper.env_id}/x/reset", headers=headers)
        seen["step"] = await stepper.post('{"name": "bump"}')
        replies = await asyncio.gather(*[stepper.client.post(f"/v1/envs/{await stepper.fresh_env()}/reset",
                                                             headers=headers) for _ in range(3)],
                                       *[stepper.post('{"name": "bump"}') for _ in range(3)])
        seen["together"] = [reply.status_code for reply in replies]
        episodes.reset = reset

    with_app(tmp_path, test)
    assert seen["plain"].status_code == 200 and seen["root path"].status_code == 200, seen["root path"].text
    assert seen["root path"].json()["episode"] == 3
    assert seen["get"].status_code == 405 and seen["get"].headers["allow"] == "POST"
    assert seen["slash"].status_code == 307 and seen["slash"].headers["location"].endswith("/reset")
    assert seen["two segments"].status_code == 404
    assert seen["step"].status_code == 200 and seen["together"] == [200] * 6
    assert len(seen["threads"]) == 5 and all(name.startswith("sandpit-create_") for name in seen["threads"]), \
        seen["threads"]


@pytest.mark.parametrize("failure", ["bug", "executor"])
def test_failures_of_the_reset(tmp_path: Path, failure: str) -> None:
    """A bug in the reset is the catch-all 500 ``internal``; an executor error that
    escapes the adapter is translated (503 with ``Retry-After``), as the app's handlers
    answer them on the route; no key stays claimed."""
    seen: dict[str, list[httpx.Response]] = {"door": [], "route": []}

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("a bug") if failure == "bug" else CapacityError("no sandbox")

    async def test(stepper: Stepper) -> None:
        stepper.app.state.episodes.reset = broken
        door = stepper.app.reset_door
        for way in ("door", "route"):
            stepper.app.reset_door = door if way == "door" else None
            for _ in range(2):  # the second runs again: the key was released
                seen[way].append(await stepper.client.post(f"/v1/envs/{stepper.env_id}/reset", content="{}", headers={
                    "content-type": "application/json", "idempotency-key": f"{way}-k", **stepper.keys["team-a"]}))
        stepper.app.reset_door = door

    with_app(tmp_path, test, raise_app_exceptions=False)
    status = 500 if failure == "bug" else 503
    assert [r.status_code for r in seen["door"]] == [status, status]
    assert [(r.status_code, r.headers.raw, r.content) for r in seen["door"]] == \
        [(r.status_code, r.headers.raw, r.content) for r in seen["route"]]


def test_bodies_over_the_cap_are_413(tmp_path: Path) -> None:
    """A declared length over ``max_body_bytes`` (with ``Connection: close``) and a body
    read over it: 413, through the door as through the route; no episode starts."""
    seen: dict[str, list[httpx.Response]] = {"door": [], "route": []}

    async def test(stepper: Stepper) -> None:
        big = '{"init_config": {"p": "' + "x" * 3000 + '"}}'
        headers = {"content-type": "application/json", **stepper.keys["team-a"]}
        path = f"/v1/envs/{stepper.env_id}/reset"

        async def chunks() -> Any:  # no Content-Length: read, then refused
            yield big.encode()

        door = stepper.app.reset_door
        for way in ("door", "route"):
            stepper.app.reset_door = door if way == "door" else None
            seen[way].append(await stepper.client.post(path, headers=headers, content=big))
            seen[way].append(await stepper.client.post(path, headers=headers, content=chunks()))
        stepper.app.reset_door = door
        seen["env"] = [await stepper.client.get(f"/v1/envs/{stepper.env_id}", headers=headers)]

    with_app(tmp_path, test, max_body_bytes=2048)
    for way in ("door", "route"):
        assert [r.status_code for r in seen[way]] == [413, 413]
        assert all(r.json()["error"]["code"] == "payload_too_large" for r in seen[way])
    assert [(r.headers.raw, r.content) for r in seen["door"]] == [(r.headers.raw, r.content) for r in seen["route"]]
    assert seen["door"][0].headers["connection"] == "close"
    assert seen["env"][0].json()["episode"] == 1
