"""Idempotency keys (``sandpit.api.services.idempotency``) on a real SQLite file: what a
key may be, what makes two requests the same, and what a second request with a key
gets (replay, 409 reused, 409 in flight with Retry-After, a new claim after an error);
a step's check, which only reads, and whose claim its own transaction takes."""

from __future__ import annotations

import threading

import pytest
from sandpit.api.db.database import Database
from sandpit.api.db.idempotency import claim_with_response_core
from sandpit.api.errors import IdempotencyKeyInFlight, IdempotencyKeyReused, error_reply, field_of
from sandpit.api.services.common import utcnow
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


def test_check_reads_and_the_steps_transaction_claims(database: Database, tmp_path) -> None:
    keys = Idempotency(ApiSettings(data_dir=tmp_path, idempotency_key_ttl_s=600, idempotency_lease_s=30), database)
    claim = keys.check("t", "k", "d")
    assert not isinstance(claim, Replay) and claim.deferred is not None
    assert (claim.deferred.digest, claim.deferred.ttl_s, claim.deferred.lease_s) == ("d", 600, 30)
    with pytest.raises(IdempotencyKeyInFlight) as in_flight:  # the same key while this process runs it
        keys.check("t", "k", "d")
    assert error_reply(in_flight.value).headers["Retry-After"] == "1"
    with pytest.raises(IdempotencyKeyInFlight):  # any digest: the key is busy
        keys.check("t", "k", "other")
    assert not isinstance(keys.check("t2", "k", "d"), Replay)  # another tenant's key
    keys.forget(claim)  # the step failed: nothing was written, the key is free again
    again = keys.check("t", "k", "d")
    assert not isinstance(again, Replay)
    with database.write_connection() as conn:
        claim_with_response_core(conn, again, utcnow(), 200, b'{"step": 1}')
    keys.forget(again)
    assert keys.check("t", "k", "d") == Replay(200, b'{"step": 1}')
    assert keys.check("t", "k", "d") == Replay(200, b'{"step": 1}')  # a replay holds nothing
    with pytest.raises(IdempotencyKeyReused):
        keys.check("t", "k", "another body")


def test_check_refuses_a_key_another_route_holds(database: Database, tmp_path) -> None:
    keys = Idempotency(ApiSettings(data_dir=tmp_path), database)
    begun = keys.begin("t", "k", "reset")
    assert not isinstance(begun, Replay)
    with pytest.raises(IdempotencyKeyInFlight):
        keys.check("t", "k", "reset")
    with pytest.raises(IdempotencyKeyReused):  # another request's digest, as begin() answers it
        keys.check("t", "k", "step")
    keys.finish(begun, 200, b"{}")
    assert keys.check("t", "k", "reset") == Replay(200, b"{}")
    with pytest.raises(IdempotencyKeyReused):
        keys.check("t", "k", "step")


def test_concurrent_checks_of_one_key_give_one_claim(database: Database, tmp_path) -> None:
    keys = Idempotency(ApiSettings(data_dir=tmp_path), database)
    claims, refusals = [], []
    barrier = threading.Barrier(8)

    def check() -> None:
        barrier.wait()
        try:
            claims.append(keys.check("t", "k", "d"))
        except IdempotencyKeyInFlight:
            refusals.append(1)

    threads = [threading.Thread(target=check) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(claims), len(refusals)) == (1, 7)
