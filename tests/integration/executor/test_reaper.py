"""Leftover sandboxes (a Sandpit process died without closing its pool) are removed when
a pool starts with ``reap_on_start``; live processes' sandboxes are left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import docker.errors
import pytest
from sandpit.executor import engine
from sandpit.executor.pool import SandboxPool

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LEAKER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from sandpit.executor.pool import SandboxPool
    from sandpit.executor.settings import ExecutorSettings

    pool = SandboxPool(ExecutorSettings(pool_size=0, run_dir=Path(sys.argv[1]), reap_on_start=False)).start()
    session = pool.open_session(tenant="leaker", source="class E:\\n    pass\\n", class_name="E")
    print(json.dumps(session._sandbox.container_id), flush=True)
    os._exit(0)  # dies without closing anything
''')


def _exists(client, container_id: str) -> bool:
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def _dead_owner() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = engine.owner_id(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return owner


def _leftover(client, image: str, labels: dict[str, str]):
    return client.containers.run(
        image, ["python3", "-c", "import time; time.sleep(300)"], detach=True, network_mode="none",
        labels={engine.LABEL: "1", engine.LABEL_POOL: "gone", **labels}, user="20999:10001",
        read_only=True, cap_drop=["ALL"])


def test_reap_on_start_removes_leftovers_of_dead_processes_only(docker_client, sandbox_image, leak_check,
                                                                 pool_settings, run_root) -> None:
    # a real leak: a process opened a session and died without closing its pool
    leaker = subprocess.run([sys.executable, "-c", LEAKER, str(run_root / "leaker")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert leaker.returncode == 0, leaker.stderr
    leaked_id = json.loads(leaker.stdout.strip().splitlines()[-1])
    dead = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: _dead_owner()})
    unowned = _leftover(docker_client, sandbox_image, {})  # no owner label at all
    alive = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: engine.owner_id()})
    other_host = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: "some-other-host:1:1"})
    try:
        doomed = [leaked_id, dead.id, unowned.id]
        assert all(_exists(docker_client, cid) for cid in doomed)

        with SandboxPool(pool_settings("noreap", pool_size=0, reap_on_start=False)):
            pass
        assert all(_exists(docker_client, cid) for cid in doomed), "reap_on_start=False must not reap"

        with SandboxPool(pool_settings("reap", pool_size=0, reap_on_start=True)):
            assert [cid for cid in doomed if _exists(docker_client, cid)] == []
            assert _exists(docker_client, alive.id), "a live process's sandbox was reaped"
            assert _exists(docker_client, other_host.id), "another host's sandbox was reaped"
    finally:
        for container in (dead, unowned, alive, other_host):
            engine.remove_container(docker_client, container.id)
        engine.remove_container(docker_client, leaked_id)


def test_removing_a_missing_container_is_not_an_error(docker_client, sandbox_image) -> None:
    container = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: engine.owner_id()})
    engine.remove_container(docker_client, container.id)
    assert not _exists(docker_client, container.id)
    engine.remove_container(docker_client, container.id)  # already gone: documented as no error
    engine.remove_container(docker_client, "f" * 64)


def test_pool_close_removes_every_container_it_started(docker_client, pool_settings, leak_check) -> None:
    pool = SandboxPool(pool_settings("closing", pool_size=2)).start()
    try:
        session = pool.open_session(tenant="closing", source="class E:\n    pass\n", class_name="E")
        assert pool.warm("closing", count=2, timeout_s=60) == 2
        ours = {c.id for c in engine.list_sandboxes(docker_client, pool=pool.id)}
        assert session._sandbox.container_id in ours and len(ours) == 3
    finally:
        pool.close()  # the open session is not closed on purpose
    assert engine.list_sandboxes(docker_client, pool=pool.id) == []
    assert not os.listdir(pool.settings.run_dir), "socket directories left behind"
