"""The API as the one owner of an env's state, over HTTP with real sandboxes: a sandbox
killed (``docker kill``) between steps or during one costs no acknowledged step; the
step it interrupted answers ``crashed`` and the next one re-opens the env from the
committed head (``recovered``), large states (keyed deltas) included; a restore or a
fork right after a loss starts from the state it names; a kill during the first step
of envs that share one initial state (config templates) recovers from that state."""

from __future__ import annotations

import contextlib
import threading
import time

import docker
import docker.errors
import httpx
import pytest
from sandpit.executor.docker import engine

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SOURCE = '''
import time
from typing import Dict


class Ledger:
    """A large table of records, like tau-bench's domains (changes travel as keyed deltas)."""

    def __init__(self, init_config: dict):
        self.records: Dict[str, dict] = init_config.get("records", {})
        self.count: int = init_config.get("count", 0)

    def touch(self, key: str) -> int:
        """Bump one record.

        Args:
            key (str): record id.
        """
        self.records[key]["n"] += 1
        self.count += 1
        return self.records[key]["n"]

    def nap(self, key: str, seconds: float) -> str:
        """Change one record, then sleep.

        Args:
            key (str): record id.
            seconds (float): how long.
        """
        self.records[key]["n"] = -1
        time.sleep(seconds)
        return "awake"
'''


def _records(n: int = 2000) -> dict:
    return {f"r{i:05d}": {"n": i, "pad": "p" * 100} for i in range(n)}


@pytest.fixture(scope="module")
def ledger_id(server) -> str:
    with server.client() as client:
        response = client.post("/v1/environments", json={"name": "ledger", "source_code": SOURCE,
                                                          "class_name": "Ledger"})
        assert response.status_code == 201, response.text
        return response.json()["id"]


def _create(api: httpx.Client, environment_id: str, **init_config) -> str:
    response = api.post("/v1/envs", json={"environment_id": environment_id, "init_config": init_config})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _step(api: httpx.Client, env_id: str, name: str, **arguments) -> dict:
    response = api.post(f"/v1/envs/{env_id}/step", json={"name": name, "arguments": arguments}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _kill_sandboxes(server, docker_client: docker.DockerClient) -> None:
    """Kill every sandbox of this module's server (the env's among them)."""
    owner = engine.owner_id(server.process.pid)
    containers = docker_client.containers.list(filters={"label": f"sandpit.owner={owner}"})
    assert containers
    for container in containers:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.kill()


def _state(api: httpx.Client, env_id: str) -> dict:
    return api.get(f"/v1/envs/{env_id}/state").json()["state"]


def _kill_during(server, docker_client, api: httpx.Client, env_id: str, key: str) -> dict:
    """A ``nap`` step of ``env_id`` whose sandbox is killed while it sleeps."""
    timer = threading.Timer(1.0, _kill_sandboxes, (server, docker_client))
    timer.start()
    try:
        return _step(api, env_id, "nap", key=key, seconds=20)
    finally:
        timer.join()


def test_a_kill_between_steps_loses_nothing_on_a_large_state(api, server, ledger_id, docker_client) -> None:
    env_id = _create(api, ledger_id, records=_records())
    assert _step(api, env_id, "touch", key="r00007")["observation"] == "8"
    _kill_sandboxes(server, docker_client)
    after = _step(api, env_id, "touch", key="r00007")
    if after["status"] == "crashed":  # the kill raced the call: it reports, the next one recovers
        assert after["step"] == 2
        after = _step(api, env_id, "touch", key="r00007")
    assert (after["status"], after["observation"], after["recovered"]) == ("ok", "9", True), after
    state = _state(api, env_id)
    assert state["records"]["r00007"]["n"] == 9 and state["records"]["r00008"]["n"] == 8
    again = _step(api, env_id, "touch", key="r01999")  # keyed deltas on the re-opened session's state
    assert (again["observation"], again["recovered"]) == ("2000", False)
    steps = api.get(f"/v1/envs/{env_id}/trajectory").json()["steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))


def test_a_kill_during_a_step_answers_crashed_and_the_next_step_goes_on(api, server, ledger_id,
                                                                         docker_client) -> None:
    env_id = _create(api, ledger_id, records=_records(50), count=3)
    _step(api, env_id, "touch", key="r00001")
    started = time.monotonic()
    killed = _kill_during(server, docker_client, api, env_id, "r00002")
    assert killed["status"] == "crashed" and killed["step"] == 2, killed
    assert time.monotonic() - started < 15  # noticed at once, not by the call timeout
    assert _state(api, env_id)["records"]["r00002"]["n"] == 2  # the lost call changed nothing
    after = _step(api, env_id, "touch", key="r00002")
    assert (after["status"], after["observation"], after["step"], after["recovered"]) == ("ok", "3", 3, True)
    assert _state(api, env_id)["count"] == 5


def test_restore_and_fork_right_after_a_loss(api, server, ledger_id, docker_client) -> None:
    env_id = _create(api, ledger_id, records=_records(50))
    for _ in range(3):
        _step(api, env_id, "touch", key="r00000")
    assert _kill_during(server, docker_client, api, env_id, "r00000")["status"] == "crashed"
    restored = api.post(f"/v1/envs/{env_id}/restore", json={"step": 1})
    assert restored.status_code == 200, restored.text
    assert _step(api, env_id, "touch", key="r00000")["observation"] == "2"  # from step 1, not the head
    assert _kill_during(server, docker_client, api, env_id, "r00000")["status"] == "crashed"
    forked = api.post(f"/v1/envs/{env_id}/fork", json={})
    assert forked.status_code == 201, forked.text
    [fork_id] = [f["id"] for f in forked.json()["data"]]
    assert _step(api, fork_id, "touch", key="r00000")["observation"] == "3"
    assert _step(api, env_id, "touch", key="r00000")["observation"] == "3"


def test_a_kill_during_the_first_step_of_envs_sharing_an_initial_state(make_server, docker_client) -> None:
    server = make_server(SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX="4", SANDPIT_EXECUTOR_POOL_SIZE="1")
    with server.client(timeout=60) as api:
        ledger = api.post("/v1/environments", json={"source_code": SOURCE, "class_name": "Ledger"}).json()["id"]
        config = {"records": _records(500), "count": 1}
        envs = [_create(api, ledger, **config) for _ in range(4)]  # the later ones forked from the config's template
        last = envs[-1]
        killed = _kill_during(server, docker_client, api, last, "r00003")
        assert (killed["status"], killed["step"]) == ("crashed", 1), killed
        after = _step(api, last, "touch", key="r00003")
        assert (after["status"], after["observation"], after["recovered"]) == ("ok", "4", True)
        for env_id in envs[:-1]:  # their sandbox died too: each goes on from its initial state
            assert _step(api, env_id, "touch", key="r00003")["observation"] == "4"
        assert _state(api, envs[0])["records"]["r00003"]["n"] == 4 and _state(api, envs[0])["count"] == 2
