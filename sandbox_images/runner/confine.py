"""Per-process confinement of a session or job process, applied by ``session.harden``
before any untrusted code exists. Stdlib only (``ctypes`` for ``prctl``).

:func:`deny_persistent_ipc` installs a seccomp filter (inherited by every process the
code starts, and impossible to remove) that makes the system calls creating kernel
objects which outlive their processes fail with ``EPERM``:

    SysV IPC        shmget, semget, msgget   (segments, semaphore sets, message queues)
    POSIX mqueues   mq_open
    keyrings        add_key, request_key, keyctl

Such objects live in the sandbox's IPC namespace (or the uid's keyring), not in any
process: a session could leave one behind for the tenant's next session in the same
sandbox. Under runc the runner could list and remove them (``/proc/sysvipc``,
``/dev/mqueue``); under gVisor it cannot list them at all (no ``/proc/sysvipc``, no
mqueue mount). Refusing their creation makes both runtimes behave the same and leaves
nothing to clean. POSIX shared memory and semaphores (``shm_open``, ``sem_open``, what
``multiprocessing`` uses) are files in ``/dev/shm`` and keep working; the runner empties
``/dev/shm`` before a sandbox is reused.

System calls of another ABI than the native one (i386 through ``int 0x80``, x32) fail
with ``EPERM`` too: otherwise the i386 ``ipc(2)`` multiplexer would bypass the filter.
Only x86_64 and aarch64 are known; elsewhere :func:`deny_persistent_ipc` raises.
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

# (AUDIT_ARCH, {name: number}) per machine
ARCHES = {
    "x86_64": (0xC000003E, {"shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
                            "add_key": 248, "request_key": 249, "keyctl": 250}),
    "aarch64": (0xC00000B7, {"shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
                             "add_key": 217, "request_key": 218, "keyctl": 219}),
}

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_OFFSET_NR = 0
_OFFSET_ARCH = 4


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def filter_program(machine: str) -> bytes:
    """The classic-BPF program (``struct sock_filter[]``) for ``machine``
    (``platform.machine()``). Raises KeyError for an unknown machine."""
    arch, numbers = ARCHES[machine]
    denied = sorted(numbers.values())
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    prog = [(_LD_W_ABS, 0, 0, _OFFSET_ARCH), (_JEQ_K, 1, 0, arch), (_RET_K, 0, 0, deny),
            (_LD_W_ABS, 0, 0, _OFFSET_NR)]
    checks = [(_JGE_K, X32_SYSCALL_BIT)] if machine == "x86_64" else []
    checks += [(_JEQ_K, nr) for nr in denied]
    deny_at = len(prog) + len(checks) + 1  # after the checks and the final "allow"
    for code, k in checks:
        prog.append((code, deny_at - len(prog) - 1, 0, k))
    prog += [(_RET_K, 0, 0, SECCOMP_RET_ALLOW), (_RET_K, 0, 0, deny)]
    return b"".join(_insn(*insn) for insn in prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny_persistent_ipc() -> None:
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
