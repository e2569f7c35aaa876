"""Scale-out end to end: a real local Ray cluster of two sandbox nodes (plus a head without
Docker), a real PostgreSQL database, two ``sandpit serve`` replicas on the Ray backend.

Envs are created through both replicas and spread over both nodes; every env is stepped
through either replica in turn; one node is removed mid-run. Every acknowledged step must
be in the database and in the state, and the envs of the lost node must resume on the
other node from their last committed step. Everything runs on loopback only (Ray's node
address is forced to 127.0.0.1; see ``loopback_ray``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import postgres
import pytest
from api_server import COUNTER_SOURCE, ApiServer
from sandpit.executor import engine
from sqlalchemy import create_engine, text

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray then takes 127.0.0.1 as every node's address (``get_node_ip_address``), never an
interface's. Ray reads it when imported, so it is set before the import, for this whole
process (its drivers and the replicas it starts)."""
os.environ.update(LOOPBACK)
pytestmark = [pytest.mark.docker, pytest.mark.slow]
ray = pytest.importorskip("ray", reason="the Ray backend needs the 'ray' extra (scripts/test installs it)") \
    if os.environ.get("SANDPIT_REQUIRE_DOCKER") != "1" else __import__("ray")
from ray.cluster_utils import Cluster  # noqa: E402

ENVS = 4
ROUNDS_BEFORE, ROUNDS_AFTER = 3, 3
RETRY_FOR_S = 90.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head (no Docker resource) + two nodes with ``sandpit_docker: 1``, all on 127.0.0.1."""
    system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
              "health_check_initial_delay_ms": 1000}
    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False, "_system_config": system})
    try:
        for _ in range(2):
            made.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
        made.wait_for_nodes()
        yield made
    finally:
        _stop_hosts(made.address)
        if ray.is_initialized():
            ray.shutdown()
        made.shutdown()


def _stop_hosts(address: str) -> None:
    """Close the surviving hosts' pools (their containers go) and reap the lost node's."""
    from sandpit.executor.ray_backend import RayExecutor

    try:
        executor = RayExecutor(address).start()
        executor.shutdown_hosts()
    except Exception as exc:  # noqa: BLE001 - teardown: report, then reap below
        print(f"stopping hosts: {exc}")
    client = docker.from_env(timeout=30)
    try:
        engine.reap(client)  # containers whose owning process (the lost node's host) died
    finally:
        client.close()


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with postgres.fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def replicas(cluster: Cluster, pg_url: str, tmp_path_factory: pytest.TempPathFactory, leak_check,
             sandbox_image) -> Iterator[list[ApiServer]]:
    env = {"SANDPIT_DATABASE_URL": pg_url, "SANDPIT_EXECUTOR_BACKEND": "ray", "SANDPIT_RAY_ADDRESS": cluster.address,
           "SANDPIT_WARM_ON_START": "0", "SANDPIT_EXECUTOR_POOL_SIZE": "0", "SANDPIT_AUTH_CACHE_TTL_S": "0",
           **LOOPBACK}
    first = ApiServer(tmp_path_factory.mktemp("replica0"), **env)
    second = ApiServer(tmp_path_factory.mktemp("replica1"), SANDPIT_OPERATOR_KEY=first.operator_key, **env)
    started: list[ApiServer] = []
    try:
        started.append(first.start(timeout_s=120))
        second.api_key = first.api_key  # one database: tenant `default` exists already
        started.append(second.start(timeout_s=120))
        yield started
    finally:
        for server in started:
            server.stop()


def call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """A request retried on 503/429 (what ``sandpit.client`` does) for ``RETRY_FOR_S``."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        response = client.request(method, path, **kwargs)
        if response.status_code not in (429, 503) or time.monotonic() > deadline:
            return response
        time.sleep(min(float(response.headers.get("Retry-After", "1")), 2.0))


def hosts_of(pg_url: str, env_ids: list[str]) -> dict[str, str]:
    engine_ = create_engine(pg_url)
    try:
        with engine_.connect() as conn:
            rows = conn.execute(text("SELECT env_id, host FROM env_hosts")).all()
    finally:
        engine_.dispose()
    return {env_id: host for env_id, host in rows if env_id in env_ids}


def test_envs_survive_the_loss_of_a_node_through_either_replica(cluster: Cluster, replicas: list[ApiServer],
                                                                 pg_url: str, tmp_path: Path) -> None:
    clients = [server.client(timeout=120) for server in replicas]
    try:
        created = call(clients[0], "POST", "/v1/environments", json={
            "name": "counter", "source_code": COUNTER_SOURCE, "class_name": "Counter"})
        assert created.status_code == 201, created.text
        environment_id = created.json()["id"]
        env_ids = []
        for i in range(ENVS):  # created through both replicas
            response = call(clients[i % 2], "POST", "/v1/envs", json={"environment_id": environment_id,
                                                                     "init_config": {"count": 100 * i}})
            assert response.status_code == 201, response.text
            env_ids.append(response.json()["id"])
        placed = hosts_of(pg_url, env_ids)
        assert set(placed) == set(env_ids)
        assert len(set(placed.values())) == 2, f"envs should be spread over both nodes: {placed}"

        acknowledged: dict[str, list[int]] = {env_id: [] for env_id in env_ids}

        def round_(number: int) -> None:
            for i, env_id in enumerate(env_ids):
                by = number * 10 + i + 1
                response = call(clients[(number + i) % 2], "POST", f"/v1/envs/{env_id}/step",
                                json={"name": "bump", "arguments": {"by": by}})
                assert response.status_code == 200, response.text
                body = response.json()
                assert body["status"] == "ok", body
                acknowledged[env_id].append(by)
                assert body["observation"] == str(100 * i + sum(acknowledged[env_id]))

        for number in range(ROUNDS_BEFORE):
            round_(number)

        # lose the node of env 0 (a worker node: the head carries no sandbox host)
        from sandpit.executor.ray_backend import HOST_PREFIX

        lost_host = placed[env_ids[0]]
        victim = next(node for node in cluster.worker_nodes
                      if HOST_PREFIX + node.node_id[:16] == lost_host)
        cluster.remove_node(victim, allow_graceful=False)
        affected = [env_id for env_id in env_ids if placed[env_id] == lost_host]

        for number in range(ROUNDS_BEFORE, ROUNDS_BEFORE + ROUNDS_AFTER):
            round_(number)

        moved = hosts_of(pg_url, env_ids)
        assert all(moved[env_id] != lost_host for env_id in affected), moved
        for i, env_id in enumerate(env_ids):  # every acknowledged step, through either replica
            for client in clients:
                head = call(client, "GET", f"/v1/envs/{env_id}").json()
                assert head["step"] == len(acknowledged[env_id])
                steps = call(client, "GET", f"/v1/envs/{env_id}/trajectory").json()["steps"]
                bumps = [s["action"]["arguments"]["by"] for s in steps if s.get("action")]
                assert bumps == acknowledged[env_id]
                state = call(client, "GET", f"/v1/envs/{env_id}/state").json()["state"]
                assert state["count"] == 100 * i + sum(acknowledged[env_id])
                assert state["log"] == [f"bump {by}" for by in acknowledged[env_id]]
        for env_id in env_ids:
            assert call(clients[1], "DELETE", f"/v1/envs/{env_id}").status_code == 204
    finally:
        for client in clients:
            client.close()
