"""`client.admin` (tenants, keys, audit) against an `httpx.MockTransport`: which key each
call carries, what it sends, how answers parse; a missing operator key sends nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sandpit.client import ApiKey, AsyncClient, Client, Conflict, Tenant, Unauthorized

NOW = "2025-05-01T12:00:00Z"
KEY = {"id": "key_1", "tenant": "team-a", "name": "ci", "prefix": "sp_ab", "created_at": NOW, "expires_at": None,
       "revoked_at": None, "key": "sp_secret"}
TENANT = {"id": "team-a", "display_name": None, "quota_overrides": {"max_live_envs": 5},
          "quotas": {"max_live_envs": 5}, "model_base_url": None, "has_model_api_key": False, "created_at": NOW,
          "active_keys": 1, "api_key": KEY}


class Recorder:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, method = request.url.path, request.method
        if (method, path) == ("POST", "/v1/admin/tenants"):
            body = json.loads(request.content)
            if body["id"] == "taken":
                return httpx.Response(409, json={"error": {"code": "conflict", "message": "tenant taken exists",
                                                           "field": "id"}})
            return httpx.Response(201, json=TENANT)
        answers: dict[tuple[str, str], Any] = {
            ("GET", "/v1/admin/tenants"): {"data": [TENANT], "count": 1},
            ("GET", "/v1/admin/tenants/team-a"): TENANT,
            ("PATCH", "/v1/admin/tenants/team-a"): TENANT,
            ("POST", "/v1/admin/tenants/team-a/keys"): KEY,
            ("GET", "/v1/admin/tenants/team-a/keys"): {"data": [{**KEY, "key": None}], "count": 1},
            ("POST", "/v1/admin/keys/key_1/revoke"): {**KEY, "key": None, "revoked_at": NOW},
            ("GET", "/v1/admin/audit"): {"data": [{"id": 7, "at": NOW, "tenant": "team-a", "actor": "operator",
                                                   "action": "tenant.create", "resource_id": "team-a",
                                                   "detail": None}], "count": 1},
        }
        return httpx.Response(200, json=answers[(method, path)])


def test_admin_calls_carry_the_operator_key_and_parse() -> None:
    recorder = Recorder()
    with Client("http://sandpit.test", api_key="tenant-key", operator_key="op-key",
                transport=httpx.MockTransport(recorder)) as client:
        tenant = client.admin.tenants.create("team-a", quotas={"max_live_envs": 5}, key_name="ci")
        assert isinstance(tenant, Tenant) and tenant.api_key is not None and tenant.api_key.key == "sp_secret"
        assert [t.id for t in client.admin.tenants.list().data] == ["team-a"]
        assert client.admin.tenants.get("team-a").quota_overrides == {"max_live_envs": 5}
        client.admin.tenants.update("team-a", model_api_key="")
        assert isinstance(client.admin.keys.create("team-a", name="ci", expires_in_s=60), ApiKey)
        assert client.admin.keys.list("team-a").data[0].key is None
        assert client.admin.keys.revoke("key_1").revoked_at is not None
        events = client.admin.audit.list(tenant="team-a", action="tenant.create", limit=5)
        assert events.data[0].action == "tenant.create" and events.count == 1
        with pytest.raises(Conflict) as taken:
            client.admin.tenants.create("taken")
        assert taken.value.field == "id"
    assert {r.headers["authorization"] for r in recorder.requests} == {"Bearer op-key"}
    bodies = [json.loads(r.content) if r.content else None for r in recorder.requests]
    assert bodies[0] == {"id": "team-a", "quotas": {"max_live_envs": 5}, "create_key": True, "key_name": "ci"}
    assert bodies[3] == {"model_api_key": ""}  # only what is given changes; "" removes the stored key
    assert bodies[4] == {"name": "ci", "expires_in_s": 60}
    assert recorder.requests[7].url.params == httpx.QueryParams({"tenant": "team-a", "action": "tenant.create",
                                                                 "limit": "5"})


def test_without_an_operator_key_nothing_is_sent() -> None:
    recorder = Recorder()
    with Client("http://sandpit.test", api_key="tenant-key", transport=httpx.MockTransport(recorder)) as client:
        with pytest.raises(Unauthorized) as refused:
            client.admin.tenants.list()
    assert refused.value.code == "no_operator_key" and refused.value.status_code is None
    assert recorder.requests == []


def test_async_admin_parity() -> None:
    recorder = Recorder()

    async def run() -> list[str]:
        async with AsyncClient("http://sandpit.test", operator_key="op-key",
                               transport=httpx.MockTransport(recorder)) as client:
            created = await client.admin.tenants.create("team-a")
            keys = await client.admin.keys.list("team-a")
            revoked = await client.admin.keys.revoke("key_1")
            audit = await client.admin.audit.list()
            assert (await client.admin.tenants.get("team-a")).id == "team-a"
            assert (await client.admin.tenants.update("team-a", display_name="A")).id == "team-a"
            assert (await client.admin.keys.create("team-a")).key == "sp_secret"
            assert (await client.admin.tenants.list()).count == 1
            return [created.id, keys.data[0].id, revoked.id, audit.data[0].tenant]

    assert asyncio.run(run()) == ["team-a", "key_1", "key_1", "team-a"]
    assert {r.headers["authorization"] for r in recorder.requests} == {"Bearer op-key"}
