"""Tenants, API keys and the audit log (:mod:`sandpit.api.services.tenants`) on a
migrated SQLite copy: keys, revocation, expiry, the operator key, quotas per tenant."""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unauthorized
from sandpit.api.schemas.tenants import TenantCreate, TenantUpdate
from sandpit.api.services.common import utcnow
from sandpit.api.services.tenants import TenantService, hash_key
from sandpit.api.settings import ApiSettings

OPERATOR_KEY = "op-" + "k7Qz9VwXy2" * 4


@pytest.fixture
def tenants(database: Database, tmp_path: Path) -> TenantService:
    settings = ApiSettings(operator_key=SecretStr(OPERATOR_KEY), data_dir=tmp_path, auth_cache_ttl_s=60)
    return TenantService(settings, database)


def bearer(key: str) -> str:
    return f"Bearer {key}"


def test_a_new_tenant_gets_a_key_shown_once_and_stored_as_its_hash(tenants: TenantService,
                                                                    database: Database) -> None:
    public = tenants.create(TenantCreate(id="team-a", quotas={"max_live_envs": 3}))
    assert public.api_key is not None and public.api_key.key is not None and public.active_keys == 1
    key = public.api_key.key
    assert key.startswith("sp_") and public.quotas["max_live_envs"] == 3
    with database.read() as db:
        row = db.get(models.ApiKey, public.api_key.id)
    assert row is not None and row.hash == hashlib.sha256(key.encode()).hexdigest() == hash_key(key)
    assert all(k.key is None for k in tenants.keys("team-a").data)
    ctx = tenants.authenticate(bearer(key))
    assert (ctx.tenant, ctx.actor, ctx.quotas.max_live_envs) == ("team-a", public.api_key.id, 3)


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer " + "x" * 300, "Bearer sp_unknown"])
def test_missing_malformed_or_unknown_keys_are_401(tenants: TenantService, header: str | None) -> None:
    with pytest.raises(Unauthorized):
        tenants.authenticate(header)


def test_revocation_takes_effect_at_once_despite_the_cache(tenants: TenantService) -> None:
    key = tenants.create(TenantCreate(id="team-a")).api_key
    assert key is not None and key.key is not None
    tenants.authenticate(bearer(key.key))  # cached now
    tenants.revoke(key.id)
    with pytest.raises(Unauthorized, match="revoked"):
        tenants.authenticate(bearer(key.key))
    assert tenants.revoke(key.id).revoked_at is not None  # idempotent
    with pytest.raises(NotFound):
        tenants.revoke("key_nope")


def test_an_expired_key_is_401_read_fresh_or_from_the_cache(tenants: TenantService, database: Database) -> None:
    tenants.create(TenantCreate(id="team-a", create_key=False))
    short = tenants.new_key("team-a", "short", 0.3)
    assert short.key is not None
    tenants.authenticate(bearer(short.key))  # cached, with its expiry
    time.sleep(0.35)
    with pytest.raises(Unauthorized, match="expired"):
        tenants.authenticate(bearer(short.key))
    old = tenants.new_key("team-a", "old", 3600)
    assert old.key is not None
    with database.write() as db:
        row = db.get(models.ApiKey, old.id)
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    with pytest.raises(Unauthorized, match="expired"):
        tenants.authenticate(bearer(old.key))
    assert tenants.every().data[0].active_keys == 0


def test_the_operator_key_opens_admin_only(tenants: TenantService) -> None:
    tenants.require_operator(bearer(OPERATOR_KEY))
    with pytest.raises(Forbidden):
        tenants.authenticate(bearer(OPERATOR_KEY))
    key = tenants.create(TenantCreate(id="team-a")).api_key
    assert key is not None and key.key is not None
    with pytest.raises(Forbidden):
        tenants.require_operator(bearer(key.key))
    with pytest.raises(Unauthorized):
        tenants.require_operator(None)
    no_operator = TenantService(ApiSettings(data_dir=tenants.settings.data_dir), tenants.db)
    with pytest.raises(Forbidden, match="disabled"):
        no_operator.require_operator(bearer(OPERATOR_KEY))


def test_tenant_ids_quotas_and_duplicates_are_checked(tenants: TenantService) -> None:
    for bad in ("Team A", "team-a\n"):  # the request model refuses them first (the document's pattern)
        with pytest.raises(ValidationError):
            TenantCreate(id=bad)
        with pytest.raises(InvalidRequest):
            tenants.create(TenantCreate.model_construct(id=bad, display_name=None, quotas=None, create_key=True,
                                                        key_name=None, key_expires_in_s=None))
    with pytest.raises(InvalidRequest) as raised:
        tenants.create(TenantCreate(id="team-a", quotas={"max_lives": 1}))
    assert raised.value.field == "quotas.max_lives"
    tenants.create(TenantCreate(id="team-a"))
    with pytest.raises(Conflict):
        tenants.create(TenantCreate(id="team-a"))
    with pytest.raises(NotFound):
        tenants.read("team-b")
    with pytest.raises(NotFound):
        tenants.new_key("team-b", None, None)


def test_quota_changes_reach_cached_contexts_and_the_model_key_is_never_shown(tenants: TenantService) -> None:
    key = tenants.create(TenantCreate(id="team-a")).api_key
    assert key is not None and key.key is not None
    assert tenants.authenticate(bearer(key.key)).quotas.max_live_envs == 1000
    updated = tenants.update("team-a", TenantUpdate(quotas={"max_live_envs": 7}, model_base_url="http://m/v1",
                                                    model_api_key="sk-secret"))
    assert updated.has_model_api_key and "sk-secret" not in updated.model_dump_json()
    assert tenants.authenticate(bearer(key.key)).quotas.max_live_envs == 7
    assert tenants.quotas("team-a").max_live_envs == 7
    assert tenants.model_api_key("team-a") == "sk-secret"
    assert tenants.quotas("nobody").max_live_envs == 1000  # defaults for unknown tenants


def test_the_audit_log_is_per_tenant_and_newest_first(tenants: TenantService) -> None:
    tenants.create(TenantCreate(id="team-a"))
    tenants.create(TenantCreate(id="team-b"))
    tenants.audit("team-a", "key_1", "env.create", "env_1", {"x": 1})
    mine = tenants.audit_page("team-a", 10, 0)
    assert [e.action for e in mine.data] == ["env.create", "api_key.create", "tenant.create"]
    assert {e.tenant for e in tenants.audit_page(None, 100, 0).data} == {"team-a", "team-b"}
    assert tenants.audit_page("team-a", 10, 0, action="env.create").count == 1
    assert [t.id for t in tenants.every().data] == ["team-a", "team-b"]


def test_the_cached_check_reads_no_database_and_forgets_revoked_keys(tenants: TenantService) -> None:
    key = tenants.create(TenantCreate(id="team-a")).api_key
    assert key is not None and key.key is not None
    assert tenants.authenticate_cached(bearer(key.key)) is None  # never seen: ask authenticate
    ctx = tenants.authenticate(bearer(key.key))
    assert tenants.authenticate_cached(bearer(key.key)) == ctx
    assert tenants.authenticate_cached(bearer("sp_unknown")) is None
    with pytest.raises(Unauthorized):
        tenants.authenticate_cached(None)
    with pytest.raises(Unauthorized):
        tenants.authenticate_cached("Basic abc")
    tenants.revoke(key.id)
    assert tenants.authenticate_cached(bearer(key.key)) is None
