"""Multi-tenancy through the real API server: authentication, API keys, isolation of every
route, the audit log, and the admin API. Quotas and fairness are in ``test_quotas.py``."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest
from api_server import plain_client

pytestmark = pytest.mark.docker

CHECK = "def check_func(final_state):\n    return final_state['count'] > 1\n"


@pytest.fixture(scope="module")
def other_key(server) -> str:
    """API key of a second tenant, ``intruder``."""
    return server.new_tenant("intruder")


@pytest.fixture(scope="module")
def owned(server, counter_env_id: str) -> dict[str, str]:
    """Objects of tenant ``default``: environment, scenario, env (2 steps, one evaluation)."""
    with server.client() as api:
        scenario = api.post("/v1/scenarios", json={
            "environment_id": counter_env_id, "task": "bump it", "init_config": {"count": 1},
            "checklist": ["count grew"], "checklist_with_func": [{"check_item": "count grew", "check_func": CHECK}]})
        assert scenario.status_code == 201, scenario.text
        env = api.post("/v1/envs", json={"scenario_id": scenario.json()["id"]})
        assert env.status_code == 201, env.text
        env_id = env.json()["id"]
        for _ in range(2):
            assert api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}}).status_code == 200
        assert api.post(f"/v1/envs/{env_id}/evaluate").json()["reward"] == 1.0
        evaluation = api.post("/v1/evaluations", json={"mode": "replay", "episodes": [
            {"scenario_id": scenario.json()["id"], "tool_calls": [{"name": "bump", "arguments": {"by": 1}}]}]})
        assert evaluation.status_code == 201, evaluation.text
        evaluation_id = evaluation.json()["id"]
        deadline = time.monotonic() + 60
        while api.get(f"/v1/evaluations/{evaluation_id}").json()["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    return {"environment_id": counter_env_id, "scenario_id": scenario.json()["id"], "env_id": env_id,
            "evaluation_id": evaluation_id}


# -- authentication ---------------------------------------------------------------------
def test_every_v1_route_needs_a_key_but_health_does_not(server) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert httpx.get(f"{server.url}/readyz").status_code in (200, 503)
    assert httpx.get(f"{server.url}/metrics").status_code == 200  # open unless metrics_require_auth
    checked = 0
    with plain_client() as http:
        for path, methods in spec["paths"].items():
            if not path.startswith("/v1/"):
                continue
            concrete = path.replace("{", "x").replace("}", "")
            for method in methods:
                for headers in ({}, {"Authorization": "Bearer sp_not_a_key"}, {"Authorization": "Basic abc"},
                                {"Authorization": "Bearer " + "k" * 300}):
                    response = http.request(method.upper(), f"{server.url}{concrete}", headers=headers, json={})
                    if path.startswith("/v1/admin"):
                        assert response.status_code in (401, 403), (method, path, response.text)
                    else:
                        assert response.status_code == 401, (method, path, headers, response.text)
                        assert response.headers["www-authenticate"].startswith("Bearer")
                        assert response.json()["error"]["code"] == "unauthorized"
                    checked += 1
    assert checked > 60


def test_operator_key_and_tenant_keys_do_not_mix(server) -> None:
    tenant_route = httpx.get(f"{server.url}/v1/envs", headers=server.operator_headers)
    assert tenant_route.status_code == 403 and "operator key" in tenant_route.json()["error"]["message"]
    admin_route = httpx.get(f"{server.url}/v1/admin/tenants", headers=server.headers)
    assert admin_route.status_code == 403 and admin_route.json()["error"]["code"] == "forbidden"


def test_keys_are_stored_hashed_shown_once_revocable_and_expiring(server) -> None:
    key = server.new_tenant("keyed")
    rows = sqlite3.connect(server.db_path).execute("SELECT id, hash, prefix FROM api_keys WHERE tenant='keyed'").fetchall()
    assert len(rows) == 1
    key_id, stored_hash, prefix = rows[0]
    assert stored_hash == hashlib.sha256(key.encode()).hexdigest() and key.startswith(prefix)
    dump = b"".join(line.encode() for line in sqlite3.connect(server.db_path).iterdump())
    assert key.encode() not in dump  # the key itself is nowhere in the database
    listed = httpx.get(f"{server.url}/v1/admin/tenants/keyed/keys", headers=server.operator_headers).json()
    assert listed["count"] == 1 and listed["data"][0]["key"] is None and "hash" not in listed["data"][0]

    with server.client(key) as api:
        assert api.get("/v1/tenant").json()["tenant"] == "keyed"
        revoked = httpx.post(f"{server.url}/v1/admin/keys/{key_id}/revoke", headers=server.operator_headers)
        assert revoked.status_code == 200 and revoked.json()["revoked_at"]
        refused = api.get("/v1/tenant")
        assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
        assert httpx.post(f"{server.url}/v1/admin/keys/{key_id}/revoke",
                          headers=server.operator_headers).status_code == 200  # idempotent

    short = httpx.post(f"{server.url}/v1/admin/tenants/keyed/keys", headers=server.operator_headers,
                       json={"name": "short-lived", "expires_in_s": 1.5}).json()
    with server.client(short["key"]) as api:
        assert api.get("/v1/tenant").status_code == 200
        time.sleep(2.0)
        expired = api.get("/v1/tenant")
        assert expired.status_code == 401 and "expired" in expired.json()["error"]["message"]


def test_admin_input_is_checked(server) -> None:
    admin = server.operator_headers
    for body, status in [({"id": "Bad Id!"}, 422), ({"id": "x" * 65}, 422), ({"id": "ok", "quotas": {"nope": 1}}, 422),
                         ({"id": "ok", "quotas": {"max_live_envs": -1}}, 422), ({"id": "ok", "extra": 1}, 422),
                         ({"id": "keyed"}, 409)]:
        response = httpx.post(f"{server.url}/v1/admin/tenants", headers=admin, json=body)
        assert response.status_code == status, (body, response.text)
    assert httpx.get(f"{server.url}/v1/admin/tenants/ok", headers=admin).status_code == 404  # nothing half-created
    assert httpx.post(f"{server.url}/v1/admin/keys/key_nope/revoke", headers=admin).status_code == 404
    assert httpx.post(f"{server.url}/v1/admin/tenants/nope/keys", headers=admin, json={}).status_code == 404
    patched = httpx.patch(f"{server.url}/v1/admin/tenants/keyed", headers=admin,
                          json={"quotas": {"max_live_envs": 7, "max_profile": {"memory_mib": 128}},
                                "model_api_key": "sk-very-secret-model-key"})
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["quotas"]["max_live_envs"] == 7 and body["quotas"]["max_profile"]["memory_mib"] == 128
    assert body["quotas"]["max_profile"]["cpus"] == 1.0 and body["has_model_api_key"] is True
    assert "sk-very-secret-model-key" not in patched.text
    stored = sqlite3.connect(server.db_path).execute("SELECT model_api_key_enc FROM tenants WHERE id='keyed'").fetchone()
    assert b"sk-very-secret-model-key" not in stored[0]  # encrypted at rest


def test_placeholder_operator_key_is_refused_at_start_up(server) -> None:
    for placeholder in ("changeme", "secret", "x" * 40, "short", "my-operator-key-placeholder-123"):
        completed = subprocess.run([sys.executable, "-c", "from sandpit.cli import app; app()", "serve", "--port", "1"],
                                   env={"SANDPIT_OPERATOR_KEY": placeholder, "SANDPIT_DATA_DIR": str(server.data_dir),
                                        "PATH": "/usr/bin:/bin"},
                                   capture_output=True, text=True, timeout=60)
        assert completed.returncode == 1, (placeholder, completed.stdout, completed.stderr)
        assert "operator_key" in completed.stderr and "placeholder" in completed.stderr


# -- isolation --------------------------------------------------------------------------
BODIES = {
    ("post", "/v1/envs/{env_id}/step"): {"name": "bump", "arguments": {"by": 5}},
    ("post", "/v1/envs/{env_id}/restore"): {"step": 0},
    ("post", "/v1/envs/{env_id}/fork"): {"count": 1},
    ("post", "/v1/envs/{env_id}/reset"): {},
    ("post", "/v1/envs/{env_id}/evaluate"): {},
}


def test_another_tenants_ids_are_404_on_every_route(server, owned: dict[str, str], other_key: str) -> None:
    spec = httpx.get(f"{server.url}/openapi.json").json()
    covered = []
    with server.client(other_key) as intruder:
        for path, methods in spec["paths"].items():
            if not path.startswith("/v1/") or path.startswith("/v1/admin") or "{" not in path:
                continue
            param = path[path.index("{") + 1:path.index("}")]
            if param not in owned:
                pytest.fail(f"route {path} has an id parameter {param!r} this test does not cover")
            concrete = path.replace("{" + param + "}", owned[param])
            for method in methods:
                response = intruder.request(method.upper(), concrete, json=BODIES.get((method, path), {}))
                assert response.status_code == 404, (method, path, response.text)
                assert response.json()["error"]["code"] == "not_found"
                covered.append(f"{method} {path}")
        # ids in bodies: creating from another tenant's environment or scenario
        assert intruder.post("/v1/envs", json={"environment_id": owned["environment_id"]}).status_code == 404
        assert intruder.post("/v1/envs", json={"scenario_id": owned["scenario_id"]}).status_code == 404
        replay = intruder.post("/v1/evaluations", json={"mode": "replay", "episodes": [
            {"scenario_id": owned["scenario_id"], "tool_calls": []}]})
        assert replay.status_code in (404, 422) and intruder.get("/v1/evaluations").json()["count"] == 0
        assert intruder.post("/v1/scenarios", json={
            "environment_id": owned["environment_id"], "task": "t", "init_config": {}, "checklist": [],
            "checklist_with_func": []}).status_code == 404
        for listing in ("/v1/environments", "/v1/envs", "/v1/scenarios", "/v1/audit", "/v1/evaluations"):
            page = intruder.get(listing, params={"limit": 1000}).json()
            seen = {item.get("id") for item in page["data"]} | {item.get("resource_id") for item in page["data"]}
            assert set(owned.values()).isdisjoint(seen), listing
            assert all(item.get("tenant", "intruder") == "intruder" for item in page["data"])
        assert intruder.get("/v1/envs").json()["count"] == 0 and intruder.get("/v1/environments").json()["count"] == 0
        unknown = intruder.get("/v1/envs/env_0123456789abcdef01234567")
        mine = intruder.get(f"/v1/envs/{owned['env_id']}")
        assert unknown.json()["error"]["message"].replace("env_0123456789abcdef01234567", "ID") == \
            mine.json()["error"]["message"].replace(owned["env_id"], "ID")  # indistinguishable
    assert len(covered) >= 12
    with server.client() as api:  # the owner's objects are untouched
        env = api.get(f"/v1/envs/{owned['env_id']}").json()
        assert env["step"] == 2 and env["episode"] == 1
        assert api.get(f"/v1/envs/{owned['env_id']}/state").json()["state"]["count"] == 3
        assert api.get(f"/v1/scenarios/{owned['scenario_id']}").status_code == 200


def test_sandboxes_carry_their_tenant(server, owned: dict[str, str], other_key: str, docker_client) -> None:
    with server.client(other_key) as intruder:
        environment = intruder.post("/v1/environments", json={"source_code": "class E:\n    def ping(self) -> str:\n"
                                                              "        return 'pong'\n", "class_name": "E"}).json()
        env = intruder.post("/v1/envs", json={"environment_id": environment["id"]}).json()
        assert intruder.post(f"/v1/envs/{env['id']}/step", json={"name": "ping"}).json()["observation"] == "pong"
    labels = [c.labels for c in docker_client.containers.list(filters={"label": "sandpit=1"})]
    tenants = {label.get("sandpit.tenant") for label in labels if label.get("sandpit.pool")}
    assert {"default", "intruder"} <= tenants


# -- audit ------------------------------------------------------------------------------
def test_audit_log_says_who_did_what(server, owned: dict[str, str], other_key: str) -> None:
    with server.client() as api:
        me = api.get("/v1/tenant").json()
        events = api.get("/v1/audit", params={"limit": 1000}).json()["data"]
    actions = {(e["action"], e["resource_id"]) for e in events}
    assert ("env.create", owned["env_id"]) in actions and ("scenario.create", owned["scenario_id"]) in actions
    assert ("env.evaluate", owned["env_id"]) in actions and ("environment.create", owned["environment_id"]) in actions
    assert ("evaluation.create", owned["evaluation_id"]) in actions
    assert {e["actor"] for e in events if e["action"] == "env.create"} == {me["key_id"]}
    assert all(e["tenant"] == "default" for e in events)
    everyone = httpx.get(f"{server.url}/v1/admin/audit", headers=server.operator_headers,
                         params={"limit": 1000}).json()["data"]
    assert {"default", "intruder"} <= {e["tenant"] for e in everyone}
    assert any(e["action"] == "tenant.create" and e["actor"] == "operator" for e in everyone)
    assert any(e["action"] == "api_key.revoke" for e in everyone)
    assert "sk-very-secret-model-key" not in str(everyone)


def test_operator_can_restrict_rollout_model_endpoints(make_server, counter_source: str) -> None:
    server = make_server(SANDPIT_MODEL_URL_ALLOW='["http://127.0.0.1:9/v1"]')
    with server.client() as api:
        environment = api.post("/v1/environments", json={"source_code": counter_source, "class_name": "Counter"}).json()
        scenario = api.post("/v1/scenarios", json={"environment_id": environment["id"], "task": "t", "init_config": {},
                                                   "checklist": [], "checklist_with_func": []}).json()
        body = {"mode": "rollout", "model": "m", "scenario_ids": [scenario["id"]], "api_key": "sk-x"}
        for url in ("http://169.254.169.254/latest/v1", "http://127.0.0.1:9/v10", "http://127.0.0.1:90/v1"):
            refused = api.post("/v1/evaluations", json={**body, "base_url": url})
            assert refused.status_code == 422 and "SANDPIT_MODEL_URL_ALLOW" in refused.text, (url, refused.text)
        assert api.get("/v1/evaluations").json()["count"] == 0
        allowed = api.post("/v1/evaluations", json={**body, "base_url": "http://127.0.0.1:9/v1", "retries": 0})
        assert allowed.status_code == 201, allowed.text
        api.post(f"/v1/evaluations/{allowed.json()['id']}/cancel")


def test_metrics_can_require_the_operator_key(make_server) -> None:
    server = make_server(SANDPIT_METRICS_REQUIRE_AUTH="true")
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers=server.headers).status_code == 403  # a tenant key is not enough
    scraped = httpx.get(f"{server.url}/metrics", headers=server.operator_headers)
    assert scraped.status_code == 200 and "sandpit_quota_rejections_total" in scraped.text
    assert httpx.get(f"{server.url}/healthz").status_code == 200
