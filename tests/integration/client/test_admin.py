"""`client.admin` against a real server: tenants, keys and the audit log with the operator
key; a revoked key stops working; errors map as for tenant calls."""

from __future__ import annotations

import pytest
from sandpit.client import Client, Conflict, InvalidRequest, NotFound, Unauthorized

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one


def test_tenants_keys_and_audit(server) -> None:
    with Client(server.url, operator_key=server.operator_key, timeout=30) as operator:
        tenant = operator.admin.tenants.create("admin-a", quotas={"max_live_envs": 7}, key_name="first")
        assert tenant.api_key is not None and tenant.api_key.key and tenant.quotas["max_live_envs"] == 7
        assert operator.admin.tenants.get("admin-a").quota_overrides == {"max_live_envs": 7}
        assert operator.admin.tenants.update("admin-a", display_name="Team A").display_name == "Team A"
        assert "admin-a" in [t.id for t in operator.admin.tenants.list().data]
        second = operator.admin.keys.create("admin-a", name="ci", expires_in_s=3600)
        assert second.key and second.expires_at is not None
        assert {k.name for k in operator.admin.keys.list("admin-a").data} == {"first", "ci"}
        with Client(server.url, api_key=second.key, timeout=30) as tenant_client:
            assert tenant_client.environments.list().count == 0
            operator.admin.keys.revoke(second.id)
            with pytest.raises(Unauthorized):
                tenant_client.environments.list()
        actions = {e.action for e in operator.admin.audit.list(tenant="admin-a").data}
        assert actions, "the audit log records the tenant's administration"
        with pytest.raises(Conflict):
            operator.admin.tenants.create("admin-a")
        with pytest.raises(NotFound):
            operator.admin.tenants.get("no-such-tenant")
        with pytest.raises(InvalidRequest):
            operator.admin.tenants.create("Not A Valid Id!")
    with Client(server.url, api_key=server.api_key, operator_key=server.api_key, timeout=30) as impostor:
        with pytest.raises(Unauthorized):  # a tenant key is not the operator key
            impostor.admin.tenants.list()
