"""A sandbox killed from outside (``docker kill``) mid-episode: the call in flight reports
it, and the episode continues in a new sandbox from the last good snapshot."""

from __future__ import annotations

import threading
import time

import docker.errors
import pytest

pytestmark = pytest.mark.docker


def _gone(docker_client, container_id: str) -> bool:
    try:
        docker_client.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_docker_kill_between_calls(open_env, probe, docker_client) -> None:
    session = open_env(init_config={"counter": 0})
    for by in (1, 2, 3):
        assert session.call("bump", {"by": by}).status == "ok"
    good_state = session.state()
    good_snapshot = session.snapshot()
    killed = session._sandbox
    docker_client.containers.get(killed.container_id).kill()

    first = session.call("bump", {"by": 10})
    if first.status == "ok":  # the death was noticed before the call: re-placed at once
        results = [first]
    else:
        assert first.status == "crashed", first
        assert first.delta.set == {}
        results = [first, session.call("bump", {"by": 10})]
    ok = results[-1]
    assert ok.status == "ok" and ok.recovered, ok
    assert ok.observation == "16", "the episode must continue from the last good state (6)"
    assert session._sandbox is not killed and session._sandbox.container_id != killed.container_id
    assert session.recoveries == 1
    assert session.state() == {**good_state, "counter": 16, "log": [1, 2, 3, 10]}
    assert session.snapshot().attributes != good_snapshot.attributes

    later = session.call("bump", {"by": 1})
    assert (later.status, later.observation, later.recovered) == ("ok", "17", False)
    assert _gone(docker_client, killed.container_id), "the dead sandbox must be removed"


@pytest.mark.slow
def test_docker_kill_during_a_call(open_env, probe, docker_client, fast_profile) -> None:
    session = open_env(init_config={"counter": 5})
    session.call("bump", {"by": 1})
    killed = session._sandbox
    timer = threading.Timer(0.3, lambda: docker_client.containers.get(killed.container_id).kill())
    timer.start()
    try:
        started = time.monotonic()
        result = probe.run(session, "import time\nself.counter = 1000\ntime.sleep(60)\n")
        elapsed = time.monotonic() - started
    finally:
        timer.join()
    # noticed at once (connection closed), not by the call timeout or the host watchdog
    assert result.status == "crashed", result
    assert elapsed < fast_profile.call_timeout_s, elapsed
    ok = session.call("bump", {"by": 1})
    assert (ok.status, ok.observation, ok.recovered) == ("ok", "7", True), ok
    assert session._sandbox is not killed
    assert session.state()["counter"] == 7


def test_state_and_restore_after_a_kill(open_env, docker_client) -> None:
    session = open_env(init_config={"counter": 2})
    session.call("bump", {"by": 2})
    snapshot = session.snapshot()
    session.call("bump", {"by": 100})
    docker_client.containers.get(session._sandbox.container_id).kill()
    # state() is the host's copy of the last good state (the +100 included): no sandbox round trip
    assert session.state()["counter"] == 104
    session.restore(snapshot)  # notices the dead sandbox and re-places the session
    assert session.state() == {"counter": 4, "log": [2]}
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation) == ("ok", "5")
