"""Environment code attacking the runner: forged protocol frames, closed or garbage
channels, ignored signals, processes that outlive their call, signals to PID 1.

Each test checks the hostile call gets *a* result (its own), and that the calls after it
are unaffected and run in the same sandbox on the last good state.
"""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.docker

FORGE = """
import json, struct, sys
frames = b''
for rid in list(range(1, 40)) + ['x']:
    body = json.dumps({"id": rid, "status": "ok", "observation": "forged",
                       "delta": {"set": {"counter": ["j", 666]}, "del": []}}).encode()
    frames += struct.pack('>I', len(body)) + body
print(frames.decode(), flush=True)
sys.stdout.buffer.write(frames)
sys.stdout.flush()
os.write(1, frames)
os.write(2, frames)
sys.stderr.buffer.write(frames)
sys.stderr.flush()
self.counter += 1
result = 'real'
"""


def test_forged_frames_on_stdout_and_stderr_are_just_output(open_env, probe) -> None:
    session = open_env(init_config={"counter": 10})
    result = probe.run(session, FORGE)
    assert (result.status, result.observation) == ("ok", "real"), result
    assert result.delta.set == {"counter": ["j", 11]}
    assert '"observation": "forged"' in result.stdout  # delivered as text, not as a reply
    assert '"observation": "forged"' in result.stderr
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation, after.stdout, after.stderr) == ("ok", "12", "", "")
    assert session.state()["counter"] == 12


@pytest.mark.parametrize("fds", [(1,), (2,), (1, 2), (0, 1, 2)])
def test_closing_stdout_and_stderr(open_env, probe, fds) -> None:
    session = open_env()
    result = probe.run(session, (
        f"for fd in {fds!r}:\n"
        "    os.close(fd)\n"
        "print('into the void')\n"
        "self.counter += 1\n"
        "result = 'closed'\n"))
    assert result.status in ("ok", "error", "crashed"), result
    after = session.call("bump", {"by": 1})
    assert after.status == "ok", after
    assert after.observation in ("1", "2")  # 2 only if the hostile call counted (ok/error)
    assert after.observation == ("2" if result.status in ("ok", "error") else "1")
    assert session.call("bump", {"by": 1}).status == "ok"


def test_ignoring_sigterm_and_blocking_signals_does_not_stop_the_timeout(open_env, probe, fast_profile) -> None:
    session = open_env(init_config={"counter": 1})
    started = time.monotonic()
    result = probe.run(session, (
        "import signal\n"
        "for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):\n"
        "    signal.signal(sig, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP})\n"
        "self.counter = 100\n"
        "while True:\n"
        "    pass\n"))
    assert result.status == "timeout", result
    assert time.monotonic() - started <= fast_profile.call_timeout_s + 3.0  # slack for a loaded machine
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation) == ("ok", "2")


STRAYS = {
    "fork": (
        "import time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(0.3)\n"
        "    while True:\n"
        "        print('STRAY', flush=True)\n"
        "        open('stray.log', 'a').write('x')\n"
        "        time.sleep(0.05)\n"
        "result = pid\n"),
    "popen": (
        "import subprocess, sys\n"
        "code = 'import time\\nwhile True:\\n    print(\"STRAY\", flush=True)\\n"
        "    open(\"stray.log\", \"a\").write(\"x\")\\n    time.sleep(0.05)'\n"
        "result = subprocess.Popen([sys.executable, '-c', code]).pid\n"),
    "setsid": (
        "import subprocess, sys\n"
        "code = 'import time\\nwhile True:\\n    print(\"STRAY\", flush=True)\\n"
        "    open(\"stray.log\", \"a\").write(\"x\")\\n    time.sleep(0.05)'\n"
        "result = subprocess.Popen([sys.executable, '-c', code], start_new_session=True).pid\n"),
    "double-fork-daemon": (
        "import time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode())\n"
        "        while True:\n"
        "            os.write(1, b'STRAY\\n')\n"
        "            open('stray.log', 'a').write('x')\n"
        "            time.sleep(0.05)\n"
        "    os._exit(0)\n"
        "result = int(os.read(r, 32))\n"),
    # eight processes changing pid all the time to slip through a sweep; they start hopping
    # once all eight are forked (hoppers started first could otherwise fill the 64-pid
    # cgroup with zombies PID 1 has not reaped yet, and the session's own next fork fail)
    "fork-hoppers": (
        "r, w = os.pipe()\n"
        "go_r, go_w = os.pipe()\n"
        "for _ in range(8):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        os.write(w, str(os.getpid()).encode() + b'.')\n"
        "        os.read(go_r, 1)\n"
        "        while True:\n"
        "            try:\n"
        "                if os.fork():\n"
        "                    os._exit(0)\n"
        "            except OSError:\n"
        "                continue\n"
        "            try:\n"
        "                os.write(1, b'STRAY\\n')\n"
        "            except OSError:\n"
        "                pass\n"
        "pids = b''\n"
        "while pids.count(b'.') < 8:\n"
        "    pids += os.read(r, 64)\n"
        "os.write(go_w, b'x' * 8)\n"
        "result = int(pids.split(b'.')[0])\n"),
}


CHECK_STRAY = """
import time
time.sleep(0.2)
size = os.path.getsize('stray.log') if os.path.exists('stray.log') else 0
time.sleep(0.3)
grown = (os.path.getsize('stray.log') if os.path.exists('stray.log') else 0) - size
self.counter += 1
result = grown
"""


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "fork-hoppers" else k
                                  for k in STRAYS])
def test_processes_outliving_their_call_are_killed(open_env, probe, pool, kind) -> None:
    session = open_env(init_config={"counter": 3})
    before = {p[0] for p in probe.settled_processes(session)}
    # the runner (PID 1), this session's process, maybe the spare; under runc the jobs template (it forks the spares)
    assert 2 <= len(before) <= 3 + (pool.settings.runtime == "runc"), before
    rounds = 4 if kind == "fork-hoppers" else 1  # a hopper escapes a single racy pass often
    for _ in range(rounds):
        stray = probe.run(session, STRAYS[kind])
        assert stray.status == "ok", stray
        assert int(stray.observation) not in before
        for _ in range(2):  # the stray would print and log throughout these calls
            later = probe.run(session, CHECK_STRAY)
            assert later.status == "ok", later
            assert "STRAY" not in later.stdout + later.stderr, "a stray process wrote into a later call"
            assert later.observation == "0", "the stray process is still writing"
    assert session.state()["counter"] == 3 + 2 * rounds
    running = [p for p in probe.processes(session) if p[1] != "Z"]  # zombies are dead already
    assert {p[0] for p in running} == before, running


def test_os_exit_crashes_only_the_call_and_state_is_restored(open_env, probe) -> None:
    session = open_env(init_config={"counter": 4})
    sandbox = session._sandbox
    for code in ("self.counter = 99\nos._exit(0)\n",
                 "import signal\nself.counter = 98\nos.kill(os.getpid(), signal.SIGKILL)\n",
                 "import ctypes\nself.counter = 97\nctypes.string_at(0)\n"):  # segfault
        result = probe.run(session, code)
        assert result.status == "crashed", result
        assert result.observation.startswith("Error: session process died"), result.observation
        after = session.call("bump", {"by": 1})
        assert after.status == "ok" and not after.recovered, after
    assert session.state()["counter"] == 7
    assert session._sandbox is sandbox


def test_sys_exit_and_keyboard_interrupt_are_errors(open_env, probe) -> None:
    session = open_env()
    for code, kind in (("import sys\nsys.exit(3)", "SystemExit"), ("raise KeyboardInterrupt", "KeyboardInterrupt"),
                       ("raise GeneratorExit", "GeneratorExit")):
        result = probe.run(session, code)
        assert result.status == "error" and result.observation.startswith(f"Error: {kind}"), result
    assert session.call("bump", {}).observation == "1"


CONTROL_FD_ATTACKS = {
    "not-json": "os.write(3, b'\\x00\\x00\\x00\\x05hello')\n",
    "oversize-header": "os.write(3, b'\\xff\\xff\\xff\\xff')\n",
    "deeply-nested": "body = b'[' * 100000\nos.write(3, len(body).to_bytes(4, 'big') + body)\n",
    "nan": "body = b'{\"id\": 1, \"x\": NaN}'\nos.write(3, len(body).to_bytes(4, 'big') + body)\n",
    "partial-frame": "os.write(3, b'\\x00\\x01\\x00\\x00{')\n",
    "wrong-id": (
        "import json\n"
        "body = json.dumps({'id': 'guess', 'status': 'ok', 'observation': 'forged'}).encode()\n"
        "os.write(3, len(body).to_bytes(4, 'big') + body)\n"),
    "random-bytes": "os.write(3, os.urandom(4096))\n",
    "close": "os.close(3)\n",
    "shutdown": "import socket\nsocket.socket(fileno=os.dup(3)).shutdown(socket.SHUT_RDWR)\n",
}


@pytest.mark.parametrize("attack", list(CONTROL_FD_ATTACKS))
def test_garbage_on_the_control_channel(open_env, probe, attack) -> None:
    session = open_env(init_config={"counter": 20})
    sandbox = session._sandbox
    result = probe.run(session, "self.counter = 0\n" + CONTROL_FD_ATTACKS[attack] + "result = 'own'\n")
    # a crash, a timeout (a half frame swallows the real reply) or this call's own result
    assert result.status in ("crashed", "timeout", "ok"), result
    if result.status == "ok":
        assert result.observation in ("own", "forged")
    after = session.call("bump", {"by": 1})
    assert after.status == "ok", after
    expected = "1" if result.status == "ok" and result.observation == "own" else "21"
    assert after.observation == expected, (result, after)
    assert session._sandbox is sandbox and not after.recovered


def test_a_reply_forged_with_the_right_id_only_answers_its_own_call(open_env, probe) -> None:
    """The request id is in the session process's memory: a tool can answer for itself,
    but that is its own call's result; the real reply is then stale and dropped."""
    session = open_env(init_config={"counter": 5})
    result = probe.run(session, (
        "import json, sys\n"
        "frame = sys._getframe()\n"
        "while 'request_id' not in frame.f_locals:\n"
        "    frame = frame.f_back\n"
        "body = json.dumps({'id': frame.f_locals['request_id'], 'status': 'ok', 'observation': 'forged',\n"
        "                   'delta': {'set': {}, 'del': []}}).encode()\n"
        "os.write(3, len(body).to_bytes(4, 'big') + body)\n"
        "self.counter += 1\n"
        "result = 'real'\n"))
    assert (result.status, result.observation) == ("ok", "forged")
    for expected in ("7", "8"):  # the stale real reply must not answer these
        after = session.call("bump", {"by": 1})
        assert (after.status, after.observation) == ("ok", expected), after


MALFORMED_REPLIES = {
    "delta-a-list": "'delta': []",
    "set-a-list": "'delta': {'set': [], 'del': []}",
    "set-text": "'delta': {'set': 'x', 'del': []}",
    "entry-not-encoded": "'delta': {'set': {'counter': 666}, 'del': []}",
    "del-not-names": "'delta': {'set': {}, 'del': [1]}",
    "observation-not-text": "'observation': {'x': 1}",
    "duration-not-a-number": "'duration_ms': 'soon'",
    "traceback-not-text": "'traceback': 7",
}


@pytest.mark.parametrize("field", list(MALFORMED_REPLIES))
def test_a_reply_forged_with_the_right_id_but_out_of_shape_is_a_crash_of_that_call(open_env, probe, field) -> None:
    """The forged reply answers its own call, but PID 1 checks it first: a process that
    sends one out of shape has broken the protocol (crashed, re-created from the last good
    state), and PID 1, the sandbox and the other sessions in it go on."""
    session = open_env(init_config={"counter": 5})
    neighbour = open_env(init_config={"counter": 50})
    sandbox = session._sandbox
    result = probe.run(session, (
        "import json, sys\n"
        "frame = sys._getframe()\n"
        "while 'request_id' not in frame.f_locals:\n"
        "    frame = frame.f_back\n"
        "reply = {'id': frame.f_locals['request_id'], 'status': 'ok', 'observation': 'forged', 'duration_ms': 1,\n"
        "         'delta': {'set': {}, 'del': []}}\n"
        f"reply.update({{{MALFORMED_REPLIES[field]}}})\n"
        "body = json.dumps(reply).encode()\n"
        "os.write(3, len(body).to_bytes(4, 'big') + body)\n"
        "self.counter += 1\n"
        "result = 'real'\n"))
    assert result.status == "crashed" and "malformed reply" in result.observation, result
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation, after.recovered) == ("ok", "6", False), after
    assert session._sandbox is sandbox and sandbox.alive
    if neighbour._sandbox is sandbox:  # a shared sandbox: the other session never noticed
        assert neighbour.call("bump", {"by": 1}).observation == "51"


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGQUIT", "SIGKILL", "SIGSTOP"])
def test_signals_to_the_runner_are_ignored(open_env, probe, signame) -> None:
    session = open_env(init_config={"counter": 1})
    sandbox = session._sandbox
    result = probe.run(session, (
        "import signal, time\n"
        f"os.kill(1, signal.{signame})\n"
        "time.sleep(0.2)\n"
        "result = 'sent'\n"))
    assert (result.status, result.observation) == ("ok", "sent"), result
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation, after.recovered) == ("ok", "2", False), after
    assert session._sandbox is sandbox and sandbox.alive


def test_runner_secrets_are_out_of_reach(open_env, probe) -> None:
    session = open_env()
    for path in ("/proc/1/environ", "/proc/1/mem", "/proc/1/fd", "/proc/1/cwd", "/proc/1/maps"):
        result = probe.run(session, f"result = os.listdir({path!r}) if {path!r}.endswith(('fd', 'cwd')) "
                                    f"else open({path!r}, 'rb').read(100)")
        assert result.status == "error", (path, result)
        assert result.observation.startswith("Error: PermissionError"), (path, result.observation)
    # the protocol socket was unlinked once the runner connected: nothing to connect to
    assert json.loads(probe.ok(session, "import json\nresult = json.dumps(os.listdir('/run/sandpit'))")) == []
    # the environment carries no token
    assert probe.ok(session, "result = sorted(k for k in os.environ if 'TOKEN' in k or 'LIMITS' in k)") == "[]"
    assert probe.run(session, (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.ptrace(16, 1, 0, 0) != 0:\n"  # PTRACE_ATTACH
        "    raise PermissionError(ctypes.get_errno())\n")).observation.startswith("Error: PermissionError")


def test_exited_children_of_a_tool_do_not_stay_zombies(open_env, probe) -> None:
    """A tool that forks children and never waits for them: the session collects them at
    its next request, so they do not hold pids of the sandbox until the session ends."""
    session = open_env()
    probe.ok(session, "for _ in range(5):\n    if os.fork() == 0:\n        os._exit(0)\nresult = 'forked'\n")
    probe.ok(session, "import time\ntime.sleep(0.3)\nresult = 'let them exit'")  # reaped when the next request starts
    zombies = [p for p in probe.processes(session) if p[1] == "Z"]
    assert zombies == [], zombies


def test_long_tracebacks_keep_their_start_and_their_end(open_env, probe) -> None:
    session = open_env()
    result = probe.run(session, "raise ValueError('start ' + 'x' * 20000 + ' end')")
    assert result.status == "error"
    assert result.traceback is not None and len(result.traceback) < 4096 + 200
    assert "Traceback (most recent call last)" in result.traceback  # the head survives
    assert result.traceback.rstrip().endswith("x end")  # and the failing line's message


def test_a_forged_keyed_delta_crashes_only_that_call(open_env, probe) -> None:
    """Environment code runs in the session process and can rewrite its own deltas: a
    keyed change for an attribute that is not a JSON object cannot corrupt the runner's
    or the host's snapshot; the call reports crashed and the session restarts cleanly."""
    session = open_env(init_config={"counter": 2})
    forged = probe.run(session, (
        "import gc, sys\n"
        "child = sys.modules['__main__']\n"
        "for obj in gc.get_objects():\n"
        "    if type(obj).__name__ == 'Session' and hasattr(obj, 'delta_json'):\n"
        "        obj.delta_json = lambda full=False: '{\"set\":{\"counter\":[\"k\",{\"set\":{\"a\":1},\"del\":[]}]},\"del\":[]}'\n"
        "self.counter = 50\n"
        "result = 'forged'\n"))
    assert forged.status == "crashed", forged
    after = session.call("bump", {"by": 1})
    assert (after.status, after.observation) == ("ok", "3"), after
    assert session.state()["counter"] == 3


def test_sweeps_skip_listing_proc_only_while_the_cgroup_counts_no_stray(open_env, probe, pool) -> None:
    session = open_env(init_config={"counter": 0})
    probe.settled_processes(session)  # the spare (or a template) has started
    sandbox = session._sandbox
    before = sandbox.request("ping")["sweeps"]
    for _ in range(5):
        assert probe.run(session, "self.counter += 1\nresult = 1").status == "ok"
    quiet = sandbox.request("ping")["sweeps"]
    if pool.settings.runtime == "runc":  # the pids cgroup counts the sandbox's tasks exactly
        assert quiet["counted"] >= before["counted"] + 5, (before, quiet)
    else:
        assert quiet["counted"] == before["counted"] == 0, quiet
    stray = probe.run(session, STRAYS["setsid"])
    assert stray.status == "ok", stray
    after = sandbox.request("ping")["sweeps"]
    assert after["listed"] > quiet["listed"], (quiet, after)  # a stray is counted: /proc is listed
    later = probe.run(session, CHECK_STRAY)
    assert later.status == "ok" and later.observation == "0" and "STRAY" not in later.stdout, later
    assert session.state()["counter"] == 6
