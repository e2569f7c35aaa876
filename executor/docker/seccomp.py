"""The seccomp profile of gVisor sandboxes (``runtime="runsc"``): Docker's refusals, in the
names gVisor knows.

Under runc every sandbox gets Docker's default profile, never overridden. Under runsc a
container's profile is loaded only when runsc is registered with ``--oci-seccomp``
(``engine.check_runtime`` refuses a pool otherwise), and then inside gVisor's kernel (the
sentry), by runsc's own conversion. Measured with Debian's runsc 2022-12-19, Docker's
default profile does not survive that conversion intact:

* ``errnoRet`` is ignored, so every refusal is ``EPERM``: ``clone3`` (which the profile
  answers with ``ENOSYS`` so that glibc falls back to ``clone``) made ``pthread_create``
  (every ``threading.Thread``) and ``posix_spawn`` (how the runner starts session
  processes) fail;
* names are looked up in gVisor's table and unknown ones skipped, so what the profile
  allows under another name is refused: ``pselect6`` (gVisor says ``pselect``), which
  glibc's ``select()`` uses, so ``select.select`` failed with EPERM (forked check
  processes and config templates wait with it); and the calls gVisor does not implement
  answered ``EPERM`` instead of ``ENOSYS`` (``openat2``, ``futex_waitv``, ...).

So runsc sandboxes get this profile instead: everything is allowed but
:data:`RUNSC_REFUSED` and ``clone`` with a CLONE_NEW* flag, which fail with ``EPERM``.
:data:`RUNSC_REFUSED` is what Docker's default profile refuses to a container without
capabilities (measured under runc: ``EPERM`` with the profile, not without it; plus the
calls that need a capability the container lacks, which the profile refuses as well)
that gVisor answers itself, i.e. implements or refuses for lack of a capability (calls
it answers with ``ENOSYS`` are no surface and are left out). ``personality`` is left
out as well: Docker allows a few values of it and a profile that allows everything else
cannot say so; gVisor's implementation only records flags for the caller. So is
``_sysctl``, which gVisor refuses itself (EPERM) and whose name its table does not know.
Every name here is one gVisor's table knows (a name it does not know would be skipped
silently): ``tests/integration/executor/test_gvisor_confine.py`` traps each of them under
runsc, and measures ``pselect6``, threads, ``posix_spawn`` and unimplemented calls
answering as without a profile.

The session processes' own filter (``sandbox_images/runner/child_confine.py``) refuses
namespace creation too, in both runtimes; this profile covers every process of the
sandbox, the runner included.
"""

from __future__ import annotations

import json
from typing import Any

RUNSC_REFUSED: tuple[str, ...] = (
    # namespaces (clone's flags: see CLONE_NEW_FLAGS)
    "unshare", "setns",
    # keyrings: kernel objects that outlive the processes
    "add_key", "request_key", "keyctl",
    # mounts, file systems, file handles
    "mount", "umount2", "pivot_root", "chroot", "swapon", "swapoff", "quotactl",
    "name_to_handle_at", "open_by_handle_at",
    # the machine: clock, names, power, modules, kexec, I/O ports, accounting
    "settimeofday", "clock_settime", "sethostname", "setdomainname", "reboot", "vhangup", "acct",
    "create_module", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "iopl", "ioperm", "lookup_dcookie",
    # memory policy and other processes' pages, tracing and BPF
    "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
    "perf_event_open", "bpf", "kcmp",
)
"""System calls every process of a runsc sandbox is refused (``EPERM``)."""

CLONE_NEW_FLAGS: dict[str, int] = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
"""``clone`` with any of these flags (``linux/sched.h``) is refused (``EPERM``)."""


def runsc_profile() -> dict[str, Any]:
    """The OCI seccomp profile of runsc sandboxes (the JSON ``docker run --security-opt
    seccomp=<file>`` reads): default allow; :data:`RUNSC_REFUSED` and ``clone`` with a
    CLONE_NEW* flag (one masked-equal rule per flag: rules on one argument are or-ed)
    refused with ``EPERM`` (``errnoRet`` 1; runsc 2022-12 returns EPERM whatever it says)."""
    refuse = {"action": "SCMP_ACT_ERRNO", "errnoRet": 1}
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": list(RUNSC_REFUSED), **refuse}] + [
            {"names": ["clone"], **refuse, "args": [{"index": 0, "value": flag, "valueTwo": flag,
                                                     "op": "SCMP_CMP_MASKED_EQ"}]}
            for flag in CLONE_NEW_FLAGS.values()],
    }


def security_opt(runtime: str) -> list[str]:
    """Docker ``security_opt`` entries for a sandbox under ``runtime``: always
    ``no-new-privileges``; under runsc also :func:`runsc_profile` (``seccomp=<JSON>``, the
    profile itself, as the Engine API takes it). Under runc nothing replaces Docker's
    default profile."""
    options = ["no-new-privileges:true"]
    if runtime == "runsc":
        options.append("seccomp=" + json.dumps(runsc_profile(), separators=(",", ":")))
    return options
