"""The session's seccomp filter (``child_confine``): the program it would install, run by a
tiny BPF interpreter here; never installed on a test process."""

from __future__ import annotations

import struct

import pytest
from sandpit.sandbox_images.runner import child_confine


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
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET
            taken = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
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


CLONE_NEW = {"NEWNS": 0x00020000, "NEWCGROUP": 0x02000000, "NEWUTS": 0x04000000, "NEWIPC": 0x08000000,
             "NEWUSER": 0x10000000, "NEWPID": 0x20000000, "NEWNET": 0x40000000}
"""Every CLONE_NEW* flag ``clone`` takes (linux/sched.h); CLONE_NEWTIME (0x80) is ``clone3``/``unshare`` only."""
SIGCHLD = 17
FORK = 0x01200000 | SIGCHLD  # glibc fork: CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
THREAD = 0x003D0F00  # glibc pthread_create: VM FS FILES SIGHAND THREAD SYSVSEM SETTLS PARENT_SETTID CHILD_CLEARTID
VFORK = 0x00004100 | SIGCHLD  # posix_spawn: CLONE_VM | CLONE_VFORK | SIGCHLD


@pytest.mark.parametrize("machine", sorted(child_confine.ARCHES))
def test_filter_refuses_namespaces_and_keeps_fork_threads_and_spawn(machine: str) -> None:
    arch, numbers = child_confine.ARCHES[machine]
    program = child_confine.filter_program(machine)
    deny, allow = child_confine.SECCOMP_RET_ERRNO | 1, child_confine.SECCOMP_RET_ALLOW  # EPERM
    nosys = child_confine.SECCOMP_RET_ERRNO | 38  # ENOSYS: glibc falls back to clone
    clone = numbers["clone"]
    for name, flag in CLONE_NEW.items():
        assert _run_bpf(program, numbers["unshare"], arch, flag) == deny, name
        assert _run_bpf(program, clone, arch, flag | SIGCHLD) == deny, name
        assert _run_bpf(program, clone, arch, flag | FORK) == deny, name
        assert _run_bpf(program, clone, arch, flag | THREAD) == deny, name
        assert _run_bpf(program, numbers["setns"], arch, 3, flag) == deny, name
    assert _run_bpf(program, numbers["unshare"], arch, 0x10000000 | 0x00020000 | 0x02000000) == deny  # the report's call
    assert _run_bpf(program, numbers["unshare"], arch, 0x00000080) == deny  # CLONE_NEWTIME
    assert _run_bpf(program, numbers["unshare"], arch, 0x00000400) == deny  # CLONE_FILES: refused whole
    assert _run_bpf(program, numbers["setns"], arch, 3, 0) == deny  # nstype 0: any namespace
    for flags in (FORK, THREAD, VFORK, SIGCHLD, 0):
        assert _run_bpf(program, clone, arch, flags) == allow, hex(flags)
        assert _run_bpf(program, clone, arch, flags | (1 << 32)) == allow, hex(flags)  # high half: no CLONE_NEW*
    assert _run_bpf(program, numbers["clone3"], arch, 0, 88) == nosys  # flags are in memory: refused whole
    assert _run_bpf(program, numbers["clone3"], arch) == nosys


def test_unknown_machine_has_no_filter() -> None:
    with pytest.raises(KeyError):
        child_confine.filter_program("sparc64")
