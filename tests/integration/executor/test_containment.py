"""Containment between sessions and against the runner, under runc and under gVisor
(issue 12): nothing a session or job leaves behind reaches the next one in a reused
sandbox; the runner's token is nowhere a session can read; spawn loops and memory bombs
get the same status every time and leave the sandbox's other session serving.

Every test runs once per runtime on real sandboxes (``runsc`` only when Docker has it
registered). The pool hosts two sessions per sandbox and keeps no warm spare sandbox, so
a sandbox freed by one test step is the one the next step gets (asserted through the
start time of its PID 1, which only a new container changes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.errors import SessionOpenError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.profiles import ProfileOverrides
from sandpit.executor.recovering import RecoveringSession

from ..conftest import PROBE_SOURCE, TENANT

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)]
REPEATS = 4
"""Runs of each hostile program whose status must not vary."""

PROCESS_LIST = """
import json
procs = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        procs.append([int(entry), stat[stat.rfind(")") + 2:].split()[0], stat[stat.find("(") + 1:stat.rfind(")")]])
result = json.dumps(sorted(procs))
"""
"""Snippet: ``[[pid, state, comm], ...]`` of every process in the sandbox."""

BOOT_ID = ("import os\n"
           "result = f\"{os.stat('/etc/hostname').st_mtime_ns}:{open('/proc/1/stat').read().split(') ')[1].split()[19]}\"")
"""Snippet: identity of the container: when Docker wrote its ``/etc/hostname`` (host clock,
nanoseconds) and PID 1's start time. The start time alone repeats under gVisor, whose
clock ticks count from each sandbox's own boot (two sandboxes both said ``22``)."""


@pytest.fixture(scope="module", params=RUNTIMES)
def rt_pool(request, leak_check, pool_settings, docker_client) -> Iterator[SandboxPool]:
    runtime = request.param
    if runtime == "runsc" and "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    settings = pool_settings(f"contain-{runtime}", runtime=runtime, sessions_per_sandbox=2, pool_size=0,
                             idle_timeout_s=300.0)
    with docker_pool(settings) as pool:
        yield pool


FAST = ProfileOverrides(call_timeout_s=2.0, memory_mib=128, tmpfs_mib=8, output_cap_bytes=8192)

LEAVE_BEHIND = r"""
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
report = {'home': os.path.expanduser('~/.h'), 'cwd': os.getcwd()}
for path in ('/dev/shm/s', '/tmp/t', '/var/tmp/v', report['home'], 'cwd-file'):
    try:
        with open(path, 'w') as handle:
            handle.write('secret')
        report[path] = 'written'
    except OSError as exc:
        report[path] = errno.errorcode[exc.errno]
os.makedirs('/dev/shm/d/e', exist_ok=True)
os.chmod('/dev/shm/d', 0)
os.mkfifo('/tmp/fifo')
def attempt(name, call):
    value = call()
    report[name] = 'created' if value >= 0 else errno.errorcode[ctypes.get_errno()]
attempt('shm', lambda: libc.shmget(0x5A17, 4096, 0o1666))
attempt('sem', lambda: libc.semget(0x5A17, 1, 0o1666))
attempt('msg', lambda: libc.msgget(0x5A17, 0o1666))
rt = ctypes.CDLL('librt.so.1', use_errno=True)
attempt('mqueue', lambda: rt.mq_open(b'/leak', os.O_CREAT | os.O_RDWR, 0o666, None))
listener = socket.socket(socket.AF_UNIX)
listener.bind('\0sandpit-leak')
listener.listen()
tcp = socket.socket()
tcp.bind(('127.0.0.1', 47011))
tcp.listen()
KEEP = [listener, tcp]  # held by the process until it ends
result = json.dumps(report)
"""


def leave_behind(in_session: bool) -> str:
    """Code writing everywhere it can and creating IPC objects; its result is a JSON
    report (``written``, or the errno name of the failure, per place)."""
    if in_session:
        return LEAVE_BEHIND.replace("KEEP = [listener, tcp]", "type(self).keep = [listener, tcp]")
    return LEAVE_BEHIND + "print(result)\n"


def look_for(report: dict, in_session: bool) -> str:
    """Code looking for everything ``report``'s program left; its result is JSON."""
    paths = ["/dev/shm/s", "/dev/shm/d", "/tmp/t", "/tmp/fifo", "/work/w", "/var/tmp/v", report["home"],
             report["cwd"]]
    code = f"paths = {paths!r}\n" + r"""
import ctypes, errno, json, os, socket
found = {path: os.path.exists(path) for path in paths}
found['/dev/shm'] = os.listdir('/dev/shm')
found['/tmp'] = os.listdir('/tmp')
found['/dev/mqueue'] = os.listdir('/dev/mqueue') if os.path.isdir('/dev/mqueue') else []
sysv = []
for kind in ('shm', 'sem', 'msg'):
    try:
        sysv += open('/proc/sysvipc/' + kind).read().splitlines()[1:]
    except OSError:
        pass  # gVisor has no /proc/sysvipc
found['sysvipc'] = sysv
probe = socket.socket(socket.AF_UNIX)
try:
    probe.connect('\0sandpit-leak')
    found['abstract'] = 'connected'
except OSError as exc:
    found['abstract'] = errno.errorcode[exc.errno]
try:
    socket.create_connection(('127.0.0.1', 47011), timeout=1)
    found['tcp'] = 'connected'
except OSError as exc:
    found['tcp'] = errno.errorcode.get(exc.errno, str(exc))
found['here'] = os.listdir('.')
result = json.dumps(found)
"""
    return code if in_session else code + "print(result)\n"


def nothing_left(report: dict) -> dict:
    paths = ["/dev/shm/s", "/dev/shm/d", "/tmp/t", "/tmp/fifo", "/work/w", "/var/tmp/v", report["home"],
             report["cwd"]]
    return {**dict.fromkeys(paths, False), "/dev/shm": [], "/tmp": [], "/dev/mqueue": [], "sysvipc": [],
            "abstract": "ECONNREFUSED", "tcp": "ECONNREFUSED", "here": []}


def check_report(report: dict) -> None:
    written = {k for k, v in report.items() if v == "written"}
    # writable: the shared tmpfs mounts and the process's own directory (also its HOME)
    assert written == {"/dev/shm/s", "/tmp/t", report["home"], "cwd-file"}, report
    assert report["/var/tmp/v"] in ("EROFS", "EACCES"), report  # read-only root
    # objects that outlive processes cannot be created at all (confine.py), either runtime
    assert {report[k] for k in ("shm", "sem", "msg", "mqueue")} == {"EPERM"}, report


def test_a_reused_sandbox_carries_nothing_from_earlier_sessions(open_env, probe, rt_pool) -> None:
    first = open_env(on=rt_pool)
    boot = probe.ok(first, BOOT_ID)
    report = json.loads(probe.ok(first, leave_behind(in_session=True)))
    check_report(report)
    first.close()

    second = open_env(on=rt_pool)
    assert probe.ok(second, BOOT_ID) == boot, "the pool should have reused the emptied sandbox"
    assert json.loads(probe.ok(second, look_for(report, in_session=True))) == nothing_left(report)


def test_a_sandbox_that_cannot_be_proven_empty_is_not_reused(open_env, probe, rt_pool) -> None:
    """/work is writable by every session but listable by none (mode 1733: a session's
    directory name is its secret), so the runner cannot remove a file a session put
    beside its own directory: it sees it (the directory's size counts its entries) and
    the pool destroys the sandbox instead of reusing it."""
    first = open_env(on=rt_pool)
    boot = probe.ok(first, BOOT_ID)
    probe.ok(first, "open('/work/w', 'w').write('secret')\nos.mkdir('/work/.d')")
    unclean = rt_pool.failures["unclean"]
    first.close()
    assert rt_pool.failures["unclean"] == unclean + 1

    second = open_env(on=rt_pool)
    assert probe.ok(second, BOOT_ID) != boot, "a sandbox with leftovers in /work must not be reused"
    assert probe.ok(second, "result = [os.path.exists(p) for p in ('/work/w', '/work/.d')]") == "[False, False]"


def test_a_reused_sandbox_carries_nothing_between_jobs(rt_pool) -> None:
    profile = rt_pool.profile(overrides=FAST)
    boot = BOOT_ID + "\nprint(result)\n"
    first = rt_pool.execute(tenant="tests", code=leave_behind(in_session=False) + boot, profile=profile)
    assert first.status == "ok", first
    text, first_boot = first.stdout.splitlines()[-2:]
    report = json.loads(text)
    check_report(report)
    second = rt_pool.execute(tenant="tests", code=look_for(report, in_session=False) + boot, profile=profile)
    assert second.status == "ok", second
    found, second_boot = second.stdout.splitlines()[-2:]
    assert second_boot == first_boot, "the pool should have reused the emptied sandbox"
    assert json.loads(found) == nothing_left(report)


PACKAGE_VIEW = """
import json, sys
package = sys.modules.get('sandpit_runner')
result = json.dumps({'path': sys.path, 'package': getattr(package, '__file__', None),
                     'loaded': sorted(name for name in sys.modules if name.startswith('sandpit_runner'))})
"""
"""Snippet: the session process's ``sys.path``, where its runner package was loaded from,
and which of its modules it holds."""


def test_the_runner_package_is_loaded_from_the_image_and_off_the_untrusted_path(open_env, probe, rt_pool) -> None:
    """The image installs the runner as a package in /opt/sandpit; a spawned process
    imports it from there, then takes /opt/sandpit off sys.path before any untrusted code
    runs, so code of the environment (or a script) finds no runner module by import."""
    session = open_env(on=rt_pool)
    seen = json.loads(probe.ok(session, PACKAGE_VIEW))
    assert seen["package"] == "/opt/sandpit/sandpit_runner/__init__.py", seen
    assert {"sandpit_runner.child_spare", "sandpit_runner.child_session", "sandpit_runner.wire"} <= set(seen["loaded"])
    assert not any(name.startswith("sandpit_runner.pid1_") for name in seen["loaded"]), seen["loaded"]
    assert not any(entry == "/opt/sandpit" or "sandpit_runner" in entry for entry in seen["path"]), seen["path"]
    script = rt_pool.execute(tenant="tests", profile=rt_pool.profile(overrides=FAST), code=(
        "import json, sys\n"
        "try:\n"
        "    import sandpit_runner\n"
        "except ImportError:\n"
        "    found = None\n"
        "else:\n"
        "    found = sandpit_runner.__file__\n"
        "print(json.dumps({'path': sys.path, 'found': found,\n"
        "                  'loaded': [m for m in sys.modules if m.startswith('sandpit_runner')]}))\n"))
    assert script.status == "ok", script
    view = json.loads(script.stdout)
    assert view["found"] is None and view["loaded"] == [], view
    assert not any(entry == "/opt/sandpit" or "sandpit" in entry for entry in view["path"]), view["path"]


def test_the_runner_token_is_nowhere_a_session_can_read(open_env, probe, rt_pool) -> None:
    session = open_env(on=rt_pool)
    environ = probe.run(session, "result = open('/proc/1/environ', 'rb').read().decode('latin-1')")
    # runc: non-dumpable PID 1, so PermissionError; gVisor shows it, without a token
    if environ.status == "ok":
        assert "TOKEN=" not in environ.observation and "SANDPIT_LIMITS" in environ.observation
    else:
        assert environ.observation.startswith("Error: PermissionError"), environ
    assert probe.ok(session, "result = os.listdir('/run/sandpit')") == "[]"
    # the runner's streams are sockets: not openable through /proc/<pid>/fd in either runtime
    opened = probe.run(session, (
        "opened = []\n"
        "for pid in ('1', str(os.getpid())):\n"
        "    try:\n"
        "        fds = os.listdir(f'/proc/{pid}/fd')\n"
        "    except OSError:\n"
        "        continue\n"
        "    for fd in fds:\n"
        "        path = f'/proc/{pid}/fd/{fd}'\n"
        "        try:\n"
        "            target = os.readlink(path)\n"
        "        except OSError:\n"
        "            continue\n"
        "        if target != '/dev/null' and (pid == '1' or target.startswith(('pipe:', 'socket:'))):\n"
        "            try:\n"
        "                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))\n"
        "                opened.append((pid, fd, target))\n"
        "            except OSError:\n"
        "                pass\n"
        "result = opened\n"))
    assert (opened.status, opened.observation) == ("ok", "[]"), opened


SPAWN_LOOP = """
import subprocess
self.counter = -1
while True:
    try:
        subprocess.Popen(['sh', '-c', 'sleep 100'], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        pass
"""

BOMB_IN_INIT = '''
class Greedy:
    def __init__(self, init_config):
        self.hoard = bytearray(1 << 30)

    def ping(self):
        return "pong"
'''


def _neighbour(open_env, probe, rt_pool):
    """A second session in the same sandbox, its process id and its state."""
    other = open_env(on=rt_pool, init_config={"counter": 7})
    return other, probe.ok(other, "result = os.getpid()")


def _neighbour_still_serving(probe, other, pid: str, sandbox, expected: int) -> None:
    """The other session answers with its state intact. Under runc it runs on in the
    same process and sandbox; under runsc a sandbox that gVisor's kept host pids fill
    is retired (``runsc_retire_pids_fraction``) and the session moves to a fresh one."""
    after = other.call("bump", {"by": 1})
    assert (after.status, after.observation) == ("ok", str(expected)), after
    if sandbox.runtime == "runc":
        assert not after.recovered, after
        assert probe.ok(other, "result = os.getpid()") == pid, "the other session's process was restarted"
        assert other._sandbox is sandbox


def _serving(result, runtime: str) -> None:
    assert result.status == "ok", result
    if runtime == "runc":
        assert not result.recovered, result


def test_a_spawn_loop_times_out_every_time_and_the_sandbox_serves_on(open_env, probe, rt_pool) -> None:
    session = open_env(on=rt_pool, init_config={"counter": 1})
    other, other_pid = _neighbour(open_env, probe, rt_pool)
    sandbox = session._sandbox
    assert other._sandbox is sandbox
    runtime = rt_pool.settings.runtime
    statuses = Counter()
    for round_ in range(REPEATS):
        statuses[probe.run(session, SPAWN_LOOP).status] += 1
        _serving(session.call("bump", {"by": 1}), runtime)
        _neighbour_still_serving(probe, other, other_pid, sandbox, 8 + round_)
    assert statuses == {"timeout": REPEATS}, statuses
    assert session.state()["counter"] == 1 + REPEATS
    running = [p for p in probe.processes(session) if p[1] != "Z"]
    assert len(running) <= 4 + (runtime == "runc"), running  # runner, the two sessions, maybe a spare; runc: the jobs template


@pytest.mark.parametrize("where", ["call", "init"])
def test_a_memory_bomb_is_oom_every_time_and_the_sandbox_serves_on(open_env, probe, rt_pool, where) -> None:
    anchor = open_env(on=rt_pool, init_config={"counter": 1})
    other, other_pid = _neighbour(open_env, probe, rt_pool) if where == "call" else (anchor, None)
    sandbox = anchor._sandbox
    runtime = rt_pool.settings.runtime
    statuses = Counter()
    for round_ in range(REPEATS):
        if where == "call":
            result = probe.run(anchor, "self.counter = -1\nx = bytearray(1 << 30)\n")
            statuses[result.status] += 1
            _serving(anchor.call("bump", {"by": 1}), runtime)
            _neighbour_still_serving(probe, other, other_pid, sandbox, 8 + round_)
        else:
            with pytest.raises(SessionOpenError) as failed:
                open_env(on=rt_pool, source=BOMB_IN_INIT, class_name="Greedy")
            statuses[failed.value.status] += 1
            after = anchor.call("bump", {"by": 1})  # the sandbox's other session
            assert (after.status, after.recovered) == ("ok", False), after
            assert anchor._sandbox is sandbox  # a memory bomb never needs a new sandbox
    assert statuses == {"oom": REPEATS}, statuses


RETIRED_REMOVAL_S = 30.0
"""How long a sandbox the bomb retired may take to be gone (seconds): gVisor tears down the
bomb's leftover processes before the engine can remove the container, which took over 10 s
with every core busy and the suite's other worker running on this project's VM."""
STRESS_ROUNDS = {"runc": 35, "runsc": 10}
"""Fork bombs in a row per runtime (a runsc round costs several seconds of gVisor's
process teardown and usually a fresh sandbox, see below)."""


@pytest.fixture
def cpu_burners() -> Iterator[int]:
    """One busy-looping host process per core for the duration of the test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield len(burners)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def test_fork_bombs_leave_no_survivor_on_a_loaded_machine(request, probe, rt_pool, docker_client,
                                                         cpu_burners) -> None:
    """Issue 12, finding 4: a fork bomb's processes are all dead when its call returns,
    every time, while every core of the host is busy. Under runc the same sandbox serves
    on and shows no process but the runner's, the session's and the spare. Under runsc
    the bomb usually retires the sandbox (gVisor keeps its host pids): then the session
    goes on in a fresh one and the old container must be gone."""
    runtime = rt_pool.settings.runtime
    profile = rt_pool.profile(overrides=ProfileOverrides(call_timeout_s=1.0, memory_mib=128, tmpfs_mib=8,
                                                         output_cap_bytes=8192))
    # a session that keeps its state and re-opens after a lost sandbox (a sentry OOM kill
    # under runsc); a retiring sandbox is left by the handle itself, its state read from it
    session = RecoveringSession(rt_pool, tenant=TENANT, source=PROBE_SOURCE, class_name="Probe",
                                profile=profile, init_config={"counter": 0})
    request.addfinalizer(session.close)
    statuses: Counter[str] = Counter()
    started = time.monotonic()
    longest_removal_s = 0.0
    for round_ in range(STRESS_ROUNDS[runtime]):
        sandbox = session._session._sandbox
        result = probe.run(session, probe.FORK_BOMB)
        statuses[result.status] += 1
        assert result.status in ("timeout", "oom", "crashed"), result
        listing = probe.run(session, PROCESS_LIST)
        assert listing.status == "ok", listing
        alive = [p for p in json.loads(listing.observation) if p[1] != "Z"]
        if session._session._sandbox is sandbox:
            # runner, this session, maybe the spare; under runc the jobs template (it forks the spares)
            assert len(alive) <= 3 + (runtime == "runc"), (round_, alive)
        else:  # moved (retired) or re-opened (lost) on the listing, or already on the bomb's
            # call (its sandbox was found retiring only after the previous round's last call)
            assert runtime == "runsc", (round_, result, listing)
            began = time.monotonic()
            while docker_client.containers.list(all=True, filters={"id": sandbox.container_id}):
                assert time.monotonic() < began + RETIRED_REMOVAL_S, \
                    f"the retired sandbox was not destroyed within {RETIRED_REMOVAL_S:g} s (round {round_})"
                time.sleep(0.1)
            longest_removal_s = max(longest_removal_s, time.monotonic() - began)
        assert session.call("bump", {"by": 1}).observation == str(round_ + 1)
    print(f"{runtime}: {STRESS_ROUNDS[runtime]} fork bombs with {cpu_burners} busy cores in "
          f"{time.monotonic() - started:.0f} s, statuses {dict(statuses)}, "
          f"longest wait for a retired sandbox's removal {longest_removal_s:.1f} s")


TOUCH_THE_RUNNER = """
import json, resource
report = {}
for name, act in (("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (8, 8))),
                  ("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
                  ("nice-all", lambda: os.setpriority(os.PRIO_USER, 0, 19)),
                  ("scheduler", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))),
                  ("affinity", lambda: os.sched_setaffinity(1, {0}))):
    try:
        act()
        report[name] = "done"
    except OSError as exc:
        report[name] = exc.errno
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # its own limits: allowed
os.nice(5)
result = json.dumps(report)
"""


def test_a_session_cannot_change_the_runners_limits_or_priority(open_env, probe, rt_pool) -> None:
    """Without ptrace rights a process may still set the limits, nice value and policy
    of another process of its uid (measured: the runner's RLIMIT_NOFILE went to 8); the
    session's seccomp filter refuses it, and recycle checks the runner's settings."""
    session = open_env(on=rt_pool)
    boot = probe.ok(session, BOOT_ID)
    assert json.loads(probe.ok(session, TOUCH_THE_RUNNER)) == dict.fromkeys(
        ("prlimit", "setpriority", "nice-all", "scheduler", "affinity"), 1)  # EPERM
    session.close()
    again = open_env(on=rt_pool)
    assert probe.ok(again, BOOT_ID) == boot  # recycled: the runner's settings are intact


FROM_THE_OTHER_SESSION = r"""
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
A = OTHER_PID
seen = {}
def attempt(name, act):
    try:
        act()
        seen[name] = "allowed"
    except OSError as exc:
        seen[name] = errno.errorcode.get(exc.errno, str(exc.errno))
def check(ok):
    if ok < 0:
        raise OSError(ctypes.get_errno(), "")
attempt("runner environ", lambda: open("/proc/1/environ", "rb").read())
attempt("runner fd list", lambda: os.listdir("/proc/1/fd"))
attempt("runner mem", lambda: open("/proc/1/mem", "rb").read(1))
attempt("other environ", lambda: open(f"/proc/{A}/environ", "rb").read())
attempt("other cwd", lambda: os.readlink(f"/proc/{A}/cwd"))
attempt("other mem", lambda: open(f"/proc/{A}/mem", "rb").read(1))
attempt("other ptrace", lambda: check(libc.ptrace(16, A, 0, 0)))
attempt("other signal", lambda: os.kill(A, 0))
attempt("list /work", lambda: os.listdir("/work"))
def unshare_user():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
    code = os.waitpid(pid, 0)[1] >> 8
    if code:
        raise OSError(code, "")
attempt("unshare user namespace", unshare_user)
def userfaultfd():
    fd = libc.syscall(323, 0)
    check(fd)
    os.close(fd)
attempt("userfaultfd", userfaultfd)
attempt("shmget", lambda: check(libc.shmget(0, 4096, 0o600)))
result = json.dumps(seen)
"""

ISOLATION = {
    # what a session sees of the runner and of another session of its sandbox (docs/isolation.md's table)
    "runc": {"runner environ": "EACCES", "runner fd list": "EACCES", "runner mem": "EACCES",
             "other environ": "EACCES", "other cwd": "EACCES", "other mem": "EACCES", "other ptrace": "EPERM",
             "other signal": "allowed", "list /work": "EACCES", "unshare user namespace": "EPERM",
             "userfaultfd": "EPERM", "shmget": "EPERM"},
    "runsc": {"runner environ": "allowed", "runner fd list": "allowed", "runner mem": "EACCES",
              "other environ": "allowed", "other cwd": "EACCES", "other mem": "EACCES", "other ptrace": "EPERM",
              "other signal": "allowed", "list /work": "EACCES", "unshare user namespace": "EPERM",
              "userfaultfd": "ENOSYS", "shmget": "EPERM"},
}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")
def test_what_a_session_sees_of_the_runner_and_of_its_neighbour(open_env, probe, rt_pool) -> None:
    """The isolation table of ``docs/isolation.md``, measured: it must change only with this test."""
    first = open_env(on=rt_pool)
    second = open_env(on=rt_pool)
    assert first._sandbox is second._sandbox
    other = probe.ok(first, "result = os.getpid()")
    seen = json.loads(probe.ok(second, FROM_THE_OTHER_SESSION.replace("OTHER_PID", other)))
    assert seen == ISOLATION[rt_pool.settings.runtime]


def test_the_delta_scans_write_barrier_loads_under_each_runtime(open_env, probe, rt_pool) -> None:
    """``child_delta`` falls back to marshal comparisons when ``state_watch`` does not
    import (correct, but the airline step about twice as slow): the compiled module must
    load in a real session process under runc and under gVisor alike."""
    session = open_env(on=rt_pool)
    loaded = probe.ok(session, "import sys\nresult = repr(sys.modules['sandpit_runner.child_delta'].state_watch)")
    assert "state_watch" in loaded and "/opt/sandpit/sandpit_runner/state_watch." in loaded, loaded
