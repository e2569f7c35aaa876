"""Containment of the runner (PID 1): killing leftover processes with certainty, and
proving a sandbox empty before it serves another session. Stdlib only; runs in the
runner process and never executes session code.

Processes (:func:`sweep`): a pass lists ``/proc``, reads every listed process's state
and session, SIGKILLs the selected ones still alive and reaps the dead ones. A process
with a pending SIGKILL can no longer fork (the kernel's ``copy_process`` aborts when a
signal is pending, and gVisor's does the same), so a fork bomb cannot outrun the passes:
every child it made before its signal is already in ``/proc`` at the next listing.

A pass is *quiet* only if it found no selected process alive, no selected zombie it had
not already seen as a zombie in the pass before, and no listed process that vanished
before its state could be read; the sweep ends at the first quiet pass. The listing is
not atomic, so a process that forks after the listing and exits before its state is read
("fork hoppers") leaves a child this pass never saw; but the exited parent is then a new
zombie (orphans go to PID 1, which reaps only between passes) or, if a process of the
sandbox reaped it first, it vanished from the listing, or its reaper is itself a listed
process that was alive, died or vanished: each of these makes the pass noisy and the
next listing shows the child. A zombie seen in two passes in a row died before the
first one's listing was complete, so its children are in the second.

Noisy passes alone can lose the race when a pass is slower than a hop (a loaded machine:
a chain forks hundreds of generations while one pass reads ``/proc``). So a pass also
kills the process group of every selected process (``killpg``: atomic against forks in
Linux and gVisor), which ends a hopping chain in one blow as long as its members stay in
one group. A chain that also makes a new session in every generation can still outpace
the passes on a saturated machine; then the deadline below ends the sweep.

The only bound is ``deadline_s`` of wall-clock time for processes to actually die (a
killed process needs CPU to exit, which a loaded machine and the CPU quota delay); past
it the sweep reports failure and the runner stops reusing the sandbox.

Emptiness (:func:`reset`, when no session and no job is left): ``kill(-1, SIGKILL)``
from PID 1 (the kernel spares only PID 1 itself: atomic, no race with forks), then every
writable place is emptied and checked:

    place                 emptied by                     proven empty by
    /tmp, /dev/shm        removing every entry           st_size of the directory
    /work                 removing known work dirs       st_size of the directory
    /dev/mqueue (runc)    unlinking every queue          listing
    SysV IPC (runc)       (sessions cannot create any)   /proc/sysvipc/{shm,sem,msg}
    Unix sockets          kill(-1): no process holds     /proc/net/unix lists no
                          one                            named or abstract socket
    TCP/UDP on loopback   kill(-1)                       no LISTEN or UDP row in
                                                         /proc/net/{tcp,udp}{,6}
    runner's rlimits,     (sessions cannot change them)  comparison with the start
    nice, policy, CPUs

A tmpfs directory's ``st_size`` is 20 bytes per entry (plus 40), in Linux and in gVisor
alike, so ``/work`` (which nobody may list: mode 1733) can be proven empty without
listing it. SysV IPC and POSIX message queues cannot be listed under gVisor; there the
guarantee is that session processes cannot create any (``child_confine.py``'s seccomp filter).
Whatever cannot be emptied or proven empty is reported as a problem: the host then
destroys the sandbox instead of reusing it.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import stat
import time
from collections.abc import Callable

from .limits import SWEEP_DEADLINE_S

SCRUB_DIRS = ("/tmp", "/dev/shm")
"""Listable shared tmpfs directories emptied entry by entry."""
MQUEUE_DIR = "/dev/mqueue"
SYSVIPC_FILES = ("/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg")
UNIX_SOCKETS = "/proc/net/unix"
INET_SOCKETS = ("/proc/net/tcp", "/proc/net/tcp6", "/proc/net/udp", "/proc/net/udp6")
TCP_LISTEN = "0A"


def scan() -> dict[int, tuple[str, int]]:
    """``pid -> (state letter, session id)`` of every process visible in /proc (a process
    that vanished between the listing and the read of its stat is left out)."""
    return {pid: (info[0], info[1]) for pid, info in _scan().items() if info is not None}


def _scan() -> dict[int, tuple[str, int, int] | None]:
    """``pid -> (state letter, session id, process group id)``, with ``None`` for a listed
    process whose stat could not be read any more (it exited and was reaped meanwhile)."""
    out: dict[int, tuple[str, int, int] | None] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            out[int(entry)] = None
            continue
        fields = raw[raw.rfind(b")") + 2:].split()
        out[int(entry)] = ((fields[0].decode("ascii", "replace"), int(fields[3]), int(fields[2]))
                           if len(fields) > 3 else None)
    return out


TASK_COUNT_FILES = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
"""The sandbox's pids cgroup task count (cgroup v1, v2), as the container sees it."""


def read_task_count(fd: int) -> int | None:
    """The tasks (processes and threads; exited ones not yet reaped and forks under way
    included) the pids cgroup behind ``fd`` counts now, read with ``pread`` from offset 0;
    None for ``fd`` -1 or anything but a decimal count."""
    if fd < 0:
        return None
    try:
        raw = os.pread(fd, 64, 0).strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() and len(raw) < 20 else None


def task_counter(paths: tuple[str, ...] = TASK_COUNT_FILES) -> int:
    """A read-only descriptor of the first of ``paths`` (the pids cgroup's
    ``pids.current``) that counts exactly one task now, or -1. Called by PID 1 of the
    sandbox before it starts any child, when the host says the cgroup holds exactly the
    sandbox's tasks (``cgroup_task_count``: runc): PID 1 alone counted as one proves that
    the file counts the cgroup PID 1 is in, which every process of the sandbox inherits
    and none can leave (the cgroup file system is read-only in the container). A sweep
    then lists /proc only when the count exceeds what PID 1 follows
    (``pid1_children.Children.sweep``)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if read_task_count(fd) == 1:
            return fd
        os.close(fd)
    return -1


def _dead(state: str) -> bool:
    return state in ("Z", "X", "x")


def reap_pid(pid: int) -> None:
    """Collect ``pid`` if it is an exited child of this process (anything else: no-op)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass


def sweep(selected: Callable[[int, int], bool], deadline_s: float = SWEEP_DEADLINE_S,
          reap: Callable[[int], None] = reap_pid) -> bool:
    """SIGKILL every process ``selected(pid, sid)`` picks (never this process) and wait
    for a quiet pass (see the module docstring): none of them alive and no sign that one
    forked while the pass was listing. A selected process's whole process group is killed
    too (``killpg``) when ``selected(pgid, sid)`` also holds, i.e. the group's leader id is
    not a protected process: a group-directed signal reaches every member at once, a child
    being forked included (Linux queues it for the child; gVisor forks and signals groups
    under one lock), so a chain of processes that fork and exit in a loop inside one
    group dies in one pass however fast it hops. Dead ones are passed to ``reap`` after each pass's
    listing (so the runner collects only the children it does not track itself).

    Returns True when no selected process is left alive, False when the passes were not
    quiet yet after ``deadline_s`` seconds (the caller must not trust the sandbox any
    more)."""
    me = os.getpid()
    end = time.monotonic() + deadline_s
    zombies: set[int] = set()
    while True:
        alive: list[int] = []
        dead: list[int] = []
        groups: set[int] = set()
        noisy = False
        for pid, info in _scan().items():
            if pid == me:
                continue
            if info is None:
                noisy = True  # exited and reaped while listed: may have forked unseen
                continue
            state, sid, pgid = info
            if not selected(pid, sid):
                continue
            if pgid not in (0, 1, me) and selected(pgid, sid):
                groups.add(pgid)
            if _dead(state):
                dead.append(pid)
                noisy = noisy or pid not in zombies
            else:
                alive.append(pid)
        zombies = set(dead)
        for pid in dead:
            reap(pid)
        if not alive and not noisy:
            return True
        for group in groups:  # the whole group at once, including a fork under way
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass
        for pid in alive:  # again for those signalled before: harmless, they are dying
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if time.monotonic() > end:
            return False
        time.sleep(0.001)


def kill_all(deadline_s: float = SWEEP_DEADLINE_S, keep: int | None = None) -> bool:
    """``kill(-1, SIGKILL)`` from PID 1: every other process of the sandbox dies at once,
    then the passes of :func:`sweep` wait for them and reap every child. Only for a
    sandbox with nothing left to keep (no session, no job, the spare forgotten) but,
    with ``keep``, that one process (a child of PID 1 leading its own process session
    and group: ``pid1_templates``' kept jobs template): then the passes of :func:`sweep`
    kill every other process, process groups whole, as they do after every call.
    Returns False if a process was still alive after ``deadline_s`` seconds."""
    if os.getpid() != 1:
        return True  # not the sandbox's init (tests on the host): /proc is not ours
    if keep is None:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass  # ESRCH: nothing else runs
    done = sweep(lambda pid, sid: pid != keep, deadline_s)
    while True:  # collect every exited child, tracked or not: none is tracked any more
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return done


def _own_settings() -> dict[str, object]:
    """This process's resource limits, nice value, scheduling policy and CPU affinity:
    what another process of the same uid could change (``child_confine.py`` forbids it to
    sessions; :func:`reset` checks it stayed)."""
    out: dict[str, object] = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                out[name] = resource.getrlimit(getattr(resource, name))
            except (OSError, ValueError):
                continue
    for name, read in (("nice", lambda: os.getpriority(os.PRIO_PROCESS, 0)),
                       ("policy", lambda: os.sched_getscheduler(0)),
                       ("affinity", lambda: sorted(os.sched_getaffinity(0)))):
        try:
            out[name] = read()
        except OSError:
            continue
    return out


class Baseline:
    """What :func:`reset` compares against, taken when the runner started: sizes of the
    shared directories (``st_size`` of an empty tmpfs directory) and the runner's own
    limits and scheduling settings."""

    def __init__(self, work_root: str) -> None:
        self.sizes: dict[str, int] = {}
        for path in (*SCRUB_DIRS, work_root):
            try:
                self.sizes[path] = os.stat(path).st_size
            except OSError:
                continue
        self.settings = _own_settings()


def remove(path: str) -> None:
    """Remove a file or a whole tree the runner's uid owns, iteratively (a session may
    nest directories deeper than any recursion limit), making directories a session
    chmod-ed unreadable readable first. Raises OSError for what cannot be removed."""
    stack = [path]
    while stack:
        top = stack[-1]
        try:
            info = os.lstat(top)
        except FileNotFoundError:
            stack.pop()
            continue
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(top)
            stack.pop()
            continue
        if info.st_mode & 0o700 != 0o700:
            os.chmod(top, 0o700)
        entries = os.listdir(top)
        if entries:
            stack.extend(os.path.join(top, entry) for entry in entries)
        else:
            os.rmdir(top)
            stack.pop()


def scrub(directory: str) -> list[str]:
    """Remove every entry of ``directory``; returns problems (entries that stayed)."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{directory}: cannot list ({exc.strerror})"]
    for entry in entries:
        try:
            remove(os.path.join(directory, entry))
        except OSError:
            pass
    try:
        left = os.listdir(directory)
    except OSError:
        left = []
    return [f"{directory}: {len(left)} entries could not be removed"] if left else []


def _empty_by_size(path: str, baseline: Baseline) -> list[str]:
    expected = baseline.sizes.get(path)
    if expected is None:
        return []
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return [f"{path}: cannot stat ({exc.strerror})"]
    if size != expected:
        return [f"{path}: {max(0, (size - expected) // 20)} unknown entries remain"]
    return []


def _ipc_objects() -> list[str]:
    problems = []
    for path in SYSVIPC_FILES:
        try:
            with open(path) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue  # gVisor has no /proc/sysvipc: sessions cannot create objects there
        if any(row.strip() for row in rows):
            problems.append(f"{path}: {len(rows)} SysV IPC objects remain")
    try:
        queues = os.listdir(MQUEUE_DIR)
    except OSError:
        queues = []
    for name in queues:
        try:
            os.unlink(os.path.join(MQUEUE_DIR, name))
        except OSError:
            pass
    try:
        if os.listdir(MQUEUE_DIR):
            problems.append(f"{MQUEUE_DIR}: POSIX message queues remain")
    except OSError:
        pass
    return problems


def _own_sockets() -> set[str]:
    """Inode numbers of the sockets this process holds (its connection to the host shows
    the host's socket path in /proc/net/unix)."""
    inodes: set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _named_sockets() -> list[str]:
    """Bound Unix sockets (a path or an abstract name) not connected to anything: what a
    session would leave listening. No process but the runner is left when this runs, and
    the runner binds none; its own sockets are skipped, and so are connected ones (the
    host's end of the runner's connection is created in the sandbox's network namespace
    and carries the host's socket path)."""
    try:
        with open(UNIX_SOCKETS) as handle:
            rows = [row.split() for row in handle.read().splitlines()[1:]]
    except OSError:
        return []
    own = _own_sockets()
    named = [row[7] for row in rows if len(row) > 7 and row[6] not in own and row[5] != "03"]
    problems = [f"{UNIX_SOCKETS}: {len(named)} bound sockets remain ({named[0][:40]!r}...)"] if named else []
    for path in INET_SOCKETS:  # on the sandbox's loopback: listening TCP, any UDP
        try:
            with open(path) as handle:
                rows = [row.split() for row in handle.read().splitlines()[1:]]
        except OSError:
            continue
        left = [row for row in rows if len(row) > 3 and ("udp" in path or row[3] == TCP_LISTEN)]
        if left:
            problems.append(f"{path}: {len(left)} bound sockets remain")
    return problems


def reset(work_root: str, workdirs: list[str], baseline: Baseline, keep: int | None = None) -> list[str]:
    """Make an idle sandbox as it was at start (see the module docstring), every process
    but PID 1 and ``keep`` killed (:func:`kill_all`). Call only when no session and no
    job is left and the spare is forgotten. Returns the problems found; an empty list
    means the sandbox is proven empty and may be reused."""
    problems = [] if kill_all(keep=keep) else ["processes survived kill(-1)"]
    return problems + empty_places(work_root, workdirs, baseline)


def empty_places(work_root: str, workdirs: list[str], baseline: Baseline) -> list[str]:
    """The part of :func:`reset` after its ``kill(-1)``: remove ``workdirs``, empty the
    writable places and prove them empty, check the runner's own settings. Returns the
    problems found (none: proven empty). For a sandbox whose live processes wrote
    nothing (the runner's light recycle)."""
    problems: list[str] = []
    for workdir in workdirs:
        try:
            remove(workdir)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                problems.append(f"{workdir}: {exc.strerror}")
    for directory in SCRUB_DIRS:
        problems += scrub(directory)
    for path in (*SCRUB_DIRS, work_root):
        problems += _empty_by_size(path, baseline)
    problems += _ipc_objects()
    problems += _named_sockets()
    now = _own_settings()
    problems += [f"the runner's {name} changed: {baseline.settings.get(name)} -> {value}"
                 for name, value in now.items() if baseline.settings.get(name) != value]
    return problems


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session...),
    or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2:].decode("ascii", "replace").split()


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (/proc), or None when it is gone."""
    fields = proc_stat(pid)
    return int(fields[1]) if fields else None


def waiting_child(pid: int) -> bool:
    """Whether /proc shows ``pid`` as this process's child, running or sleeping: not gone,
    not dying, not stopped by a signal (a process PID 1 keeps for later must be all of that
    when it is used)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] in ("S", "R") and int(fields[1]) == os.getpid()
