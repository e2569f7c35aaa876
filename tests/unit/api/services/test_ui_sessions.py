"""The viewer's sessions (:mod:`sandpit.api.services.ui_sessions`) on a migrated database:
the key checked as the API does, only hashes and the key id stored, expiry, revocation
and sign-out end a session."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.errors import Unauthorized
from sandpit.api.schemas.tenants import TenantCreate
from sandpit.api.services.common import utcnow
from sandpit.api.services.tenants import TenantService
from sandpit.api.services.ui_sessions import UiSessions, token_hash
from sandpit.api.settings import ApiSettings

OPERATOR_KEY = "op-" + "k7Qz9VwXy2" * 4


@pytest.fixture
def tenants(database: Database, tmp_path: Path) -> TenantService:
    return TenantService(ApiSettings(operator_key=SecretStr(OPERATOR_KEY), data_dir=tmp_path), database)


@pytest.fixture
def sessions(database: Database, tenants: TenantService) -> UiSessions:
    return UiSessions(database, tenants)


def new_key(tenants: TenantService, tenant: str = "team-a") -> tuple[str, str]:
    key = tenants.create(TenantCreate(id=tenant)).api_key
    assert key is not None and key.key is not None
    return key.id, key.key


def test_sign_in_stores_hashes_and_the_key_id_never_the_key(sessions: UiSessions, tenants: TenantService,
                                                            database: Database) -> None:
    key_id, key = new_key(tenants)
    token, session = sessions.sign_in(f"  {key}\n")
    assert (session.tenant, session.actor, session.operator) == ("team-a", key_id, False)
    assert session.context is not None and session.context.tenant == "team-a" and len(session.csrf) == 64
    with database.read() as db:
        rows = db.query(models.UiSession).all()
    assert len(rows) == 1 and rows[0].token_hash == token_hash(token) != token
    stored = " ".join(str(v) for v in vars(rows[0]).values())
    assert key not in stored and token not in stored
    found = sessions.lookup(token)
    assert found is not None and (found.tenant, found.actor, found.csrf) == ("team-a", key_id, session.csrf)


@pytest.mark.parametrize("key", ["", "   ", "sp_unknown", "x" * 300, "Bearer sp_x", "\x00", "ключ"])
def test_bad_keys_are_refused(sessions: UiSessions, key: str) -> None:
    with pytest.raises(Unauthorized):
        sessions.sign_in(key)


def test_the_operator_key_opens_an_operator_session(sessions: UiSessions) -> None:
    token, session = sessions.sign_in(OPERATOR_KEY)
    assert session.operator and session.context is None and session.actor == "operator"
    found = sessions.lookup(token)
    assert found is not None and found.operator


@pytest.mark.parametrize("token", [None, "", "nope", "x" * 500])
def test_unknown_tokens_find_nothing(sessions: UiSessions, token: str | None) -> None:
    assert sessions.lookup(token) is None


def test_revoking_the_key_ends_its_sessions(sessions: UiSessions, tenants: TenantService) -> None:
    key_id, key = new_key(tenants)
    token, _ = sessions.sign_in(key)
    tenants.revoke(key_id)
    assert sessions.lookup(token) is None


def test_an_expired_session_or_key_ends_it_and_its_row_goes(sessions: UiSessions, tenants: TenantService,
                                                            database: Database) -> None:
    key_id, key = new_key(tenants)
    token, _ = sessions.sign_in(key)
    with database.write() as db:
        row = db.get(models.UiSession, token_hash(token))
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    assert sessions.lookup(token) is None
    with database.read() as db:
        assert db.get(models.UiSession, token_hash(token)) is None
    other, _ = sessions.sign_in(key)
    with database.write() as db:
        found = db.get(models.ApiKey, key_id)
        assert found is not None
        found.expires_at = utcnow() - timedelta(seconds=1)
    assert sessions.lookup(other) is None


def test_sign_out_and_expire(sessions: UiSessions, tenants: TenantService, database: Database) -> None:
    _, key = new_key(tenants)
    token, _ = sessions.sign_in(key)
    sessions.end(token)
    assert sessions.lookup(token) is None
    stale, _ = sessions.sign_in(key)
    kept, _ = sessions.sign_in(key)
    with database.write() as db:
        row = db.get(models.UiSession, token_hash(stale))
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    assert sessions.expire() == 1
    assert sessions.lookup(kept) is not None
    with database.write() as db:
        row = db.get(models.UiSession, token_hash(kept))
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
    sessions.sign_in(key)  # a sign-in sweeps the expired rows
    with database.read() as db:
        assert db.get(models.UiSession, token_hash(kept)) is None


def test_an_operator_session_dies_when_the_operator_key_is_removed(database: Database, tmp_path: Path) -> None:
    with_key = UiSessions(database, TenantService(ApiSettings(operator_key=SecretStr(OPERATOR_KEY),
                                                              data_dir=tmp_path), database))
    token, _ = with_key.sign_in(OPERATOR_KEY)
    without = UiSessions(database, TenantService(ApiSettings(operator_key=None, data_dir=tmp_path), database))
    assert without.lookup(token) is None
