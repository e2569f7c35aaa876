"""The lean step path (``sandpit.api.http.lean_step``) answers exactly as the FastAPI route:
the same requests, hostile ones included, sent to an app with ``lean_step`` on and to one
with it off give the same statuses, headers that matter and bodies (the whole app over the
executor's fake, through httpx's ASGI transport)."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fakes import SOURCE, fake_executor
from pydantic import SecretStr
from sandpit.api.app import create_app
from sandpit.api.envs.steps import Steps
from sandpit.api.http import lean_step
from sandpit.api.settings import ApiSettings

OPERATOR = secrets.token_urlsafe(32)
DEEP = '{"name": "bump", "arguments": {"a": ' + "[" * 70 + "]" * 70 + "}}"
REQUESTS: list[tuple[str, str | bytes, dict[str, str]]] = [
    # (query, raw body, extra headers); every body is sent as given
    ("", '{"name": "bump", "arguments": {"by": 2}}', {}),
    ("", '{"name": "bump"}', {}),
    ("", '{"name": "bump", "arguments": null}', {}),
    ("?include=state", '{"name": "bump", "arguments": {"by": 1}}', {}),
    ("?include=state_diff,state", '{"name": "bump", "arguments": {"by": 1}}', {}),
    ("?include=bogus", '{"name": "bump"}', {}),
    ("?include=state&include=state_diff", '{"name": "bump"}', {}),
    ("?include=" + "s" * 65, '{"name": "bump"}', {}),
    ("?unrelated=1", '{"name": "bump"}', {}),
    ("", '{"name": "bump", "arguments": [1]}', {}),
    ("", '{"name": "bump", "arguments": "{\\"by\\": 3}"}', {}),
    ("", '{"name": "_private"}', {}),
    ("", '{"name": "__class__"}', {}),
    ("", '{"name": "no_such_tool", "arguments": {}}', {}),
    ("", '{"name": "bump", "arguments": {"by": "x"}}', {}),
    ("", '{"name": "bump", "arguments": {"by": 123456789012345678901234567890}}', {}),
    ("", '{"name": "bump", "arguments": {"by": 1e400}}', {}),
    ("", '{"name": "bump", "arguments": {"by": NaN}}', {}),
    ("", '{"name": "bump", "arguments": {"by": Infinity}}', {}),
    ("", '{"name": "\\ud800"}', {}),
    ("", '{"name": "bump", "arguments": {"k": "\\udfff"}}', {}),
    ("", '{"name": "bump", "arguments": {"k": "\\ud83d\\ude00"}}', {}),
    ("", DEEP, {}),
    ("", '{"name": "bump", "extra": 1}', {}),
    ("", '{"name": "bump", "text": "hi"}', {}),
    ("", '{"arguments": {}}', {}),
    ("", "{}", {}),
    ("", "[]", {}),
    ("", '"bump"', {}),
    ("", "null", {}),
    ("", "", {}),
    ("", '{"name": ', {}),
    ("", '{"name": "bump"} trailing', {}),
    ("", '{"name": "bump", "name": "fail", "arguments": {"message": "dup"}}', {}),
    ("", '{"name": 7}', {}),
    ("", '{"name": "' + "n" * 1025 + '"}', {}),
    ("", '{"name": "bump", "arguments": {"pad": "' + "p" * 300_000 + '"}}', {}),
    ("", '{"text": "' + "t" * 70_000 + '"}', {}),
    ("", '{"type": "function", "function": {"name": "bump", "arguments": "{\\"by\\": 5}"}}', {}),
    ("", '{"type": "function", "function": {"name": "bump", "arguments": "{"}}', {}),
    ("", '{"type": "other", "function": {"name": "bump"}}', {}),
    ("", '{"text": "<tool_call>{\\"name\\": \\"bump\\", \\"arguments\\": {}}</tool_call>"}', {}),
    ("", '{"name": "fail", "arguments": {"message": "boom"}}', {}),
    ("", '{"name": "finish"}', {}),  # ends the episode: the steps after it are 409s
    ("", '{"name": "bump"}', {}),
    ("", '{"name": "bump"}', {"content-type": "text/plain"}),
    ("", '{"name": "bump"}', {"content-type": "application/json; charset=utf-8"}),
    ("", '{"name": "bump"}', {"content-type": "application/merge-patch+json"}),
    ("", '{"name": "bump"}', {"authorization": "Bearer not-a-key"}),
    ("", '{"name": "bump"}', {"authorization": ""}),
    ("", '{"name": "bump"}', {"authorization": f"Bearer {OPERATOR}"}),
    ("", b'{"name": "b\xffump"}', {}),  # not UTF-8
]


def normalize(text: str, ids: dict[str, str]) -> Any:
    """A reply body with the run's own ids replaced and timings dropped."""
    for real, label in ids.items():
        text = text.replace(real, label)
    try:
        body = json.loads(text)
    except ValueError:
        return text
    if isinstance(body, dict):
        body.pop("duration_ms", None)
    return body


def run_requests(tmp_path: Path, lean: bool) -> list[tuple[int, str | None, str | None, Any]]:
    """Every request of :data:`REQUESTS` (and the 404s) against a fresh app; the
    replies as (status, content-type, retry-after, normalized body)."""
    data = tmp_path / ("lean" if lean else "router")
    data.mkdir()
    settings = ApiSettings(data_dir=data, operator_key=SecretStr(OPERATOR), warm_on_start=False,
                           janitor_interval_s=60, lean_step=lean, max_arguments_bytes=256 * 1024)
    from sandpit.api.db.engine import upgrade

    upgrade(settings.resolved_database_url())
    app = create_app(settings, executor_factory=lambda _settings: fake_executor())
    out: list[tuple[int, str | None, str | None, Any]] = []

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
                keys = {}
                for tenant in ("team-a", "team-b"):
                    made = await client.post("/v1/admin/tenants", json={"id": tenant},
                                             headers={"Authorization": f"Bearer {OPERATOR}"})
                    keys[tenant] = {"authorization": f"Bearer {made.json()['api_key']['key']}"}
                environment = await client.post("/v1/environments", headers=keys["team-a"],
                                                json={"source_code": SOURCE, "class_name": "Counter"})
                env = await client.post("/v1/envs", headers=keys["team-a"],
                                        json={"environment_id": environment.json()["id"],
                                              "episode": {"max_steps": 1000, "termination_action": "finish"}})
                env_id = env.json()["id"]
                ids = {env_id: "<env>", environment.json()["id"]: "<environment>"}
                for query, body, extra in REQUESTS:
                    headers = {"content-type": "application/json", **keys["team-a"], **extra}
                    reply = await client.post(f"/v1/envs/{env_id}/step{query}", headers=headers,
                                              content=body if isinstance(body, bytes) else body.encode())
                    out.append((reply.status_code, reply.headers.get("content-type"),
                                reply.headers.get("retry-after"), normalize(reply.text, ids)))
                for target, who in (("env_unknown", "team-a"), (env_id, "team-b")):
                    reply = await client.post(f"/v1/envs/{target}/step", headers=keys[who], json={"name": "bump"})
                    out.append((reply.status_code, None, None, normalize(reply.text, ids)))
                missing_auth = await client.post(f"/v1/envs/{env_id}/step", json={"name": "bump"})
                out.append((missing_auth.status_code, missing_auth.headers.get("www-authenticate"), None,
                            normalize(missing_auth.text, ids)))
                trajectory = await client.get(f"/v1/envs/{env_id}/trajectory", headers=keys["team-a"])
                out.append((trajectory.status_code, None, None,
                            [(s["step"], s["action"], s["observation"], s["status"])
                             for s in trajectory.json()["steps"]]))

    asyncio.run(main())
    return out



def fake_app(tmp_path: Path, **settings: Any) -> Any:
    """The app on a migrated SQLite file in ``tmp_path`` and the executor's fake."""
    from sandpit.api.db.engine import upgrade

    api_settings = ApiSettings(data_dir=tmp_path, operator_key=SecretStr(OPERATOR), warm_on_start=False,
                               janitor_interval_s=60, **settings)
    upgrade(api_settings.resolved_database_url())
    return create_app(api_settings, executor_factory=lambda _settings: fake_executor())


async def counter_env(client: httpx.AsyncClient) -> tuple[dict[str, str], str]:
    """A tenant's key headers and a live env of the ``Counter`` environment."""
    made = await client.post("/v1/admin/tenants", json={"id": "team-a"},
                             headers={"Authorization": f"Bearer {OPERATOR}"})
    key = {"Authorization": f"Bearer {made.json()['api_key']['key']}"}
    environment = await client.post("/v1/environments", headers=key,
                                    json={"source_code": SOURCE, "class_name": "Counter"})
    env = await client.post("/v1/envs", headers=key, json={"environment_id": environment.json()["id"]})
    return key, str(env.json()["id"])


def test_the_lean_path_answers_every_request_as_the_router_does(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[object] = []
    parse = lean_step._parse

    def counted(*args: Any) -> Any:
        result = parse(*args)
        taken.append(result)
        return result

    monkeypatch.setattr(lean_step, "_parse", counted)
    lean = run_requests(tmp_path, lean=True)
    assert len(taken) >= 20  # the plain requests did take the lean path (and the rest fell through)
    router = run_requests(tmp_path, lean=False)
    assert len(lean) == len(router) == len(REQUESTS) + 4
    for index, (mine, theirs) in enumerate(zip(lean, router, strict=True)):
        what = REQUESTS[index][:2] if index < len(REQUESTS) else index
        assert mine == theirs, f"{str(what)[:200]}: lean {str(mine)[:400]} != router {str(theirs)[:400]}"
    statuses = {status for status, *_ in lean}
    assert {200, 401, 403, 404, 413, 422} <= statuses  # the list does reach every kind of answer
    assert all(status < 500 for status in statuses)


@pytest.mark.parametrize("lean", [True])
def test_step_metrics_count_both_paths(tmp_path: Path, lean: bool) -> None:
    """The lean path times the step's phases (``sandpit_step_phase_*``) and counts it once."""
    app = fake_app(tmp_path, lean_step=lean)
    seen: dict[str, str] = {}

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
                key, env_id = await counter_env(client)
                for _ in range(3):
                    reply = await client.post(f"/v1/envs/{env_id}/step", headers=key, json={"name": "bump"})
                    assert reply.status_code == 200, reply.text
                seen["metrics"] = (await client.get("/metrics")).text

    asyncio.run(main())
    assert "sandpit_step_phase_steps_total 3.0" in seen["metrics"]
    for phase in ("parse", "auth", "sandbox", "persist", "serialize", "other"):
        value = re.search(rf'sandpit_step_phase_wall_seconds_total{{phase="{phase}"}} (\S+)', seen["metrics"])
        assert value is not None and float(value.group(1)) > 0, phase



@pytest.mark.parametrize("lean", [True, False])
def test_a_stalled_step_body_is_408_on_both_paths(tmp_path: Path, lean: bool) -> None:
    """A step whose body stops arriving gets 408 and ``Connection: close`` (BodyReadTimeout),
    not a 500, whether the lean path or the router was reading it."""
    app = fake_app(tmp_path, lean_step=lean, body_read_timeout_s=0.3)
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        async with app.router.lifespan_context(app):
            chunks = [{"type": "http.request", "body": b'{"name": "bu', "more_body": True}]

            async def receive() -> dict[str, Any]:
                if chunks:
                    return chunks.pop()
                await asyncio.sleep(30)  # stalls
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/envs/env_x/step", "raw_path": b"/v1/envs/env_x/step",
                     "root_path": "", "query_string": b"", "server": ("sandpit", 80), "client": ("127.0.0.1", 1),
                     "headers": [(b"content-type", b"application/json"), (b"content-length", b"100"),
                                 (b"authorization", b"Bearer whatever")]}
            await asyncio.wait_for(app(scope, receive, send), timeout=10)

    asyncio.run(main())
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 408
    assert (b"connection", b"close") in start["headers"]


def fail_once(function: Any) -> Any:
    """``function``, raising a RuntimeError (a bug) on its first call only."""
    calls: list[int] = []

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return function(*args, **kwargs)

    return broken


@pytest.mark.parametrize(("lean", "where"), [(True, "step"), (False, "step"), (True, "parse")])
def test_a_bug_in_a_step_is_the_catch_all_500_and_the_server_goes_on(tmp_path: Path, lean: bool, where: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug raised while stepping (not an ApiError, not an executor error) or while the
    lean path parses the request is answered 500 ``internal`` with the catch-all
    handler's JSON body (not the server's plain-text one: the lean path sits in front of
    FastAPI's error middleware), whichever path ran it; the next step is served."""

    app = fake_app(tmp_path, lean_step=lean)
    if where == "step":
        monkeypatch.setattr(Steps, "step", fail_once(Steps.step))
    else:
        monkeypatch.setattr(lean_step, "_parse", fail_once(lean_step._parse))
    replies: list[httpx.Response] = []

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
                key, env_id = await counter_env(client)
                for _ in range(2):
                    replies.append(await client.post(f"/v1/envs/{env_id}/step", headers=key, json={"name": "bump"}))

    asyncio.run(main())
    assert [reply.status_code for reply in replies] == [500, 200], replies[-1].text
    assert replies[0].json() == {"error": {"code": "internal", "message": "internal error (logged)", "field": None}}
