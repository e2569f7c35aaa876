"""Durability and recovery: docker kill mid-episode, graceful and kill -9 API restarts
under load, idle eviction, more envs than sandboxes, incremental snapshot storage."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

import docker
import docker.errors
import httpx
import pytest
from sandpit.executor.docker import engine

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _create(api: httpx.Client, environment_id: str, **init_config) -> str:
    response = api.post("/v1/envs", json={"environment_id": environment_id, "init_config": init_config})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _bump(api: httpx.Client, env_id: str, by: int = 1) -> dict:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": by}})
    assert response.status_code == 200, response.text
    return response.json()


def test_docker_kill_mid_episode_then_the_next_step_runs_on_the_restored_state(
        api: httpx.Client, server, counter_env_id: str, docker_client: docker.DockerClient) -> None:
    env_id = _create(api, counter_env_id, count=10)
    _bump(api, env_id, 5)
    containers = docker_client.containers.list(filters={"label": f"sandpit.owner={engine.owner_id(server.process.pid)}"})
    assert containers
    for container in containers:  # every sandbox of this server (not other tests'): ours is among them
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # gone or already stopped
            container.kill()
    after = _bump(api, env_id, 1)
    assert (after["status"], after["observation"], after["step"]) in {("ok", "16", 2), ("crashed", after["observation"], 2)}
    if after["status"] == "crashed":  # the kill raced the call: it reports, the next one recovers
        after = _bump(api, env_id, 1)
        assert (after["status"], after["observation"]) == ("ok", "16")
    assert after["recovered"] or after["status"] == "ok"
    state = api.get(f"/v1/envs/{env_id}/state").json()
    assert state["state"]["count"] == 16


def test_api_restarts_lose_no_acknowledged_step(make_server, counter_source: str) -> None:
    server = make_server()
    if True:
        with server.client(timeout=60) as api:
            environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                                "class_name": "Counter"}).json()["id"]
            env_ids = [_create(api, environment_id) for _ in range(4)]
            for env_id in env_ids:
                _bump(api, env_id, 1)
        server.stop()  # graceful restart
        server.start()
        with server.client(timeout=60) as api:
            for env_id in env_ids:
                assert api.get(f"/v1/envs/{env_id}").json()["status"] == "evicted"
                assert _bump(api, env_id, 1)["observation"] == "2"

        acknowledged: dict[str, list[int]] = {env_id: [] for env_id in env_ids}
        stop = threading.Event()

        def drive(env_id: str) -> None:
            with server.client(timeout=30) as client:
                while not stop.is_set():
                    try:
                        response = client.post(f"/v1/envs/{env_id}/step", json={"name": "bump", "arguments": {"by": 1}})
                    except httpx.TransportError:
                        return
                    if response.status_code == 200:
                        acknowledged[env_id].append(response.json()["step"])

        threads = [threading.Thread(target=drive, args=(env_id,)) for env_id in env_ids]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        server.kill()  # kill -9 under load
        stop.set()
        for thread in threads:
            thread.join()
        assert all(len(steps) > 3 for steps in acknowledged.values()), acknowledged
        server.start()
        with server.client(timeout=60) as api:
            for env_id, steps in acknowledged.items():
                head = api.get(f"/v1/envs/{env_id}").json()["step"]
                assert head >= steps[-1], (env_id, head, steps[-1])  # nothing acknowledged is lost
                trajectory = api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]
                assert [s["step"] for s in trajectory] == list(range(1, head + 1))
                state = api.get(f"/v1/envs/{env_id}/state").json()["state"]
                assert state["count"] == head  # every stored step bumped by one
                assert _bump(api, env_id, 1)["observation"] == str(head + 1)


def test_idle_eviction_and_more_envs_than_sandboxes(make_server, counter_source: str) -> None:
    server = make_server(SANDPIT_ENV_IDLE_EVICT_S="1", SANDPIT_EXECUTOR_MAX_SANDBOXES="2",
                         SANDPIT_EXECUTOR_POOL_SIZE="0")
    if True:
        with server.client(timeout=60) as api:
            environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                                "class_name": "Counter"}).json()["id"]
            env_ids = [_create(api, environment_id, count=i * 10) for i in range(5)]  # > 2 sandboxes
            for round_ in range(2):
                for i, env_id in enumerate(env_ids):
                    assert _bump(api, env_id, 1)["observation"] == str(i * 10 + round_ + 1)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                statuses = {api.get(f"/v1/envs/{e}").json()["status"] for e in env_ids}
                if statuses == {"evicted"}:
                    break
                time.sleep(0.3)
            assert statuses == {"evicted"}
            assert _bump(api, env_ids[0], 1)["observation"] == "3"


def _blob_bytes(db_path) -> int:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0]


def test_large_state_is_stored_incrementally(api: httpx.Client, server, counter_env_id: str) -> None:
    records = {f"r{i:05d}": {"value": f"v{i}", "pad": "p" * 180} for i in range(10000)}  # ~2.3 MB
    created = api.post("/v1/envs", json={"environment_id": counter_env_id, "init_config": {"records": records}})
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    before = _blob_bytes(server.db_path)
    steps = 10
    for i in range(steps):
        response = api.post(f"/v1/envs/{env_id}/step",
                            json={"name": "set_record", "arguments": {"key": f"r{i * 7:05d}", "value": f"new{i}"}})
        assert response.json()["status"] == "ok"
    per_step = (_blob_bytes(server.db_path) - before) / steps
    assert per_step <= 20 * 1024, f"{per_step:.0f} bytes stored per step"
    restored = api.post(f"/v1/envs/{env_id}/restore", json={"step": 3}).json()
    assert restored["step"] == 3
    state = api.get(f"/v1/envs/{env_id}/state").json()["state"]
    assert state["records"]["r00014"]["value"] == "new2" and state["records"]["r00021"]["value"] == "v21"
    assert list(state["records"])[:3] == ["r00000", "r00001", "r00002"]  # insertion order kept
    assert api.delete(f"/v1/envs/{env_id}").status_code == 204


def test_a_graceful_stop_closes_the_sessions_of_many_sandboxes_and_leaves_no_container(
        make_server, counter_source: str, docker_client: docker.DockerClient) -> None:
    server = make_server(SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="3", SANDPIT_EXECUTOR_MAX_SANDBOXES="8")
    owner = engine.owner_id(server.process.pid)
    with server.client(timeout=60) as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        env_ids = [_create(api, environment_id, count=n) for n in range(10)]
        for env_id in env_ids:
            _bump(api, env_id, 1)
    assert len(docker_client.containers.list(filters={"label": f"sandpit.owner={owner}"})) >= 4  # 10 envs, 3 a sandbox
    server.stop()  # SIGTERM: every live session closed (several at once), every sandbox removed
    assert docker_client.containers.list(all=True, filters={"label": f"sandpit.owner={owner}"}) == []
    with sqlite3.connect(server.db_path) as db:
        counts = dict(db.execute("SELECT env_id, MAX(step) FROM steps GROUP BY env_id").fetchall())
    assert counts == {env_id: 1 for env_id in env_ids}  # every acknowledged step was kept
