"""Leftover sandboxes (a Sandpit process died without closing its pool) are removed when
a pool starts with ``reap_on_start`` and by the periodic sweep of every started pool
(``reap_interval_s``); live owners' sandboxes are left alone and keep serving: owners in
this pid namespace, in another one (a server in another container: ``unshare``), owners
killed with SIGKILL, stopped past their lease, and containers with hostile owner labels.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker.errors
import pytest
from sandpit.executor.docker import docker_pool, engine, owners
from sandpit.executor.pool import SandboxPool

pytestmark = [pytest.mark.docker, pytest.mark.slow]

LEAKER = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path
    from sandpit.executor.docker import docker_pool
    from sandpit.executor.pool import SandboxPool
    from sandpit.executor.settings import ExecutorSettings

    pool = docker_pool(ExecutorSettings(pool_size=0, run_dir=Path(sys.argv[1]), reap_on_start=False)).start()
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
    """A sleeping container labeled like a sandbox. Other processes sweep this engine too:
    one whose owner label is dead or not Sandpit's may be removed by them at any moment,
    even between its creation and its start (then it is returned unstarted)."""
    container = client.containers.create(
        image, ["python3", "-c", "import time; time.sleep(300)"], network_mode="none",
        labels={engine.LABEL: "1", engine.LABEL_POOL: "gone", **labels}, user="20999:10001",
        read_only=True, cap_drop=["ALL"])
    try:
        container.start()
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: marked for removal by another process's reaper
            raise
    return container


def test_reap_on_start_removes_leftovers_of_dead_processes_only(docker_client, sandbox_image, leak_check,
                                                                 pool_settings, run_root) -> None:
    # a real leak: a process opened a session and died without closing its pool
    leaker = subprocess.run([sys.executable, "-c", LEAKER, str(run_root / "leaker")],
                            capture_output=True, text=True, timeout=120, check=False)
    assert leaker.returncode == 0, leaker.stderr
    leaked_id = json.loads(leaker.stdout.strip().splitlines()[-1])
    made = []
    try:
        # the doomed ones may also go to other processes' reapers (they share this engine):
        # what this test proves is that this process's pools reap them or not
        made += [_leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: _dead_owner()}),
                 _leftover(docker_client, sandbox_image, {})]  # no owner label at all
        doomed = [leaked_id, *(container.id for container in made)]
        made += [alive := _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: engine.owner_id()}),
                 other_host := _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: "some-other-host:1:1"})]

        with docker_pool(pool_settings("noreap", pool_size=0, reap_on_start=False, reap_interval_s=0)) as noreap:
            pass
        assert noreap.driver.stats()["reaped"] == 0, "reap_on_start=False must not reap"

        with docker_pool(pool_settings("reap", pool_size=0, reap_on_start=True)):
            # another process's reaper may be removing one still (this reaper leaves a 409
            # "removal in progress" to it), so each must be gone soon, not at once
            _gone_within(docker_client, doomed, 15.0, [])
            assert _exists(docker_client, alive.id), "a live process's sandbox was reaped"
            assert _exists(docker_client, other_host.id), "another host's sandbox was reaped"
    finally:
        for container in made:
            engine.remove_container(docker_client, container.id)
        engine.remove_container(docker_client, leaked_id)


def test_removing_a_missing_container_is_not_an_error(docker_client, sandbox_image) -> None:
    container = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: engine.owner_id()})
    engine.remove_container(docker_client, container.id)
    assert not _exists(docker_client, container.id)
    engine.remove_container(docker_client, container.id)  # already gone: documented as no error
    engine.remove_container(docker_client, "f" * 64)


def test_pool_close_removes_every_container_it_started(docker_client, pool_settings, leak_check) -> None:
    pool = docker_pool(pool_settings("closing", pool_size=2)).start()
    try:
        session = pool.open_session(tenant="closing", source="class E:\n    pass\n", class_name="E")
        assert pool.warm("closing", count=2, timeout_s=60) == 2
        ours = {c.id for c in engine.list_sandboxes(docker_client, pool=pool.id)}
        assert session._sandbox.container_id in ours and len(ours) == 3
    finally:
        pool.close()  # the open session is not closed on purpose
    assert engine.list_sandboxes(docker_client, pool=pool.id) == []
    assert not os.listdir(pool.settings.run_dir), "socket directories left behind"


# -- periodic sweeps: owners that die while others keep serving ---------------------------------
INTERVAL_S = 1.0
LEASE_S = 4.0
BOUND_S = INTERVAL_S + LEASE_S
"""A dead owner's sandboxes go within this (``reap_interval_s + owner_lease_timeout_s``)."""
SLACK_S = 6.0
"""Allowance for container removal and a loaded 2-core machine on top of the bound."""

ENV_SOURCE = "class E:\n    def __init__(self):\n        self.n = 0\n\n    def bump(self):\n        self.n += 1\n        return self.n\n"

OWNER = textwrap.dedent('''
    import json, sys
    from sandpit.executor.docker import docker_pool
    from sandpit.executor.pool import SandboxPool
    from sandpit.executor.recovering import RecoveringSession
    from sandpit.executor.settings import ExecutorSettings

    pool = docker_pool(ExecutorSettings(**json.loads(sys.argv[1]))).start()
    sessions = []

    def open_one():  # each keeps its state and re-opens when its sandbox was reaped under it
        session = RecoveringSession(pool, tenant="owners", source=sys.argv[2], class_name="E")
        sessions.append(session)
        return session._session._sandbox.container_id

    first = [open_one() for _ in range(int(sys.argv[3]))]
    print(json.dumps({"pool": pool.id, "containers": first}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "call":
            print(json.dumps([session.call("bump").status for session in sessions]), flush=True)
        elif command == "open":
            print(json.dumps(open_one()), flush=True)
        elif command == "quit":
            break
    pool.close()
''')
"""A Sandpit process owning sandboxes: opens sessions (``RecoveringSession``: a session
whose sandbox was reaped while the process was stopped re-opens), then answers ``call``
(every session steps once), ``open`` (one more session) and ``quit`` (close the pool) on stdin."""


class Owner:
    """An :data:`OWNER` subprocess (``prefix``: e.g. ``unshare`` into other namespaces)."""

    def __init__(self, settings: dict, sessions: int, log_path, prefix: tuple[str, ...] = ()) -> None:
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([*prefix, sys.executable, "-c", OWNER, json.dumps(settings), ENV_SOURCE,
                                      str(sessions)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        hello = self.read(120)
        self.pool: str = hello["pool"]
        self.containers: list[str] = hello["containers"]

    def read(self, timeout_s: float = 60) -> object:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"owner said nothing within {timeout_s} s: {open(self.log.name).read()[-3000:]}")
        return json.loads(line)

    def ask(self, command: str, timeout_s: float = 60) -> object:
        self.proc.stdin.write(command + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.read(timeout_s)

    def stop(self, client) -> None:
        """Quit (or kill) the process and remove whatever containers of its pool are left."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        for container in engine.list_sandboxes(client, pool=self.pool):
            engine.remove_container(client, container.id)
        self.log.close()


def _owner_settings(run_root, name: str, leases, **changes) -> dict:
    return {"pool_size": 0, "run_dir": str(run_root / name), "reap_on_start": False, "reap_interval_s": INTERVAL_S,
            "owner_lease_timeout_s": LEASE_S, "owner_lease_dir": str(leases), "idle_timeout_s": 60.0, **changes}


def _gone_within(client, container_ids: list[str], timeout_s: float, serving: list) -> float:
    """Seconds until every container of ``container_ids`` is gone (AssertionError after
    ``timeout_s``); meanwhile every callable of ``serving`` is called (live owners' steps)."""
    started = time.monotonic()
    while any(_exists(client, cid) for cid in container_ids):
        assert time.monotonic() - started < timeout_s, f"still there after {timeout_s:.1f} s: {container_ids}"
        for call in serving:
            call()
        time.sleep(0.2)
    return time.monotonic() - started


def _reaped_ids(caplog) -> set[str]:
    """Short ids of the containers reaped by this process's pools (their log lines)."""
    return {record.args[0] for record in caplog.records  # type: ignore[index]
            if record.name == "sandpit.executor.docker.engine" and record.msg.startswith("reaped sandbox container")}


def _sweeps(pool: SandboxPool, count: int, timeout_s: float = 30) -> None:
    """Wait until ``pool`` finished ``count`` more sweeps."""
    target = pool.driver.stats()["sweeps"] + count
    deadline = time.monotonic() + timeout_s
    while pool.driver.stats()["sweeps"] < target:
        assert time.monotonic() < deadline, f"{pool.driver.stats()['sweeps']} sweeps, waiting for {target}"
        time.sleep(0.1)


@pytest.fixture
def sweeper(pool_settings, run_root, request, leak_check):
    """A live owner in this process that sweeps every second, with a session of its own;
    yields (pool, lease directory shared with the test's other owners)."""
    leases = run_root / f"leases-{request.node.name[:40]}"
    settings = pool_settings(f"sweeper-{request.node.name[:20]}", pool_size=0, reap_on_start=False,
                             reap_interval_s=INTERVAL_S, owner_lease_timeout_s=LEASE_S, owner_lease_dir=leases)
    with docker_pool(settings) as pool:
        yield pool, leases


def _stepper(session):
    def step() -> None:
        result = session.call("bump")
        assert result.status == "ok", (result.status, result.observation)
    return step


def test_a_killed_owner_is_reaped_while_live_owners_keep_serving(docker_client, sweeper, run_root, tmp_path) -> None:
    pool, leases = sweeper
    mine = pool.open_session(tenant="owners", source=ENV_SOURCE, class_name="E")
    live = Owner(_owner_settings(run_root, "live", leases), 1, tmp_path / "live.log")
    victim = Owner(_owner_settings(run_root, "victim", leases, reap_interval_s=0), 2, tmp_path / "victim.log")
    try:
        assert live.ask("call") == ["ok"] and victim.ask("call") == ["ok", "ok"]
        _sweeps(pool, 2)  # every owner is alive: nothing of theirs goes
        assert all(_exists(docker_client, cid) for cid in live.containers + victim.containers)

        victim.proc.kill()  # kill -9: no close, no lease release
        victim.proc.wait()
        took = _gone_within(docker_client, victim.containers, BOUND_S + SLACK_S,
                            [_stepper(mine), lambda: live.ask("call") == ["ok"] or pytest.fail("live owner")])
        print(f"killed owner's sandboxes reaped after {took:.2f} s (bound {BOUND_S:.0f} s)")
        assert _exists(docker_client, mine._sandbox.container_id) and _exists(docker_client, live.containers[0])
        assert live.ask("call") == ["ok"] and mine.call("bump").status == "ok"
    finally:
        mine.close()
        live.stop(docker_client)
        victim.stop(docker_client)


def _unshare_available() -> bool:
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--uts", "true"], capture_output=True,
                           check=False)
    return probe.returncode == 0


def test_an_owner_in_another_pid_namespace_lives_by_its_lease(docker_client, sweeper, run_root, tmp_path,
                                                               caplog) -> None:
    """Another container's server: its own pid namespace and hostname, one engine and one
    lease directory. Its pids mean nothing here; only its lease says whether it lives."""
    if not _unshare_available():
        pytest.skip("needs unshare --pid --mount-proc --uts (root)")
    caplog.set_level(logging.INFO, logger="sandpit.executor.docker.engine")
    pool, leases = sweeper
    mine = pool.open_session(tenant="owners", source=ENV_SOURCE, class_name="E")
    foreign = Owner(_owner_settings(run_root, "foreign", leases, reap_interval_s=0), 2, tmp_path / "foreign.log",
                    prefix=("unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c",
                            'hostname sandpit-foreign-server && exec "$0" "$@"'))
    try:
        labels = docker_client.containers.get(foreign.containers[0]).labels
        assert labels[engine.LABEL_OWNER].startswith("sandpit-foreign-server:1:"), labels  # pid 1 there
        assert labels["sandpit.owner-ns"] != owners.owner_ns()
        _sweeps(pool, int(LEASE_S / INTERVAL_S) + 2)  # longer than a lease: renewed, so alive
        assert all(_exists(docker_client, cid) for cid in foreign.containers)
        assert foreign.ask("call") == ["ok", "ok"]

        init = int(Path(f"/proc/{foreign.proc.pid}/task/{foreign.proc.pid}/children").read_text().split()[0])
        os.kill(init, signal.SIGKILL)  # its pid 1: the whole namespace dies
        foreign.proc.wait(timeout=30)
        time.sleep(1.0)  # the lease was renewed at most LEASE_S / 4 before: still fresh
        assert all(_exists(docker_client, cid) for cid in foreign.containers), "reaped before its lease expired"
        took = 1.0 + _gone_within(docker_client, foreign.containers, BOUND_S + SLACK_S, [_stepper(mine)])
        print(f"foreign owner's sandboxes reaped {took:.2f} s after SIGKILL (bound {BOUND_S:.0f} s)")
        assert took >= LEASE_S / 2, f"reaped after {took:.2f} s: sooner than its lease allows"
        assert {cid[:12] for cid in foreign.containers} & _reaped_ids(caplog), "not reaped by the sweeper"
        assert mine.call("bump").status == "ok"
    finally:
        mine.close()
        foreign.stop(docker_client)


def test_an_owner_stopped_past_its_lease_is_reaped_and_comes_back(docker_client, sweeper, run_root,
                                                                  tmp_path) -> None:
    """A process that exists but has not renewed its lease for longer than its timeout
    (SIGSTOP: hung) is dead to the others; once it runs again it renews and serves."""
    pool, leases = sweeper
    mine = pool.open_session(tenant="owners", source=ENV_SOURCE, class_name="E")
    stopped = Owner(_owner_settings(run_root, "stopped", leases, reap_interval_s=0), 1, tmp_path / "stopped.log")
    try:
        os.kill(stopped.proc.pid, signal.SIGSTOP)
        time.sleep(1.0)
        assert _exists(docker_client, stopped.containers[0]), "reaped before its lease expired"
        took = 1.0 + _gone_within(docker_client, stopped.containers, BOUND_S + SLACK_S, [_stepper(mine)])
        print(f"stopped owner's sandbox reaped {took:.2f} s after SIGSTOP (bound {BOUND_S:.0f} s)")
        os.kill(stopped.proc.pid, signal.SIGCONT)
        fresh = stopped.ask("open")  # renews its lease before creating the container
        _sweeps(pool, 3)
        assert _exists(docker_client, fresh), "a resumed owner's new sandbox was reaped"
        assert stopped.ask("call")[-1] == "ok"  # type: ignore[index]
    finally:
        mine.close()
        stopped.stop(docker_client)


def test_an_owner_starting_and_creating_sandboxes_under_a_fast_sweep_loses_none(docker_client, pool_settings,
                                                                               run_root, tmp_path,
                                                                               leak_check) -> None:
    """The race between creating a container and a sweep: a sweep every 0.1 s from before
    the owner starts, while it starts and opens sessions one after the other."""
    leases = run_root / "leases-race"
    settings = pool_settings("fast-sweeper", pool_size=0, reap_on_start=True, reap_interval_s=0.1,
                             owner_lease_timeout_s=LEASE_S, owner_lease_dir=leases)
    with docker_pool(settings) as pool:
        _sweeps(pool, 2)
        owner = Owner(_owner_settings(run_root, "racer", leases, reap_on_start=True, reap_interval_s=0.1), 1,
                      tmp_path / "racer.log")
        try:
            opened = [owner.ask("open") for _ in range(5)]
            _sweeps(pool, 5)
            assert all(_exists(docker_client, cid) for cid in owner.containers + opened)
            assert owner.ask("call") == ["ok"] * 6
        finally:
            owner.stop(docker_client)


def test_sweeps_leave_hostile_and_foreign_labels_alone(docker_client, sandbox_image, sweeper, caplog) -> None:
    """Only proven-dead owners are swept: containers without an owner label, with labels
    Sandpit never writes, of other hosts or other pid namespaces without a lease stay
    (the start-up reap and ``sandpit sandboxes --reap`` remove the unowned ones)."""
    caplog.set_level(logging.INFO, logger="sandpit.executor.docker.engine")
    pool, leases = sweeper
    host = socket.gethostname()
    dead = _dead_owner()
    boot = owners.owner_ns().partition("/")[0]
    foreign_ns = f"{boot}/{int(owners.owner_ns().partition('/')[2]) + 1}"
    hostile = {
        "no owner label": {},
        "empty owner": {engine.LABEL_OWNER: ""},
        "garbage owner": {engine.LABEL_OWNER: "garbage"},
        "too many fields": {engine.LABEL_OWNER: f"{dead}:1:2"},
        "unicode pid": {engine.LABEL_OWNER: f"{host}:١٢٣:1"},
        "huge owner": {engine.LABEL_OWNER: "x" * 4000},
        "newline owner": {engine.LABEL_OWNER: f"{dead}\n"},
        "other host (old label)": {engine.LABEL_OWNER: "some-other-host:1:1"},
        "other pid namespace, no lease": {engine.LABEL_OWNER: f"{host}:1:1", "sandpit.owner-ns": foreign_ns},
        "hostile namespace": {engine.LABEL_OWNER: dead, "sandpit.owner-ns": "../../../etc/passwd"},
    }
    made: dict = {}
    try:
        for name, labels in hostile.items():
            made[name] = _leftover(docker_client, sandbox_image, labels)
        made["doomed"] = doomed = _leftover(docker_client, sandbox_image, {engine.LABEL_OWNER: dead,
                                                                           "sandpit.owner-ns": owners.owner_ns()})
        took = _gone_within(docker_client, [doomed.id], BOUND_S + SLACK_S, [])
        _sweeps(pool, 2)
        swept = _reaped_ids(caplog)
        assert {name for name, container in made.items() if container.id[:12] in swept} <= {"doomed"}
        assert doomed.id[:12] in swept or not _exists(docker_client, doomed.id)
        print(f"dead owner's container reaped after {took:.2f} s; hostile labels left alone")
    finally:
        for container in made.values():
            engine.remove_container(docker_client, container.id)
