"""``Idempotency-Key`` on real sandboxes over HTTP: a retried step runs once and replays
the first body, a key is one request (another body, route or env is 409), tenants do not
share keys, errors are not stored, a request still running is 409 with Retry-After, and
a second server on the same database file replays what the first one stored. A step's
key is claimed in the step's own transaction: eight concurrent sends of one keyed step run
it once (one reply, the others its replay or 409 in flight), and so do two servers on
one database file sent the same slow step at once. Hostile: oversized, empty and
non-ASCII keys."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from api_server import ApiServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _env(api: httpx.Client, environment_id: str, **fields: object) -> str:
    response = api.post("/v1/envs", json={"environment_id": environment_id, **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _count(api: httpx.Client, env_id: str) -> int:
    response = api.get(f"/v1/envs/{env_id}/state")
    assert response.status_code == 200, response.text
    return response.json()["state"]["count"]


def _key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def _step(api: httpx.Client, env_id: str, headers: dict[str, str], by: int = 1, **params: str) -> httpx.Response:
    return api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": by}}, headers=headers,
                    params=params)


def test_a_retried_step_runs_once_and_replays_the_first_body(api: httpx.Client, counter_env_id: str) -> None:
    env_id = _env(api, counter_env_id)
    key = _key()
    first = _step(api, env_id, key, 5, include="state")
    assert first.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    for _ in range(3):
        again = _step(api, env_id, key, 5, include="state")
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
    assert _count(api, env_id) == 5  # the tool ran once
    steps = api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]
    assert [s["step"] for s in steps] == [1]
    assert _step(api, env_id, _key(), 5).json()["observation"] == "10"  # a new key is a new step


def test_a_key_is_one_request(api: httpx.Client, counter_env_id: str) -> None:
    env_id, other_env = _env(api, counter_env_id), _env(api, counter_env_id)
    key = _key()
    assert _step(api, env_id, key, 1).status_code == 200
    refusals = [_step(api, env_id, key, 2),                   # another body
                _step(api, env_id, key, 1, include="state"),  # another query
                _step(api, other_env, key, 1),                # another env
                api.post(f"/v1/envs/{env_id}/reset", json={}, headers=key),  # another route
                api.post("/v1/envs", json={"environment_id": counter_env_id}, headers=key)]
    for refused in refusals:
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "idempotency_key_reused"
        assert refused.json()["error"]["field"] == "Idempotency-Key"
    assert (_count(api, env_id), _count(api, other_env)) == (1, 0)  # nothing ran
    assert api.get(f"/v1/envs/{env_id}").json()["episode"] == 1


def test_tenants_do_not_share_keys(server: ApiServer, api: httpx.Client, counter_env_id: str,
                                   counter_source: str) -> None:
    other_key = server.new_tenant(f"idem-{uuid.uuid4().hex[:8]}")
    with server.client(other_key) as other:
        environment = other.post("/v1/environments", json={"source_code": counter_source, "class_name": "Counter"})
        assert environment.status_code == 201, environment.text
        theirs = _env(other, environment.json()["id"])
        ours = _env(api, counter_env_id)
        key = _key()
        mine = _step(api, ours, key, 3)
        their_step = _step(other, theirs, key, 3)
        assert mine.status_code == their_step.status_code == 200
        assert "idempotent-replayed" not in their_step.headers
        assert their_step.json()["env_id"] == theirs and _count(other, theirs) == 3
        assert _count(api, ours) == 3


def test_errors_are_not_stored_so_the_retry_runs(api: httpx.Client, counter_env_id: str) -> None:
    env_id = _env(api, counter_env_id, episode={"max_steps": 1})
    assert _step(api, env_id, _key(), 1).json()["truncated"] is True
    key = _key()
    ended = _step(api, env_id, key, 1)
    assert ended.status_code == 409 and ended.json()["error"]["code"] == "episode_ended"
    missing = api.post("/v1/envs/no-such-env/step", json={"name": "bump", "arguments": {}}, headers=key)
    assert missing.status_code == 404  # the key was released: another request may take it
    missing_again = api.post("/v1/envs/no-such-env/step", json={"name": "bump", "arguments": {}}, headers=key)
    assert missing_again.status_code == 404
    assert api.post(f"/v1/envs/{env_id}/reset", json={}, headers=_key()).status_code == 200
    retried = _step(api, env_id, key, 1)
    assert retried.status_code == 200 and retried.json()["observation"] == "1", retried.text


def test_a_rejected_action_is_a_step_and_is_stored(api: httpx.Client, counter_env_id: str) -> None:
    env_id, key = _env(api, counter_env_id), _key()
    body = {"name": "no_such_tool", "arguments": {}}
    first = api.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
    assert first.status_code == 200 and first.json()["status"] == "rejected"
    again = api.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
    assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
    assert len(api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]) == 1


def test_a_key_still_running_is_409_with_retry_after(api: httpx.Client, counter_env_id: str,
                                                     server: ApiServer) -> None:
    env_id = _env(api, counter_env_id, profile={"call_timeout_s": 2.0})
    key = _key()
    body = {"name": "spin", "arguments": {}}
    first: list[httpx.Response] = []
    with server.client() as other:
        runner = threading.Thread(target=lambda: first.append(
            other.post(f"/v1/envs/{env_id}/step", json=body, headers=key)))
        runner.start()
        time.sleep(0.7)
        busy = api.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
        runner.join()
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"]["code"] == "idempotency_key_in_flight" and busy.headers["retry-after"] == "1"
    assert first[0].status_code == 200 and first[0].json()["status"] == "timeout"
    replay = api.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
    assert replay.content == first[0].content
    assert len(api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]) == 1


def test_create_reset_and_fork_replay(api: httpx.Client, counter_env_id: str) -> None:
    key = _key()
    body = {"environment_id": counter_env_id, "init_config": {"count": 7}}
    created = [api.post("/v1/envs", json=body, headers=key) for _ in range(2)]
    assert [r.status_code for r in created] == [201, 201]
    assert created[1].content == created[0].content and created[1].headers["idempotent-replayed"] == "true"
    env_id = created[0].json()["id"]
    listed = api.get("/v1/envs", params={"limit": 1000}).json()["data"]
    assert sum(1 for env in listed if env["init_config"] == {"count": 7} and env["id"] == env_id) == 1
    reset_key = _key()
    resets = [api.post(f"/v1/envs/{env_id}/reset", json={"init_config": {"count": 1}}, headers=reset_key)
              for _ in range(2)]
    assert [r.status_code for r in resets] == [200, 200] and resets[1].content == resets[0].content
    assert api.get(f"/v1/envs/{env_id}").json()["episode"] == 2  # one reset, not two
    fork_key = _key()
    forks = [api.post(f"/v1/envs/{env_id}/fork", json={"count": 2}, headers=fork_key) for _ in range(2)]
    assert [r.status_code for r in forks] == [201, 201] and forks[1].content == forks[0].content
    assert len(forks[0].json()["data"]) == 2


@pytest.mark.parametrize("value", ["x" * 256, "", "caf\u00e9".encode("latin-1"), "caf\u00e9".encode(),
                                   b"tab\there"])
def test_malformed_keys_are_422_naming_the_header(api: httpx.Client, counter_env_id: str,
                                                  value: str | bytes) -> None:
    env_id = _env(api, counter_env_id)
    headers = {"Idempotency-Key": value}
    for response in (api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {}}, headers=headers),
                     api.post(f"/v1/envs/{env_id}/reset", json={}, headers=headers),
                     api.post("/v1/envs", json={"environment_id": counter_env_id}, headers=headers)):
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "Idempotency-Key"
    assert _count(api, env_id) == 0 and api.get(f"/v1/envs/{env_id}").json()["episode"] == 1


def test_a_second_server_on_the_same_database_replays(make_server, counter_source: str, tmp_path) -> None:
    first = make_server()
    with first.client() as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        env_id = _env(api, environment_id)
        key = _key()
        stepped = _step(api, env_id, key, 4)
        assert stepped.status_code == 200
    first.stop()  # the first server is gone; a second one (a new process) shares its database file
    second = ApiServer(tmp_path / "second", SANDPIT_DATABASE_URL=f"sqlite:///{first.db_path}")
    second.api_key = first.api_key
    second.start()
    try:
        with second.client() as api:
            replay = _step(api, env_id, key, 4)
            assert replay.status_code == 200 and replay.headers["idempotent-replayed"] == "true"
            assert replay.content == stepped.content
            assert _count(api, env_id) == 4
            assert _step(api, env_id, key, 5).json()["error"]["code"] == "idempotency_key_reused"
    finally:
        second.stop()


SLOW_SOURCE = '''
import time


class Slow:
    """A counter whose bump takes a while."""

    def __init__(self, init_config: dict):
        self.count = 0

    def bump(self, by: int = 1, seconds: float = 0.0) -> int:
        """Wait `seconds`, then add `by`."""
        time.sleep(seconds)
        self.count += by
        return self.count
'''


def _sent_at_once(sends: list) -> list[httpx.Response]:
    barrier = threading.Barrier(len(sends))

    def send(index: int) -> httpx.Response:
        barrier.wait()
        return sends[index]()

    with ThreadPoolExecutor(len(sends)) as pool:
        return list(pool.map(send, range(len(sends))))


def _once(replies: list[httpx.Response], refusals: tuple[tuple[int, str], ...] = (
        (409, "idempotency_key_in_flight"),)) -> httpx.Response:
    """The one reply of a step that ran, checked against the others: each is that step's
    replay (the same bytes) or one of ``refusals`` (status, code) with Retry-After."""
    ran = [r for r in replies if r.status_code == 200 and "idempotent-replayed" not in r.headers]
    assert len(ran) == 1, [(r.status_code, r.headers.get("idempotent-replayed"), r.text) for r in replies]
    for reply in replies:
        if reply.status_code == 200:
            assert reply.content == ran[0].content
        else:
            assert (reply.status_code, reply.json()["error"]["code"]) in refusals, reply.text
            assert reply.headers["retry-after"] == "1"
    return ran[0]


def test_concurrent_sends_of_one_keyed_step_run_it_once(server: ApiServer, counter_env_id: str) -> None:
    with server.client() as api:
        env_id = _env(api, counter_env_id)
        key = _key()
        clients = [server.client() for _ in range(8)]
        try:
            replies = _sent_at_once([lambda c=c: _step(c, env_id, key, 3) for c in clients])
        finally:
            for client in clients:
                client.close()
        first = _once(replies)
        assert _count(api, env_id) == 3
        assert [s["step"] for s in api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]] == [1]
        later = _step(api, env_id, key, 3)
        assert later.headers["idempotent-replayed"] == "true" and later.content == first.content


def test_two_servers_sent_one_slow_keyed_step_at_once_run_it_once(make_server, tmp_path) -> None:
    """Two replicas on one database file, the same keyed step sent to both while neither
    has committed it: the key's row is written only by the step's transaction, so the
    second commit finds it taken and commits nothing; its reply is the first's replay,
    a 409 in flight, or the 503 of a head that moved twice under it (as for any two
    replicas stepping one env at once), and the env's history and state hold the step
    once."""
    first = make_server()
    second = ApiServer(tmp_path / "second", SANDPIT_DATABASE_URL=f"sqlite:///{first.db_path}",
                       SANDPIT_OPERATOR_KEY=first.operator_key)
    second.api_key = first.api_key
    second.start()
    try:
        _two_replicas_run_one_slow_keyed_step(first, second)
    finally:
        second.stop()


def _two_replicas_run_one_slow_keyed_step(first: ApiServer, second: ApiServer) -> None:
    with first.client() as one, second.client() as two:
        environment = one.post("/v1/environments", json={"source_code": SLOW_SOURCE, "class_name": "Slow"})
        assert environment.status_code == 201, environment.text
        env_id = _env(one, environment.json()["id"])
        for client in (one, two):  # each replica has stepped the env once: both hold a session of it
            assert _step(client, env_id, _key(), 1).status_code == 200
        key = _key()
        body = {"name": "bump", "arguments": {"by": 10, "seconds": 0.5}}
        replies = _sent_at_once([lambda c=c: c.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
                                 for c in (one, two)])
        ran = _once(replies, ((409, "idempotency_key_in_flight"), (503, "unavailable")))
        assert ran.json()["observation"] == "12"
        steps = one.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert one.get(f"/v1/envs/{env_id}/state").json()["state"]["count"] == 12
        for client in (one, two):  # either replica replays it, and steps on from the committed head
            again = client.post(f"/v1/envs/{env_id}/step", json=body, headers=key)
            assert again.headers["idempotent-replayed"] == "true" and again.content == ran.content
        assert _step(two, env_id, _key(), 1).json()["observation"] == "13"
        assert _step(one, env_id, _key(), 1).json()["observation"] == "14"
