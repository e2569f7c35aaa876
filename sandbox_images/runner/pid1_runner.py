"""PID 1 of every sandbox container: start-up, host dispatch, recycle (stdlib only; PID 1
never runs environment code).

It connects to the host's protocol endpoint (``pid1_host``: a Unix socket bind-mounted at
``/run/sandpit/runner.sock``, proven with the per-container token read from the file
``/run/sandpit/token``, never from the environment), then serves length-prefixed JSON
requests (``protocol.py``) from one single-threaded event loop (``pid1_loop``)::

    host socket ──► PID 1 (trusted) ──► session process 1 (untrusted env code)   pid1_sessions
                                    ├──► session process 2 ...
                                    ├──► one-shot job: a script or a check batch   pid1_jobs
                                    ├──► spare (started ahead, no code yet)        pid1_children
                                    └──► templates (shared sandboxes: module executed
                                         once, sessions forked from it)            pid1_templates

Every process that runs untrusted code is PID 1's child, in its own process session, with
its own private working directory (``/work/<random>``; the parent is not listable),
non-dumpable, with RLIMIT_DATA (RLIMIT_AS under gVisor) as its memory limit and a seccomp
filter (``child_spare.py``, ``child_confine.py``). The host channel is never inherited by
a child; each child's stdout/stderr are socket streams read here and capped, so nothing
the environment prints can forge a protocol message. A child's timeout, memory exhaustion
or death is a result (``timeout``/``oom``/``crashed``), never a crash of PID 1; after every
call and job, and before its reply, what it left behind is killed (``pid1_cleanup``).

This module wires the parts (each receives the loop, the host channel and the process
table it needs; none of them knows the runner), answers ``ping`` and ``recycle`` itself,
and hands every other request to the part that owns it.

The messages are those of ``protocol.py`` (a ``TypedDict`` each); a request that is
unusable (unknown op or session, bad fields) is answered ``fault``.
"""

from __future__ import annotations

import json
import os
import signal
import socket

from . import pid1_cleanup, pid1_host
from .limits import (
    CONNECT_TIMEOUT_S,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_OBSERVATION_CAP_BYTES,
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_SESSION_MEMORY_BYTES,
    MAX_FRAME_BYTES,
    RECYCLE_MAX_PROBLEMS,
)
from .pid1_children import WORK_ROOT, Children
from .pid1_groups import GroupingHost, handle_calls
from .pid1_host import Host
from .pid1_jobs import Jobs
from .pid1_loop import Loop
from .pid1_sessions import Sessions
from .pid1_templates import Templates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox


class Runner:
    """PID 1's parts, wired (module docstring). ``sock`` is the connected host socket,
    ``limits`` the sandbox's (``SANDPIT_LIMITS`` with defaults, :func:`main`)."""

    def __init__(self, sock: socket.socket, limits: dict[str, Any], work_root: str = WORK_ROOT) -> None:
        self.limits = limits
        self.work_root = work_root
        self.loop = Loop(float(limits.get("poll_interval_s", 1.0)))
        self.host = Host(sock, self.loop, int(limits.get("max_request_bytes", MAX_FRAME_BYTES)), self.on_host_message)
        self.children = Children(self.loop, limits, work_root)
        self.templates = Templates(self.loop, self.children, limits)
        self.grouping = GroupingHost(self.host)
        self.sessions = Sessions(self.loop, self.grouping, self.children, self.templates, limits)
        self.jobs = Jobs(self.loop, self.host, self.children, self.templates, limits)
        self.baseline = pid1_cleanup.Baseline(work_root)
        self.untouched = True
        """No request but ``ping``, ``recycle`` and ``checks`` came since the start or the
        last recycle (no session was opened, no script run): with ``Jobs.kept_only`` the
        condition of a light recycle (:meth:`recycle`)."""

    def on_host_message(self, msg: Any) -> None:
        """One host request: ``ping`` and ``recycle`` here, ``exec``/``checks`` to the
        jobs, ``calls`` to the sessions as a group (``pid1_groups``), everything else to the sessions (which answer an unknown op ``fault``)."""
        rid = msg.get("id")
        op = msg.get("op")
        if op == "ping":
            self.host.reply({"id": rid, "status": "ok", "sessions": len(self.sessions.by_sid), "pid": os.getpid(),
                             "templates": self.templates.stats(), "sweeps": dict(self.children.sweeps),
                             "deferred": len(self.loop.deferred)})
        elif op == "recycle":
            self.recycle(rid)
            return
        self.children.code_ran = True  # every other request may run untrusted code
        if op == "calls":
            self.untouched = False
            handle_calls(self.grouping, self.sessions.handle, rid, msg)
        elif op in ("exec", "checks"):
            self.untouched = self.untouched and op == "checks"
            self.jobs.start(rid, msg)
        else:
            self.untouched = False
            self.sessions.handle(rid, op, msg)

    def recycle(self, rid: object) -> None:
        """Host request ``recycle {}`` -> ``{status: ok, clean, problems}``, sent when the
        host's last session or job of this sandbox has ended and before the sandbox goes
        back to the warm pool. With no session and no job left: every process but PID 1
        is killed (the spares too, which lived beside the previous sessions), the writable
        places are emptied and proven empty (``pid1_cleanup.reset``), a fresh spare is started.
        With ``spares_from_template`` the jobs template is kept when it is clean
        (``Templates.keepable_jobs``: the reset's passes kill every other process), or a new
        one is started and the answer waits until it is ready (or failed); the spare is then
        forked from it once the loop is quiet.
        ``clean`` is False (with at most RECYCLE_MAX_PROBLEMS ``problems`` saying why) when
        anything could not be emptied or proven empty, when a session or job is still open,
        or when an earlier sweep failed: the host then destroys the sandbox instead of
        reusing it.

        A light recycle keeps the processes instead, when the sandbox only served check
        batches since its start or last recycle and every one of them ran all its checks
        in place, in a zygote it kept (``Jobs.kept_only``): no code but read-only checks
        ran, which start no process and write nothing (``child_readonly``), so the spare,
        the jobs template and the kept zygote are as they were. It sweeps (anything
        untracked is killed) and proves the writable places empty as above
        (``pid1_cleanup.empty_places``); any problem there makes it a full recycle."""
        if self.sessions.by_sid or self.jobs.active:
            busy = f"{len(self.sessions.by_sid)} sessions and {len(self.jobs.active)} jobs are still open"
            self.host.reply({"id": rid, "status": "ok", "clean": False, "problems": [busy]})
            return
        light = self.untouched and self.jobs.kept_only and not self.children.tainted
        self.untouched, self.jobs.kept_only = True, True
        if light:
            self.children.sweep()
            workdirs, self.children.leftovers = self.children.leftovers, []
            problems = list(self.children.tainted) + pid1_cleanup.empty_places(self.work_root, workdirs, self.baseline)
            if not problems:
                self.sessions.recycle()
                self.host.reply({"id": rid, "status": "ok", "clean": True, "problems": []})
                return
        children = self.children
        keep = None if children.tainted else self.templates.keepable_jobs()
        children.kill_spare()
        self.jobs.kill_spare()
        self.loop.cancel_deferred()  # what was wanted before is not wanted now
        had_jobs_template = self.templates.clear(keep)
        self.sessions.recycle()  # session ids only need to be unique while the sandbox is in use
        problems = list(children.tainted) + pid1_cleanup.reset(self.work_root, children.leftovers, self.baseline,
                                                               keep=keep.child.pid if keep is not None else None)
        children.leftovers = []
        children.tainted = problems[:]
        children.code_ran = False  # every process that ran code is dead, proven by the reset

        templates = self.templates

        def answer() -> None:
            self.host.reply({"id": rid, "status": "ok", "clean": not problems,
                             "problems": problems[:RECYCLE_MAX_PROBLEMS]})

        if templates.spares_from_jobs():  # the spare forks from the template: once the loop is quiet
            if keep is None and not problems:  # a new one, answered once ready: before any code can run
                templates.want_jobs()
            templates.when_jobs_settled(answer)
            self.loop.later(children.ensure_spare, quiet=True)
            return
        answer()
        children.ensure_spare()
        if had_jobs_template and not problems:  # a sandbox that served check batches serves more
            templates.want_jobs()  # (fresh processes, started after the emptiness proof)

    def run(self) -> None:
        """Have children's exits wake the loop, start the jobs template with
        ``spares_from_template`` (``pid1_templates``: it forks the spares once ready, and
        is kept through recycles when it was ready before the first request) and the
        spare, then serve until the host closes the channel or breaks the protocol."""
        self.loop.wake_on_child_exit()
        if self.templates.spares_from_jobs():
            self.templates.want_jobs()
        self.children.ensure_spare()
        self.loop.run()


def main() -> None:
    """PID 1's entry point (the image's boot line): read the token, apply the limits'
    defaults, make PID 1 non-dumpable and the reaper of its orphans, connect to the host,
    say hello, detach the standard streams, and run until the host goes away. Raises
    OSError when the host's socket cannot be reached within CONNECT_TIMEOUT_S."""
    token = pid1_host.read_token()
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
    sock = pid1_host.connect(pid1_host.SOCKET_PATH, CONNECT_TIMEOUT_S)
    pid1_host.hello(sock, token)
    pid1_host.detach_stdio()
    Runner(sock, limits).run()
