"""Several sessions of one tenant in one sandbox (``sessions_per_sandbox=2``): separate
processes, globals and working directories; one failing leaves the other alone; a reused
sandbox carries nothing over from closed sessions."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def pair_pool(leak_check, pool_settings) -> Iterator[SandboxPool]:
    """Two sessions per sandbox; no warm sandbox, so an idle one is always reused next."""
    with docker_pool(pool_settings("pair", sessions_per_sandbox=2, pool_size=0, idle_timeout_s=300.0)) as pair:
        yield pair


def pid_of(probe, session) -> int:
    return int(probe.ok(session, "result = os.getpid()"))


def test_two_sessions_share_a_sandbox_but_not_globals_or_files(open_env, probe, pair_pool) -> None:
    a = open_env(on=pair_pool, init_config={"counter": 1})
    b = open_env(on=pair_pool, init_config={"counter": 2})
    assert a._sandbox is b._sandbox and a._sandbox.id == b._sandbox.id
    assert pid_of(probe, a) != pid_of(probe, b)

    # module globals, builtins and loaded modules of A
    probe.ok(a, (
        "import builtins, sys\n"
        "type(self).run.__globals__['SECRET'] = 'from A'\n"
        "builtins.LEAK = 'from A'\n"
        "sys.modules['a_module'] = sys\n"))
    assert probe.ok(a, "result = type(self).run.__globals__['SECRET']") == "from A"
    assert probe.ok(b, (
        "import builtins, sys\n"
        "result = (type(self).run.__globals__.get('SECRET'), getattr(builtins, 'LEAK', None),\n"
        "          'a_module' in sys.modules)")) == "(None, None, False)"

    # working directories
    a_cwd = probe.ok(a, "open('secret.txt', 'w').write('A only')\nresult = os.getcwd()")
    b_cwd = probe.ok(b, "result = os.getcwd()")
    assert a_cwd != b_cwd and a_cwd.startswith("/work/") and b_cwd.startswith("/work/")
    assert probe.ok(a, "result = open('secret.txt').read()") == "A only"
    listing = probe.run(b, "result = os.listdir('/work')")
    assert listing.status == "error" and listing.observation.startswith("Error: PermissionError"), listing
    relative = probe.run(b, "result = open('secret.txt').read()")
    assert relative.observation.startswith("Error: FileNotFoundError"), relative
    assert probe.ok(b, "result = os.listdir('.')") == "[]"
    # nor can B discover A's directory through A's process
    a_pid = pid_of(probe, a)
    for path in (f"/proc/{a_pid}/cwd", f"/proc/{a_pid}/environ", f"/proc/{a_pid}/fd"):
        probe_code = f"result = os.listdir({path!r})" if path.endswith(("cwd", "fd")) else f"result = open({path!r}).read()"
        result = probe.run(b, probe_code)
        assert result.observation.startswith("Error: PermissionError"), (path, result)


@pytest.mark.parametrize("failure,status", [
    ("self.counter = -1\nos._exit(0)\n", "crashed"),
    ("self.counter = -1\nwhile True:\n    pass\n", "timeout"),
    ("self.counter = -1\nx = bytearray(1 << 30)\n", "oom"),
])
def test_one_session_failing_leaves_the_other_untouched(open_env, probe, pair_pool, failure, status) -> None:
    a = open_env(on=pair_pool, init_config={"counter": 10})
    b = open_env(on=pair_pool, init_config={"counter": 20})
    assert a._sandbox is b._sandbox
    b.call("bump", {"by": 5})
    b_state, b_pid = b.state(), pid_of(probe, b)

    result = probe.run(a, failure)
    assert result.status == status, result

    assert b.state() == b_state == {"counter": 25, "log": [5]}
    assert pid_of(probe, b) == b_pid  # B's process was never restarted
    after_b = b.call("bump", {"by": 1})
    assert (after_b.status, after_b.observation, after_b.recovered) == ("ok", "26", False)
    after_a = a.call("bump", {"by": 1})
    assert (after_a.status, after_a.observation, after_a.recovered) == ("ok", "11", False)
    assert a._sandbox is b._sandbox


def test_reused_sandbox_carries_nothing_over(open_env, probe, pair_pool) -> None:
    a = open_env(on=pair_pool)
    b = open_env(on=pair_pool)
    sandbox_id = a._sandbox.id
    probe.ok(a, "open('/tmp/a-secret.txt', 'w').write('A')\nopen('mine.txt', 'w').write('A')")
    probe.ok(b, "os.makedirs('/tmp/b-dir/sub')\nopen('/tmp/b-dir/sub/f', 'w').write('B')")
    assert "a-secret.txt" in json.loads(probe.ok(a, "import json\nresult = json.dumps(os.listdir('/tmp'))"))
    a_cwd = probe.ok(a, "result = os.getcwd()")
    a.close()
    b.close()

    c = open_env(on=pair_pool)
    assert c._sandbox.id == sandbox_id, "the pool should have reused the idle sandbox"
    assert probe.ok(c, "result = os.listdir('/tmp')") == "[]"
    gone = probe.run(c, f"result = os.listdir({a_cwd!r})")
    assert gone.observation.startswith("Error: FileNotFoundError"), gone
    assert probe.ok(c, "result = os.listdir('.')") == "[]"
    assert probe.ok(c, "result = type(self).run.__globals__.get('SECRET')") == "None"
