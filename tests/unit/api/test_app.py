"""The whole app in-process over the executor's scripted fake: the lifespan wires it,
requests go through routes, dependencies, services and the adapter (httpx's ASGI
transport; nothing listens on a port)."""

from __future__ import annotations

import asyncio
import gc
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from api_fakes import SOURCE, fake_executor
from pydantic import SecretStr
from sandpit.api.app import create_app, tune_gc
from sandpit.api.settings import ApiSettings
from sandpit.executor.errors import CapacityError, DockerUnavailable
from sandpit.executor.fake import FakeExecutor

OPERATOR = secrets.token_urlsafe(32)


def run(db_path: Path, tmp_path: Path, fake: FakeExecutor,
        scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    settings = ApiSettings(data_dir=tmp_path, database_url=f"sqlite:///{db_path}", operator_key=SecretStr(OPERATOR),
                           warm_on_start=False, janitor_interval_s=60)
    app = create_app(settings, executor_factory=lambda _settings: fake)

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
                await scenario(client)

    asyncio.run(main())


async def tenant(client: httpx.AsyncClient, tenant_id: str) -> dict[str, str]:
    response = await client.post("/v1/admin/tenants", json={"id": tenant_id},
                                 headers={"Authorization": f"Bearer {OPERATOR}"})
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['api_key']['key']}"}


def test_an_env_through_http_on_the_fake(db_path: Path, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def scenario(client: httpx.AsyncClient) -> None:
        mine, theirs = await tenant(client, "team-a"), await tenant(client, "team-b")
        environment = await client.post("/v1/environments", headers=mine,
                                        json={"source_code": SOURCE, "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        env = await client.post("/v1/envs", headers=mine, json={"environment_id": environment.json()["id"],
                                                                "init_config": {"count": 1}})
        assert env.status_code == 201, env.text
        env_id = env.json()["id"]
        step = await client.post(f"/v1/envs/{env_id}/step?include=state", headers=mine,
                                 json={"type": "function", "function": {"name": "bump", "arguments": '{"by": 4}'}})
        assert step.status_code == 200 and step.headers["content-type"] == "application/json"
        assert step.json()["observation"] == "5" and step.json()["state"]["count"] == 5
        state = await client.get(f"/v1/envs/{env_id}/state", headers=mine, params={"step": 0})
        assert state.json()["state"]["count"] == 1
        hidden = await client.get(f"/v1/envs/{env_id}", headers=theirs)
        assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "not_found"
        usage = await client.get("/v1/tenant", headers=mine)
        assert usage.json()["live_envs"] == 1
        audit = await client.get("/v1/audit", headers=mine)
        assert {e["action"] for e in audit.json()["data"]} >= {"environment.create", "env.create"}
        seen["metrics"] = (await client.get("/metrics")).text

    fake = fake_executor()
    run(db_path, tmp_path, fake, scenario)
    assert 'sandpit_step_seconds_count{status="ok"} 1.0' in seen["metrics"]
    assert 'python_gc_collections_total{generation="2"}' in seen["metrics"]  # pauses of the whole process
    assert all(s.closed for s in fake.sessions.values())  # shutdown closed every session


def test_readiness_and_executor_failures_as_http_statuses(db_path: Path, tmp_path: Path) -> None:
    fake = fake_executor()

    async def scenario(client: httpx.AsyncClient) -> None:
        mine = await tenant(client, "team-a")
        assert (await client.get("/readyz")).json() == {"status": "ok", "checks": {
            "database": "ok", "docker": "ok", "pool": "ok"}}
        fake.fail("ping", DockerUnavailable("engine down"))
        down = await client.get("/readyz")
        assert down.status_code == 503 and down.json()["checks"]["docker"] == "error: DockerUnavailable"
        fake.fail("describe", DockerUnavailable("engine down"))
        refused = await client.post("/v1/environments", headers=mine,
                                    json={"source_code": SOURCE, "class_name": "Counter"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
        assert refused.headers["retry-after"] == "2"
        fake.fail("describe", CapacityError("full"))
        full = await client.post("/v1/environments", headers=mine,
                                 json={"source_code": SOURCE, "class_name": "Counter"})
        assert full.status_code == 503 and full.json()["error"]["code"] == "no_capacity"
        missing = await client.post("/v1/environments", headers=mine,
                                    json={"source_code": SOURCE.replace("Counter", "Other"), "class_name": "Other"})
        assert missing.status_code == 422 and missing.json()["error"]["field"] == "source_code"

    run(db_path, tmp_path, fake, scenario)



def test_tune_gc_sets_the_young_threshold_and_freezes_what_exists() -> None:
    before = gc.get_threshold()
    try:
        tune_gc(12_345)
        assert gc.get_threshold() == (12_345, *before[1:])
        assert gc.get_freeze_count() > 0  # modules, the app: out of the collector's reach
        tune_gc(0)  # 0 keeps the threshold as it is
        assert gc.get_threshold() == (12_345, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_served_app_freezes_what_its_start_up_built(db_path: Path, tmp_path: Path) -> None:
    """With ``tune_gc(threshold, app)`` (what ``sandpit serve`` does) the lifespan freezes
    once its start-up is done: the services it built are out of the collector's reach
    while it serves. An app left alone (``freeze_after_start`` off) freezes nothing."""
    before = gc.get_threshold()
    frozen: dict[str, int] = {}

    def served(app_frozen: bool) -> None:
        settings = ApiSettings(data_dir=tmp_path, database_url=f"sqlite:///{db_path}",
                               operator_key=SecretStr(OPERATOR), warm_on_start=False, janitor_interval_s=60)
        app = create_app(settings, executor_factory=lambda _settings: fake_executor())
        if app_frozen:
            tune_gc(0, app)
        gc.unfreeze()  # what tune_gc froze itself: only the lifespan's freeze is measured

        async def main() -> None:
            async with app.router.lifespan_context(app):
                frozen["serving" if app_frozen else "alone"] = gc.get_freeze_count()

        asyncio.run(main())

    try:
        served(app_frozen=False)
        served(app_frozen=True)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert frozen["alone"] == 0
    assert frozen["serving"] > 0


def test_the_janitor_deletes_expired_viewer_sessions(db_path: Path, tmp_path: Path) -> None:
    """A viewer session that expired and is never used again (no sign-in after it) is
    deleted by the janitor; a live one stays."""
    from datetime import timedelta

    from sandpit.api.db import models
    from sandpit.api.services.common import utcnow
    from sandpit.api.services.ui_sessions import token_hash
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    settings = ApiSettings(data_dir=tmp_path, database_url=f"sqlite:///{db_path}", operator_key=SecretStr(OPERATOR),
                           warm_on_start=False, janitor_interval_s=0.05)
    app = create_app(settings, executor_factory=lambda _settings: fake_executor())
    engine = create_engine(f"sqlite:///{db_path}")

    def hashes() -> set[str]:
        with Session(engine) as db:
            return set(db.scalars(select(models.UiSession.token_hash)))

    async def main() -> None:
        async with app.router.lifespan_context(app):
            now = utcnow()
            with Session(engine) as db:
                for token, expires in (("old", now - timedelta(seconds=1)), ("live", now + timedelta(hours=1))):
                    db.add(models.UiSession(token_hash=token_hash(token), tenant=None, actor="operator", csrf="x",
                                            created_at=now - timedelta(hours=2), expires_at=expires))
                db.commit()
            for _ in range(200):
                if token_hash("old") not in hashes():
                    break
                await asyncio.sleep(0.05)
            assert hashes() == {token_hash("live")}

    try:
        asyncio.run(main())
    finally:
        engine.dispose()
