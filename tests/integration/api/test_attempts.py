"""Attempt fencing on real sandboxes over HTTP: after a resume, a stale worker's step,
reset, restore and delete are 409 ``stale_attempt`` and change nothing; the new attempt
steps; calls without a token are not fenced; malformed tokens are 422 naming the header,
another env's token is stale, another tenant's env is 404; a server restart keeps the
fence."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _env(api: httpx.Client, environment_id: str) -> str:
    response = api.post("/v1/envs", json={"environment_id": environment_id})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _resume(api: httpx.Client, env_id: str) -> dict:
    response = api.post(f"/v1/envs/{env_id}/attempts")
    assert response.status_code == 201, response.text
    return response.json()


def _bump(api: httpx.Client, env_id: str, token: str | None) -> httpx.Response:
    headers = {"Sandpit-Attempt": token} if token is not None else {}
    return api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}}, headers=headers)


def _count(api: httpx.Client, env_id: str) -> int:
    return api.get(f"/v1/envs/{env_id}/state").json()["state"]["count"]


def test_a_stale_worker_is_fenced_and_the_new_attempt_steps(api: httpx.Client, counter_env_id: str) -> None:
    env_id = _env(api, counter_env_id)
    first = _resume(api, env_id)
    assert first["attempt"] == 1 and first["env_id"] == env_id and len(first["token"]) == 32
    assert _bump(api, env_id, first["token"]).status_code == 200
    second = _resume(api, env_id)
    assert second["attempt"] == 2 and second["token"] != first["token"]
    head = api.get(f"/v1/envs/{env_id}").json()
    stale = {"Sandpit-Attempt": first["token"]}
    refusals = [_bump(api, env_id, first["token"]),
                api.post(f"/v1/envs/{env_id}/reset", json={}, headers=stale),
                api.post(f"/v1/envs/{env_id}/restore", json={"step": 0}, headers=stale),
                api.delete(f"/v1/envs/{env_id}", headers=stale)]
    for refused in refusals:
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "stale_attempt"
    after = api.get(f"/v1/envs/{env_id}").json()
    assert (after["episode"], after["step"]) == (head["episode"], head["step"]) == (1, 1)
    assert _count(api, env_id) == 1  # the stale step changed nothing
    assert _bump(api, env_id, second["token"]).json()["observation"] == "2"
    assert _bump(api, env_id, None).json()["observation"] == "3"  # no token: not fenced


def test_hostile_tokens(api: httpx.Client, counter_env_id: str, server) -> None:
    env_id, other_env = _env(api, counter_env_id), _env(api, counter_env_id)
    never_resumed = _bump(api, env_id, "a" * 32)
    assert never_resumed.status_code == 409 and never_resumed.json()["error"]["code"] == "stale_attempt"
    mine, theirs = _resume(api, env_id), _resume(api, other_env)
    crossed = _bump(api, env_id, theirs["token"])  # another env's current token
    assert crossed.status_code == 409 and crossed.json()["error"]["code"] == "stale_attempt"
    for malformed in ("x" * 65, "", "has space", "caf\u00e9".encode(), "a/b"):
        headers = {"Sandpit-Attempt": malformed}
        for response in (api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {}}, headers=headers),
                         api.post(f"/v1/envs/{env_id}/reset", json={}, headers=headers)):
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"] == "Sandpit-Attempt"
    assert _count(api, env_id) == 0
    intruder = server.new_tenant("attempt-intruder")
    with server.client(intruder) as other:
        assert other.post(f"/v1/envs/{env_id}/attempts").status_code == 404
        assert _bump(other, env_id, mine["token"]).status_code == 404
    assert api.post("/v1/envs/no-such-env/attempts").status_code == 404
    assert _bump(api, env_id, mine["token"]).status_code == 200


def test_the_fence_survives_a_restart(make_server, counter_source: str) -> None:
    server = make_server()
    with server.client() as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        env_id = _env(api, environment_id)
        old, new = _resume(api, env_id), _resume(api, env_id)
    server.stop()
    server.start()
    with server.client() as api:
        assert _bump(api, env_id, old["token"]).json()["error"]["code"] == "stale_attempt"
        assert _bump(api, env_id, new["token"]).status_code == 200
        assert _count(api, env_id) == 1


SLOW_SOURCE = '''
import time


class Slow:
    """A counter whose bump takes a while."""

    def __init__(self, init_config):
        self.count = 0

    def bump(self, seconds: float = 1.5) -> int:
        """Add one after sleeping `seconds`."""
        time.sleep(seconds)
        self.count += 1
        return self.count
'''


def test_a_resume_during_a_step_keeps_that_step_from_committing(api: httpx.Client, server) -> None:
    created = api.post("/v1/envs", json={"source_code": SLOW_SOURCE, "class_name": "Slow"})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    old = _resume(api, env_id)
    results: list[httpx.Response] = []
    with server.client() as worker:
        thread = threading.Thread(target=lambda: results.append(worker.post(
            f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"seconds": 1.5}},
            headers={"Sandpit-Attempt": old["token"]})))
        thread.start()
        time.sleep(0.5)  # the step's tool is running
        new = _resume(api, env_id)
        thread.join()
    assert results[0].status_code == 409 and results[0].json()["error"]["code"] == "stale_attempt"
    assert api.get(f"/v1/envs/{env_id}").json()["step"] == 0
    assert api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"] == []
    stepped = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"seconds": 0}},
                       headers={"Sandpit-Attempt": new["token"]})
    assert stepped.json()["observation"] == "1"  # the sandbox was re-synced from the committed head
