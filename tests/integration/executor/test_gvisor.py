"""The same sandbox under gVisor (``runtime="runsc"``), when Docker has it registered."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.recovering import RecoveringSession
from sandpit.executor.results import Snapshot

from ..conftest import FAST, PROBE_SOURCE, TENANT

pytestmark = [pytest.mark.docker, pytest.mark.gvisor, pytest.mark.slow]


# Under runsc the pids cgroup also holds the sentry's threads and stub processes; the
# executor sizes it ``pids * runsc_pids_per_process + runsc_pids_headroom``, so these tests
# use the default profile (pids=64).


@pytest.fixture(scope="module")
def gvisor_pool(leak_check, pool_settings, docker_client) -> Iterator[SandboxPool]:
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    settings = pool_settings("gvisor", runtime="runsc", pool_size=0)
    with docker_pool(settings) as gvisor:
        yield gvisor


def test_episode_under_gvisor(open_env, probe, gvisor_pool, docker_client) -> None:
    session = open_env(on=gvisor_pool, init_config={"counter": 1})
    inspect = docker_client.api.inspect_container(session._sandbox.container_id)
    assert inspect["HostConfig"]["Runtime"] == "runsc"
    assert session.call("bump", {"by": 2}).observation == "3"
    failed = probe.run(session, "raise ValueError('under gvisor')")
    assert failed.status == "error" and failed.observation == "Error: ValueError: under gvisor"
    snapshot = Snapshot(attributes=session.read_state())
    assert session.call("bump", {"by": 4}).observation == "7"
    assert session.state() == {"counter": 7, "log": [2, 4]}
    session.restore(snapshot)
    assert session.state() == {"counter": 3, "log": [2]}

    lines = probe.ok(session, "result = open('/proc/net/dev').read()").splitlines()[2:]
    assert [line.split(":")[0].strip() for line in lines] == ["lo"]
    # gVisor's own kernel answers, not the host's
    host_release = os.uname().release
    assert json.loads(probe.ok(session, "import json\nresult = json.dumps(os.uname())"))[2] != host_release


def test_timeouts_and_crashes_recover_in_the_same_gvisor_sandbox(open_env, probe, gvisor_pool) -> None:
    session = open_env(on=gvisor_pool, init_config={"counter": 1})
    sandbox = session._sandbox
    for expected, code, status in ((2, "self.counter = 50\nwhile True:\n    pass\n", "timeout"),
                                   (3, "self.counter = 60\nos._exit(1)\n", "crashed"),
                                   (4, "self.counter = 70\nwhile True:\n    pass\n", "timeout")):
        result = probe.run(session, code)
        assert result.status == status, result
        after = session.call("bump", {"by": 1})
        assert (after.status, after.observation, after.recovered) == ("ok", str(expected), False), after
    assert session._sandbox is sandbox


def test_fork_bomb_under_gvisor_is_contained(request, probe, gvisor_pool, docker_client) -> None:
    """Under runsc (ptrace platform) every sandboxed process has host stub processes in the
    container's cgroups, which gVisor keeps after the process exits. RLIMIT_NPROC holds
    the bomb's process count, but its copies of the interpreter can fill the container's
    memory (the sentry is then OOM-killed: the handle closes, and a session that keeps its
    state re-opens from it) or its kept host pids retire the sandbox (the handle moves
    with the state read from it). It stays contained: the call reports a failure status,
    the old container is removed, and the episode continues from its last good state."""
    session = RecoveringSession(gvisor_pool, tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                                init_config={"counter": 1}, profile=gvisor_pool.profile(overrides=FAST))
    request.addfinalizer(session.close)
    session.call("bump", {"by": 1})
    sandbox = session._session._sandbox
    result = probe.run(session, probe.FORK_BOMB)
    assert result.status in ("timeout", "crashed", "oom"), result
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation) == ("ok", "3"), after
    if session._session._sandbox is not sandbox:
        gone = time.monotonic() + 10
        while docker_client.containers.list(all=True, filters={"id": sandbox.container_id}):
            assert time.monotonic() < gone, "the old sandbox was not destroyed"
            time.sleep(0.1)
