"""The jobs template kept through full recycles (``pid1_templates.Templates.keepable_jobs``,
``pid1_runner.Runner.recycle``): a jobs template that was ready before any untrusted code
ran in the sandbox stays through every recycle and forks the sandbox's spares; signals a
session sends it change nothing; one a session stopped or killed is not kept, and the
recycle builds a clean one before it answers. A spare forked from it ahead of an open
rehearses an open with the runner's own class (``child_spare.rehearse``), and the
environment that spare then constructs finds nothing of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from waiting import wait_until

from ..conftest import FAST, TENANT, deferred_actions, template_state

pytestmark = pytest.mark.docker

SIGNALLER = '''
import os
import signal


class Signaller:
    """Sends signals to every other process of its sandbox."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)

    def bump(self) -> int:
        self.count += 1
        return self.count

    def signal_everyone_else(self, names: str) -> str:
        """Send each signal of comma-separated ``names`` to every process but PID 1 and itself."""
        me, sent = os.getpid(), 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, me):
                for name in names.split(","):
                    try:
                        os.kill(int(entry), getattr(signal, name))
                        sent += 1
                    except OSError:
                        pass
        return str(sent)
'''

INSPECTOR = '''
import gc
import sys


class Inspector:
    """Looks for what a rehearsal could have left in its process."""

    def __init__(self, init_config):
        self.count = init_config.get("count", 0)

    def leftovers(self) -> str:
        classes = sorted({o.__name__ for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "Rehearsal"})
        instances = sum(type(o).__name__ == "Rehearsal" for o in gc.get_objects())
        module = sys.modules.get("dynamic_env")
        mine = module is not None and getattr(module, "Inspector", None) is Inspector
        alias = sys.modules.get("sandpit_env") is module
        names = sorted(n for n in vars(module) if not n.startswith("__")) if module is not None else []
        return f"{classes}|{instances}|{mine}|{alias}|{names}"
'''

CATCHABLE = "SIGINT,SIGTERM,SIGHUP,SIGUSR1,SIGUSR2,SIGALRM,SIGQUIT,SIGABRT,SIGPIPE,SIGTSTP,SIGCONT,SIGCHLD"


@pytest.fixture(scope="module")
def kept_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """One warm sandbox shared by up to 8 sessions, templates on (what keeps a jobs template)."""
    with docker_pool(pool_settings("keptjobs", sessions_per_sandbox=8, pool_size=1, idle_timeout_s=300.0)) as pool:
        yield pool


def open_signaller(pool: SandboxPool) -> Session:
    return pool.open_session(tenant=TENANT, source=SIGNALLER, class_name="Signaller", init_config={"count": 1},
                             profile=pool.profile(overrides=FAST))


def settled(sandbox: Any, timeout_s: float = 20.0) -> dict[str, Any]:
    """The sandbox's template counters once no deferred start waits and no jobs template loads."""
    states: list[dict[str, Any]] = []

    def done() -> bool:
        waiting = deferred_actions(sandbox)  # first: the counters read after it include what ran before
        states.append(template_state(sandbox))
        return waiting == 0 and states[-1]["jobs"] != "loading"

    wait_until(done, "no deferred start and no jobs template loading", timeout_s=timeout_s, poll_s=0.05)
    return states[-1]


def cycle(pool: SandboxPool, signals: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Open a session, have it signal every other process (``signals``), close it (its
    sandbox is recycled: it held nothing else); the sandbox's counters when the session
    opened and after the recycle."""
    session = open_signaller(pool)
    sandbox = session._sandbox
    before = template_state(sandbox)
    assert session.call("bump").observation == "2"
    if signals:
        assert int(session.call("signal_everyone_else", {"names": signals}).observation) > 0
    session.close()
    return before, settled(sandbox)


def clean_cycle(pool: SandboxPool, signals: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`cycle` until it runs in a sandbox whose jobs template was clean when the
    session opened (the warm sandboxes take turns, and a new one's template may have met
    code before it was ready)."""
    for _ in range(6):
        before, after = cycle(pool, signals)
        if before["jobs"] == "clean":
            return before, after
    raise AssertionError("no sandbox with a clean jobs template in 6 cycles")


def test_a_clean_jobs_template_outlives_full_recycles_and_forks_the_spares(kept_pool) -> None:
    for _ in range(4):
        before, after = cycle(kept_pool)
        assert after["jobs"] == "clean", after  # whatever the start left, a recycle leaves a clean one
        if before["jobs"] == "clean":  # kept, and the spare after the recycle forked from it
            assert after["jobs_kept"] == before["jobs_kept"] + 1 and after["spares_forked"] >= 1, (before, after)
    before, after = clean_cycle(kept_pool)
    assert after["jobs_kept"] == before["jobs_kept"] + 1, (before, after)
    session = open_signaller(kept_pool)
    try:  # a session in a process forked from the kept template works as any other
        assert [session.call("bump").observation for _ in range(3)] == ["2", "3", "4"]
    finally:
        session.close()


def test_signals_a_session_sends_leave_the_jobs_template_kept(kept_pool) -> None:
    before, after = clean_cycle(kept_pool, CATCHABLE)  # every catchable signal, to every other process
    assert after["jobs"] == "clean" and after["jobs_kept"] == before["jobs_kept"] + 1, (before, after)
    assert after["spares_forked"] >= 1, after
    for _ in range(2):  # and the sandboxes go on serving sessions
        _, later = cycle(kept_pool)
        assert later["jobs"] == "clean", later


@pytest.mark.parametrize("signals", ["SIGSTOP", "SIGKILL"])
def test_a_jobs_template_a_session_stopped_or_killed_is_replaced_by_a_clean_one(kept_pool, signals) -> None:
    before, after = clean_cycle(kept_pool, signals)
    # not kept (a stopped one may be anything when it resumes; a dead one is gone): the
    # recycle killed everything, proved the sandbox empty (it is reused: ``settled`` pinged
    # it after the recycle) and waited for a new template, ready before any code could run
    assert after["jobs"] == "clean" and after["jobs_kept"] == before["jobs_kept"], (before, after)
    for _ in range(2):
        _, later = cycle(kept_pool)
        assert later["jobs"] == "clean", later


def test_a_spare_forked_ahead_rehearses_and_its_environment_finds_nothing_of_it(kept_pool) -> None:
    _, after = clean_cycle(kept_pool)  # the recycle forks the next spare ahead, from the kept template
    assert after["spares_rehearsed"] >= 1 and after["spares_rehearsed"] <= after["spares_forked"], after
    session = kept_pool.open_session(tenant=TENANT, source=INSPECTOR, class_name="Inspector",
                                     init_config={"count": 1}, profile=kept_pool.profile(overrides=FAST))
    try:  # the first open of this source since the recycle: the rehearsed spare constructs it
        assert session.call("leftovers").observation == "[]|0|True|True|['Inspector', 'gc', 'sys']"
    finally:
        session.close()
