"""Session processes forked ahead of the next open (``pid1_templates``, "Forks ahead"): a
template that a session was forked from keeps its next process forked and verified once
the runner is quiet, and the next open of that environment (or config) takes it. The
process is confined exactly like one forked on the open's path; a session that kills or
stops it costs the next open nothing but the fork; the runner never takes a fork under way for a
stray; at most ``session_forks_ahead`` templates keep one (none with 0), and a recycle
kills them with everything else."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.sandbox_images.runner.limits import FORK_AHEAD_DEFAULT
from waiting import wait_until

from ..conftest import deferred_actions, template_state
from .test_templates import FORKABLE, identity, open_, other, wait_ready

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def ahead_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """Eight sessions per sandbox, templates on, one warm sandbox."""
    with docker_pool(pool_settings("ahead", sessions_per_sandbox=8, pool_size=1, idle_timeout_s=300.0)) as pool:
        yield pool


def wait_for(sandbox: Any, done: Callable[[dict[str, Any]], bool], timeout_s: float = 20.0) -> dict[str, Any]:
    """The sandbox's template counters once ``done(counters)`` holds (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = template_state(sandbox)
        if done(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def test_the_next_open_takes_the_process_forked_ahead_confined_like_one_forked_on_its_path(ahead_pool, opened) -> None:
    first = open_(ahead_pool, opened, count=1)
    sandbox = first._sandbox
    assert wait_ready(sandbox)["ready"] == 1
    forked_now = open_(ahead_pool, opened, count=10)  # the environment's template: forked on the open's path
    before = wait_for(sandbox, lambda s: s["ahead"] == 1)
    assert before["ahead"] == 1, before
    taken = open_(ahead_pool, opened, count=20)
    after = template_state(sandbox)
    assert after["ahead_taken"] == before["ahead_taken"] + 1
    assert after["forked"] == before["forked"] + 1 and after["fallbacks"] == before["fallbacks"]

    now, ahead = identity(forked_now), identity(taken)
    assert ahead["pid"] != now["pid"] and ahead["ppid"] == now["ppid"] == 1
    assert ahead["sid"] == ahead["pgid"] == ahead["pid"]
    for field in ("fds", "seccomp", "no_new_privs", "threads", "env"):
        assert ahead[field] == now[field], field
    assert ahead["cwd"] != now["cwd"]  # a work directory of its own, given at its open
    assert taken.call("bump", {"by": 2}).observation == "22"
    assert forked_now.call("bump").observation == "11"
    assert taken.call("registry").observation == "[('bumps', 2)]"  # module state not shared
    assert wait_for(sandbox, lambda s: s["ahead"] == 1)["ahead"] == 1  # the next one is forked ahead again


def test_a_process_forked_ahead_that_a_session_killed_costs_the_next_open_nothing_but_its_fork(ahead_pool, opened) -> None:
    first = open_(ahead_pool, opened, count=1)
    sandbox = first._sandbox
    wait_ready(sandbox)
    open_(ahead_pool, opened, count=2)
    assert wait_for(sandbox, lambda s: s["ahead"] == 1)["ahead"] == 1
    killed = int(first.call("kill_everyone_else").observation)
    assert killed >= 2  # at least the template and the process forked ahead
    later = open_(ahead_pool, opened, count=5)
    assert later.call("bump").observation == "6"
    assert first.call("bump").observation == "2"
    assert later.call("identity").status == "ok"


STOPPING = FORKABLE.replace('''    def spin(self) -> None:''', '''    def stop_newest(self) -> str:
        os = OS()
        me = os["getpid"]()
        newest = max(int(e) for e in os["listdir"]("/proc") if e.isdigit() and int(e) != me)
        os["kill"](newest, 19)  # SIGSTOP
        return str(newest)

    def spin(self) -> None:''')


def test_a_process_forked_ahead_that_a_session_stopped_is_not_taken(ahead_pool, opened) -> None:
    """A process stopped by a signal would never answer its open (the open would time out):
    the runner kills it and forks the session at once."""
    first = open_(ahead_pool, opened, source=STOPPING, count=1)
    sandbox = first._sandbox
    wait_ready(sandbox)
    # the spare starts once the runner is quiet: now, not after the fork ahead
    wait_until(lambda: deferred_actions(sandbox) == 0, "the runner's deferred starts", timeout_s=20.0)
    second = open_(ahead_pool, opened, source=STOPPING, count=2)  # forked on its path; the next one ahead
    before = wait_for(sandbox, lambda s: s["ahead"] == 1)
    assert before["ahead"] == 1, before
    stopped = int(second.call("stop_newest").observation)
    assert stopped > identity(second)["pid"]  # the newest process: the one forked ahead after it
    later = open_(ahead_pool, opened, source=STOPPING, count=3)
    assert later.call("bump").observation == "4"
    assert identity(later)["pid"] != stopped
    after = template_state(sandbox)
    assert after["ahead_taken"] == before["ahead_taken"] and after["forked"] == before["forked"] + 1, after
    assert after["failed"] == 0, after


def test_back_to_back_opens_and_closes_never_take_a_fork_under_way_for_a_stray(ahead_pool, opened) -> None:
    """An open's close sweeps the sandbox while the next fork ahead may be under way: the
    sweep waits for it instead of killing it (which would fail the template)."""
    keeper = open_(ahead_pool, opened, count=7)
    sandbox = keeper._sandbox
    wait_ready(sandbox)
    paths = []
    for _ in range(40):
        session = open_(ahead_pool, [], count=7)  # the keeper's profile: its sandbox
        assert session._sandbox is sandbox
        opened_state = session.take_opened()
        paths.append(opened_state.construction.path if opened_state.construction else None)
        assert session.call("bump").observation == "8"
        session.close()
    state = template_state(sandbox)
    assert state["failed"] == 0 and state["configs_failed"] == 0 and state["fallbacks"] == 0, repr(state)
    assert paths[-30:] == ["template"] * 30, paths
    assert state["ahead_taken"] >= 25, state


def test_forks_ahead_are_bounded_per_sandbox_and_die_with_their_templates_at_recycle(ahead_pool) -> None:
    sessions: list[Session] = []
    sources = [FORKABLE] + [other(FORKABLE, f"env{i}") for i in range(FORK_AHEAD_DEFAULT + 1)]
    first = open_(ahead_pool, sessions, source=sources[0], count=1)
    sandbox = first._sandbox
    try:
        for source in sources[1:]:
            open_(ahead_pool, sessions, source=source, count=1)
        assert wait_ready(sandbox, len(sources))["ready"] == len(sources)
        for round_ in range(2):
            for i, source in enumerate(sources):  # each forked from its template, then closed
                session = open_(ahead_pool, [], source=source, count=100 * round_ + i)
                assert session._sandbox is sandbox
                session.close()
        settled = wait_for(sandbox, lambda s: s["ahead"] == FORK_AHEAD_DEFAULT, timeout_s=10.0)
        assert settled["ahead"] == FORK_AHEAD_DEFAULT, settled
        time.sleep(0.5)  # nothing more is forked ahead later
        assert template_state(sandbox)["ahead"] == FORK_AHEAD_DEFAULT
    finally:
        for session in sessions:
            session.close()
    assert sandbox.request("recycle")["clean"] is True  # already recycled by the last close: proven empty again
    state = template_state(sandbox)
    assert state["ahead"] == 0 and state["ready"] == 0 and state["ahead_taken"] == 0, state


def test_with_no_forks_ahead_every_session_is_forked_on_its_opens_path(leak_check, pool_settings) -> None:
    settings = pool_settings("noahead", sessions_per_sandbox=8, pool_size=1, session_forks_ahead=0)
    with docker_pool(settings) as pool:
        sessions: list[Session] = []
        try:
            first = open_(pool, sessions, count=1)
            sandbox = first._sandbox
            wait_ready(sandbox)
            for count in range(2, 8):
                assert open_(pool, sessions, count=count).call("bump").observation == str(count + 1)
            time.sleep(0.5)  # a quiet runner: nothing is forked ahead all the same
            state = template_state(sandbox)
            assert state["ahead"] == 0 and state["ahead_taken"] == 0 and state["forked"] == 6, state
        finally:
            for session in sessions:
                session.close()
