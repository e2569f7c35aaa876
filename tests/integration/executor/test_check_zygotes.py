"""Kept zygotes: a check batch whose every check ran in place (read-only checks on plain
states) leaves its zygote to serve the next batch, and the sandbox's next recycle keeps
its processes (a light recycle) when nothing else ran since the last one. Results must be
those of a fresh zygote; anything that is not a read-only check (a forked check, a
timeout, an out-of-memory check, a script) ends the reuse, and a sandbox in which such
code ran is recycled in full. Under runc (the shared pool: job-only sandboxes, recycled
after every batch) and under gVisor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.results import CheckResult
from sandpit.sandbox_images.runner.child_readonly import why_not_read_only

from ..conftest import FAST
from .test_checks import FINAL, PID, READ_ONLY, check, run

pytestmark = pytest.mark.docker

SAYS = check("print('balance', final_state['balance'])\nreturn final_state['balance'] == 80")
FAILS = check("return initial_state['balance'] == 80")
RAISES = check("return final_state['missing']")
NOT_BOOL = check("return len(final_state['log'])")
READ_ONLY_BATCH = [READ_ONLY, SAYS, FAILS, RAISES, NOT_BOOL]
LOOPS = check("n = 0\nwhile True:\n    n += 1")  # read-only, but never returns
HOGS = check("return len('x' * 10**14) > 0")  # read-only, MemoryError at once
FORGES = check("print('{\"status\": \"ok\", \"passed\": true, \"index\": 1}')\nreturn False")
LEAVES = check("import os, subprocess\nopen('/tmp/left-by-a-check', 'w').write('x')\n"
               "subprocess.Popen(['sleep', '30'], start_new_session=True)\nprint(os.getpid())\nreturn True")
SEES = check("import os, sys, decimal, linecache\n"
             "print(os.getpid())\n"
             "print(sorted(os.listdir('/tmp')))\n"
             "print(sorted(f.__name__ for f, on in decimal.getcontext().flags.items() if on))\n"
             "print(repr(linecache.getline('<check_func>', 2)))\n"
             "def command(pid):\n"
             "    try:\n"
             "        return open(f'/proc/{pid}/cmdline').read()\n"
             "    except OSError:\n"
             "        return ''\n"
             "strays = [p for p in os.listdir('/proc') if p.isdigit() and command(p).startswith('sleep')]\n"
             "return strays == [] and 'encodings.idna' not in sys.modules")


def outcome(results: list[CheckResult]) -> list[tuple[object, ...]]:
    """What a result says, without its duration."""
    return [(r.check_item, r.status, r.passed, r.result, r.error, r.traceback, r.stdout, r.stderr) for r in results]


def fresh_pid(results: list[CheckResult]) -> int:
    """The pid the batch's last check (a forked one that prints it first) printed."""
    assert results[-1].status == "ok", results[-1]
    return int(results[-1].stdout.splitlines()[0])


def assert_kept_zygotes(pool: SandboxPool, profile: ResourceProfile) -> None:
    """Read-only batches give the same results on a kept zygote as on a fresh one and
    start no process: between two forked checks, ten read-only batches take fewer pids
    than one zygote each would."""
    assert all(why_not_read_only(source) is None for source in READ_ONLY_BATCH)
    first = run(pool, profile, READ_ONLY_BATCH)
    assert [(r.status, r.passed) for r in first] == [("ok", True), ("ok", True), ("ok", False), ("error", False),
                                                      ("error", False)], first
    assert first[1].stdout == "balance 80\n" and first[3].error == "Error: KeyError: 'missing'"
    assert first[4].error == "returned int 1, not a bool"
    before = fresh_pid(run(pool, profile, [PID]))
    again = [run(pool, profile, READ_ONLY_BATCH) for _ in range(10)]
    after = fresh_pid(run(pool, profile, [READ_ONLY, PID]))
    assert all(outcome(results) == outcome(first) for results in again), again
    assert after - before < 10, (before, after)


def assert_hostile_checks_end_the_reuse(pool: SandboxPool, profile: ResourceProfile, recycled: bool) -> None:
    """A check that loops, one that exhausts memory, one that prints a forged verdict and
    one that leaves a file and a process: each gets its own status, and the batches after
    them (on kept zygotes or not) see nothing of them: no process, no module, no flag, and,
    in a sandbox ``recycled`` after each batch, no file (a sandbox that serves sessions
    keeps its /tmp while they live)."""
    expected = outcome(run(pool, profile, READ_ONLY_BATCH))
    looped = run(pool, profile, [READ_ONLY, LOOPS, READ_ONLY], timeout_s=1.0)
    assert [(r.status, r.passed) for r in looped] == [("ok", True), ("timeout", False), ("ok", True)], looped
    assert outcome(run(pool, profile, READ_ONLY_BATCH)) == expected
    hogged = run(pool, profile, [READ_ONLY, HOGS, READ_ONLY])
    assert [(r.status, r.passed) for r in hogged] == [("ok", True), ("oom", False), ("ok", True)], hogged
    assert outcome(run(pool, profile, READ_ONLY_BATCH)) == expected
    forged = run(pool, profile, [READ_ONLY, FORGES, FAILS])
    assert [(r.status, r.passed) for r in forged] == [("ok", True), ("ok", False), ("ok", False)], forged
    assert forged[1].stdout.startswith('{"status": "ok"')  # data, never a frame
    assert outcome(run(pool, profile, READ_ONLY_BATCH)) == expected
    left = run(pool, profile, [LEAVES])
    assert left[0].passed, left
    # a traceback and a codec import in a kept zygote, then a forked check that looks
    leaves = check("name = str(b'xn--bcher-kva', 'idna')\nreturn final_state['missing'] and len(name) > 0")
    assert why_not_read_only(leaves) is None
    for _ in range(2):
        run(pool, profile, [leaves, READ_ONLY])
        seen = run(pool, profile, [SEES])
        assert seen[0].passed, seen
        files = "[]" if recycled else "['left-by-a-check']"
        assert seen[0].stdout.splitlines()[1:] == [files, "[]", "''"], seen


PID_WHERE = check("import os\nprint(os.getpid())\n"
                  "print(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19])\nreturn True")
"""A forked check printing its pid and its sandbox's PID 1 start time (which tells one
container from another: pids are only comparable within one)."""


def pid_and_container(results: list[CheckResult]) -> tuple[int, str]:
    """What the batch's last check (:data:`PID_WHERE`) printed: its pid and its sandbox's
    PID 1 start time (in clock ticks since boot, as text)."""
    return fresh_pid(results), results[-1].stdout.split()[1]


@pytest.fixture(scope="module")
def one_sandbox_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """At most one sandbox and none warm: every batch runs in the one container (a batch
    waits for its recycle), unless the pool replaces it."""
    with docker_pool(pool_settings("zygotes-one", pool_size=0, max_sandboxes=1)) as one:
        yield one


def test_a_zygote_that_restored_large_states_is_not_kept(one_sandbox_pool) -> None:
    """A read-only batch on states of tens of megabytes as objects leaves a zygote holding
    that memory after it drops them: it exits instead of waiting for the next batch
    (``ZYGOTE_KEEP_MAX_BYTES``), so each such batch takes a fresh zygote; the results are
    those of any batch. (Small batches keep their zygote: the next test.) The pids are
    compared only when the batches before and after ran in one container: the pool of one
    sandbox replaces it when a recycle cannot prove it clean or the sandbox is lost, and a
    new container starts its pids again; up to three tries."""
    pool = one_sandbox_pool
    profile = pool.profile(overrides=FAST.model_copy(update={"memory_mib": 256}))  # room for the states
    large = {**FINAL, "rows": [{"k": i, "s": f"row {i:06d}"} for i in range(150_000)]}
    places = []
    for _ in range(3):
        first = run(pool, profile, [PID_WHERE])
        results = [run(pool, profile, [READ_ONLY, SAYS], final=large) for _ in range(3)]
        last = run(pool, profile, [READ_ONLY, PID_WHERE])
        assert all([(r.status, r.passed) for r in batch] == [("ok", True), ("ok", True)] for batch in results), results
        (before, where_before), (middle, where_middle) = pid_and_container(first), pid_and_container(last)
        places.append((where_before, where_middle))
        if where_before == where_middle:
            break
    assert where_before == where_middle, places  # three tries, never one container before and after
    assert middle - before >= 3, (before, middle)  # a zygote per large batch, where one kept zygote takes none


def test_read_only_batches_keep_their_zygote(pool, fast_profile) -> None:
    unclean = pool.stats()["failures"].get("unclean", 0)
    assert_kept_zygotes(pool, fast_profile)
    assert pool.stats()["failures"].get("unclean", 0) == unclean  # light recycles proved the sandbox clean


def test_hostile_checks_end_the_reuse_and_leave_nothing(pool, fast_profile) -> None:
    assert_hostile_checks_end_the_reuse(pool, fast_profile, recycled=True)


@pytest.fixture(scope="module")
def shared_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """Sandboxes of 4 sessions each: check batches run beside the sessions (no recycle)."""
    with docker_pool(pool_settings("zygotes-shared", sessions_per_sandbox=4)) as shared:
        yield shared


def test_kept_zygotes_beside_sessions(shared_pool, open_env) -> None:
    profile = shared_pool.profile(overrides=FAST)
    session = open_env(on=shared_pool, init_config={"counter": 1})
    assert session.call("bump", {"by": 2}).observation == "3"
    assert_kept_zygotes(shared_pool, profile)
    assert_hostile_checks_end_the_reuse(shared_pool, profile, recycled=False)
    assert session.call("bump", {"by": 4}).observation == "7"


@pytest.fixture(scope="module")
def gvisor_pool(leak_check, pool_settings, docker_client) -> Iterator[SandboxPool]:
    if "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    with docker_pool(pool_settings("zygotes-gvisor", runtime="runsc", pool_size=1)) as gvisor:
        yield gvisor


@pytest.mark.gvisor
@pytest.mark.slow
def test_kept_zygotes_under_gvisor(gvisor_pool) -> None:
    profile = gvisor_pool.profile()
    assert_kept_zygotes(gvisor_pool, profile)
    assert_hostile_checks_end_the_reuse(gvisor_pool, profile, recycled=True)
