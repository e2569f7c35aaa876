"""Idempotency keys (``sandpit.api.services.idempotency``) on a real SQLite file: what a
key may be, what makes two requests the same, and what a second request with a key
gets (replay, 409 reused, 409 in flight with Retry-After, a new claim after an error)."""

from __future__ import annotations

import pytest
from sandpit.api.db.database import Database
from sandpit.api.errors import IdempotencyKeyInFlight, IdempotencyKeyReused, error_reply, field_of
from sandpit.api.services.idempotency import Idempotency, Replay, request_digest, valid_key
from sandpit.api.settings import ApiSettings


@pytest.mark.parametrize("key", ["a", "x" * 255, "uuid-4b0c 9f ~!{}", " leading space"])
def test_valid_keys(key: str) -> None:
    assert valid_key(key)


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there", "new\nline", "nul\x00", "\x7f",
                                 "emoji\U0001f600"])
def test_invalid_keys(key: str) -> None:
    assert not valid_key(key)


def test_digest_tells_requests_apart() -> None:
    base = request_digest("POST", "/v1/envs/{env_id}/step", "e1", b"", b'{"name":"bump"}')
    assert base == request_digest("POST", "/v1/envs/{env_id}/step", "e1", b"", b'{"name":"bump"}')
    others = {request_digest("POST", "/v1/envs/{env_id}/reset", "e1", b"", b'{"name":"bump"}'),
              request_digest("POST", "/v1/envs/{env_id}/step", "e2", b"", b'{"name":"bump"}'),
              request_digest("POST", "/v1/envs/{env_id}/step", "e1", b"include=state", b'{"name":"bump"}'),
              request_digest("POST", "/v1/envs/{env_id}/step", "e1", b"", b'{"name": "bump"}'),
              # parts are length-prefixed: moving bytes between env id and query is another request
              request_digest("POST", "/v1/envs/{env_id}/step", "e", b"1", b'{"name":"bump"}')}
    assert base not in others and len(others) == 5


def test_begin_replays_refuses_and_reclaims(database: Database, tmp_path) -> None:
    keys = Idempotency(ApiSettings(data_dir=tmp_path), database)
    claim = keys.begin("t", "k", "d")
    assert not isinstance(claim, Replay)
    with pytest.raises(IdempotencyKeyInFlight) as in_flight:
        keys.begin("t", "k", "d")
    reply = error_reply(in_flight.value)
    assert (reply.status, reply.body["error"]["code"], reply.headers["Retry-After"]) == (
        409, "idempotency_key_in_flight", "1")
    assert reply.body["error"]["field"] == "Idempotency-Key"
    with pytest.raises(IdempotencyKeyReused) as reused:
        keys.begin("t", "k", "other")
    assert error_reply(reused.value).body["error"]["code"] == "idempotency_key_reused"
    keys.finish(claim, 201, b'{"id": "e"}')
    assert keys.begin("t", "k", "d") == Replay(201, b'{"id": "e"}')
    failed = keys.begin("t", "k2", "d")
    assert not isinstance(failed, Replay)
    keys.release(failed)  # an error: nothing stored, the retry runs
    assert not isinstance(keys.begin("t", "k2", "d"), Replay)


def test_expire_deletes_only_old_keys(database: Database, tmp_path) -> None:
    keys = Idempotency(ApiSettings(data_dir=tmp_path, idempotency_key_ttl_s=1e-6), database)
    keys.begin("t", "k", "d")
    assert keys.expire() == 1
    assert Idempotency(ApiSettings(data_dir=tmp_path), database).expire() == 0


def test_header_errors_name_the_header() -> None:
    assert field_of(("header", "Idempotency-Key")) == "Idempotency-Key"
