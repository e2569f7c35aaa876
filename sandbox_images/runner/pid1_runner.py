"""Sandbox runner: PID 1 of every sandbox container (stdlib only, never runs env code).

It connects to the host's protocol endpoint (a Unix socket bind-mounted at
``/run/sandpit/runner.sock``), proves itself with the per-container token (read from the
file ``/run/sandpit/token``, never from the environment), then serves
length-prefixed JSON requests (``protocol.py``) from one single-threaded event loop:

    host socket ──► runner (this file, trusted) ──► session child 1 (untrusted env code)
                                               ├──► session child 2 ...
                                               ├──► spare child (started ahead, no code yet)
                                               └──► template per environment (shared sandboxes:
                                                    module executed once, sessions forked
                                                    from it; ``pid1_templates.py``)

Every session is its own child process (``child_session.py``), own process session, own private
working directory (``/work/<random>``, the parent is not listable), non-dumpable, with
RLIMIT_DATA (RLIMIT_AS under gVisor) as its memory limit and a seccomp filter
(``child_confine.py``). The host channel is never inherited by a child; each child's
stdout/stderr are socketpairs read here and capped per call, so nothing the environment
prints can forge a protocol message. Replies from a child are matched by a random
request id; a malformed or oversize frame kills the child.

Failure handling (a result, never a runner crash):
- call exceeds ``call_timeout_s``: SIGKILL the child's process group → ``timeout`` (a
  newly spawned process is sent ``hello`` first and the limit starts at its answer; one
  that does not answer within ``SESSION_STARTUP_S`` fails the request as ``crashed``);
- MemoryError / cgroup OOM kill → ``oom``; any other death → ``crashed``;
in each case the session is re-created from its source and restored to the last good
snapshot (the state after the last ``ok``/``error`` call) before its next request runs.
After every call, and before its reply, processes that the call left behind (same
session id, or escaped into a session of their own) are killed and waited for
(``pid1_cleanup.sweep``).

Host requests (each has an integer ``id``; each reply echoes it):
  open {session, source, class_name, init_config, snapshot?, describe_only?}
      -> {status, observation?, snapshot?, snapshot_digest?}   (describe_only: load the class,
      never instantiate). Instead of ``init_config``: ``config_hash`` (SHA-256 hex of the
      config's JSON bytes) and, unless PID 1 has it (``Configs``), ``config_b64`` (those
      bytes); a hash PID 1 does not hold is a fault with ``missing_config: true`` (the host
      sends the bytes). Such a session of an environment whose config template is ready
      is forked from it: the reply is ``{status: ok, template: true, snapshot_digest}``
      without the snapshot (the host asks ``snapshot`` when it does not know the digest).
  call {session, name, arguments} -> {status, observation, duration_ms, stdout, stderr, delta}
  describe {session} -> {status, tools, notes} or {status, observation, traceback?}
      (OpenAI tool schemas of the class; the encoded tools are at most MAX_SCHEMAS_BYTES)
  state {session} -> {status, state};  snapshot {session} -> {status, snapshot}
  restore {session, snapshot} -> {status, snapshot};  close {session} -> {status}
  ping {} -> {status, sessions, templates: {ready, loading, forked, fallbacks, failed, reasons}}
  recycle {} -> {status, clean, problems}: once no session or job is left, kill every
      process but PID 1, empty and prove empty every writable place (``pid1_cleanup.reset``);
      ``clean`` False means the host must destroy the sandbox instead of reusing it
  exec {code, stdin?, files?, time_limit_s} and checks {checks, initial_state, final_state,
      time_limit_s}: one-shot jobs, each in a fresh process of its own (``pid1_jobs.py``)
A reply with ``status == "fault"`` means the request itself was unusable (unknown session,
bad fields); ``message`` says why.
"""

from __future__ import annotations

import base64
import collections
import errno
import hashlib
import json
import os
import secrets
import selectors
import signal
import socket
import sys
import time

from . import pid1_cleanup, pid1_jobs, pid1_templates, protocol
from .limits import (
    BROKEN_MAX_CHARS,
    CHILD_SEND_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_OBSERVATION_CAP_BYTES,
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_SESSION_MEMORY_BYTES,
    DEFAULT_SESSION_NOFILE,
    DEFER_MAX_S,
    DESCRIBE_ERROR_CHARS,
    DESCRIBE_TRACEBACK_CHARS,
    MAX_FRAME_BYTES,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_SCHEMAS_BYTES,
    RECYCLE_MAX_PROBLEMS,
    SESSION_ID_MAX_CHARS,
    SESSION_STARTUP_S,
    SPAWN_RETRY_S,
    TOKEN_MAX_CHARS,
)
from .wire import call_failure_observation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

SOCKET_PATH = f"{protocol.SOCKET_DIR}/{protocol.SOCKET_NAME}"
TOKEN_PATH = f"{protocol.SOCKET_DIR}/{protocol.TOKEN_NAME}"
"""The per-container token is a file the host writes next to the socket and unlinks as
soon as the runner has connected. Neither it nor its path is in the runner's environment,
which gVisor's /proc/1/environ shows to every process of the same uid (it ignores
PR_SET_DUMPABLE): both paths are fixed (``protocol.SOCKET_DIR``)."""
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


_OOM_FD: list[int] = []
"""A read-only descriptor of the first readable file of OOM_FILES, kept open (:func:`_oom_kills`)."""


def _oom_kills() -> int:
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


def _discard_output(child: Child) -> None:
    """Drop what sits in a waiting process's stdout/stderr pipes before it gets its first
    request (it wrote nothing itself: anything there came from another process of the
    sandbox that opened the pipe, and must not be attributed to the job)."""
    for fd in (child.out_r, child.err_r):
        try:
            while os.read(fd, 65536):
                pass
        except OSError:  # EAGAIN: empty
            pass


def _stream() -> tuple[int, int]:
    """A one-way byte stream for a child's stdout or stderr: (runner's read end, child's
    write end). A socketpair rather than a pipe: under gVisor any process of the same
    uid can open another's pipes through /proc/<pid>/fd/<n> (it ignores
    PR_SET_DUMPABLE), while a socket cannot be opened that way (ENXIO, both runtimes)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.shutdown(socket.SHUT_WR)
    theirs.shutdown(socket.SHUT_RD)
    return ours.detach(), theirs.detach()


class Child:
    """A session child process and its three channels (control socketpair on fd 3,
    stdout/stderr streams the runner reads)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = _stream()
        err_r, err_w = _stream()
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
        try:  # first candidate for the kernel OOM killer, before the runner
            with open(f"/proc/{self.pid}/oom_score_adj", "w") as handle:
                handle.write("1000")
        except OSError:
            pass
        parent.settimeout(CHILD_SEND_TIMEOUT_S)
        self.sock = parent
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self.out_r = out_r
        self.err_r = err_r
        self.frames = protocol.FrameBuffer(MAX_FRAME_BYTES)
        self.alive = True
        self.booted = False
        """Whether the process has answered anything yet (``hello``, see ``pump``)."""

    @classmethod
    def adopt(cls, pid: int, sock: socket.socket, out_r: int, err_r: int) -> Child:
        """A session process forked from a template (``pid1_templates``), already verified
        as this runner's child and the leader of its own process session: from here on
        handled exactly like a spawned one."""
        child = cls.__new__(cls)
        try:  # first candidate for the kernel OOM killer, before the runner
            with open(f"/proc/{pid}/oom_score_adj", "w") as handle:
                handle.write("1000")
        except OSError:
            pass
        sock.settimeout(CHILD_SEND_TIMEOUT_S)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        child.pid, child.sock, child.out_r, child.err_r = pid, sock, out_r, err_r
        child.frames = protocol.FrameBuffer(MAX_FRAME_BYTES)
        child.alive = True
        child.booted = True  # forked from a running process: nothing left to start
        return child

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(protocol.encode(message))

    def kill(self) -> None:
        if self.alive:
            self.alive = False
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
        for fd in (self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.sock.close()


class Session:
    def __init__(self, sid: str, spec: dict[str, Any], workdir: str, limits: dict[str, Any]) -> None:
        self.sid = sid
        self.spec = spec  # source, class_name, init_config
        self.key = pid1_templates.template_key(spec["source"], spec["class_name"])
        self.workdir = workdir
        self.child: Child | None = None
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.current: dict[str, Any] | None = None  # in-flight item
        self.snapshot: dict[str, Any] = {}
        self.broken: str | None = None
        self.opened = False
        self.out = pid1_jobs.Output(limits["output_cap_bytes"])
        self.err = pid1_jobs.Output(limits["output_cap_bytes"])
        self.config: bytes | None = None
        """The ``init_config`` JSON bytes when it came by hash (``spec["init_config"]`` is None)."""
        self.config_hash: str | None = None
        self.forked_from: pid1_templates.Template | None = None
        """The config template the current child was forked from, until its init answers."""


class Runner:
    def __init__(self, sock: socket.socket, limits: dict[str, Any]) -> None:
        self.host = sock  # blocking: read only when the selector reports it readable
        self.limits = limits
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.host, selectors.EVENT_READ, ("host", None))
        self.host_frames = protocol.FrameBuffer(int(limits.get("max_request_bytes", MAX_FRAME_BYTES)))
        self.sessions: dict[str, Session] = {}
        self.by_pid: dict[int, Session] = {}
        self.spare: Child | None = None
        self.job_spare: Child | None = None
        """A process forked ahead from the ready jobs template, waiting for the next check
        batch (:meth:`_ensure_job_spare`): the batch's zygote then costs no fork on its path."""
        self.deferred: list[Callable[[], None]] = []
        """Process starts waiting for a quiet moment (:meth:`later`)."""
        self.deferred_due: float | None = None
        self.closed: set[str] = set()
        self.oom_seen = _oom_kills()
        self.timeout_s = float(limits["call_timeout_s"])
        self.startup_s = float(limits.get("session_startup_s", SESSION_STARTUP_S))
        """Seconds a new session process has to answer ``hello`` (see ``pump``)."""
        self.running = True
        self.jobs = pid1_jobs.Jobs(self, WORK_ROOT, _oom_kills)
        self.templates = pid1_templates.Templates(self)
        self.templates.make_child = Child.adopt
        self.configs = pid1_templates.Configs()
        self.baseline = pid1_cleanup.Baseline(WORK_ROOT)
        self.leftovers: list[str] = []
        """Work directories that could not be removed when their session or job ended."""
        self.tainted: list[str] = []
        """Why this sandbox must not be reused (a sweep that could not kill everything)."""

    # -- children --------------------------------------------------------------------
    def _session_limits(self) -> dict[str, Any]:
        return {
            "session_memory_bytes": self.limits["session_memory_bytes"],
            "memory_rlimit": self.limits.get("memory_rlimit", "data"),
            "observation_cap_bytes": self.limits["observation_cap_bytes"],
            "session_nofile": self.limits.get("session_nofile", DEFAULT_SESSION_NOFILE),
        }

    def _take_child(self) -> Child:
        child = self.spare if self.spare is not None and self.spare.alive else self._spawn()
        self.spare = None
        self.later(self._ensure_spare)
        return child

    def later(self, action: Callable[[], None]) -> None:
        """Run ``action`` (starting a spare or a template: a Python start-up, ~30 ms of
        the sandbox's CPU quota) once no call, open or job is in flight, so it does not
        compete with the request that made it necessary; at the latest DEFER_MAX_S
        seconds from now. Each action at most once per round."""
        if action not in self.deferred:
            self.deferred.append(action)
        if self.deferred_due is None:
            self.deferred_due = time.monotonic() + DEFER_MAX_S

    def _busy(self) -> bool:
        return bool(self.jobs.active) or any(s.current is not None for s in self.sessions.values())

    def _run_deferred(self) -> None:
        if not self.deferred or (self._busy() and time.monotonic() < (self.deferred_due or 0.0)):
            return
        actions, self.deferred, self.deferred_due = self.deferred, [], None
        for action in actions:
            action()

    def take_child(self) -> Child:
        """A fresh process for a one-shot job or a template (the spare when there is
        one). Raises OSError when none can be started (pids limit)."""
        return self._take_child()

    def spawn_child(self) -> Child:
        """A newly spawned process (never the spare, which may have been killed). Raises
        OSError when none can be started (pids limit)."""
        return self._spawn()

    def _session_child(self, session: Session, fresh: bool = False) -> Child:
        """The process for ``session``: for a ``fresh`` open (no snapshot) of a config
        sent by hash, forked from its ready config template; else forked from its
        environment's ready template; else the spare or a new one (``_take_child``). A
        seeded session (``seed``) is never forked from a template: it seeds ``random``
        before it runs the module and constructs the instance, as EnvScaler's reset does."""
        seeded = session.spec.get("seed") is not None  # its module and instance must come after the seed
        if fresh and session.config_hash is not None and not seeded:
            template = self.templates.config_template(session.key, session.config_hash)
            if template is not None:
                child = self.templates.fork(template.key, Child.adopt)
                if child is not None:
                    session.forked_from = template
                    return child
        if not session.spec.get("describe_only") and not seeded:
            child = self.templates.fork(session.key, Child.adopt)
            if child is not None:
                return child
        return self._take_child()

    def tracked_pids(self) -> set[int]:
        """Every process the runner follows: sessions', jobs', templates', the spares."""
        tracked = set(self.by_pid) | self.jobs.pids() | self.templates.pids()
        for spare in (self.spare, self.job_spare):
            if spare is not None:
                tracked.add(spare.pid)
        return tracked

    def jobs_ended(self, kind: str = "exec") -> None:
        """A one-shot job finished: keep a spare (the host asks for ``recycle`` before
        the sandbox serves anything else); after a check batch, start the jobs template
        (``pid1_templates``) for the next batches, now that this one has its reply, and,
        when the sandbox serves sessions (so no ``recycle`` follows), fork the next
        batch's process from it ahead (:meth:`_ensure_job_spare`; not in a sandbox
        without sessions, which is recycled next and then holds only the runner, the
        spare and the jobs template). Not while a batch runs: its checks would see one
        more process."""
        self._ensure_spare()
        if kind == "checks":
            self.templates.want_jobs()
            if self.sessions:
                self.later(self._ensure_job_spare)

    def _ensure_job_spare(self) -> None:
        """Fork a process from the ready jobs template ahead of the next check batch and
        keep it (``job_spare``), as ``_ensure_spare`` keeps a spawned one: it is a fresh
        process that never served a job, tracked like the spare (never a stray, reaped
        and forgotten when it dies, killed by ``recycle``). Forking it takes the
        template's fork, the intermediate process and the new process's own set-up
        (about 4 ms of the sandbox's CPU quota, measured) off the batch's path."""
        if self.job_spare is not None and self.job_spare.alive:
            return
        self.job_spare = self.templates.fork(pid1_templates.JOBS_KEY, Child.adopt)

    def job_child(self, kind: str) -> Child:
        """A fresh process for a one-shot job: for a check batch, the process forked ahead
        from the jobs template, else one forked from the ready jobs template now, else
        (and for ``exec``) the spare or a new one. Raises OSError when none can be
        started (pids limit)."""
        if kind == "checks":
            child = self.job_spare
            self.job_spare = None
            if child is not None and child.alive:
                _discard_output(child)
                return child
            if child is not None:
                child.kill()
            child = self.templates.fork(pid1_templates.JOBS_KEY, Child.adopt)
            if child is not None:
                return child
        return self._take_child()

    def remove_workdir(self, path: str) -> None:
        """Remove a finished session's or job's work directory; what cannot be removed
        now is retried by ``recycle`` (and makes it report the sandbox unclean)."""
        try:
            pid1_cleanup.remove(path)
        except OSError:
            self.leftovers.append(path)

    def _ensure_spare(self) -> None:
        if self.limits.get("spare_child", True) and (self.spare is None or not self.spare.alive):
            if len(self.sessions) < int(self.limits.get("max_sessions", 1)):
                try:
                    self.spare = Child(self._session_limits())
                except OSError:  # pids limit reached: the spare is only an optimisation
                    self.spare = None

    def _spawn(self) -> Child:
        """A new session process. At the pids limit (processes just killed, e.g. a fork
        bomb's, are not reaped yet) collect exited strays and retry for up to SPAWN_RETRY_S."""
        deadline = time.monotonic() + SPAWN_RETRY_S
        while True:
            try:
                return Child(self._session_limits())
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                self._reap_untracked()
                time.sleep(0.005)

    def _reap_untracked(self) -> None:
        """Reap exited children that are neither a session's process nor the spare (those
        are left to :meth:`reap`, which acts on their death)."""
        tracked = self.tracked_pids()
        for pid in pid1_cleanup.scan():
            if pid != os.getpid() and pid not in tracked:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def _attach(self, session: Session, child: Child) -> None:
        session.child = child
        self.by_pid[child.pid] = session
        self.sel.register(child.sock, selectors.EVENT_READ, ("ctrl", session))
        self.sel.register(child.out_r, selectors.EVENT_READ, ("out", session))
        self.sel.register(child.err_r, selectors.EVENT_READ, ("err", session))

    def _detach(self, session: Session) -> None:
        child = session.child
        if child is None:
            return
        for obj in (child.sock, child.out_r, child.err_r):
            try:
                self.sel.unregister(obj)
            except (KeyError, ValueError, OSError):
                pass
        child.kill()
        self.by_pid.pop(child.pid, None)
        session.child = None

    # -- host side -------------------------------------------------------------------
    def reply(self, message: dict[str, Any]) -> None:
        # "replace": a lone surrogate that a session escaped into its JSON (valid JSON,
        # not encodable as UTF-8) becomes "?" instead of an exception in PID 1
        self.host.sendall(protocol.encode(message, errors="replace"))

    def fault(self, request_id: object, message: str) -> None:
        self.reply({"id": request_id, "status": "fault", "message": message})

    def on_host_message(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        op = msg.get("op")
        if op == "ping":
            self.reply({"id": rid, "status": "ok", "sessions": len(self.sessions), "pid": os.getpid(),
                        "templates": self.templates.stats()})
            return
        if op == "recycle":
            self.recycle(rid)
            return
        if op in ("exec", "checks"):
            self.jobs.start(rid, msg)
            return
        sid = msg.get("session")
        if not isinstance(sid, str) or not sid or len(sid) > SESSION_ID_MAX_CHARS:
            self.fault(rid, "field 'session' must be a non-empty string")
            return
        if op == "open":
            self.open_session(rid, sid, msg)
            return
        session = self.sessions.get(sid)
        if session is None:
            self.fault(rid, f"unknown session {sid!r}")
            return
        if op == "close":
            self.close_session(session)
            self.reply({"id": rid, "status": "ok"})
            return
        if op not in ("call", "state", "snapshot", "restore", "describe"):
            self.fault(rid, f"unknown op {op!r}")
            return
        session.queue.append({"rid": rid, "msg": msg})
        self.pump(session)

    def open_session(self, rid: object, sid: str, msg: dict[str, Any]) -> None:
        if sid in self.sessions:
            self.fault(rid, f"session {sid!r} already exists")
            return
        if len(self.sessions) >= int(self.limits.get("max_sessions", 1)):
            self.fault(rid, "sandbox is full")
            return
        if sid in self.closed:
            self.fault(rid, f"session {sid!r} was closed; session ids are single-use")
            return
        spec = {k: msg.get(k) for k in ("source", "class_name", "init_config")}
        spec["describe_only"] = msg.get("describe_only") is True
        seed = msg.get("seed")
        if seed is not None:
            if type(seed) is not int or not 0 <= seed < 2 ** 64:
                self.fault(rid, "field 'seed' must be an integer from 0 to 2**64 - 1")
                return
            spec["seed"] = seed  # EnvScaler's reset(seed): random is seeded before the constructor runs
        if not isinstance(spec["source"], str) or not isinstance(spec["class_name"], str):
            self.fault(rid, "fields 'source' and 'class_name' must be strings")
            return
        if spec["init_config"] is not None and not isinstance(spec["init_config"], dict):
            self.fault(rid, "field 'init_config' must be an object")
            return
        config_hash, config = msg.get("config_hash"), None
        if config_hash is not None:
            if not isinstance(config_hash, str) or len(config_hash) != 64 or spec["init_config"] is not None:
                self.fault(rid, "field 'config_hash' must be a SHA-256 hex digest, without 'init_config'")
                return
            if msg.get("config_b64") is not None:
                try:
                    data = base64.b64decode(msg["config_b64"], validate=True)
                except (TypeError, ValueError):
                    data = b""
                if not self.configs.put(config_hash, data):
                    self.fault(rid, "field 'config_b64' does not match 'config_hash'")
                    return
            config = self.configs.get(config_hash)
            if config is None:
                self.reply({"id": rid, "status": "fault", "message": "unknown config", "missing_config": True})
                return
        workdir = os.path.join(WORK_ROOT, secrets.token_hex(16))
        os.mkdir(workdir, 0o700)
        session = Session(sid, spec, workdir, self.limits)
        session.config, session.config_hash = config, config_hash
        self.sessions[sid] = session
        session.queue.append({"internal": "init", "rid": rid, "snapshot": msg.get("snapshot")})
        self.pump(session)
        key = session.key  # templates start after the open's reply (or DEFER_MAX_S)
        self.later(lambda: self.templates.want(key, spec))
        if config is not None and config_hash is not None and not spec["describe_only"]:
            self.later(lambda: self.templates.want_config(key, config_hash, config))

    def close_session(self, session: Session) -> None:
        self._detach(session)
        self.sessions.pop(session.sid, None)
        self.closed.add(session.sid)
        for item in session.queue:
            if item.get("rid") is not None:
                self.fault(item["rid"], "session closed")
        session.queue.clear()
        self.sweep_strays()
        self.remove_workdir(session.workdir)
        self._ensure_spare()

    def recycle(self, rid: object) -> None:
        """Host request ``recycle {}`` -> ``{status: ok, clean, problems}``, sent when the
        host's last session or job of this sandbox has ended and before the sandbox goes
        back to the warm pool. With no session and no job left: every process but PID 1
        is killed (the spare too, which lived beside the previous sessions), the writable
        places are emptied and proven empty (``pid1_cleanup.reset``), a fresh spare is started.
        ``clean`` is False (with ``problems`` saying why) when anything could not be
        emptied or proven empty, when a session or job is still open, or when an earlier
        sweep failed: the host then destroys the sandbox instead of reusing it."""
        if self.sessions or self.jobs.active:
            busy = f"{len(self.sessions)} sessions and {len(self.jobs.active)} jobs are still open"
            self.reply({"id": rid, "status": "ok", "clean": False, "problems": [busy]})
            return
        for spare in (self.spare, self.job_spare):
            if spare is not None:
                spare.kill()
        self.spare = self.job_spare = None
        self.deferred, self.deferred_due = [], None  # what was wanted before is not wanted now
        had_jobs_template = self.templates.clear()
        self.configs.clear()
        self.closed.clear()  # session ids only need to be unique while the sandbox is in use
        problems = list(self.tainted) + pid1_cleanup.reset(WORK_ROOT, self.leftovers, self.baseline)
        self.leftovers = []
        self.tainted = problems[:]
        self.reply({"id": rid, "status": "ok", "clean": not problems, "problems": problems[:RECYCLE_MAX_PROBLEMS]})
        self._ensure_spare()
        if had_jobs_template and not problems:  # a sandbox that served check batches serves more
            self.templates.want_jobs()  # (fresh processes, started after the emptiness proof)

    # -- dispatch to child -----------------------------------------------------------
    def pump(self, session: Session) -> None:
        """Send the next queued item to the session's child if it is idle; start a child
        (init from source + restore of the last snapshot) first when it has none."""
        while session.current is None and session.queue:
            item = session.queue[0]
            is_init = item.get("internal") == "init"
            msg = item.get("msg")
            if session.broken and not is_init:
                session.queue.popleft()
                self.reply({"id": item["rid"], "status": "crashed",
                            "observation": f"Error: session cannot be restored: {session.broken}"})
                continue
            if msg is not None and msg["op"] == "snapshot":
                session.queue.popleft()
                self.reply({"id": item["rid"], "status": "ok", "snapshot": session.snapshot})
                continue
            if session.child is None:
                if not is_init:
                    session.queue.appendleft({"internal": "init", "snapshot": session.snapshot})
                fresh = is_init and item.get("rid") is not None and not item.get("snapshot") and not session.opened
                self._attach(session, self._session_child(session, fresh))
                continue
            session.queue.popleft()
            token = secrets.token_hex(16)
            raw: dict[str, bytes] = {}
            if is_init and session.forked_from is not None:  # the instance exists already
                request = {"op": "init", "id": token, "workdir": session.workdir, "from_template": True,
                           "source": session.spec["source"], "class_name": session.spec["class_name"]}
            elif is_init:
                request = {"op": "init", "id": token, "workdir": session.workdir, **session.spec,
                           "snapshot": item.get("snapshot")}
                if session.config is not None:  # the host's bytes, forwarded without parsing
                    request.pop("init_config", None)
                    raw["init_config"] = session.config
            else:
                assert msg is not None  # only the internal init item has no host message
                request = {"op": msg["op"], "id": token}
                if msg["op"] == "call":
                    request["name"] = msg.get("name")
                    request["arguments"] = msg.get("arguments")
                    if msg.get("rules") == "envscaler":  # EnvScaler's step(): hasattr decides what a call is
                        request["rules"] = "envscaler"
                    self._drain(session, discard=True)  # output between calls belongs to nobody
                elif msg["op"] == "describe":
                    self._drain(session, discard=True)
                elif msg["op"] == "restore":
                    if not isinstance(msg.get("snapshot"), dict):
                        self.fault(item["rid"], "field 'snapshot' must be an object")
                        continue
                    request["snapshot"] = msg["snapshot"]
            item["token"] = token
            session.current = item
            try:
                frame = protocol.encode_raw(request, raw) if raw else protocol.encode(request)
                if session.child.booted:
                    item.pop("hello", None)  # a re-queued item is timed afresh
                    item["deadline"] = time.monotonic() + self.timeout_s
                else:  # a new process: its start is not the request's time (``hello``)
                    item["hello"] = secrets.token_hex(16)
                    item["deadline"] = time.monotonic() + self.startup_s
                    frame = protocol.encode({"op": "hello", "id": item["hello"]}) + frame
                session.child.sock.sendall(frame)
            except (OSError, ValueError, TypeError):
                self.child_failed(session, "crashed", note="request could not be delivered")

    def _drain(self, session: Session, discard: bool = False) -> None:
        child = session.child
        if child is None:
            return
        for fd, capture in ((child.out_r, session.out), (child.err_r, session.err)):
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if not chunk:
                    break
                if not discard:
                    capture.add(chunk)
        if discard:
            session.out.take()
            session.err.take()

    def _read_final_frames(self, session: Session) -> None:
        """Process the frames a child wrote before it exited (e.g. its ``oom`` reply just
        before ``os._exit``), which may still sit in the socket when its death is reaped."""
        child = session.child
        while child is not None and session.child is child and session.current is not None:
            data = protocol.recv_ready(child.sock)
            if not data:
                return
            try:
                messages = child.frames.feed(data)
            except protocol.ProtocolViolation:
                return
            for msg in messages:
                if session.child is not child:
                    return
                self.on_child_message(session, msg)

    def on_child_message(self, session: Session, msg: dict[str, Any]) -> None:
        item = session.current
        if item is not None and "hello" in item and msg.get("id") == item["hello"]:
            # the new process runs and reads the request sent right behind ``hello``:
            # the request's own time limit starts now
            del item["hello"]
            if session.child is not None:
                session.child.booted = True
            item["deadline"] = time.monotonic() + self.timeout_s
            return
        if item is None or msg.get("id") != item["token"]:
            return  # unsolicited or stale frame: ignored, cannot answer anything
        session.current = None
        status = msg.get("status")
        if status not in ("ok", "error", "rejected", "oom"):
            self.child_failed(session, "crashed", item=item, note="malformed reply from session")
            return
        if status == "oom":
            session.current = item
            self.child_failed(session, "oom", item=item)
            return
        kind = item.get("internal") or item["msg"]["op"]
        rid = item.get("rid")
        if kind == "init":
            if status != "ok":
                if item.get("rid") is None:  # a respawn failed: the session is unusable
                    session.broken = str(msg.get("observation"))[:BROKEN_MAX_CHARS]
                    self._detach(session)
                else:
                    self.reply({"id": rid, "status": status, "observation": msg.get("observation"),
                                "traceback": msg.get("traceback")})
                    self.close_session(session)
                    return
            else:
                template = session.forked_from
                if template is not None and (template.snapshot is None or msg.get("from_template") is not True):
                    self.child_failed(session, "crashed", item=item, note="malformed reply from session")
                    return
                session.forked_from = None
                session.opened = True
                retyped = {"retyped": msg["retyped"]} if isinstance(msg.get("retyped"), list) else {}
                if template is not None and template.snapshot is not None:
                    session.snapshot = dict(template.snapshot)  # entries are replaced, never changed in place
                    if rid is not None:
                        self.reply({"id": rid, "status": "ok", "template": True, "snapshot_digest": template.digest,
                                    **retyped})
                    self.pump(session)
                    return
                delta = msg.get("delta") or {}
                session.snapshot = dict(delta.get("set") or {})
                if rid is not None:
                    text = protocol.snapshot_text(session.snapshot)
                    self.host.sendall(protocol.encode_raw(
                        {"id": rid, "status": "ok", "snapshot_digest": hashlib.sha256(text).hexdigest(), **retyped},
                        {"snapshot": text}, errors="replace"))
        elif kind == "call":
            self._drain(session)
            delta = msg.get("delta") or {"set": {}, "del": []}
            if status in ("ok", "error"):
                for key, value in (delta.get("set") or {}).items():
                    if isinstance(value, list) and len(value) == 2 and value[0] == "k":
                        value = protocol.apply_keyed(session.snapshot.get(key), value[1])
                        if value is None:  # our snapshot can no longer follow the session
                            self.child_failed(session, "crashed", item=item, note="malformed keyed delta")
                            return
                    session.snapshot[key] = value
                for key in delta.get("del") or []:
                    session.snapshot.pop(key, None)
            out = {
                "id": rid, "status": status, "observation": msg.get("observation"),
                "duration_ms": msg.get("duration_ms"), "stdout": session.out.take(),
                "stderr": session.err.take(), "delta": delta,
            }
            for extra in ("traceback", "observation_truncated"):
                if msg.get(extra):
                    out[extra] = msg[extra]
            self.sweep_strays(session)  # before the reply: no leftover outlives the call
            self.reply(out)
        elif kind == "state":
            self.reply({"id": rid, "status": "ok", "state": msg.get("state")})
        elif kind == "describe":
            self._drain(session, discard=True)  # what introspection printed is nobody's output
            self.reply(_describe_reply(rid, status, msg))
        elif kind == "restore":
            delta = msg.get("delta") or {}
            session.snapshot = dict(delta.get("set") or {})
            self.reply({"id": rid, "status": "ok", "snapshot": session.snapshot})
        self.pump(session)

    def child_failed(self, session: Session, status: str, item: dict[str, Any] | None = None, note: str = "") -> None:
        """The child timed out, ran out of memory or died: kill it, answer the in-flight
        request with ``status``, and schedule re-creation from the last good snapshot."""
        item = item or session.current
        session.current = None
        template, session.forked_from = session.forked_from, None
        if template is not None and item is not None and item.get("internal") == "init" and not session.opened:
            # forked from a config template and it went wrong: that template is not used
            # again, and the open is retried the normal way (construction from the config)
            self.templates.fail(template, f"a forked session failed ({status})")
            if session.child is not None:
                self._drain(session, discard=True)
            self._detach(session)
            self.sweep_strays()
            session.queue.appendleft(item)
            self.pump(session)
            return
        oom_now = _oom_kills()
        if status == "crashed" and oom_now > self.oom_seen:
            status = "oom"
        self.oom_seen = oom_now
        if session.child is not None:
            self._drain(session)
        self._detach(session)
        self.sweep_strays()
        observation = call_failure_observation(status, self.timeout_s, note)
        if item is not None:
            kind = item.get("internal") or item["msg"]["op"]
            rid = item.get("rid")
            if kind == "init" and rid is not None and not session.opened:
                self.reply({"id": rid, "status": status, "observation": observation})
                self.close_session(session)
                return
            if kind == "init" and rid is None:
                session.broken = observation
            elif rid is not None:
                self.reply({"id": rid, "status": status, "observation": observation,
                            "stdout": session.out.take(), "stderr": session.err.take(),
                            "delta": {"set": {}, "del": []}})
        if session.sid in self.sessions and not session.broken:
            session.queue.appendleft({"internal": "init", "snapshot": session.snapshot})
            self.pump(session)

    def sweep_strays(self, session: Session | None = None) -> None:
        """Kill processes a call left behind, with certainty (``pid1_cleanup.sweep``): members
        of ``session``'s process session other than its child, and every process outside
        all known sessions (escaped with setsid). Returns once none of them is alive;
        if some still live after ``limits.SWEEP_DEADLINE_S`` the sandbox is marked
        tainted and ``recycle`` will refuse it.

        Only when the runner is PID 1 of its own pid namespace (always, in a sandbox):
        elsewhere /proc would show processes that are not ours."""
        if os.getpid() != 1:
            return
        templates = self.templates.pids()
        settled = self.templates.ready_pids()
        known = {s.child.pid for s in self.sessions.values() if s.child is not None} | self.jobs.pids() | templates
        for spare in (self.spare, self.job_spare):
            if spare is not None:
                known.add(spare.pid)
        me = os.getpid()
        try:
            pids = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        except OSError:
            return
        if pids <= known | {me}:
            return  # nothing but the runner, its sessions and the spare
        own = session.child.pid if session is not None and session.child is not None else None

        def stray(pid: int, sid: int) -> bool:
            if pid in known:
                return False
            # not another running session's; a ready template's process session holds only
            # it (a loading one's may hold its construction probe: Templates.ready_pids)
            return sid not in known or sid == own or sid in settled

        tracked = self.tracked_pids()

        def reap(pid: int) -> None:
            if pid not in tracked:
                pid1_cleanup.reap_pid(pid)

        if not pid1_cleanup.sweep(stray, reap=reap):
            self.tainted.append("a sweep left processes alive")

    # -- loop ------------------------------------------------------------------------
    def reap(self) -> None:
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.jobs.by_pid:
                self.jobs.on_exit(pid, wait_status)
                continue
            if self.templates.by_pid(pid) is not None:
                self.templates.on_exit(pid)
                continue
            session = self.by_pid.get(pid)
            if session is not None and session.child is not None and session.child.pid == pid:
                child = session.child
                child.alive = False
                if session.current is not None:
                    self._read_final_frames(session)  # a reply sent just before exiting wins
                if session.child is not child:
                    pass  # that reply already failed the child over to a new one
                elif session.current is not None:
                    self.child_failed(session, "crashed")
                else:
                    self._detach(session)
            if self.spare is not None and self.spare.pid == pid:
                self.spare.alive = False
                self.spare.kill()
                self.spare = None
            if self.job_spare is not None and self.job_spare.pid == pid:
                self.job_spare.alive = False
                self.job_spare.kill()
                self.job_spare = None

    def check_deadlines(self) -> float:
        now = time.monotonic()
        wait = float(self.limits.get("poll_interval_s", 1.0))
        for session in list(self.sessions.values()):
            item = session.current
            if item is None:
                continue
            remaining = item["deadline"] - now
            if remaining <= 0 and "hello" in item:
                self.child_failed(session, "crashed",
                                  note=f"the new session process did not start within {self.startup_s:g} s")
            elif remaining <= 0:
                self.child_failed(session, "timeout")
            else:
                wait = min(wait, remaining)
        job_wait = self.jobs.check_deadlines(now)
        if job_wait is not None:
            wait = min(wait, job_wait)
        template_wait = self.templates.check_deadlines(now)
        if template_wait is not None:
            wait = min(wait, template_wait)
        return wait

    def on_readable(self, kind: str, owner: Session | pid1_jobs.Job | pid1_templates.Template | None,
                    obj: Any) -> None:
        """``obj`` (registered as ``(kind, owner)``) is readable: the host socket, the wake-up
        socket, or a session's or job's control socket or output stream."""
        if kind == "wake":  # SIGCHLD: the loop goes on to reap()
            try:
                while obj.recv(4096):
                    pass
            except OSError:
                pass
            return
        if kind.startswith("job-"):
            assert isinstance(owner, pid1_jobs.Job)
            self.jobs.on_readable(kind, owner)
            return
        if kind.startswith("tmpl"):
            assert isinstance(owner, pid1_templates.Template)
            self.templates.on_readable(kind, owner, obj)
            return
        if kind == "host":
            try:
                data = self.host.recv(1 << 20)
            except BlockingIOError:
                return
            if not data:
                self.running = False
                return
            for msg in self.host_frames.feed(data):
                try:
                    self.on_host_message(msg)
                except Exception as exc:  # noqa: BLE001 - a bad request must not kill the runner
                    sys.stderr.write(f"sandpit-runner: request failed: {exc!r}\n")
                    self.fault(msg.get("id"), f"runner error: {type(exc).__name__}: {exc}")
            return
        assert isinstance(owner, Session)
        session = owner
        child = session.child
        if child is None:
            return
        if kind == "ctrl":
            received = protocol.recv_ready(child.sock)
            if received is None:
                return
            if not received:
                if session.current is not None:
                    self.child_failed(session, "crashed", note="closed its control channel")
                else:
                    self._detach(session)
                return
            try:
                messages = child.frames.feed(received)
            except protocol.ProtocolViolation as exc:
                self.child_failed(session, "crashed", note=str(exc)[:200])
                return
            for msg in messages:
                if session.child is not child:
                    break
                self.on_child_message(session, msg)
            return
        fd = child.out_r if kind == "out" else child.err_r
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            return
        (session.out if kind == "out" else session.err).add(chunk)

    def _wake_on_child_exit(self) -> None:
        """Make a child's exit wake the event loop (SIGCHLD through a wakeup fd), so a
        job's exit status is collected at once, not at the next poll. Signals from
        sessions are then no longer ignored for SIGCHLD only, which just wakes the loop."""
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        reader.setblocking(False)
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self._wakeup = (reader, writer)
        self.sel.register(reader, selectors.EVENT_READ, ("wake", None))

    def run(self) -> None:
        self._wake_on_child_exit()
        self._ensure_spare()
        while self.running:
            timeout = self.check_deadlines()
            if self.deferred_due is not None:
                timeout = max(0.0, min(timeout, self.deferred_due - time.monotonic()))
            for key, _ in self.sel.select(timeout):
                kind, session = key.data
                try:
                    self.on_readable(kind, session, key.fileobj)
                except protocol.ProtocolViolation as exc:
                    sys.stderr.write(f"sandpit-runner: host protocol violation: {exc}\n")
                    self.running = False
                    break
            self.reap()
            self._run_deferred()


def _describe_reply(rid: object, status: object, msg: dict[str, Any]) -> dict[str, Any]:
    """The host reply to a ``describe`` answered by a child. Nothing the child sends is
    trusted: ``tools`` must be a list and encode to at most MAX_SCHEMAS_BYTES, ``notes``
    a short list of strings, an error's observation/traceback are cut to 4 KiB; anything
    else becomes an ``error`` result (the host validates each schema's shape)."""
    if status != "ok":
        out = {"id": rid, "status": status, "observation": str(msg.get("observation"))[:DESCRIBE_ERROR_CHARS]}
        if isinstance(msg.get("traceback"), str):
            out["traceback"] = msg["traceback"][:DESCRIBE_TRACEBACK_CHARS]
        return out
    tools = msg.get("tools")
    notes = msg.get("notes")
    if not isinstance(tools, list) or not isinstance(notes, list) or len(notes) > MAX_NOTES:
        return {"id": rid, "status": "error", "observation": "Error: malformed describe reply from the session"}
    try:
        size = len(protocol.encode({"tools": tools}, errors="replace"))
    except (TypeError, ValueError, RecursionError):
        size = MAX_SCHEMAS_BYTES + 1
    if size > MAX_SCHEMAS_BYTES + 64:  # frame header and key
        return {"id": rid, "status": "error",
                "observation": f"Error: tool schemas exceed {MAX_SCHEMAS_BYTES} bytes"}
    return {"id": rid, "status": "ok", "tools": tools, "notes": [str(n)[:MAX_NOTE_CHARS] for n in notes]}


def connect(path: str, deadline_s: float) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if time.monotonic() > end or exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                raise
            time.sleep(0.01)


def read_token(path: str = TOKEN_PATH) -> str:
    """The one-time token from the file the host wrote ("" when absent: the host then
    refuses the hello)."""
    try:
        with open(path) as handle:
            return handle.read(TOKEN_MAX_CHARS).strip()
    except OSError:
        return ""


def main() -> None:
    token = read_token()
    limits = json.loads(os.environ.pop("SANDPIT_LIMITS", "{}"))
    limits.setdefault("call_timeout_s", DEFAULT_CALL_TIMEOUT_S)
    limits.setdefault("session_memory_bytes", DEFAULT_SESSION_MEMORY_BYTES)
    limits.setdefault("output_cap_bytes", DEFAULT_OUTPUT_CAP_BYTES)
    limits.setdefault("observation_cap_bytes", DEFAULT_OBSERVATION_CAP_BYTES)
    try:  # non-dumpable: sessions (same uid) cannot read our memory, environ or fds
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass
    os.umask(0o077)
    try:  # outside a container (not PID 1): orphans of templates' forks come back to us
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass
    # PID 1 of the sandbox: with no handler, signals from sessions (same uid) are ignored by
    # the kernel; Python's default SIGINT handler would let a session stop the runner.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sock = connect(SOCKET_PATH, CONNECT_TIMEOUT_S)
    sock.sendall(protocol.encode({"op": "hello", "token": token, "pid": os.getpid()}))
    _detach_stdio()
    Runner(sock, limits).run()


def _detach_stdio() -> None:
    """Point fds 0-2 at /dev/null once connected. Docker's stdin and log pipes are host
    files that gVisor lets any process of the runner's uid open through /proc/1/fd
    (measured: it ignores PR_SET_DUMPABLE), which would let a session write into or read
    from the container's log. Costs the runner's own diagnostics after start-up (only
    the start-up output is ever read, by ``Sandbox.start`` on failure)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
