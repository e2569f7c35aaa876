"""``GET /v1/admin/cluster`` and ``sandpit cluster status`` on a real server (local backend:
one host, ``local``), with the operator key and refused without it; drains there (unknown
hosts 404, the one local host 409: nowhere to drain to); undrains there (``local`` is a
host never drained: a no-op; unknown and hostile names 404, a huge one 422)."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from sandpit.cli import app
from sandpit.client import Client, Conflict, Unauthorized
from typer.testing import CliRunner

pytestmark = pytest.mark.docker


def test_status_reports_the_local_host_the_sessions_and_this_replica(server, api: httpx.Client,
                                                                      counter_env_id: str) -> None:
    created = api.post("/v1/envs", json={"environment_id": counter_env_id})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    try:
        with Client(server.url, operator_key=server.operator_key, timeout=30) as client:
            status = client.admin.cluster.status()
        assert status.backend == "local" and status.nodes == 1
        assert [h.host for h in status.hosts] == ["local"]
        assert status.sessions >= 1 and status.live_envs >= 1 and status.sandboxes >= 1
        assert status.replica in {r.id for r in status.replicas}
    finally:
        api.delete(f"/v1/envs/{env_id}")


def test_cli_prints_a_table_and_json(server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDPIT_URL", server.url)
    monkeypatch.setenv("SANDPIT_OPERATOR_KEY", server.operator_key)
    runner = CliRunner()
    table = runner.invoke(app, ["cluster", "status"])
    assert table.exit_code == 0, table.output
    assert "backend local" in table.stdout and "local" in table.stdout
    raw = runner.invoke(app, ["cluster", "status", "--json"])
    assert raw.exit_code == 0 and json.loads(raw.stdout)["backend"] == "local"


@pytest.mark.parametrize("key", ["", "not-a-key", "' OR 1=1 --", "x" * 5000])
def test_a_tenant_key_or_garbage_is_refused(server, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{server.url}/v1/admin/cluster", headers=headers, timeout=30)
    assert response.status_code in (401, 403), response.text
    tenant = httpx.get(f"{server.url}/v1/admin/cluster", headers=server.headers, timeout=30)
    assert tenant.status_code in (401, 403)
    with Client(server.url, operator_key="y" * 40, timeout=30) as client, pytest.raises(Unauthorized):
        client.admin.cluster.status()


def test_cli_without_operator_key_exits_1(server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDPIT_URL", server.url)
    monkeypatch.delenv("SANDPIT_OPERATOR_KEY", raising=False)
    result = CliRunner().invoke(app, ["cluster", "status"])
    assert result.exit_code == 1 and "no operator key" in result.output


@pytest.mark.parametrize("verb", ["drain", "undrain"])
@pytest.mark.parametrize("host", ["sandpit-host-0123456789abcdef", " ", "../admin/tenants", "..%2F..%2Fcluster",
                                  "x" * 1000, "h\u00e9te\u0000", "' OR 1=1 --"])
def test_a_drain_or_undrain_of_an_unknown_host_is_404_and_a_huge_name_422(server, verb: str, host: str) -> None:
    response = httpx.post(f"{server.url}/v1/admin/cluster/hosts/{quote(host, safe='')}/{verb}",
                          headers=server.operator_headers, timeout=30)
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"
    huge = httpx.post(f"{server.url}/v1/admin/cluster/hosts/{'y' * 10_000}/{verb}", headers=server.operator_headers,
                      timeout=30)
    assert huge.status_code == 422 and "error" in huge.json()


def test_the_local_backend_has_nowhere_to_drain_to(server, api: httpx.Client, counter_env_id: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    created = api.post("/v1/envs", json={"environment_id": counter_env_id})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    try:
        for force in (False, True):
            with Client(server.url, operator_key=server.operator_key, timeout=30) as client, \
                    pytest.raises(Conflict) as refusal:
                client.admin.cluster.drain("local", force=force)
            assert refusal.value.status_code == 409
        assert api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}}).status_code == 200
        tenant = httpx.post(f"{server.url}/v1/admin/cluster/hosts/local/drain", headers=server.headers, timeout=30)
        assert tenant.status_code in (401, 403)
        monkeypatch.setenv("SANDPIT_URL", server.url)
        monkeypatch.setenv("SANDPIT_OPERATOR_KEY", server.operator_key)
        result = CliRunner().invoke(app, ["cluster", "drain", "local", "--wait", "--timeout", "5"])
        assert result.exit_code == 1 and "409" in result.output, result.output
        result = CliRunner().invoke(app, ["cluster", "drain", "no-such-host"])
        assert result.exit_code == 1 and "404" in result.output, result.output
    finally:
        api.delete(f"/v1/envs/{env_id}")




def test_undrain_of_the_local_host_is_a_no_op_for_the_operator_only(server, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client(server.url, operator_key=server.operator_key, timeout=30) as client:
        answer = client.admin.cluster.undrain("local")
        assert (answer.host, answer.previous, answer.status) == ("local", None, "active")
        assert client.admin.cluster.undrain("local") == answer  # idempotent
        assert client.admin.cluster.status().hosts[0].drain is None
    for headers in (server.headers, {"Authorization": "Bearer not-a-key"}, {}):
        response = httpx.post(f"{server.url}/v1/admin/cluster/hosts/local/undrain", headers=headers, timeout=30)
        assert response.status_code in (401, 403), response.text
    monkeypatch.setenv("SANDPIT_URL", server.url)
    monkeypatch.setenv("SANDPIT_OPERATOR_KEY", server.operator_key)
    result = CliRunner().invoke(app, ["cluster", "undrain", "local"])
    assert result.exit_code == 0 and "active" in result.stdout and "not drained" in result.stdout, result.output
    raw = CliRunner().invoke(app, ["cluster", "undrain", "local", "--json"])
    assert raw.exit_code == 0 and json.loads(raw.stdout)["previous"] is None
    result = CliRunner().invoke(app, ["cluster", "undrain", "no-such-host"])
    assert result.exit_code == 1 and "404" in result.output, result.output
    monkeypatch.delenv("SANDPIT_OPERATOR_KEY")
    result = CliRunner().invoke(app, ["cluster", "undrain", "local"])
    assert result.exit_code == 1 and "no operator key" in result.output
