"""`sandpit tenants ...` (through `client.admin`) against a real server: what it prints,
that the keys it prints work, and its errors (exit 1, one line)."""

from __future__ import annotations

import json

import pytest
from sandpit.cli import app
from sandpit.client import Client, Unauthorized
from typer.testing import CliRunner

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


@pytest.fixture
def runner(server, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("SANDPIT_URL", server.url)
    monkeypatch.setenv("SANDPIT_OPERATOR_KEY", server.operator_key)
    return CliRunner()


def test_create_list_and_revoke(runner: CliRunner, server) -> None:
    created = runner.invoke(app, ["tenants", "create", "cli-a", "--quota", "max_live_envs=3", "--quiet"])
    assert created.exit_code == 0, created.output
    first_key = created.stdout.strip()
    verbose = runner.invoke(app, ["tenants", "create", "cli-b", "--key-name", "main", "--expires-in-days", "2"])
    assert verbose.exit_code == 0 and "tenant cli-b created; API key key_" in flat(verbose.stderr)
    assert "(expires 20" in flat(verbose.stderr) and verbose.stdout.strip().count("\n") == 0
    another = runner.invoke(app, ["tenants", "create-key", "cli-a", "--name", "second"])
    assert another.exit_code == 0 and "for cli-a (expires never)" in flat(another.stderr)
    listed = runner.invoke(app, ["tenants", "list", "--keys"])
    assert listed.exit_code == 0, listed.output
    assert "cli-a" in listed.stdout and "max_live_envs=3" in listed.stdout and "second" in listed.stdout
    with Client(server.url, api_key=first_key, timeout=30) as tenant:
        assert tenant.envs.list().count == 0
        key_id = next(k.id for k in _keys(server, "cli-a") if k.name is None)
        revoked = runner.invoke(app, ["tenants", "revoke-key", key_id])
        assert revoked.exit_code == 0 and f"revoked {key_id} of tenant cli-a at 20" in flat(revoked.stderr)
        with pytest.raises(Unauthorized):
            tenant.envs.list()


def test_errors_are_one_line_and_exit_1(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.invoke(app, ["tenants", "create", "cli-dup", "--quiet"]).exit_code == 0
    duplicate = runner.invoke(app, ["tenants", "create", "cli-dup"])
    assert duplicate.exit_code == 1 and duplicate.stderr.startswith("error: 409: ")
    unknown = runner.invoke(app, ["tenants", "create-key", "no-such-tenant"])
    assert unknown.exit_code == 1 and unknown.stderr.startswith("error: 404: ")
    monkeypatch.setenv("SANDPIT_OPERATOR_KEY", "not-the-key")
    assert runner.invoke(app, ["tenants", "list"]).stderr.startswith("error: 403: the admin API needs the operator key")
    monkeypatch.delenv("SANDPIT_OPERATOR_KEY")
    missing = runner.invoke(app, ["tenants", "list"])
    assert missing.exit_code == 1 and "no operator key: set SANDPIT_OPERATOR_KEY" in flat(missing.stderr)
    monkeypatch.setenv("SANDPIT_OPERATOR_KEY", "k")
    down = runner.invoke(app, ["tenants", "list", "--url", "http://127.0.0.1:9"])
    assert down.exit_code == 1 and down.stderr.startswith("error: cannot reach http://127.0.0.1:9: ")


def test_a_servers_message_is_printed_as_written(runner: CliRunner) -> None:
    """The server's 422 for a bad tenant id quotes its pattern (``...{0,63}``), and the id
    itself holds markup: both reach the terminal as sent, on one line."""
    refused = runner.invoke(app, ["tenants", "create", "BAD[bold]x[/bold]"])
    assert refused.exit_code == 1 and refused.stderr.startswith("error: 422: ")
    assert "{0,63}" in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


def test_list_json_is_the_apis_page_with_full_ids(runner: CliRunner) -> None:
    assert runner.invoke(app, ["tenants", "create", "cli-json-with-a-rather-long-tenant-id", "--quiet"]).exit_code == 0
    listed = runner.invoke(app, ["tenants", "list", "--keys", "--json"])
    assert listed.exit_code == 0, listed.output
    document = json.loads(listed.stdout)
    ids = [t["id"] for t in document["data"]]
    assert "cli-json-with-a-rather-long-tenant-id" in ids and document["count"] == len(ids)
    assert set(document["keys"]) == set(ids)
    key_id = document["keys"]["cli-json-with-a-rather-long-tenant-id"]["data"][0]["id"]
    narrow = runner.invoke(app, ["tenants", "list", "--keys"], env={"COLUMNS": "30"})
    assert "cli-json-with-a-rather-long-tenant-id" in narrow.stdout and key_id in narrow.stdout


def flat(text: str) -> str:
    """``text`` with rich's line wrapping undone."""
    return " ".join(text.split())


def _keys(server, tenant_id: str) -> list:
    with Client(server.url, operator_key=server.operator_key, timeout=30) as operator:
        return operator.admin.keys.list(tenant_id).data
