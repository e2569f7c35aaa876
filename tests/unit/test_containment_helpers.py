"""Pure helpers of the runner's containment (``pid1_cleanup.py``) and of the session's seccomp
filter (``child_confine.py``): imported on the host, never installed on a test process."""

from __future__ import annotations

import os
import struct

import pytest
from sandpit.sandbox_images import RUNNER_FILES
from sandpit.sandbox_images.runner import child_confine, pid1_cleanup


def test_new_runner_modules_ship_in_the_image() -> None:
    assert {"pid1_cleanup.py", "child_confine.py"} <= set(RUNNER_FILES)


def _run_bpf(program: bytes, nr: int, arch: int, *args: int) -> int:
    """A tiny interpreter of the instructions :func:`child_confine.filter_program` emits."""
    insns = [struct.unpack("HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    padded = (list(args) + [0] * 6)[:6]
    data = struct.pack("iIQ6Q", nr, arch, 0, *padded)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("I", data, k)[0]
        elif code in (0x15, 0x35):
            taken = acc == k if code == 0x15 else acc >= k
            pc += jt if taken else jf
        elif code == 0x06:
            return k
        pc += 1


@pytest.mark.parametrize("machine", sorted(child_confine.ARCHES))
def test_filter_denies_persistent_ipc_and_touching_other_processes(machine: str) -> None:
    arch, numbers = child_confine.ARCHES[machine]
    program = child_confine.filter_program(machine)
    deny, allow = child_confine.SECCOMP_RET_ERRNO | 1, child_confine.SECCOMP_RET_ALLOW  # EPERM
    for name in ("shmget", "semget", "msgget", "mq_open", "add_key", "request_key", "keyctl",
                 "process_vm_readv", "process_vm_writev"):
        assert _run_bpf(program, numbers[name], arch, 0, 0) == deny, name
    for name in ("prlimit64", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr"):
        assert _run_bpf(program, numbers[name], arch, 0, 7) == allow, name  # pid 0: the caller
        assert _run_bpf(program, numbers[name], arch, 1, 7) == deny, name  # PID 1: the runner
        assert _run_bpf(program, numbers[name], arch, 1 << 32, 7) == allow, name  # pid_t is 32 bits
    setpriority, ioprio_set = numbers["setpriority"], numbers["ioprio_set"]
    assert _run_bpf(program, setpriority, arch, 0, 0, 19) == allow  # os.nice()
    assert _run_bpf(program, setpriority, arch, 0, 1, 19) == deny
    assert _run_bpf(program, setpriority, arch, 2, 0, 19) == deny  # PRIO_USER 0: every process of the uid
    assert _run_bpf(program, ioprio_set, arch, 1, 0, 0) == allow
    assert _run_bpf(program, ioprio_set, arch, 1, 1, 0) == deny
    for nr in (0, 1, 3, 57, 59, 60, 231, 97, 160):  # read, write, close, fork, execve, exit, getrlimit...
        if nr not in numbers.values():
            assert _run_bpf(program, nr, arch, 1, 1) == allow, nr
    assert _run_bpf(program, 0, 0x40000003) == deny  # i386 ABI: its ipc(2) would bypass the list
    if machine == "x86_64":
        assert _run_bpf(program, child_confine.X32_SYSCALL_BIT | 29, arch) == deny  # x32 ABI


def test_unknown_machine_has_no_filter() -> None:
    with pytest.raises(KeyError):
        child_confine.filter_program("sparc64")


def test_remove_handles_unreadable_and_deep_trees(tmp_path) -> None:
    root = tmp_path / "leftover"
    deep = root
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    locked = root / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "g").write_text("y")
    os.chmod(locked / "inner", 0)
    os.chmod(locked, 0)
    os.symlink("/etc/passwd", root / "link")
    pid1_cleanup.remove(str(root))
    assert not root.exists()
    assert os.path.exists("/etc/passwd")  # a symlink is removed, never followed
    pid1_cleanup.remove(str(root))  # missing: no error


def test_scrub_and_baseline_prove_a_directory_empty(tmp_path) -> None:
    (tmp_path / "a").write_text("x")
    (tmp_path / "b" / "c").mkdir(parents=True)
    assert pid1_cleanup.scrub(str(tmp_path)) == []
    assert os.listdir(tmp_path) == []
    assert pid1_cleanup.scrub(str(tmp_path / "missing")) == []


def test_sweep_outside_a_pid_namespace_selects_nothing_it_is_not_told_to() -> None:
    seen = []
    assert pid1_cleanup.sweep(lambda pid, sid: seen.append(pid) or False)
    assert os.getpid() not in seen and seen  # it scanned, selected nothing, killed nothing
    assert pid1_cleanup.kill_all() is True  # not PID 1: refuses to kill(-1) on a host


def test_session_memory_is_rlimit_as_under_gvisor_only() -> None:
    from sandpit.executor.profiles import ResourceProfile

    profile = ResourceProfile(memory_mib=100)
    assert profile.runner_limits(1, True)["memory_rlimit"] == "data"
    assert profile.runner_limits(1, True, 0.05, "runsc")["memory_rlimit"] == "as"
    assert profile.runner_limits(1, True, 0.05, "runsc")["session_memory_bytes"] == 100 * 1024 * 1024
