"""``GET /v1/admin/cluster`` and ``sandpit cluster status`` on a real server (local backend:
one host, ``local``), with the operator key and refused without it."""

from __future__ import annotations

import json

import httpx
import pytest
from sandpit.cli import app
from sandpit.client import Client, Unauthorized
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
