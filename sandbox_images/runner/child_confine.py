"""Per-process confinement of a session or job process, applied by ``child_spare.harden``
before any untrusted code exists. Stdlib only (``ctypes`` for ``prctl``).

:func:`install_filter` installs a seccomp filter (inherited by every process the
code starts, and impossible to remove) under which these system calls fail with
``EPERM``:

    SysV IPC        shmget, semget, msgget   (segments, semaphore sets, message queues)
    POSIX mqueues   mq_open
    keyrings        add_key, request_key, keyctl
    other processes prlimit64, sched_setaffinity, sched_setscheduler, sched_setparam,
                    sched_setattr on a pid other than 0 (the caller); setpriority
                    and ioprio_set on anything but the calling process;
                    process_vm_readv, process_vm_writev
    namespaces      unshare, setns (always); clone with any CLONE_NEW* flag (NS, UTS,
                    IPC, USER, PID, NET, CGROUP)

and ``clone3`` fails with ``ENOSYS``.

The first three kinds create kernel objects that live in the sandbox's IPC namespace (or
the uid's keyring), not in any process: a session could leave one behind for the
tenant's next session in the same sandbox. Under runc the runner could list and remove
them (``/proc/sysvipc``, ``/dev/mqueue``); under gVisor it cannot list them at all (no
``/proc/sysvipc``, no mqueue mount). Refusing their creation makes both runtimes behave
the same and leaves nothing to clean. POSIX shared memory and semaphores (``shm_open``,
``sem_open``, what ``multiprocessing`` uses) are files in ``/dev/shm`` and keep working;
the runner empties ``/dev/shm`` before a sandbox is reused.

The fourth kind act on other processes of the same uid without ptrace rights: measured
under runc and gVisor, a session process could set the runner's (PID 1) RLIMIT_NOFILE to
8, its nice value to 19 and (runc) its policy to SCHED_IDLE, which would cripple the
runner for every later session. A process may still change its own limits, priority
and affinity (pid 0, what ``resource.setrlimit``, ``os.nice`` and
``os.sched_setaffinity(0, ...)`` use); naming its own pid explicitly is refused too.

The namespace kind closes the kernel's namespace code to sandboxed code in both runtimes.
Under runc Docker's seccomp profile refuses it too (no CAP_SYS_ADMIN); under gVisor an
unprivileged ``unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWCGROUP)`` succeeds inside the
sentry when runsc does not load the container's seccomp profile (``--oci-seccomp``,
which ``scripts/ensure-docker`` registers), and with a user namespace comes every
capability over it: mounts, the sentry's namespace and cgroup code, all attack surface of
the one kernel between the code and the host. ``unshare`` is refused whatever its flags
(without a CLONE_NEW* flag it only un-shares the caller's own files or fs state, which
no program here needs; Docker's profile refuses it whole as well). ``clone``'s flags are
its first argument, in a register, so the filter tests them and ``fork``, threads
(CLONE_VM | CLONE_THREAD | ...), ``vfork`` and ``posix_spawn`` keep working.
``clone3`` passes its flags in memory, out of a filter's reach, so it is refused with
``ENOSYS``, as Docker's profile does: glibc then falls back to ``clone`` (threads,
``posix_spawn``), which is filtered. CLONE_NEWTIME has no bit in ``clone``'s flags
(its low byte is the exit signal) and is reachable only through the two refused calls.

System calls of another ABI than the native one (i386 through ``int 0x80``, x32) fail
with ``EPERM`` as well: otherwise the i386 ``ipc(2)`` multiplexer would bypass the
filter. Only x86_64 and aarch64 are known; elsewhere :func:`install_filter` raises.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000

ALWAYS = "always"
NO_SUCH_CALL = "always, as ENOSYS"
"""Refused with ENOSYS instead of EPERM: callers (glibc's ``clone3`` users) fall back."""
NEW_NAMESPACE = "arg0 & CLONE_NEW*"
"""Denied when the first argument (``clone``'s flags; low 32 bits) has a CLONE_NEW* bit."""
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
"""CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
| CLONE_NEWNET (``linux/sched.h``; the mask of Docker's profile for ``clone``)."""
OTHER_PID = "arg0 != 0"
"""Denied when the first argument (a pid; its low 32 bits) is not 0."""
NOT_SELF = "arg0 != 0 or arg1 != 0"
"""Denied unless ``which`` is the process kind (PRIO_PROCESS = 0 for setpriority; for
ioprio_set IOPRIO_WHO_PROCESS = 1, see RULES) and ``who`` is 0 (the caller)."""

# (AUDIT_ARCH, {name: number}) per machine
ARCHES = {
    "x86_64": (0xC000003E, {"shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
                            "add_key": 248, "request_key": 249, "keyctl": 250,
                            "process_vm_readv": 310, "process_vm_writev": 311,
                            "prlimit64": 302, "sched_setaffinity": 203, "sched_setscheduler": 144,
                            "sched_setparam": 142, "sched_setattr": 314,
                            "setpriority": 141, "ioprio_set": 251,
                            "unshare": 272, "setns": 308, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {"shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
                             "add_key": 217, "request_key": 218, "keyctl": 219,
                             "process_vm_readv": 270, "process_vm_writev": 271,
                             "prlimit64": 261, "sched_setaffinity": 122, "sched_setscheduler": 119,
                             "sched_setparam": 118, "sched_setattr": 274,
                             "setpriority": 140, "ioprio_set": 30,
                             "unshare": 97, "setns": 268, "clone": 220, "clone3": 435}),
}
RULES: dict[str, tuple[str, int | None]] = {
    "shmget": (ALWAYS, None), "semget": (ALWAYS, None), "msgget": (ALWAYS, None),
    "mq_open": (ALWAYS, None), "add_key": (ALWAYS, None), "request_key": (ALWAYS, None),
    "keyctl": (ALWAYS, None), "process_vm_readv": (ALWAYS, None), "process_vm_writev": (ALWAYS, None),
    "prlimit64": (OTHER_PID, None), "sched_setaffinity": (OTHER_PID, None),
    "sched_setscheduler": (OTHER_PID, None), "sched_setparam": (OTHER_PID, None),
    "sched_setattr": (OTHER_PID, None),
    "setpriority": (NOT_SELF, 0),  # PRIO_PROCESS
    "ioprio_set": (NOT_SELF, 1),  # IOPRIO_WHO_PROCESS
    "unshare": (ALWAYS, None), "setns": (ALWAYS, None),
    "clone": (NEW_NAMESPACE, None), "clone3": (NO_SUCH_CALL, None),
}
"""System call name -> (condition, the ``which`` value that means "a process")."""

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_OFFSET_NR = 0
_OFFSET_ARCH = 4
_OFFSET_ARG0 = 16  # args[i] is a u64 at 16 + 8 * i; its low half comes first (little-endian)
_OFFSET_ARG1 = 24


_Insn = tuple[int, int | str, int | str, int]
"""(code, jt, jf, k); a jump target is an offset or a label resolved at the end."""


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def filter_program(machine: str) -> bytes:
    """The classic-BPF program (``struct sock_filter[]``) for ``machine``
    (``platform.machine()``). Raises KeyError for an unknown machine.

    Instructions jump to the labels ``"allow"``, ``"deny"`` (EPERM), ``"nosys"`` (ENOSYS)
    or the next rule; they are resolved to BPF's relative offsets at the end."""
    arch, numbers = ARCHES[machine]
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    prog: list[_Insn | tuple[str, str]] = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH), (_JEQ_K, 1, 0, arch), (_RET_K, 0, 0, deny)]
    load_nr = (_LD_W_ABS, 0, 0, _OFFSET_NR)
    prog.append(load_nr)
    if machine == "x86_64":
        prog.append((_JGE_K, "deny", 0, X32_SYSCALL_BIT))
    for name, (condition, which) in RULES.items():
        nr = numbers[name]
        if condition in (ALWAYS, NO_SUCH_CALL):
            prog.append((_JEQ_K, "deny" if condition == ALWAYS else "nosys", 0, nr))
            continue
        rule_end = f"after-{name}"
        prog.append((_JEQ_K, 0, rule_end, nr))
        if condition == NEW_NAMESPACE:
            prog += [(_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JSET_K, "deny", "allow", CLONE_NEW_FLAGS)]
        elif condition == OTHER_PID:
            prog += [(_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JEQ_K, "allow", "deny", 0)]
        else:
            assert which is not None  # NOT_SELF rules name the "process" value
            prog += [(_LD_W_ABS, 0, 0, _OFFSET_ARG0), (_JEQ_K, 0, "deny", which),
                     (_LD_W_ABS, 0, 0, _OFFSET_ARG1), (_JEQ_K, "allow", "deny", 0)]
        prog.append(("label", rule_end))
        prog.append(load_nr)
    prog += [("label", "allow"), (_RET_K, 0, 0, SECCOMP_RET_ALLOW), ("label", "deny"), (_RET_K, 0, 0, deny),
             ("label", "nosys"), (_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    labels: dict[str, int] = {}
    code: list[_Insn] = []
    for insn in prog:
        if len(insn) == 2:  # ("label", name)
            labels[insn[1]] = len(code)
        else:
            code.append(insn)

    def offset(target: int | str, at: int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(_insn(c, offset(jt, i), offset(jf, i), k) for i, (c, jt, jf, k) in enumerate(code))


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter() -> None:
    """Install the filter on the calling process (and so on everything it starts).

    Raises:
        OSError: ``prctl`` refused (errno set), or the machine is not x86_64/aarch64.
    """
    machine = platform.machine()
    if machine not in ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter known for {machine!r}")
    program = filter_program(machine)
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
