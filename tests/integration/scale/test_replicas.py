"""Scale-out end to end: a real local Ray cluster of two sandbox nodes (plus a head without
Docker), a real PostgreSQL database, two ``sandpit serve`` replicas on the Ray backend.

The tests share one cluster and run in file order:

1. drain: a third node joins; envs spread over the three hosts are stepped by client
   threads through both replicas while one host is drained (twice, concurrently, through
   both replicas). Every acknowledged step must be there, the drained host's envs on other
   hosts with the right state, no 5xx but the 503s the client library retries, no
   container of the drained host left. The two remaining hosts serve the next test.
2. loss: envs are created through both replicas and spread over both nodes; every env is
   stepped through either replica in turn; one node is removed mid-run. Every acknowledged
   step must be in the database and in the state, and the envs of the lost node must
   resume on the other node from their last committed step.
3. hostile drains: unknown, empty, long and odd host names, a tenant key, and two
   concurrent drains of the last two hosts taking envs (exactly one is refused: 409).
4. undrain of a draining host (a fifth node joins): its drain, held by a long tool call,
   stops at its next pass without shutting the host down; a new env lands there; every
   acknowledged step is there.
5. undrain of a drained host whose node lives (drained by test 1 or 3; through the CLI):
   its actor is re-created on that node and takes envs.
6. hostile undrains (odd names 404/422, a tenant key 401/403, a never-drained host a
   no-op) and the undrain of a drained host whose node was removed: 409.
7. takeover: a third replica starts a drain held by a long call and is killed (SIGKILL);
   once its heartbeat is stale exactly one of the two live replicas claims the drain and
   finishes it (row ``drained``, owned by the claimer); the call is acknowledged.

Everything runs on loopback only (Ray's node address is forced to 127.0.0.1; see
``LOOPBACK``)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import docker
import httpx
import postgres
import pytest
from api_server import COUNTER_SOURCE, ApiServer
from sandpit.api.settings import LEASE_S
from sandpit.client import Client, Conflict, NotFound, SandpitError, Unauthorized
from sandpit.executor.docker import engine
from sqlalchemy import create_engine, text
from waiting import wait_until

LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray then takes 127.0.0.1 as every node's address (``get_node_ip_address``), never an
interface's. Ray reads it when imported, so it is set before the import, for this whole
process (its drivers and the replicas it starts)."""
os.environ.update(LOOPBACK)
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.serial]  # Ray clusters on timed health checks
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
    from sandpit.executor.ray import RayExecutor

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


def replica_env(cluster: Cluster, pg_url: str) -> dict[str, str]:
    """The environment of a ``sandpit serve`` replica on ``cluster`` and ``pg_url``."""
    return {"SANDPIT_DATABASE_URL": pg_url, "SANDPIT_EXECUTOR_BACKEND": "ray", "SANDPIT_RAY_ADDRESS": cluster.address,
            "SANDPIT_WARM_ON_START": "0", "SANDPIT_EXECUTOR_POOL_SIZE": "0", "SANDPIT_AUTH_CACHE_TTL_S": "0",
            **LOOPBACK}


@pytest.fixture(scope="module")
def replicas(cluster: Cluster, pg_url: str, tmp_path_factory: pytest.TempPathFactory, leak_check,
             sandbox_image) -> Iterator[list[ApiServer]]:
    env = replica_env(cluster, pg_url)
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


def wait_until_gone(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until process ``pid`` (a lost node's host actor) has exited: removing a node
    kills its raylet at once, but the worker process notices only later (seconds on a
    loaded machine) and answers direct actor calls until then."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the lost node's host process {pid} still runs after {timeout_s} s")


def hosts_of(pg_url: str, env_ids: list[str]) -> dict[str, str]:
    engine_ = create_engine(pg_url)
    try:
        with engine_.connect() as conn:
            rows = conn.execute(text("SELECT env_id, host FROM env_hosts")).all()
    finally:
        engine_.dispose()
    return {env_id: host for env_id, host in rows if env_id in env_ids}


class StatusRecorder(httpx.HTTPTransport):
    """An httpx transport that records the status of every response (the client library's
    retries included), so a test sees every 5xx even when the client retried it."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        with self.lock:
            self.statuses.append(response.status_code)
        return response


def host_of_node(node: Any) -> str:
    from sandpit.executor.ray import HOST_PREFIX

    return HOST_PREFIX + node.node_id[:16]


def wait_for_hosts(admins: list[Client], hosts: set[str], timeout_s: float = 90.0) -> None:
    """Until every replica lists ``hosts`` among its live, non-drained hosts."""
    deadline = time.monotonic() + timeout_s
    for admin in admins:
        while True:
            seen = {h.host for h in admin.admin.cluster.status().hosts if h.drain != "drained"}
            if hosts <= seen:
                break
            assert time.monotonic() < deadline, f"hosts {hosts} not all seen: {seen}"
            time.sleep(0.5)


DRAIN_ENVS = 6
STEPS_AFTER_DRAIN = 3
NAP_S = 6.0
NAPPER_SOURCE = '''
import time


class Napper:
    """A counter whose nap is a call still running when the drain starts."""

    def __init__(self, init_config: dict):
        self.count = init_config.get("count", 0)

    def nap(self, seconds: float) -> int:
        """Sleep, then add one.

        Args:
            seconds (float): how long.
        """
        time.sleep(seconds)
        self.count += 1
        return self.count
'''


def test_session_requests_take_the_host_link_and_a_broken_link_loses_nothing(
        cluster: Cluster, leak_check: None, sandbox_image: str) -> None:
    """Tool calls reach the host over its link (not Ray) with the same answers as through
    Ray; a stranger with a wrong token or without the host's certificate is refused; a link that breaks mid-call fails that
    call with SandboxLost while the host stays live, and the env then re-attaches on the
    same host with its state."""
    from sandpit.executor import prepare_state
    from sandpit.executor.errors import LinkRefused, SandboxLost
    from sandpit.executor.ray import RayExecutor
    from sandpit.executor.ray.link import HostLink, self_signed
    from sandpit.executor.settings import ExecutorSettings

    settings = ExecutorSettings(pool_size=0)  # as the replicas' (whoever comes first creates the hosts)
    direct = RayExecutor(cluster.address, settings).start()
    through_ray = RayExecutor(cluster.address, settings, direct=False).start()
    try:
        linked = direct.open_session(tenant="links", source=NAPPER_SOURCE, class_name="Napper",
                                     init_config={"count": 5}, session_id="env_link_direct")
        plain = through_ray.open_session(tenant="links", source=NAPPER_SOURCE, class_name="Napper",
                                         init_config={"count": 5}, session_id="env_link_ray")
        for seconds in (0.0, 0.01):
            a, b = linked.call("nap", {"seconds": seconds}), plain.call("nap", {"seconds": seconds})
            assert a.model_dump(exclude={"duration_ms", "tool_ms"}) == b.model_dump(exclude={"duration_ms", "tool_ms"})
        assert linked.call("nap", {"seconds": "x"}).status == plain.call("nap", {"seconds": "x"}).status
        assert linked.state() == plain.state()
        prepared = prepare_state({"count": ["j", 5]})  # a state's text goes over Ray as its encoded state
        check = {"check_item": "grew", "check_func": "def check_func(final_state):\n"
                                                   "    return final_state['count'] > initial_state['count']\n"}
        for final, passed in (({"count": ["j", 6]}, True), (prepared, False)):
            results = through_ray.run_checks(tenant="links", checks=[check], initial_state=prepared, final_state=final)
            assert [r.passed for r in results] == [passed], results
        host = linked.host
        assert host in direct._links and not through_ray._links
        refused_before = direct.ask(host, "info")["links_refused"]  # a Ray call (not a link method)

        where = direct.ask(host, "endpoint")
        assert where["address"] == "127.0.0.1" and len(where["token"]) == 64
        with pytest.raises(LinkRefused):  # the right certificate, a wrong token: refused, nothing served
            HostLink("stranger", where["address"], where["port"], "0" * 64, settings.max_frame_bytes,
                     where["certificate"])
        with pytest.raises(LinkRefused):  # the right token, another certificate: no TLS session at all
            HostLink("stranger", where["address"], where["port"], where["token"], settings.max_frame_bytes,
                     self_signed("127.0.0.1")[1].decode("ascii"))
        assert direct.ask(host, "info")["links_refused"] == refused_before + 1
        assert linked.call("nap", {"seconds": 0}).observation  # the session is still there

        committed = linked.read_state()  # the head before the call whose outcome is lost
        count = linked.state()["count"]
        failures: list[BaseException] = []

        def nap() -> None:
            try:
                linked.call("nap", {"seconds": 3.0})
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                failures.append(exc)

        napping = threading.Thread(target=nap)
        napping.start()
        time.sleep(1.0)
        direct._links[host].close()  # the connection breaks under the call in flight
        napping.join(30)
        assert len(failures) == 1 and isinstance(failures[0], SandboxLost), failures
        assert host in direct.refresh() and host not in direct._dead  # Ray says it lives: not lost
        assert linked.closed
        resumed = direct.open_session(tenant="links", source=NAPPER_SOURCE, class_name="Napper",
                                      session_id="env_link_direct", snapshot=committed)
        assert resumed.host == host and resumed.state()["count"] == count  # the nap's effect is rolled back
        assert resumed.call("nap", {"seconds": 0}).observation == str(count + 1)
        resumed.close()
        plain.close()
    finally:
        through_ray.close()
        direct.close()


def test_metrics_show_each_hosts_sessions_and_links(cluster: Cluster, replicas: list[ApiServer]) -> None:
    """``/metrics`` of a replica on the Ray backend: per host, its sandboxes, sessions and
    calls on its host link, and the stranger the previous test sent (refused)."""
    import re

    client = Client(replicas[0].url, api_key=replicas[0].api_key, timeout=120, max_retry_wait_s=120)
    env = client.envs.create(source_code=NAPPER_SOURCE, class_name="Napper", init_config={"count": 1})
    try:
        assert env.step("nap", seconds=0).observation == "2"
        with httpx.Client(base_url=replicas[0].url, headers=replicas[0].operator_headers, timeout=60) as raw:
            response = raw.get("/metrics")
        assert response.status_code == 200, response.text
        text = response.text
        hosts = {host_of_node(node) for node in cluster.worker_nodes}
        for host in hosts:
            for family in ("sandpit_host_sessions", "sandpit_host_link_calls", "sandpit_host_link_refused_total"):
                assert re.search(rf'^{family}{{host="{host}"}} [0-9.e+]+$', text, re.M), (family, host)
        calls = {m[0]: float(m[1]) for m in re.findall(r'^sandpit_host_link_calls\{host="([^"]+)"\} (\S+)$', text, re.M)}
        assert set(calls) == hosts and all(value >= 0 for value in calls.values())
        refused = sum(float(v) for v in re.findall(r'^sandpit_host_link_refused_total\{host="[^"]+"\} (\S+)$', text,
                                                  re.M))
        assert refused >= 1  # the stranger of the test before
    finally:
        env.delete()
        client.close()


def test_a_drained_host_loses_no_acknowledged_step_and_leaves_no_container(
        cluster: Cluster, replicas: list[ApiServer], pg_url: str) -> None:
    third = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
    cluster.wait_for_nodes()
    recorders = [StatusRecorder() for _ in replicas]
    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120,
                      max_retry_wait_s=120, transport=recorder) for server, recorder in zip(replicas, recorders, strict=True)]
    try:
        wait_for_hosts(clients, {host_of_node(n) for n in cluster.worker_nodes} | {host_of_node(third)})
        environment = clients[0].environments.create(name="counter-drain", source_code=COUNTER_SOURCE,
                                                     class_name="Counter")
        napper = clients[1].envs.create(source_code=NAPPER_SOURCE, class_name="Napper", init_config={"count": 7})
        envs = [clients[i % 2].envs.create(environment.id, init_config={"count": 1000 * i})
                for i in range(DRAIN_ENVS)]
        env_ids = [env.id for env in envs]
        placed = hosts_of(pg_url, env_ids + [napper.id])
        assert len(set(placed.values())) == 3, f"envs should be spread over the three hosts: {placed}"
        victim = placed[napper.id]
        victim_info = next(h for h in clients[0].admin.cluster.status().hosts if h.host == victim)
        on_victim = [env_id for env_id in env_ids if placed[env_id] == victim]
        assert on_victim, placed

        acknowledged: dict[str, list[int]] = {env_id: [] for env_id in env_ids}
        errors: list[str] = []
        drained = threading.Event()
        started = threading.Barrier(DRAIN_ENVS + 1)

        def stepper(index: int) -> None:
            env_id = env_ids[index]
            handles = [client.envs.get(env_id) for client in clients]
            after_drain = 0
            number = 0
            try:
                while after_drain < STEPS_AFTER_DRAIN:
                    if number == 1:
                        started.wait(timeout=120)
                    by = number * 10 + index + 1
                    was_drained = drained.is_set()
                    result = handles[number % 2].step("bump", by=by)  # alternate replicas on every step
                    assert result.status == "ok", result
                    acknowledged[env_id].append(by)
                    assert result.observation == str(1000 * index + sum(acknowledged[env_id]))
                    number += 1
                    after_drain += was_drained
            except Exception as exc:  # noqa: BLE001 - reported by the test thread
                errors.append(f"env {index}: {type(exc).__name__}: {exc}")
                started.abort()

        napped: list[object] = []
        nap = threading.Thread(target=lambda: napped.append(napper.step("nap", seconds=NAP_S)))
        nap.start()
        deadline = time.monotonic() + 60
        while not next(h for h in clients[0].admin.cluster.status().hosts if h.host == victim).calls_in_flight:
            assert time.monotonic() < deadline and nap.is_alive(), "the nap never ran on the victim"
            time.sleep(0.05)  # nothing else runs yet: this call in flight is the nap
        threads = [threading.Thread(target=stepper, args=(i,), daemon=True) for i in range(DRAIN_ENVS)]
        for thread in threads:
            thread.start()
        started.wait(timeout=120)  # every env has acknowledged steps: drain while they keep stepping
        nap_running = nap.is_alive()
        answers: list[object] = []

        def drain_through(index: int) -> None:
            try:
                answers.append(clients[index].admin.cluster.drain(victim, wait_s=120 if index == 0 else None))
            except Exception as exc:  # noqa: BLE001 - reported by the test thread
                answers.append(exc)

        drains = [threading.Thread(target=drain_through, args=(i,)) for i in (0, 1)]  # concurrent, both replicas
        began = time.monotonic()
        for thread in drains:
            thread.start()
        for thread in drains:
            thread.join(timeout=180)
        drain_s = time.monotonic() - began
        nap.join(timeout=60)
        drained.set()
        for thread in threads:
            thread.join(timeout=180)
        assert not errors, errors
        assert all(not isinstance(a, Exception) for a in answers), answers
        assert any(getattr(a, "status", None) == "drained" for a in answers), answers
        print(f"drain of {victim} ({len(on_victim) + 1} envs) took {drain_s:.1f} s")
        # the call in flight on the drained host finished and was acknowledged, then the drain ended
        assert nap_running, f"the nap ended before the drain began (slower than {NAP_S} s: a loaded machine?)"
        assert [(r.status, r.observation, r.recovered) for r in napped] == [("ok", "8", False)], napped  # type: ignore[attr-defined]
        assert napper.step("nap", seconds=0).observation == "9"  # resumed elsewhere from the committed step
        assert [s.observation for s in napper.trajectory().steps if s.action] == ["8", "9"]

        statuses = [code for recorder in recorders for code in recorder.statuses]
        assert not [code for code in statuses if code >= 500 and code != 503], statuses
        print(f"{len(statuses)} responses, {statuses.count(503)} x 503 retried by the client")

        moved = hosts_of(pg_url, env_ids + [napper.id])
        assert all(host != victim for host in moved.values()), moved
        assert set(moved) == set(env_ids + [napper.id])
        for i, env_id in enumerate(env_ids):  # every acknowledged step, through either replica
            assert len(acknowledged[env_id]) >= 1 + STEPS_AFTER_DRAIN
            for client in clients:
                env = client.envs.get(env_id)
                assert env.env.step == len(acknowledged[env_id])
                bumps = [s.action.arguments["by"] for s in env.trajectory().steps if s.action]
                assert bumps == acknowledged[env_id]
                state = env.state()
                assert state["count"] == 1000 * i + sum(acknowledged[env_id])
                assert state["log"] == [f"bump {by}" for by in acknowledged[env_id]]

        for client in clients:  # every replica shows it drained; a third drain is a no-op
            host = next(h for h in client.admin.cluster.status().hosts if h.host == victim)
            assert host.drain == "drained" and host.sessions == 0 and host.envs_placed == 0
            again = client.admin.cluster.drain(victim)
            assert again.status == "drained" and again.finished_at is not None
        docker_client = docker.from_env(timeout=30)
        try:  # the drained host's pool removed its containers before its actor exited
            left = [c.name for c in docker_client.containers.list(all=True, filters={"label": "sandpit=1"},
                                                                   ignore_removed=True)
                    if c.labels.get(engine.LABEL_OWNER, "").split(":")[1:2] == [str(victim_info.pid)]]
        finally:
            docker_client.close()
        assert not left, left
        for env_id in env_ids + [napper.id]:
            clients[1].envs.delete(env_id)
        assert not hosts_of(pg_url, env_ids + [napper.id]), "env_hosts rows must go with their env"
    finally:
        for client in clients:
            client.close()


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
        from sandpit.executor.ray import HOST_PREFIX

        lost_host = placed[env_ids[0]]
        victim = next(node for node in cluster.worker_nodes
                      if HOST_PREFIX + node.node_id[:16] == lost_host)
        status = call(clients[0], "GET", "/v1/admin/cluster", headers=replicas[0].operator_headers).json()
        host_pid = next(h["pid"] for h in status["hosts"] if h["host"] == lost_host)
        cluster.remove_node(victim, allow_graceful=False)
        wait_until_gone(host_pid)  # a loaded machine lets the host's worker answer a while
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


@pytest.mark.parametrize("verb", ["drain", "undrain"])
@pytest.mark.parametrize("host", ["", " ", "sandpit-host-0000000000000000", "x" * 10_000, "../../tenants",
                                  "..%2F..%2Fdrain", "sandpit-host-' OR 1=1 --", "h\u00e9te\u2028\u0000", "\u0000"])
def test_a_drain_or_undrain_of_an_unknown_or_odd_host_is_404_or_422(replicas: list[ApiServer], verb: str,
                                                                    host: str) -> None:
    for server in replicas:
        response = httpx.post(f"{server.url}/v1/admin/cluster/hosts/{quote(host, safe='')}/{verb}",
                              headers=server.operator_headers, timeout=30)
        assert response.status_code in (404, 405, 422), response.text
        if response.status_code != 405:
            assert set(response.json()["error"]) >= {"code", "message"}, response.text


def refuses_without_the_operator_key(replicas: list[ApiServer], verb: str) -> None:
    """A tenant key, garbage or no key: 401/403 from every replica, never a (un)drain; a
    wrong operator key is Unauthorized in the client; an unknown host NotFound."""
    for server in replicas:
        for headers in (server.headers, {"Authorization": "Bearer not-a-key"}, {}):
            response = httpx.post(f"{server.url}/v1/admin/cluster/hosts/anything/{verb}", headers=headers, timeout=30)
            assert response.status_code in (401, 403), response.text
    with Client(replicas[0].url, operator_key="y" * 40, timeout=30) as wrong, pytest.raises(Unauthorized):
        getattr(wrong.admin.cluster, verb)("anything")
    with Client(replicas[1].url, operator_key=replicas[1].operator_key, timeout=30) as right, pytest.raises(NotFound):
        getattr(right.admin.cluster, verb)("sandpit-host-unknown")


def test_drains_need_the_operator_key_and_never_take_the_last_host(cluster: Cluster, replicas: list[ApiServer],
                                                                  pg_url: str) -> None:
    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120)
               for server in replicas]
    try:
        refuses_without_the_operator_key(replicas, "drain")

        fourth = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
        cluster.wait_for_nodes()
        taking = {h.host for h in clients[0].admin.cluster.status().hosts if h.drain is None}
        wait_for_hosts(clients, taking | {host_of_node(fourth)})
        taking = {h.host for h in clients[0].admin.cluster.status().hosts if h.drain is None}
        assert len(taking) == 2, taking  # the survivor of the loss test and the new node
        outcomes: dict[str, object] = {}

        def drain_through(index: int, host: str) -> None:
            try:
                outcomes[host] = clients[index].admin.cluster.drain(host)
            except SandpitError as exc:
                outcomes[host] = exc

        racers = [threading.Thread(target=drain_through, args=(i, host)) for i, host in enumerate(sorted(taking))]
        for thread in racers:
            thread.start()
        for thread in racers:
            thread.join(timeout=120)
        refused = [host for host, outcome in outcomes.items() if isinstance(outcome, Conflict)]
        accepted = [host for host, outcome in outcomes.items() if getattr(outcome, "status", None) in
                    ("draining", "drained")]
        assert len(refused) == 1 and len(accepted) == 1, outcomes
        last = refused[0]
        for client in clients:  # the last host taking envs stays refused, through either replica
            with pytest.raises(Conflict) as refusal:
                client.admin.cluster.drain(last)
            assert "last" in refusal.value.message
        drained = clients[0].admin.cluster.drain(accepted[0], wait_s=60)
        assert drained.status == "drained"
        env = clients[0].envs.create(source_code=COUNTER_SOURCE, class_name="Counter")  # still served
        assert env.step("bump", by=2).observation == "2"
        assert hosts_of(pg_url, [env.id]) == {env.id: last}
        env.delete()
    finally:
        for client in clients:
            client.close()



# -- undrain and takeover --------------------------------------------------------------------
UNDRAIN_NAP_S = TAKEOVER_NAP_S = 9.0
"""Seconds of the call that holds a drain (under the default profile's 10 s call timeout)."""


def drain_row(pg_url: str, host: str) -> tuple[str, str | None] | None:
    """``(status, owner)`` of ``host``'s drain record, or None."""
    engine_ = create_engine(pg_url)
    try:
        with engine_.connect() as conn:
            row = conn.execute(text("SELECT status, owner FROM host_drains WHERE host = :h"), {"h": host}).first()
    finally:
        engine_.dispose()
    return (row[0], row[1]) if row is not None else None


def host_entry(client: Client, host: str) -> Any:
    return next(h for h in client.admin.cluster.status().hosts if h.host == host)


def create_on(clients: list[Client], environment_id: str, host: str, pg_url: str, made: list[Any],
              count: int = 0) -> Any:
    """An env placed on ``host``: placement takes the least-loaded host taking work, so a
    few creations (kept, in ``made``, to even the loads out) reach every such host."""
    for attempt in range(12):
        env = clients[attempt % 2].envs.create(environment_id, init_config={"count": count})
        made.append(env)
        if hosts_of(pg_url, [env.id]).get(env.id) == host:
            return env
    raise AssertionError(f"no env landed on {host} in 12 creations: {hosts_of(pg_url, [e.id for e in made])}")


def wait_for_call_on(client: Client, host: str, thread: threading.Thread) -> None:
    """Until ``host`` runs a tool call (the nap ``thread`` started)."""
    wait_until(lambda: bool(host_entry(client, host).calls_in_flight) or not thread.is_alive(), "the nap")
    assert thread.is_alive(), "the nap ended before it was seen running"


def test_an_undrained_draining_host_takes_envs_again_and_loses_no_step(cluster: Cluster, replicas: list[ApiServer],
                                                                       pg_url: str) -> None:
    fifth = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"sandpit_docker": 1})
    cluster.wait_for_nodes()
    recorders = [StatusRecorder() for _ in replicas]
    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120,
                      max_retry_wait_s=120, transport=recorder) for server, recorder in zip(replicas, recorders, strict=True)]
    made: list[Any] = []
    try:
        taking = {h.host for h in clients[0].admin.cluster.status().hosts if h.drain is None}
        wait_for_hosts(clients, taking | {host_of_node(fifth)})
        environment = clients[0].environments.create(name="counter-undrain", source_code=COUNTER_SOURCE,
                                                     class_name="Counter")
        napper = clients[0].envs.create(source_code=NAPPER_SOURCE, class_name="Napper", init_config={"count": 0})
        made.append(napper)
        victim = hosts_of(pg_url, [napper.id])[napper.id]
        counter = create_on(clients, environment.id, victim, pg_url, made)
        assert counter.step("bump", by=1).observation == "1"
        pid = host_entry(clients[0], victim).pid

        napped: list[Any] = []
        nap = threading.Thread(target=lambda: napped.append(napper.step("nap", seconds=UNDRAIN_NAP_S)))
        nap.start()
        wait_for_call_on(clients[0], victim, nap)
        started = clients[1].admin.cluster.drain(victim)
        assert (started.status, started.owner) == ("draining", clients[1].admin.cluster.status().replica)  # held by the nap
        assert drain_row(pg_url, victim) == ("draining", started.owner)
        undone = clients[0].admin.cluster.undrain(victim)  # through the other replica
        assert (undone.host, undone.previous, undone.status) == (victim, "draining", "active")
        assert nap.is_alive(), f"the nap ended before the undrain (slower than {UNDRAIN_NAP_S} s: a loaded machine?)"
        assert drain_row(pg_url, victim) is None
        nap.join(timeout=120)
        assert [(r.status, r.observation) for r in napped] == [("ok", "1")], napped

        for client in clients:  # every replica places on it again
            wait_until(lambda client=client: host_entry(client, victim).drain is None, "the undrain seen")
        fresh = create_on(clients, environment.id, victim, pg_url, made, count=50)
        assert fresh.step("bump", by=2).observation == "52"
        time.sleep(2.0)  # a drain still running would evict the fresh env within a pass (0.2 s)
        again = fresh.step("bump", by=3)  # the same replica: a re-open would only come from an eviction
        assert (again.observation, again.recovered) == ("55", False)
        assert hosts_of(pg_url, [fresh.id]) == {fresh.id: victim}
        assert host_entry(clients[0], victim).pid == pid  # the drain stopped: same actor, pool never closed
        assert drain_row(pg_url, victim) is None

        # every acknowledged step is there, through either replica (an env the drain evicted
        # before the undrain re-opens where its affinity points)
        assert clients[1].envs.get(napper.id).step("nap", seconds=0).observation == "2"
        assert clients[1].envs.get(counter.id).step("bump", by=3).observation == "4"
        for client in clients:
            assert [s.observation for s in client.envs.get(napper.id).trajectory().steps if s.action] == ["1", "2"]
            assert [s.observation for s in client.envs.get(counter.id).trajectory().steps if s.action] == ["1", "4"]
            assert client.envs.get(counter.id).state()["log"] == ["bump 1", "bump 3"]
        statuses = [code for recorder in recorders for code in recorder.statuses]
        assert not [code for code in statuses if code >= 500 and code != 503], statuses
    finally:
        for env in made:
            try:
                env.delete()
            except SandpitError:
                pass
        for client in clients:
            client.close()


def test_an_undrained_drained_host_is_recreated_on_its_live_node(cluster: Cluster, replicas: list[ApiServer],
                                                                 pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandpit.cli import app
    from typer.testing import CliRunner

    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120,
                      max_retry_wait_s=120) for server in replicas]
    made: list[Any] = []
    try:
        alive = {host_of_node(node) for node in cluster.worker_nodes}
        drained = sorted(h.host for h in clients[0].admin.cluster.status().hosts if h.drain == "drained")
        back = next(host for host in drained if host in alive)  # drained by an earlier test, its node still up
        monkeypatch.setenv("SANDPIT_URL", replicas[1].url)
        monkeypatch.setenv("SANDPIT_OPERATOR_KEY", replicas[1].operator_key)
        result = CliRunner().invoke(app, ["cluster", "undrain", back, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"host": back, "previous": "drained", "status": "active"}
        assert drain_row(pg_url, back) is None
        wait_for_hosts(clients, {back})  # re-created on its node, seen by both replicas
        entry = host_entry(clients[0], back)
        assert entry.drain is None and entry.pid and entry.node_id and host_of_node(entry) == back
        environment = clients[0].environments.create(name="counter-back", source_code=COUNTER_SOURCE,
                                                     class_name="Counter")
        env = create_on(clients, environment.id, back, pg_url, made, count=10)
        assert env.step("bump", by=1).observation == "11"
        assert clients[1].envs.get(env.id).step("bump", by=1).observation == "12"
        second = clients[0].admin.cluster.undrain(back)  # not drained any more: a no-op
        assert (second.previous, second.status) == (None, "active")
        assert host_entry(clients[1], back).pid == entry.pid
    finally:
        for made_env in made:
            made_env.delete()
        for client in clients:
            client.close()


def wait_node_dead(cluster: Cluster, node: Any, timeout_s: float = 60.0) -> None:
    """Until Ray's control store marks ``node`` dead (after a few missed health checks)."""
    ray.init(address=cluster.address, log_to_driver=False, logging_level="warning")
    try:
        wait_until(lambda: not any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()),
                   "the removed node marked dead", timeout_s)
    finally:
        ray.shutdown()


def test_undrain_refuses_a_host_whose_node_is_gone_and_needs_the_operator(cluster: Cluster, replicas: list[ApiServer],
                                                                          pg_url: str) -> None:
    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120)
               for server in replicas]
    try:
        refuses_without_the_operator_key(replicas, "undrain")
        taking = sorted(h.host for h in clients[0].admin.cluster.status().hosts if h.drain is None)
        never = clients[0].admin.cluster.undrain(taking[0])  # never drained: a no-op
        assert (never.previous, never.status) == (None, "active") and drain_row(pg_url, taking[0]) is None

        drained = sorted(h.host for h in clients[0].admin.cluster.status().hosts if h.drain == "drained")
        gone = drained[0]  # the other host an earlier test drained (its node still up until now)
        node = next(n for n in cluster.worker_nodes if host_of_node(n) == gone)
        cluster.remove_node(node, allow_graceful=False)
        wait_node_dead(cluster, node)
        for client in clients:
            with pytest.raises(Conflict) as refusal:
                client.admin.cluster.undrain(gone)
            assert refusal.value.status_code == 409 and "node is gone" in refusal.value.message
        assert drain_row(pg_url, gone) is not None and drain_row(pg_url, gone)[0] == "drained"  # type: ignore[index]
        assert host_entry(clients[0], gone).drain == "drained"
    finally:
        for client in clients:
            client.close()


def test_a_drain_whose_replica_died_is_taken_over_by_one_live_replica(cluster: Cluster, replicas: list[ApiServer],
                                                                      pg_url: str, tmp_path: Path) -> None:
    doomed = ApiServer(tmp_path / "doomed", SANDPIT_OPERATOR_KEY=replicas[0].operator_key,
                       **replica_env(cluster, pg_url))
    doomed.api_key = replicas[0].api_key
    doomed.start(timeout_s=120)
    clients = [Client(server.url, api_key=server.api_key, operator_key=server.operator_key, timeout=120,
                      max_retry_wait_s=120) for server in replicas]
    made: list[Any] = []
    try:
        live_ids = {client.admin.cluster.status().replica for client in clients}
        doomed_id = httpx.get(f"{doomed.url}/v1/admin/cluster", headers=doomed.operator_headers,
                              timeout=60).json()["replica"]
        assert len(live_ids) == 2 and doomed_id not in live_ids
        taking = {h.host for h in clients[0].admin.cluster.status().hosts if h.drain is None}
        assert len(taking) >= 2, taking
        wait_for_hosts(clients, taking)
        napper = clients[0].envs.create(source_code=NAPPER_SOURCE, class_name="Napper", init_config={"count": 0})
        made.append(napper)
        victim = hosts_of(pg_url, [napper.id])[napper.id]
        napped: list[Any] = []
        nap = threading.Thread(target=lambda: napped.append(napper.step("nap", seconds=TAKEOVER_NAP_S)))
        nap.start()
        wait_for_call_on(clients[0], victim, nap)

        started = httpx.post(f"{doomed.url}/v1/admin/cluster/hosts/{victim}/drain", headers=doomed.operator_headers,
                             timeout=60)
        assert started.status_code == 202 and started.json()["status"] == "draining", started.text
        assert drain_row(pg_url, victim) == ("draining", doomed_id)
        doomed.kill()  # SIGKILL: its drain thread dies mid-drain, held by the nap
        assert nap.is_alive(), f"the nap ended before the kill (slower than {TAKEOVER_NAP_S} s: a loaded machine?)"
        assert drain_row(pg_url, victim) == ("draining", doomed_id)
        engine_ = create_engine(pg_url)  # its heartbeat goes stale: what LEASE_S seconds of silence give
        try:
            with engine_.begin() as conn:
                conn.execute(text("UPDATE replicas SET heartbeat_at = now() - make_interval(secs => :s) "
                                  "WHERE id = :id"), {"s": LEASE_S + 5, "id": doomed_id})
        finally:
            engine_.dispose()
        wait_until(lambda: (drain_row(pg_url, victim) or ("", doomed_id))[1] != doomed_id, "a takeover", 30)
        claimer = drain_row(pg_url, victim)[1]  # type: ignore[index]
        assert claimer in live_ids
        wait_until(lambda: drain_row(pg_url, victim) == ("drained", claimer), "the drain finished", 120)
        nap.join(timeout=60)
        assert [(r.status, r.observation) for r in napped] == [("ok", "1")], napped  # acknowledged, then drained
        logs = [server.log_path.read_text(errors="replace") for server in replicas]
        assert sum(log.count(f"taking over the drain of {victim}") for log in logs) == 1, "exactly one replica claims"
        for client in clients:
            assert host_entry(client, victim).drain == "drained"
            view = client.admin.cluster.drain(victim)  # idempotent on a drained host: the record as is
            assert (view.status, view.owner) == ("drained", claimer)
        assert hosts_of(pg_url, [napper.id]).get(napper.id) != victim
        assert clients[1].envs.get(napper.id).step("nap", seconds=0).observation == "2"  # resumed elsewhere
        assert [s.observation for s in clients[0].envs.get(napper.id).trajectory().steps if s.action] == ["1", "2"]
    finally:
        if doomed.process is not None:
            doomed.kill()
        for env in made:
            env.delete()
        for client in clients:
            client.close()
