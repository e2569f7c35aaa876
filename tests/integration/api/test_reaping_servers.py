"""Several ``sandpit serve`` processes on one engine (``SANDPIT_EXECUTOR_REAP_ON_START=false``,
as they need): one killed with SIGKILL leaves its sandboxes, and a live server's periodic
sweep removes them within ``reap_interval_s + owner_lease_timeout_s`` while the live
server's own envs keep stepping."""

from __future__ import annotations

import time

import docker
import httpx
import pytest
from api_server import COUNTER_SOURCE, ApiServer
from sandpit.executor.docker import engine

pytestmark = [pytest.mark.docker, pytest.mark.slow]

INTERVAL_S = 1.0
LEASE_S = 4.0
SLACK_S = 8.0
"""Allowance for container removal on a loaded 2-core machine on top of the bound."""


def owned_by(client: docker.DockerClient, pid: int) -> list[str]:
    """Ids of the sandbox containers whose owner label names process ``pid`` of this host."""
    return [c["Id"] for c in engine.sandbox_summaries(client)
            if (c.get("Labels") or {}).get(engine.LABEL_OWNER, "").split(":")[1:2] == [str(pid)]]


def stepping_env(server: ApiServer) -> tuple[httpx.Client, str]:
    api = server.client()
    environment = api.post("/v1/environments", json={"source_code": COUNTER_SOURCE, "class_name": "Counter"})
    assert environment.status_code == 201, environment.text
    env = api.post("/v1/envs", json={"environment_id": environment.json()["id"]})
    assert env.status_code == 201, env.text
    return api, env.json()["id"]


def test_a_killed_servers_sandboxes_are_reaped_by_a_live_server_that_keeps_serving(make_server, tmp_path,
                                                                                   docker_client) -> None:
    shared = {"SANDPIT_EXECUTOR_REAP_ON_START": "false", "SANDPIT_EXECUTOR_REAP_INTERVAL_S": str(INTERVAL_S),
              "SANDPIT_EXECUTOR_OWNER_LEASE_TIMEOUT_S": str(LEASE_S),
              "SANDPIT_EXECUTOR_OWNER_LEASE_DIR": str(tmp_path / "leases")}
    live, victim = make_server(**shared), make_server(**shared)
    live_api, live_env = stepping_env(live)
    victim_api, victim_env = stepping_env(victim)
    try:
        steps = 0

        def step_live() -> None:
            nonlocal steps
            response = live_api.post(f"/v1/envs/{live_env}/step", json={"name": "bump", "arguments": {"by": 1}})
            assert response.status_code == 200 and response.json()["status"] == "ok", response.text
            steps += 1
            assert response.json()["step"] == steps

        for api, env_id in ((live_api, live_env), (victim_api, victim_env)):
            assert api.post(f"/v1/envs/{env_id}/step", json={"name": "bump"}).status_code == 200
        steps = 1
        assert victim.process is not None and live.process is not None
        victim_pid, live_pid = victim.process.pid, live.process.pid
        left = owned_by(docker_client, victim_pid)
        assert left, "the victim server holds sandboxes"
        time.sleep(2 * INTERVAL_S)  # sweeps of a live engine reap nothing of either
        assert set(left) <= set(owned_by(docker_client, victim_pid))

        victim.kill()  # kill -9: no shutdown, no lease released
        killed = time.monotonic()
        while owned_by(docker_client, victim_pid):
            assert time.monotonic() - killed < INTERVAL_S + LEASE_S + SLACK_S, "the dead server's sandboxes stayed"
            step_live()
            time.sleep(0.1)
        took = time.monotonic() - killed
        print(f"killed server's {len(left)} sandbox(es) reaped after {took:.2f} s "
              f"(bound {INTERVAL_S + LEASE_S:.0f} s), {steps} steps of the live server meanwhile")
        for _ in range(5):
            step_live()
        assert owned_by(docker_client, live_pid), "the live server's sandboxes are still there"
        metrics = httpx.get(f"{live.url}/metrics", timeout=30).text
        reaped = [line for line in metrics.splitlines() if line.startswith("sandpit_reaped_sandboxes_total ")]
        assert len(reaped) == 1, "the count of reaped sandboxes is exported"  # by this server or another sweeper
    finally:
        live_api.close()
        victim_api.close()
