"""Namespace creation is refused in every process of the sandbox, under runc and under
gVisor, nothing a legitimate program does breaks, and no process's environment names the
runner's token or where it was.

Under gVisor (runsc) without ``--oci-seccomp`` no seccomp profile applies inside the
sandbox, and an unprivileged ``unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP)``
succeeded in a session (it gives every capability over the new namespaces: mounts and the
sentry's namespace and cgroup code to attack). Two layers now refuse it: the container's
profile (runc: Docker's default; runsc: ``executor/docker/seccomp.py``, loaded because
``scripts/ensure-docker`` registers runsc with ``--oci-seccomp``, which
``engine.check_runtime`` requires), and the per-process filter of
``sandbox_images/runner/child_confine.py`` (``unshare``, ``setns``, ``clone`` with a
CLONE_NEW* flag: EPERM; ``clone3``: ENOSYS, so glibc falls back to ``clone``). The probe
below runs in a session, in a check function and in an ``exec`` script, in real sandboxes
of each runtime; ``fork``, threads, ``posix_spawn``, ``subprocess``, ``multiprocessing``
and ``select`` keep working in all three (Docker's own profile under runsc broke threads,
``posix_spawn`` and ``select``: see ``executor/docker/seccomp.py``).

Every snippet here is untrusted code: it only ever runs inside sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest
from sandpit.executor.docker import docker_pool, engine, seccomp
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.jobs import encode_json_state
from sandpit.executor.profiles import ProfileOverrides

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(os.uname().machine != "x86_64", reason="system call numbers of x86_64")]

TENANT = "tests"
RUNTIMES = ["runc", pytest.param("runsc", marks=pytest.mark.gvisor)]
FAST = ProfileOverrides(call_timeout_s=10.0, memory_mib=256, tmpfs_mib=8, output_cap_bytes=16384)
"""The probe forks about twenty children, starts a Python subprocess and a multiprocessing
pool: under gVisor that takes 3 to 4.5 s on an idle machine, so it gets the default
profile's whole budget (10 s), check functions included (their own default is 5 s); these
tests are about what is refused, not how fast."""

PROBE = r'''
import ctypes, errno, json, multiprocessing, os, subprocess, sys, threading


def namespace_probe():
    """What this process may do about namespaces, and whether processes and threads still
    start: {name: "ok" | errno name | value}."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    flags = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000, "NEWIPC": 0x08000000,
             "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
    seen = {}

    def name(code):
        return "ok" if code == 0 else errno.errorcode.get(code, str(code))

    def in_child(call):
        """call() in a forked child (what it changes stays there); its errno, 0: it succeeded."""
        pid = os.fork()
        if pid == 0:
            try:
                code = call()
            except BaseException:
                code = 254
            os._exit(code)
        return os.waitpid(pid, 0)[1] >> 8

    def unshare(flag):
        return 0 if libc.unshare(flag) == 0 else ctypes.get_errno()

    def clone(flag):
        pid = libc.syscall(56, flag | 17, 0, 0, 0, 0)  # clone(flags | SIGCHLD): a fork into new namespaces
        if pid == 0:
            os._exit(0)
        if pid < 0:
            return ctypes.get_errno()
        os.waitpid(pid, 0)
        return 0

    def setns():
        try:
            fd = os.open("/proc/self/ns/user", os.O_RDONLY)
        except OSError:
            fd = -1  # unfiltered: EBADF
        return 0 if libc.setns(fd, 0) == 0 else ctypes.get_errno()

    for flag_name, flag in flags.items():
        seen["unshare " + flag_name] = name(in_child(lambda: unshare(flag)))
        seen["clone " + flag_name] = name(in_child(lambda: clone(flag)))
    seen["unshare USER|NS|CGROUP"] = name(in_child(lambda: unshare(0x10000000 | 0x00020000 | 0x02000000)))
    seen["unshare NEWTIME"] = name(in_child(lambda: unshare(0x80)))
    seen["setns"] = name(in_child(setns))
    seen["clone3"] = name(in_child(lambda: 0 if libc.syscall(435, None, 0) >= 0 else ctypes.get_errno()))

    pid = os.fork()
    if pid == 0:
        os._exit(7)
    seen["fork"] = os.waitpid(pid, 0)[1] >> 8 == 7
    box = []
    thread = threading.Thread(target=box.append, args=(6 * 7,))
    thread.start()
    thread.join()
    seen["thread"] = box == [42]
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 5"], {})
    seen["posix_spawn"] = os.waitpid(pid, 0)[1] >> 8 == 5
    done = subprocess.run([sys.executable, "-S", "-c", "print(6 * 7)"], capture_output=True, text=True, timeout=8)
    seen["subprocess"] = done.stdout.strip() == "42"
    seen["multiprocessing"] = _mp_square(7) == 49
    import select
    left, right = os.pipe()
    os.write(right, b"x")
    seen["select"] = select.select([left], [], [], 1.0)[0] == [left]  # glibc: pselect6
    # a call gVisor does not implement answers ENOSYS (not a profile's EPERM): openat2
    seen["openat2"] = name(0 if libc.syscall(437, -100, b"/", None, 0) >= 0 else ctypes.get_errno())

    status = {}
    for pid_name in ("self", "1"):
        try:
            with open(f"/proc/{pid_name}/status") as handle:
                rows = dict(line.split(":", 1) for line in handle.read().splitlines() if ":" in line)
            status[pid_name] = {key: rows[key].strip() for key in ("Seccomp", "Seccomp_filters", "NoNewPrivs")
                                if key in rows}
        except OSError as exc:
            status[pid_name] = errno.errorcode.get(exc.errno, str(exc.errno))
    seen["status"] = status
    seen["environ"] = environ_scan()
    return seen


def _mp_square(n):
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        return pool.apply(pow, (n, 2))


def environ_scan():
    """Every /proc/<pid>/environ this process can read: {readable: [pids], named: [[pid,
    variable]]}, ``named`` listing every variable that names the token or its directory."""
    readable, named = [], []
    for entry in sorted(os.listdir("/proc")):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        readable.append(int(entry))
        for item in data.split(b"\0"):
            if b"TOKEN" in item.upper() or b"/run/sandpit" in item or b"SANDPIT_SOCKET" in item:
                named.append([int(entry), item.decode("latin-1")[:200]])
    return {"readable": readable, "named": named}
'''
"""Module text defining ``namespace_probe()``; x86_64 system call numbers (clone 56, clone3 435)."""

REFUSED = {**{f"{call} {flag}": "EPERM" for call in ("unshare", "clone")
              for flag in ("NEWNS", "NEWCGROUP", "NEWUTS", "NEWIPC", "NEWUSER", "NEWPID", "NEWNET")},
           "unshare USER|NS|CGROUP": "EPERM", "unshare NEWTIME": "EPERM", "setns": "EPERM", "clone3": "ENOSYS",
           "fork": True, "thread": True, "posix_spawn": True, "subprocess": True, "multiprocessing": True,
           "select": True}
"""What every process of untrusted code sees, in both runtimes."""


@pytest.fixture(scope="module", params=RUNTIMES)
def rt_pool(request, leak_check, pool_settings, docker_client) -> Iterator[SandboxPool]:
    runtime = request.param
    if runtime == "runsc" and "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    settings = pool_settings(f"confine-{runtime}", runtime=runtime, pool_size=0, idle_timeout_s=120.0)
    with docker_pool(settings) as pool:
        yield pool


def _check_seen(seen: dict[str, Any], runtime: str, where: str) -> None:
    assert {key: seen[key] for key in REFUSED} == REFUSED, (runtime, where, seen)
    # gVisor does not implement openat2: ENOSYS, as without a profile (Docker's made it EPERM)
    assert seen["openat2"] == "ENOSYS" if runtime == "runsc" else seen["openat2"] != "EPERM", (runtime, where, seen)
    assert seen["environ"]["named"] == [], (runtime, where, seen["environ"])
    status = seen["status"]
    # our filter on top of the container's profile (runc: Docker's; runsc: seccomp.runsc_profile,
    # loaded by --oci-seccomp) in every process of untrusted code; PID 1 has the profile only
    # (gVisor's status shows neither NoNewPrivs nor Seccomp_filters)
    assert status["self"]["Seccomp"] == "2" and status["self"].get("NoNewPrivs", "1") == "1", (runtime, where, status)
    if "Seccomp_filters" in status["self"]:
        assert status["self"]["Seccomp_filters"] == "2", (runtime, where, status)
    assert isinstance(status["1"], dict) and status["1"]["Seccomp"] == "2", (runtime, where, status)
    if "Seccomp_filters" in status["1"]:
        assert status["1"]["Seccomp_filters"] == "1", (runtime, where, status)


def test_a_session_cannot_create_namespaces(open_env, probe, rt_pool) -> None:
    session = open_env(on=rt_pool, profile=rt_pool.profile(overrides=FAST))
    seen = json.loads(probe.ok(session, PROBE + "\nimport json\nresult = json.dumps(namespace_probe())"))
    _check_seen(seen, rt_pool.settings.runtime, "session")
    readable = seen["environ"]["readable"]
    if rt_pool.settings.runtime == "runsc":
        assert 1 in readable  # gVisor ignores PR_SET_DUMPABLE: readable, and names nothing
    else:
        assert 1 not in readable


def test_a_check_function_cannot_create_namespaces(rt_pool) -> None:
    source = PROBE + "\n\ndef check_func(final_state):\n    raise RuntimeError('SEEN' + json.dumps(namespace_probe()))\n"
    state = encode_json_state({"n": 1})
    [result] = rt_pool.run_checks(tenant=TENANT, checks=[{"check_item": "probe", "check_func": source}],
                                  initial_state=state, final_state=state, profile=rt_pool.profile(overrides=FAST),
                                  per_check_timeout_s=FAST.call_timeout_s)
    assert result.status == "error" and result.error is not None and "SEEN" in result.error, result
    _check_seen(json.loads(result.error.split("SEEN", 1)[1]), rt_pool.settings.runtime, "check")


def test_an_exec_script_cannot_create_namespaces(rt_pool) -> None:
    result = rt_pool.execute(tenant=TENANT, code=PROBE + "\nprint(json.dumps(namespace_probe()))\n",
                             profile=rt_pool.profile(overrides=FAST))
    assert (result.status, result.stderr) == ("ok", ""), result
    _check_seen(json.loads(result.stdout), rt_pool.settings.runtime, "exec")


def _runsc(docker_client) -> None:
    runtimes = docker_client.info().get("Runtimes") or {}
    if "runsc" not in runtimes:
        if shutil.which("runsc"):
            pytest.fail("runsc is installed but not registered with Docker: run scripts/ensure-docker as root")
        pytest.skip("runsc not installed")


@pytest.mark.gvisor
def test_the_engine_registers_runsc_so_that_it_loads_the_profile(docker_client) -> None:
    """runsc loads the container's seccomp profile only with ``--oci-seccomp``; the
    executor refuses the runtime without it (``engine.check_runtime``)."""
    _runsc(docker_client)
    registered = docker_client.info()["Runtimes"]["runsc"]
    assert "--oci-seccomp" in (registered.get("runtimeArgs") or []), registered
    engine.check_runtime(docker_client, "runsc")


TRAP_EACH = r"""
import json, os, signal, sys, ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
seen = {}
for name, nr in json.loads(sys.argv[1]).items():
    pid = os.fork()
    if pid == 0:
        signal.alarm(2)
        libc.syscall(nr, -1, -1, -1, -1, -1, -1)
        os._exit(0)
    status = os.waitpid(pid, 0)[1]
    seen[name] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else "returned"
print(json.dumps(seen))
"""
"""Script: calls each ``{name: number}`` of argv[1] in a child; ``{name: killing signal}``."""

X86_64 = {"unshare": 272, "setns": 308, "add_key": 248, "request_key": 249, "keyctl": 250, "mount": 165,
          "umount2": 166, "pivot_root": 155, "chroot": 161, "swapon": 167, "swapoff": 168, "quotactl": 179,
          "name_to_handle_at": 303, "open_by_handle_at": 304, "settimeofday": 164, "clock_settime": 227,
          "sethostname": 170, "setdomainname": 171, "reboot": 169, "vhangup": 153, "acct": 163,
          "create_module": 174, "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246,
          "kexec_file_load": 320, "iopl": 172, "ioperm": 173, "lookup_dcookie": 212, "mbind": 237,
          "set_mempolicy": 238, "get_mempolicy": 239, "migrate_pages": 256, "move_pages": 279,
          "perf_event_open": 298, "bpf": 321, "kcmp": 312}
"""x86_64 numbers of ``seccomp.RUNSC_REFUSED`` (``asm/unistd_64.h``)."""


@pytest.mark.gvisor
def test_every_name_of_the_runsc_profile_is_one_gvisor_knows(docker_client, sandbox_image) -> None:
    """runsc skips a profile name its syscall table does not know, silently (``pselect6``
    is ``pselect`` there): the profile's rules, turned into SIGSYS traps, must each fire
    in a container of the sandbox image under runsc."""
    _runsc(docker_client)
    assert set(X86_64) == set(seccomp.RUNSC_REFUSED)
    profile = seccomp.runsc_profile()
    for rule in profile["syscalls"]:
        rule["action"] = "SCMP_ACT_TRAP"
        rule.pop("errnoRet")
    name = f"sandpit-test-trap-{os.getpid()}"
    try:
        output = docker_client.containers.run(
            sandbox_image, ["python3", "-c", TRAP_EACH, json.dumps(X86_64)], name=name, runtime="runsc",
            network_mode="none", cap_drop=["ALL"], user="10001:10001",
            security_opt=["no-new-privileges:true", "seccomp=" + json.dumps(profile)], stderr=True)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(name, force=True)
    assert json.loads(output) == dict.fromkeys(X86_64, 31)  # SIGSYS
