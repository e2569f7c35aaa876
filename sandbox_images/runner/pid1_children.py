"""PID 1's process table: the processes it starts, follows, reaps and sweeps (stdlib only).

Every process that runs untrusted code is a :class:`Child` of PID 1: spawned with
``posix_spawn`` (:data:`SESSION_BOOT`: ``child_spare.main``, in its own process session,
first candidate for the OOM killer) or forked from a template and adopted
(:meth:`Child.adopt`, ``pid1_templates``). Its control channel is a socketpair on its fd 3;
its stdout and stderr are one-way socket streams PID 1 reads (:func:`read_once`,
:func:`drain`) and caps (:class:`Output`), so nothing it prints can forge a frame.

:class:`Children` keeps the *spare* (a process started ahead, no code yet, taken by the
next session, job or template: :meth:`Children.take`), and follows the processes of the
parts that own them (sessions, jobs, templates: :meth:`Children.follow`). After a round
of the loop in which a child may have exited (``Loop.after_child_exit``) it reaps exited
children and tells their owner (:meth:`Children.reap`);
:meth:`Children.sweep` kills, with certainty, what a call or a job left behind
(``pid1_cleanup.sweep``); a sweep that cannot finish marks the sandbox ``tainted`` and
``recycle`` refuses it. Work directories (``/work/<random>``, mode 0700) are made and
removed here; what cannot be removed is retried by ``recycle``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time

from . import pid1_cleanup, protocol
from .limits import CHILD_SEND_TIMEOUT_S, DEFAULT_SESSION_NOFILE, MAX_FRAME_BYTES, SPAWN_RETRY_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .pid1_loop import Loop

PACKAGE = __package__ or ""
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SESSION_BOOT = (f"import sys; sys.path[0] = {PACKAGE_PARENT!r}; "
                f"from {PACKAGE} import child_spare; child_spare.main()")
"""How a spawned process starts: the runner's package made importable (its parent
directory, which ``child_spare.main`` takes off ``sys.path`` again before anything else),
then ``child_spare`` imported as a module, so the bytecode compiled into the image is used
instead of compiling it anew in every process."""
WORK_ROOT = os.environ.get("SANDPIT_WORK_ROOT", "/work")
OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
MEMORY_FILES = (("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max"),
                ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""The cgroup's memory use and limit (v2, v1), read by :func:`memory_over`."""
READ_SIZE = 65536
"""Bytes one read of a child's output stream takes."""


_OOM_FD: list[int] = []
"""A read-only descriptor of the first readable file of OOM_FILES, kept open (:func:`oom_kills`)."""


def oom_kills() -> int:
    """Cgroup OOM-kill counter of this container (v2 or v1); 0 when unavailable.

    Read about twice per check of a batch: the file is opened once and re-read with
    ``pread`` from offset 0 (the kernel regenerates it), ~2 us instead of ~35 us for an
    open in text mode; a descriptor that cannot be read that way falls back to opening."""
    if not _OOM_FD:
        for path in OOM_FILES:
            try:
                _OOM_FD.append(os.open(path, os.O_RDONLY))  # not inheritable (PEP 446)
                break
            except OSError:
                continue
    if _OOM_FD:
        try:
            data = os.pread(_OOM_FD[0], 4096, 0)
        except OSError:
            data = b""
        for row in data.split(b"\n"):
            name, _, count = row.partition(b" ")
            if name == b"oom_kill":
                try:
                    return int(count)
                except ValueError:
                    break
    for path in OOM_FILES:
        try:
            with open(path) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def private_bytes(pid: int) -> int | None:
    """Bytes of memory killing ``pid`` would free, at most: Private_Clean + Private_Dirty of
    /proc/<pid>/smaps_rollup (or of /proc/<pid>/smaps summed, where there is no rollup, as
    under gVisor) when PID 1 may read them; else (a non-dumpable child, as every template
    is under runc: reading its smaps needs CAP_SYS_PTRACE) its resident pages that are not
    file-backed, from /proc/<pid>/statm, which also counts the pages it shares copy-on-write
    with sessions forked from it (they stay). None when nothing is readable."""
    for name in ("smaps_rollup", "smaps"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        total = found = 0
        for line in lines:
            if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    total += int(fields[1]) * 1024
                    found += 1
        if found:
            return total
    try:
        with open(f"/proc/{pid}/statm", "rb") as handle:
            fields = handle.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def open_sched(pid: int) -> int:
    """A read-only descriptor of /proc/<pid>/schedstat (the kernel's accounting of ``pid``:
    the process cannot forge it), or -1 where there is none (gVisor has no schedstat)."""
    try:
        return os.open(f"/proc/{pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def read_sched(fd: int) -> tuple[int, int] | None:
    """``(nanoseconds on a CPU, nanoseconds runnable but waiting for one)`` so far, read
    through ``fd`` (:func:`open_sched`) with ``pread`` from offset 0: about 8 us in a
    loaded runc sandbox, where opening the file again each time cost over 100 us. None
    for ``fd`` -1, a process that is gone, or a malformed line."""
    if fd < 0:
        return None
    try:
        fields = os.pread(fd, 128, 0).split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def memory_over(fraction: float) -> int:
    """Bytes by which the sandbox's cgroup uses more than ``fraction`` of its memory limit
    (<= 0: under it; 0 when it cannot be read or has no limit: the host's admission still
    measures the cgroup)."""
    for current_path, limit_path in MEMORY_FILES:
        try:
            with open(current_path) as handle:
                current = int(handle.read().strip())
            with open(limit_path) as handle:
                raw = handle.read().strip()
        except (OSError, ValueError):
            continue
        if not raw.isdigit():
            return 0  # "max": no limit
        return current - int(int(raw) * fraction) + 1
    return 0


# -- output streams ------------------------------------------------------------------------
def stream() -> tuple[int, int]:
    """A one-way byte stream for a child's stdout or stderr: (PID 1's read end, the
    child's write end). A socketpair rather than a pipe: under gVisor any process of the
    same uid can open another's pipes through /proc/<pid>/fd/<n> (it ignores
    PR_SET_DUMPABLE), while a socket cannot be opened that way (ENXIO, both runtimes)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.shutdown(socket.SHUT_WR)
    theirs.shutdown(socket.SHUT_RD)
    return ours.detach(), theirs.detach()


class Output:
    """A capped byte buffer for one stream: keeps ``cap`` bytes, counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self, marker: bool = False) -> str:
        """The kept bytes as UTF-8 (``?`` for what is not), plus ``...[N bytes dropped]``
        when ``marker`` and something was dropped."""
        text = self.data.decode("utf-8", "replace")
        if marker and self.dropped:
            text += f"\n...[{self.dropped} bytes dropped]"
        return text

    def reset(self) -> None:
        self.data = bytearray()
        self.dropped = 0

    def take(self) -> str:
        """The text with its dropped-bytes marker, then empty the buffer (one per call)."""
        text = self.text(marker=True)
        self.reset()
        return text


def read_once(fd: int) -> bytes | None:
    """One non-blocking read of a child's output stream: the bytes, ``b""`` at its end (or
    on an error: the stream is done), None when nothing is there now."""
    try:
        return os.read(fd, READ_SIZE)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def drain(fd: int, sink: Output | None, max_reads: int | None = None) -> None:
    """Read what ``fd`` holds now (at most ``max_reads`` reads) into ``sink``; None
    discards it. Stops at the first read that finds nothing, the end, or an error."""
    reads = 0
    while max_reads is None or reads < max_reads:
        reads += 1
        chunk = read_once(fd)
        if not chunk:
            return
        if sink is not None:
            sink.add(chunk)


# -- one process ---------------------------------------------------------------------------
class Child:
    """A child process and its three channels (control socketpair on its fd 3, stdout and
    stderr streams PID 1 reads). ``limits`` are the per-process limits it applies itself
    (``child_spare.harden``)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = stream()
        err_r, err_w = stream()
        devnull = os.open(os.devnull, os.O_RDONLY)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": WORK_ROOT,
            "PYTHONHASHSEED": "0",  # deterministic set/dict-of-str ordering for replays
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "0",
            "MALLOC_ARENA_MAX": "2",
            "SANDPIT_SESSION_LIMITS": json.dumps(limits),
        }
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, err_w, 2),
            (os.POSIX_SPAWN_DUP2, child.fileno(), 3),
        ]
        try:
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, "-s", "-S", "-B", "-c", SESSION_BOOT], env,
                file_actions=actions, setsid=True)
        except BaseException:  # e.g. EAGAIN at the pids limit: keep no fds of a failed spawn
            parent.close()
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            child.close()
            os.close(out_w)
            os.close(err_w)
            os.close(devnull)
        _first_for_the_oom_killer(self.pid)
        parent.settimeout(CHILD_SEND_TIMEOUT_S)
        self.sock = parent
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self.out_r = out_r
        self.err_r = err_r
        self.frames = protocol.FrameBuffer(MAX_FRAME_BYTES)
        self.alive = True
        self.booted = False
        """Whether the process has answered anything yet (``hello``, ``pid1_sessions``)."""
        self.waited = False  # forked ahead and idle since (pid1_forks): it may have been killed meanwhile
        self.sched_fd: int | None = None
        """Its /proc/<pid>/schedstat, opened on first use (:meth:`sched_times`)."""

    @classmethod
    def adopt(cls, pid: int, sock: socket.socket, out_r: int, err_r: int) -> Child:
        """A process forked from a template (``pid1_templates``), already verified as
        PID 1's child and the leader of its own process session: from here on handled
        exactly like a spawned one."""
        child = cls.__new__(cls)
        _first_for_the_oom_killer(pid)
        sock.settimeout(CHILD_SEND_TIMEOUT_S)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        child.pid, child.sock, child.out_r, child.err_r = pid, sock, out_r, err_r
        child.frames = protocol.FrameBuffer(MAX_FRAME_BYTES)
        child.alive = True
        child.booted = True  # forked from a running process: nothing left to start
        child.waited = False
        child.sched_fd = None
        return child

    def sched_times(self) -> tuple[int, int] | None:
        """Its CPU time and run-queue wait so far in nanoseconds (:func:`read_sched`), the
        schedstat descriptor opened once and kept until :meth:`kill`; None where the
        kernel gives none."""
        if self.sched_fd is None:
            self.sched_fd = open_sched(self.pid)
        return read_sched(self.sched_fd)

    def send(self, message: dict[str, Any], raw: dict[str, bytes] | None = None) -> None:
        """One frame to the process (blocking, at most CHILD_SEND_TIMEOUT_S), with members
        that are JSON text already (``raw``, ``protocol.encode_raw``). Raises OSError (it
        is gone or stuck), ValueError/TypeError (not JSON)."""
        self.sock.sendall(protocol.encode_raw(message, raw) if raw else protocol.encode(message))

    def discard_output(self) -> None:
        """Drop what sits in a waiting process's output streams before it gets its first
        request (it wrote nothing itself: anything there came from another process of the
        sandbox, and must not be attributed to the job)."""
        for fd in (self.out_r, self.err_r):
            drain(fd, None)

    def kill(self) -> None:
        """SIGKILL its process group (while its leader is not reaped, so the group id
        cannot have been reused) and close PID 1's ends of its channels."""
        if self.alive:
            self.alive = False
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        fds = [self.out_r, self.err_r]
        if self.sched_fd is not None and self.sched_fd >= 0:
            fds.append(self.sched_fd)
        self.sched_fd = None
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.sock.close()


def _first_for_the_oom_killer(pid: int) -> None:
    try:  # the kernel's OOM killer takes it before PID 1
        with open(f"/proc/{pid}/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def await_exit(pid: int, limit_s: float) -> None:
    """Reap ``pid``, a child of this process that was sent SIGKILL (or exited), polling for at
    most ``limit_s`` seconds; no-op when it was reaped already. A process still alive then
    is left to the sweep that follows (the sweep, not this wait, guarantees it dies)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.0005)


def signal_name(number: int) -> str:
    """The name of signal ``number`` (``SIGKILL``), or the number when it has none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def describe_exit(wait_status: int) -> str:
    """How a process ended, from its ``waitpid`` status: ``killed by signal SIGKILL`` or
    ``exited with status 3``."""
    code = os.waitstatus_to_exitcode(wait_status)
    return f"killed by signal {signal_name(-code)}" if code < 0 else f"exited with status {code}"


# -- the table -----------------------------------------------------------------------------
class Children:
    """The spare, the processes PID 1's parts follow, reaping, sweeping, work directories
    (module docstring). ``limits`` are the sandbox's (``SANDPIT_LIMITS``)."""

    def __init__(self, loop: Loop, limits: dict[str, Any], work_root: str = WORK_ROOT) -> None:
        self.loop = loop
        self.limits = limits
        self.work_root = work_root
        self.spare: Child | None = None
        self._followers: list[tuple[Callable[[], set[int]], Callable[[int, int], bool]]] = []
        self._settled: list[Callable[[], set[int]]] = []
        self._before_sweep: list[Callable[[], None]] = []
        self.fork_spare: Callable[[bool], Child | None] = lambda rehearse: None
        """A fresh process forked from the jobs template (rehearsing an open when True: a
        spare forked ahead), or None (set by ``pid1_templates``): tried before a spawn,
        which costs a Python start-up on the sandbox's CPU quota."""
        self.code_ran = False
        """Whether a request that may run untrusted code came since the start or the last
        full recycle (set by ``pid1_runner``; ``pid1_templates`` keeps a jobs template
        through recycles only when it was ready before any did)."""
        self.sessions_open: Callable[[], int] = lambda: 0
        """How many sessions are open (set by ``pid1_sessions``): a spare is kept only while
        one more would fit (``max_sessions``)."""
        self.leftovers: list[str] = []
        """Work directories that could not be removed when their session or job ended."""
        self.tainted: list[str] = []
        """Why this sandbox must not be reused (a sweep that could not kill everything)."""
        on = limits.get("cgroup_task_count") is True and os.getpid() == 1  # before any child exists
        self.task_count_fd = pid1_cleanup.task_counter() if on else -1
        self.sweeps = {"counted": 0, "listed": 0}
        """Sweeps that ended on the task count and sweeps that listed /proc (``ping``)."""
        loop.after_child_exit(self.reap)

    def follow(self, pids: Callable[[], set[int]], on_exit: Callable[[int, int], bool],
               settled: Callable[[], set[int]] | None = None) -> None:
        """Register an owner of processes: ``pids()`` are its processes (never strays),
        ``on_exit(pid, wait_status)`` is offered every exit and returns True when the pid
        was its own; ``settled()`` are processes whose process session holds only them (a
        sweep kills anything else found in it)."""
        self._followers.append((pids, on_exit))
        if settled is not None:
            self._settled.append(settled)

    def before_sweep(self, action: Callable[[], None]) -> None:
        """Run ``action()`` at the start of every :meth:`sweep` (to follow the processes forked ahead first)."""
        self._before_sweep.append(action)

    def tracked_pids(self) -> set[int]:
        """Every process PID 1 follows: its owners' and the spare."""
        tracked: set[int] = set()
        for pids, _ in self._followers:
            tracked |= pids()
        if self.spare is not None:
            tracked.add(self.spare.pid)
        return tracked

    # -- starting ----------------------------------------------------------------------------
    def session_limits(self) -> dict[str, Any]:
        """The limits a spawned process applies to itself (``child_spare.harden``)."""
        return {
            "session_memory_bytes": self.limits["session_memory_bytes"],
            "memory_rlimit": self.limits.get("memory_rlimit", "data"),
            "observation_cap_bytes": self.limits["observation_cap_bytes"],
            "session_nofile": self.limits.get("session_nofile", DEFAULT_SESSION_NOFILE),
        }

    def spawn(self) -> Child:
        """A newly spawned process (never the spare, which may have been killed). At the
        pids limit (processes just killed, e.g. a fork bomb's, are not reaped yet) exited
        strays are collected and the spawn retried for up to SPAWN_RETRY_S. Raises
        OSError when no process can be started."""
        deadline = time.monotonic() + SPAWN_RETRY_S
        while True:
            try:
                return Child(self.session_limits())
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                self._reap_untracked()
                time.sleep(0.005)

    def take(self) -> Child:
        """A fresh process (the spare when it lives, else one forked from the jobs template,
        else a spawned one); a new spare is started once the loop is quiet (``Loop.later``).
        Raises OSError (pids limit)."""
        child = self.spare if self.spare is not None and self.spare.alive else None
        self.spare = None
        child = child or self.fork_spare(False) or self.spawn()
        self.loop.later(self.ensure_spare, quiet=True)
        return child

    def ensure_spare(self) -> None:
        """Start the spare (forked from the jobs template when it is ready, else spawned)
        unless there is one, spares are off (``spare_child``), or the sandbox holds
        ``max_sessions`` sessions. The pids limit only skips it."""
        if self.limits.get("spare_child", True) and (self.spare is None or not self.spare.alive):
            if self.sessions_open() < int(self.limits.get("max_sessions", 1)):
                try:
                    self.spare = self.fork_spare(True) or Child(self.session_limits())
                except OSError:  # pids limit reached: the spare is only an optimisation
                    self.spare = None

    def kill_spare(self) -> None:
        """Kill and forget the spare (``recycle``: it lived beside the previous sessions)."""
        if self.spare is not None:
            self.spare.kill()
        self.spare = None

    # -- exits -------------------------------------------------------------------------------
    def reap(self) -> None:
        """Collect every exited child and offer it to its owner (the spare's death just
        forgets it). Run after a round in which a child may have exited
        (``Loop.after_child_exit``: SIGCHLD arrived, or ``select`` found nothing)."""
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if any(on_exit(pid, wait_status) for _, on_exit in self._followers):
                continue
            if self.spare is not None and self.spare.pid == pid:
                self.spare.alive = False
                self.spare.kill()
                self.spare = None

    def _reap_untracked(self) -> None:
        """Reap exited children that nobody follows (those are left to :meth:`reap`, which
        tells their owner)."""
        tracked = self.tracked_pids()
        for pid in pid1_cleanup.scan():
            if pid != os.getpid() and pid not in tracked:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def sweep(self, own: int | None = None) -> None:
        """Kill processes a call or a job left behind, with certainty
        (``pid1_cleanup.sweep``): members of ``own``'s process session other than ``own``
        (a session's process), and every process outside all followed ones' sessions
        (escaped with setsid). Returns once none of them is alive; if some still live
        after ``limits.SWEEP_DEADLINE_S`` the sandbox is marked tainted and ``recycle``
        will refuse it. When the pids cgroup counts exactly PID 1 and the followed processes
        (``pid1_cleanup.task_counter``; they are PID 1's children, forgotten before or as
        they are reaped, which the listing trusts too) there is no other task and /proc is
        not listed; any other task, a thread included, makes the count larger.

        Only when PID 1 is PID 1 of its own pid namespace (always, in a sandbox): elsewhere
        /proc would show processes that are not ours."""
        if os.getpid() != 1:
            return
        for action in self._before_sweep:
            action()
        known = self.tracked_pids()
        if pid1_cleanup.read_task_count(self.task_count_fd) == len(known) + 1:
            self.sweeps["counted"] += 1
            return
        self.sweeps["listed"] += 1
        settled: set[int] = set()
        for ready in self._settled:
            settled |= ready()
        me = os.getpid()
        try:
            pids = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        except OSError:
            return
        if pids <= known | {me}:
            return  # nothing but PID 1 and the processes it follows

        def stray(pid: int, sid: int) -> bool:
            if pid in known:
                return False
            # not another followed process's; a settled process session holds only its
            # leader (a loading template's may hold its construction probe)
            return sid not in known or sid == own or sid in settled

        def reap(pid: int) -> None:
            if pid not in known:
                pid1_cleanup.reap_pid(pid)

        if not pid1_cleanup.sweep(stray, reap=reap):
            self.tainted.append("a sweep left processes alive")

    # -- work directories ------------------------------------------------------------------
    def make_workdir(self) -> str:
        """A new private work directory under the work root (mode 0700, a random name).
        Raises OSError (the tmpfs is full)."""
        workdir = os.path.join(self.work_root, secrets.token_hex(16))
        os.mkdir(workdir, 0o700)
        return workdir

    def remove_workdir(self, path: str) -> None:
        """Remove a finished session's or job's work directory; what cannot be removed
        now is retried by ``recycle`` (and makes it report the sandbox unclean)."""
        try:
            pid1_cleanup.remove(path)
        except OSError:
            self.leftovers.append(path)
