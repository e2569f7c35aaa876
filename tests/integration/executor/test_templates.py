"""Sessions forked from a per-environment template process (``pid1_templates.py``,
``child_template.py``): confined exactly like spawned ones, sharing nothing mutable with
their siblings; a template killed by a session, a hostile import, or a second environment
in the same sandbox never break the sessions, which fall back to starting the normal way.
Memory admission of the pool (``sessions_per_sandbox`` as a hard cap, measured memory
below it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.errors import CapacityError, SessionOpenError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.jobs import encode_json_state
from sandpit.executor.pool.session import Session

from ..conftest import FAST, TENANT, template_state

pytestmark = pytest.mark.docker

# Templatable (only ``typing`` at import) and still able to look at its own process: the
# tools reach ``os`` through an object's globals at call time, as hostile code would.
FORKABLE = '''
from typing import Any, Dict

REGISTRY: Dict[str, int] = {}
OS = lambda: [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"][0].__init__.__globals__


class Probe:
    """Counter plus views of its own process."""

    def __init__(self, init_config: Dict[str, Any]):
        self.count = init_config.get("count", 0)
        self.__dict__["__ballast__"] = "x" * (init_config.get("ballast_mib", 0) * 1048576)  # not state

    def bump(self, by: int = 1) -> int:
        self.count += by
        REGISTRY["bumps"] = REGISTRY.get("bumps", 0) + by
        return self.count

    def registry(self) -> str:
        return str(sorted(REGISTRY.items()))

    def identity(self) -> str:
        os = OS()
        fd = os["open"]("/proc/self/status", 0)
        text = os["read"](fd, 65536).decode()
        os["close"](fd)
        status = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        return repr({
            "pid": os["getpid"](), "ppid": os["getppid"](), "sid": os["getsid"](0), "pgid": os["getpgid"](0),
            "cwd": os["getcwd"](), "fds": sorted(int(f) for f in os["listdir"]("/proc/self/fd")),
            "seccomp": status["Seccomp"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
            "threads": status["Threads"].strip(), "env": sorted(os["environ"]),
        })

    def kill_everyone_else(self) -> str:
        os = OS()
        me = os["getpid"]()
        killed = []
        for entry in os["listdir"]("/proc"):
            if entry.isdigit() and int(entry) not in (1, me):
                try:
                    os["kill"](int(entry), 9)
                    killed.append(int(entry))
                except OSError:
                    pass
        return str(len(killed))

    def spin(self) -> None:
        while True:
            pass
'''


def other(source: str, label: str) -> str:
    """A second environment: same class, different source."""
    return source.replace('"""Counter plus views of its own process."""',
                          f'"""Counter plus views of its own process."""\n    LABEL = "{label}"\n\n'
                          f'    def label(self) -> str:\n        return self.LABEL\n')


@pytest.fixture(scope="module")
def shared_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """Eight sessions per sandbox, templates on, one warm sandbox."""
    with docker_pool(pool_settings("templates", sessions_per_sandbox=8, pool_size=1, idle_timeout_s=300.0)) as pool:
        yield pool


def open_(pool: SandboxPool, sessions: list[Session], source: str = FORKABLE, fast: bool = True,
          **config: Any) -> Session:
    """Open a Probe session (the fast profile: 2 s per call; ``fast=False``: the default 10 s)."""
    session = pool.open_session(tenant=TENANT, source=source, class_name="Probe", init_config=config,
                                profile=pool.profile(overrides=FAST) if fast else pool.profile())
    sessions.append(session)
    return session


def wait_ready(sandbox: Any, count: int = 1, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = template_state(sandbox)
        if state["ready"] >= count or time.monotonic() > deadline:
            return state
        time.sleep(0.1)


def identity(session: Session) -> dict[str, Any]:
    result = session.call("identity")
    assert result.status == "ok", result
    value: dict[str, Any] = eval(result.observation)  # noqa: S307 - our own repr of ints and strings
    return value


def test_forked_sessions_are_confined_like_spawned_ones_and_share_nothing(shared_pool, opened) -> None:
    first = open_(shared_pool, opened, count=1)
    sandbox = first._sandbox
    assert wait_ready(sandbox)["ready"] == 1
    a = open_(shared_pool, opened, count=10)
    b = open_(shared_pool, opened, count=20)
    assert a._sandbox is sandbox and b._sandbox is sandbox
    assert template_state(sandbox)["forked"] == 2

    spawned, fork_a, fork_b = identity(first), identity(a), identity(b)
    for forked in (fork_a, fork_b):
        assert forked["ppid"] == 1  # PID 1 waits for it, as for a spawned session
        assert forked["sid"] == forked["pid"] == forked["pgid"]  # its own process session and group
        assert forked["fds"] == spawned["fds"]  # 0-3 (and the listing's own) only
        for field in ("seccomp", "no_new_privs", "threads", "env"):
            assert forked[field] == spawned[field], field
        assert forked["cwd"].startswith("/work/") and forked["cwd"] not in (spawned["cwd"],)
    assert len({fork_a["pid"], fork_b["pid"], spawned["pid"]}) == 3
    assert fork_a["cwd"] != fork_b["cwd"]

    # state and module globals: copy-on-write, never shared
    assert a.call("bump", {"by": 5}).observation == "15"
    assert b.call("bump", {"by": 1}).observation == "21"
    assert a.call("registry").observation == "[('bumps', 5)]"
    assert b.call("registry").observation == "[('bumps', 1)]"
    assert first.call("registry").observation == "[]"
    assert a.state()["count"] == 15 and b.state()["count"] == 21 and first.state()["count"] == 1


def test_a_forked_session_that_times_out_is_forked_again_from_its_snapshot(shared_pool, opened) -> None:
    first = open_(shared_pool, opened)
    wait_ready(first._sandbox)
    forked = open_(shared_pool, opened, count=3)
    assert forked.call("bump").observation == "4"
    before = identity(forked)["pid"]
    assert forked.call("spin").status == "timeout"
    assert forked.call("bump").observation == "5"  # re-created from the last good snapshot
    assert identity(forked)["pid"] != before
    assert template_state(first._sandbox)["forked"] >= 2


def test_a_session_killing_its_template_and_siblings_leaves_them_restorable(shared_pool, opened) -> None:
    first = open_(shared_pool, opened, count=1)
    sandbox = first._sandbox
    wait_ready(sandbox)
    sibling = open_(shared_pool, opened, count=100)
    hostile = open_(shared_pool, opened, count=0)
    assert sibling.call("bump").observation == "101"
    assert int(hostile.call("kill_everyone_else").observation) >= 3  # template, spare, sessions
    time.sleep(0.3)
    state = template_state(sandbox)
    assert state["ready"] == 0 and state["failed"] == 1  # dead: never retried in this sandbox
    # the siblings come back from their snapshots, started the normal way
    assert sibling.call("bump").observation == "102"
    assert first.call("bump").observation == "2"
    late = open_(shared_pool, opened, count=7)
    assert late._sandbox is sandbox and late.call("bump").observation == "8"
    assert template_state(sandbox)["forked"] == state["forked"]


@pytest.mark.parametrize("prelude", [
    "import threading\nthreading.Thread(target=lambda: __import__('time').sleep(60), daemon=True).start()\n",
    "import os\nHANDLE = os.open('/tmp/template-file', os.O_CREAT | os.O_WRONLY)\n",
    "import os\nif os.fork() == 0:\n    import time\n    time.sleep(60)\n",
    "import random\nrandom.seed(7)\n",
    "import uuid\nSESSION_ID = str(uuid.uuid4())\n",
], ids=["thread", "file", "fork", "seeded-random", "uuid-at-import"])
def test_imports_with_side_effects_are_never_templated(shared_pool, opened, prelude) -> None:
    source = prelude + FORKABLE
    first = open_(shared_pool, opened, source=source, count=1)
    sandbox = first._sandbox
    deadline = time.monotonic() + 20
    while (state := template_state(sandbox))["failed"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state["failed"] == 1 and state["ready"] == 0
    assert any("unsuitable" in reason for reason in state["reasons"]), state
    second = open_(shared_pool, opened, source=source, count=5)
    assert second._sandbox is sandbox and second.call("bump").observation == "6"
    assert template_state(sandbox)["forked"] == state["forked"]


def test_a_template_spinning_at_import_is_killed_and_the_sandbox_recycles_clean(shared_pool, opened) -> None:
    spinning = "SPIN = 0\nwhile True:\n    SPIN += 1\n" + FORKABLE
    with pytest.raises(SessionOpenError) as error:
        open_(shared_pool, opened, source=spinning)
    assert error.value.status == "timeout"
    unclean = shared_pool.failures["unclean"]
    time.sleep(0.5)  # the sandbox is recycled (its template killed with everything else)
    assert shared_pool.failures["unclean"] == unclean
    again = open_(shared_pool, opened, count=2)
    assert again.call("bump").observation == "3"


def test_two_environments_never_share_a_template(shared_pool, opened) -> None:
    x_source, y_source = other(FORKABLE, "X"), other(FORKABLE, "Y")
    x1 = open_(shared_pool, opened, source=x_source)
    y1 = open_(shared_pool, opened, source=y_source)
    sandbox = x1._sandbox
    assert y1._sandbox is sandbox
    assert wait_ready(sandbox, count=2)["ready"] == 2
    x2 = open_(shared_pool, opened, source=x_source)
    y2 = open_(shared_pool, opened, source=y_source)
    assert template_state(sandbox)["forked"] == 2
    assert [s.call("label").observation for s in (x1, x2, y1, y2)] == ["X", "X", "Y", "Y"]
    assert json.loads(json.dumps(y2.state())) == {"count": 0}


OK_CHECK = "def check_func(final_state):\n    return final_state['count'] == 1\n"
FALSE_CHECK = "def check_func(final_state):\n    return final_state['count'] == 2\n"
KILL_EVERYONE_ELSE = """def check_func(final_state):
    import os
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) not in (1, os.getpid()):
            try:
                os.kill(int(entry), 9)
            except OSError:
                pass
    return True
"""


def batch(pool: SandboxPool, sources: list[str]) -> list[tuple[str, bool]]:
    """Run ``sources`` as a check batch on ``{"count": 1}`` (the fast profile)."""
    state = encode_json_state({"count": 1})
    results = pool.run_checks(tenant=TENANT, checks=[{"check_item": str(i), "check_func": source}
                                                     for i, source in enumerate(sources)],
                              initial_state=state, final_state=state, profile=pool.profile(overrides=FAST))
    return [(r.status, r.passed) for r in results]


def test_check_batches_fork_from_the_jobs_template_and_outlive_its_death(shared_pool, opened) -> None:
    session = open_(shared_pool, opened, count=1)  # the batches share its sandbox
    sandbox = session._sandbox
    deadline = time.monotonic() + 30
    while True:  # the jobs template starts after the sandbox's first batch
        before = template_state(sandbox)["forked"]
        assert batch(shared_pool, [OK_CHECK, FALSE_CHECK]) == [("ok", True), ("ok", False)]
        if template_state(sandbox)["forked"] > before:
            break  # this batch's zygote came from the template
        assert time.monotonic() < deadline, template_state(sandbox)
        time.sleep(0.2)
    # a check that kills every process it can see (its zygote, the template, the spare, the
    # session) crashes alone; the batch goes on in a fresh process, later ones too
    assert batch(shared_pool, [KILL_EVERYONE_ELSE, OK_CHECK, FALSE_CHECK]) == [
        ("crashed", False), ("ok", True), ("ok", False)]
    assert batch(shared_pool, [FALSE_CHECK, OK_CHECK]) == [("ok", False), ("ok", True)]
    assert session.call("bump").status in ("ok", "crashed")  # killed too: re-created from its snapshot
    assert session.call("bump").status == "ok"


ZYGOTE_AGE_OVER_HALF_A_SECOND = """def check_func(final_state):
    import os
    stat = open(f'/proc/{os.getppid()}/stat').read()
    started = int(stat[stat.rfind(')') + 2:].split()[19]) / os.sysconf('SC_CLK_TCK')
    return float(open('/proc/uptime').read().split()[0]) - started > 0.5
"""


def test_a_batch_takes_the_process_forked_ahead_and_goes_on_when_a_session_killed_it(shared_pool, opened) -> None:
    session = open_(shared_pool, opened, count=1)
    sandbox = session._sandbox
    deadline = time.monotonic() + 30
    while True:  # the jobs template starts after the sandbox's first batch
        before = template_state(sandbox)["forked"]
        assert batch(shared_pool, [OK_CHECK]) == [("ok", True)]
        if template_state(sandbox)["forked"] > before:
            break
        assert time.monotonic() < deadline, template_state(sandbox)
        time.sleep(0.2)
    time.sleep(1.0)
    # the batch's zygote was forked after the previous batch ended, not on this batch's path
    assert batch(shared_pool, [ZYGOTE_AGE_OVER_HALF_A_SECOND, OK_CHECK]) == [("ok", True), ("ok", True)]
    time.sleep(0.5)
    # a session (same uid) kills every process it can see: the waiting process, the template,
    # the spare; the next batches still run, each check in a fresh process
    assert int(session.call("kill_everyone_else").observation) >= 3
    assert batch(shared_pool, [OK_CHECK, FALSE_CHECK]) == [("ok", True), ("ok", False)]
    assert batch(shared_pool, [FALSE_CHECK, OK_CHECK]) == [("ok", False), ("ok", True)]


def test_memory_admission_spreads_sessions_below_the_hard_cap(leak_check, pool_settings) -> None:
    # hard cap 64, but a 200 MiB sandbox with 96 MiB of headroom has room for a few 10 MiB sessions
    settings = pool_settings("admission", sessions_per_sandbox=64, pool_size=0, sandbox_memory_mib=200,
                             sandbox_memory_headroom_mib=96, memory_sample_s=0.05)
    with docker_pool(settings) as pool:
        sessions = []
        try:
            for i in range(12):
                sessions.append(open_(pool, [], fast=False, count=i, ballast_mib=10))
                time.sleep(0.2)
            hosts = {id(s._sandbox) for s in sessions}
            assert 1 < len(hosts) < 12, pool.stats()
            assert all(s.call("bump").status == "ok" for s in sessions)
            assert pool.stats()["memory_projected_mib"] > 0
        finally:
            for session in sessions:
                session.close()


def test_the_pool_memory_budget_refuses_placements(leak_check, pool_settings) -> None:
    settings = pool_settings("budget", sessions_per_sandbox=8, pool_size=0, memory_budget_mib=40,
                             session_memory_estimate_mib=8.0)
    with docker_pool(settings) as pool:
        sessions: list[Session] = []
        try:
            with pytest.raises(CapacityError, match="memory budget"):
                for i in range(64):
                    sessions.append(open_(pool, [], fast=False, count=i))
                    time.sleep(0.05)
            assert sessions, "the first session fits the budget"
            assert pool.stats()["memory_rejections"] >= 1
        finally:
            for session in sessions:
                session.close()
