"""A sandbox killed from outside (``docker kill``) mid-episode: the call in flight reports
it and the session handle closes (it keeps no state and re-places nothing: recovering is
its owner's); a :class:`RecoveringSession`, which keeps the state, goes on in a new
sandbox from the last good state."""

from __future__ import annotations

import threading
import time

import docker.errors
import pytest
from sandpit.executor.errors import SandboxLost, SessionClosed
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.results import Snapshot

from ..conftest import PROBE_SOURCE, TENANT

pytestmark = pytest.mark.docker


def _gone(docker_client, container_id: str) -> bool:
    try:
        docker_client.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_docker_kill_between_calls_closes_the_handle(open_env, docker_client) -> None:
    session = open_env(init_config={"counter": 0})
    for by in (1, 2, 3):
        assert session.call("bump", {"by": by}).status == "ok"
    killed = session._sandbox
    docker_client.containers.get(killed.container_id).kill()
    try:
        first = session.call("bump", {"by": 10})
    except SessionClosed:  # the death was noticed before the call was sent
        pass
    else:
        assert first.status == "crashed" and first.delta.set == {}, first
    assert session.closed
    for request in (lambda: session.call("bump", {"by": 1}), session.state, session.read_state):
        with pytest.raises(SessionClosed):
            request()
    assert session._sandbox is None  # nothing was placed again
    deadline = time.monotonic() + 10
    while not _gone(docker_client, killed.container_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(docker_client, killed.container_id), "the dead sandbox must be removed"


def test_a_recovering_session_goes_on_from_the_last_good_state(pool, fast_profile, docker_client) -> None:
    session = RecoveringSession(pool, tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                                init_config={"counter": 0}, profile=fast_profile)
    try:
        for by in (1, 2, 3):
            assert session.call("bump", {"by": by}).status == "ok"
        good_state = session.state()
        killed = session._session._sandbox  # type: ignore[attr-defined]
        docker_client.containers.get(killed.container_id).kill()
        first = session.call("bump", {"by": 10})
        results = [first] if first.status == "ok" else [first, session.call("bump", {"by": 10})]
        ok = results[-1]
        assert ok.status == "ok" and ok.recovered, results
        assert ok.observation == "16", "the episode must continue from the last good state (6)"
        assert session.recoveries == 1
        assert session.state() == {**good_state, "counter": 16, "log": [1, 2, 3, 10]}
        later = session.call("bump", {"by": 1})
        assert (later.status, later.observation, later.recovered) == ("ok", "17", False)
    finally:
        session.close()


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
    assert session.closed and session.lost == "crashed"
    with pytest.raises(SessionClosed):
        session.call("bump", {"by": 1})


def test_state_and_restore_after_a_kill(open_env, pool, fast_profile, docker_client) -> None:
    session = open_env(init_config={"counter": 2})
    session.call("bump", {"by": 2})
    snapshot = Snapshot(attributes=session.read_state())
    docker_client.containers.get(session._sandbox.container_id).kill()
    with pytest.raises((SessionClosed, SandboxLost)):  # the handle has no state of its own to fall back on
        session.restore(snapshot)
    assert session.closed
    kept = RecoveringSession(pool, tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                             init_config={"counter": 2}, profile=fast_profile)
    try:
        kept.call("bump", {"by": 2})
        good = kept.snapshot()
        kept.call("bump", {"by": 100})
        docker_client.containers.get(kept._session._sandbox.container_id).kill()  # type: ignore[attr-defined]
        assert kept.state()["counter"] == 104  # its own copy: no sandbox round trip
        kept.restore(good)  # the sandbox is gone: a new session opens with the snapshot
        assert kept.state() == {"counter": 4, "log": [2]}
        after = kept.call("bump", {"by": 1})
        assert (after.status, after.observation) == ("ok", "5")
    finally:
        kept.close()
