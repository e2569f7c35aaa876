"""Env lifetime, storage freed by deletion, and 503 + Retry-After without capacity."""

from __future__ import annotations

import sqlite3
import threading
import time

import httpx
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _count(db_path, table: str) -> int:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names


def test_expired_envs_answer_409_and_deleting_envs_frees_their_state(make_server, counter_source: str) -> None:
    server = make_server(SANDPIT_ENV_MAX_LIFETIME_S="3")
    with server.client(timeout=60) as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        baseline = _count(server.db_path, "blobs")
        env_id = api.post("/v1/envs", json={"environment_id": environment_id}).json()["id"]
        for i in range(5):
            response = api.post(f"/v1/envs/{env_id}/step",
                                json={"name": "set_record", "arguments": {"key": f"k{i}", "value": "v" * 3000}})
            assert response.json()["status"] == "ok"
        assert _count(server.db_path, "blobs") > baseline
        time.sleep(3.5)
        expired = api.post(f"/v1/envs/{env_id}/step", json={"name": "bump"})
        assert expired.status_code == 409 and "expired" in expired.json()["error"]["message"]
        refused = api.post(f"/v1/envs/{env_id}/reset", json={"init_config": {"count": 1}})
        assert refused.status_code == 409 and "expired" in refused.json()["error"]["message"]
        closed = api.get(f"/v1/envs/{env_id}").json()
        assert (closed["status"], closed["episode"], closed["step"]) == ("closed", 1, 5)  # the reset changed nothing
        assert api.delete(f"/v1/envs/{env_id}").status_code == 204
        deadline = time.monotonic() + 10
        while _count(server.db_path, "blobs") > baseline and time.monotonic() < deadline:
            time.sleep(0.3)  # the janitor collects unreferenced blobs
        assert _count(server.db_path, "blobs") == baseline
        assert _count(server.db_path, "steps") == 0


def test_no_capacity_is_503_with_retry_after(make_server, counter_source: str) -> None:
    # two running calls for the tenant: the create must not queue behind the spin call's slot
    # (the default is half the cores, 1 on a 2-core machine), it must meet the full pool
    server = make_server(SANDPIT_EXECUTOR_MAX_SANDBOXES="1", SANDPIT_EXECUTOR_POOL_SIZE="0",
                         SANDPIT_QUOTAS__MAX_RUNNING_CALLS="2")
    with server.client(timeout=60) as api:
        environment_id = api.post("/v1/environments", json={"source_code": counter_source,
                                                            "class_name": "Counter"}).json()["id"]
        created = api.post("/v1/envs", json={"environment_id": environment_id, "profile": {"call_timeout_s": 8}})
        assert created.status_code == 201, created.text
        busy = created.json()["id"]
        spinning = threading.Thread(target=lambda: httpx.post(f"{server.url}/v1/envs/{busy}/step",
                                                              json={"name": "spin"}, timeout=60,
                                                              headers=server.headers))
        spinning.start()
        # the only sandbox is busy, and its env cannot be evicted mid-call; the margin is for a
        # loaded CI machine, where the spin call can take well over a second to reach the sandbox
        time.sleep(2)
        refused = api.post("/v1/envs", json={"environment_id": environment_id})
        spinning.join()
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1 and refused.json()["error"]["code"] == "no_capacity"
        assert api.get("/v1/envs").json()["count"] == 1  # nothing half-created
        retried = api.post("/v1/envs", json={"environment_id": environment_id})  # the idle env is evicted now
        assert retried.status_code == 201, retried.text
