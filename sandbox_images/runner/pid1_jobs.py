"""One-shot jobs of PID 1: scripts and check-function batches, each in a fresh process
that never served an environment session (stdlib only; the job's code runs in the child,
``child_oneshot.py``, never here).

A job gets a fresh process (for a check batch, one forked from the jobs template,
``pid1_templates``; else the spare, ``pid1_children``), a private empty work directory and
one request; its output streams are read and capped, its control channel read frame by
frame with a size cap, its deadline checked in the loop, its exit reaped. When it ends,
its process group is killed, what it left behind swept, its work directory removed.

``exec`` (``protocol.ExecRequest`` -> ``ExecReply``): ``ok`` (exit 0), ``error`` (non-zero
exit; an uncaught exception exits 1), ``timeout`` (killed at ``time_limit_s``, at most the
profile's ``call_timeout_s``), ``oom`` (an uncaught MemoryError, or the kernel's OOM
killer), ``crashed`` (a signal, or no process could be started). Output is capped at
``output_cap_bytes`` per stream; what is cut is dropped and flagged.

``checks`` (``protocol.ChecksRequest`` -> ``ChecksReply``): one job process (the zygote,
``child_checks.py``) restores the states once and runs the checks one after the other,
each in a process of its own: after each result PID 1 sweeps leftover processes, then sends
``{"op": "next", "index"}`` (so each check's output is attributed to it and no process of
one check outlives it); ``time_limit_s`` bounds each check. A check that times out gets
that status and the remaining checks go on in a fresh zygote (``restarts`` counts them);
one that dies or runs out of memory is reported by the zygote (``crashed``; ``oom`` when
the cgroup's OOM-kill counter rose meanwhile); a process that dies before it has
restored the states (no check ran in it) is replaced once by a newly spawned one,
charging no check. The whole batch is bounded by ``time_limit_s * len(checks) +
BATCH_SLACK_S``; checks not started by then are ``timeout`` ("not run"). A zygote whose
last result says ``"stays": true`` (every check of the batch ran in it, read-only, on
plain states: ``child_checks.run_checks``) and that needed no restart is kept, alive and
alone in its process session, as the next batch's process instead of being killed, so a
batch of such checks costs no fork (under gVisor a fork is most of a small batch); it
serves at most ``limits.ZYGOTE_MAX_BATCHES`` batches, and only while its private memory
is at most ``limits.ZYGOTE_KEEP_MAX_BYTES`` (one that restored large states exits). Requests that are malformed
(types, caps of ``limits.py``: ``pid1_job_requests``) get ``status: "fault"``.
"""

from __future__ import annotations

import os
import secrets
import signal
import time

from . import pid1_job_requests as requests
from . import protocol
from .limits import (
    BATCH_SLACK_S,
    CHECK_OUTPUT_CAP_BYTES,
    DRAIN_MAX_READS,
    JOB_EXIT_WAIT_S,
    JOB_MAX_FRAME_BYTES,
    JOBS_PER_SLOT,
    STARTUP_S,
    ZYGOTE_KEEP_MAX_BYTES,
)
from .pid1_children import (
    Output,
    await_exit,
    describe_exit,
    drain,
    oom_kills,
    private_bytes,
    read_once,
    signal_name,
)
from .pid1_forks import JOBS_KEY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

    from .pid1_children import Child, Children
    from .pid1_host import Host
    from .pid1_loop import Loop
    from .pid1_templates import Templates
    from .protocol import CheckResult, ChecksRequest, ExecRequest


class Job:
    """State of one job: its current process, work directory, deadline and results."""

    def __init__(self, kind: str, rid: object, workdir: str, timeout_s: float, output_cap: int) -> None:
        self.kind = kind
        self.rid = rid
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.child: Child | None = None
        """Its process (``pid1_children.Child``), while one runs."""
        self.token = ""
        self.deadline = 0.0
        self.started = time.monotonic()
        self.oom_baseline = 0
        self.out = Output(output_cap)
        self.err = Output(output_cap)
        self.memory_error = False  # exec: the script reported an uncaught MemoryError
        self.ctrl_open = False
        # checks
        self.request: dict[str, Any] = {}
        self.states: dict[str, bytes] = {}  # checks: the states' JSON texts, sent to its processes unparsed
        self.results: list[CheckResult | None] = []
        self.next = 0
        self.check_started = 0.0
        self.budget_deadline = 0.0
        self.restarts = 0
        self.ready = False  # checks: the current zygote has restored the states
        self.replaced = False  # checks: a process that died before restoring was replaced once


class Jobs:
    """The sandbox's one-shot jobs (module docstring). ``limits`` are the sandbox's."""

    def __init__(self, loop: Loop, host: Host, children: Children, templates: Templates,
                 limits: dict[str, Any]) -> None:
        self.loop = loop
        self.host = host
        self.children = children
        self.templates = templates
        self.limits = limits
        self.by_pid: dict[int, Job] = {}
        self.active: list[Job] = []
        self.kept_only = True
        """Whether every job since the runner last reset this (at recycle) was a check batch
        whose zygote was kept (:meth:`_keep`): no code but read-only checks ran in them."""
        self.job_spare: Child | None = None
        """A process waiting for the next check batch: forked ahead from the ready jobs
        template (:meth:`_ensure_job_spare`), or the kept zygote of a batch whose checks
        all ran in place (:meth:`_keep`): the batch's zygote then costs no fork on its path."""
        children.follow(self.pids, self._claim_exit)
        loop.add_deadlines(self.check_deadlines)
        loop.add_busy(lambda: bool(self.active))

    # -- bookkeeping -----------------------------------------------------------------
    def pids(self) -> set[int]:
        """The jobs' processes and the process forked ahead for the next batch."""
        return set(self.by_pid) | ({self.job_spare.pid} if self.job_spare is not None else set())

    def _max_jobs(self) -> int:
        return JOBS_PER_SLOT * max(1, int(self.limits.get("max_sessions", 1)))

    def _timeout(self, msg: ExecRequest | ChecksRequest) -> float:
        limit = float(self.limits["call_timeout_s"])
        value = msg.get("time_limit_s", limit)
        if not (type(value) is int or type(value) is float) or not value > 0:
            raise ValueError("field 'time_limit_s' must be a positive number")
        return min(float(value), limit)

    # -- host requests ---------------------------------------------------------------
    def start(self, rid: object, msg: ExecRequest | ChecksRequest) -> None:
        """Validate and start an ``exec`` or ``checks`` request (``fault`` if malformed)."""
        op = msg["op"]  # "exec" or "checks": the dispatcher's choice
        if len(self.active) >= self._max_jobs():
            self.host.fault(rid, f"too many jobs: at most {self._max_jobs()} run at once in this sandbox")
            return
        try:
            timeout_s = self._timeout(msg)
            states: dict[str, bytes] = {}
            if msg["op"] == "exec":  # (narrows the type)
                request = requests.exec_request(msg)
            else:
                request, states = requests.checks_request(msg)
        except ValueError as exc:
            self.host.fault(rid, str(exc))
            return
        cap = int(self.limits["output_cap_bytes"])
        cap = cap if op == "exec" else min(cap, CHECK_OUTPUT_CAP_BYTES)
        job = Job(op, rid, self.children.make_workdir(), timeout_s, cap)
        job.request, job.states = request, states
        self.active.append(job)
        if op == "exec":
            if self._launch(job):
                job.deadline = time.monotonic() + timeout_s
        else:
            count = len(request["checks"])
            job.results = [None] * count
            job.budget_deadline = job.started + timeout_s * count + BATCH_SLACK_S + STARTUP_S
            self._next_checks(job)

    def _launch(self, job: Job, fields: dict[str, Any] | None = None, spawn: bool = False) -> bool:
        """Start ``job``'s next process (``spawn``: a newly spawned one) and send it the
        request. False (and the job is finished or failed over) when no process could be
        started."""
        try:
            child = self.children.spawn() if spawn else self._job_child(job.kind)
        except OSError as exc:
            self._no_process(job, f"could not start a process: {exc}")
            return False
        child.frames = protocol.FrameBuffer(JOB_MAX_FRAME_BYTES)
        job.child = child
        job.token = secrets.token_hex(16)
        job.ctrl_open = True
        job.oom_baseline = oom_kills()
        self.by_pid[child.pid] = job
        self.loop.watch(child.sock, lambda _sock: self._on_control(job))
        self.loop.watch(child.out_r, lambda _fd: self._on_output(job, "out"))
        self.loop.watch(child.err_r, lambda _fd: self._on_output(job, "err"))
        request = {"op": job.kind, "id": job.token, "workdir": job.workdir, **job.request, **(fields or {})}
        try:
            child.send(request, job.states)
        except (OSError, ValueError, TypeError):
            pass  # the process died already: its exit is reported by waitpid
        return True

    def _no_process(self, job: Job, message: str) -> None:
        if job.kind == "exec":
            self._reply_exec(job, "crashed", None, message)
            self._cleanup(job)
        else:
            for index in range(job.next, len(job.results)):
                job.results[index] = requests.failed("crashed", message, 0.0)
            job.next = len(job.results)
            self._finish_checks(job)

    # -- events from the event loop ---------------------------------------------------
    def _on_control(self, job: Job) -> None:
        child = job.child
        if child is None:
            return
        data = protocol.recv_ready(child.sock)
        if data is None:
            return
        if not data:
            self._ctrl_closed(job)
            return
        self._feed(job, child, data)

    def _on_output(self, job: Job, kind: str) -> None:
        child = job.child
        if child is None:
            return
        fd = child.out_r if kind == "out" else child.err_r
        chunk = read_once(fd)
        if chunk is None:
            return
        if not chunk:
            self.loop.unwatch(fd)
            return
        (job.out if kind == "out" else job.err).add(chunk)

    def _feed(self, job: Job, child: Child, data: bytes) -> None:
        try:
            messages = child.frames.feed(data)
        except protocol.ProtocolViolation as exc:
            for msg in exc.messages:  # results sent before the garbage still count
                if job.child is not child:
                    return
                self._on_message(job, msg)
            if job.child is not child:
                return
            if job.kind == "exec":  # only an optional flag comes this way: stop listening
                self.loop.unwatch(child.sock)
                job.ctrl_open = False
                return
            self._process_failed(job, "crashed", f"the check process broke the protocol ({str(exc)[:200]})")
            return
        for msg in messages:
            if job.child is not child:
                return
            self._on_message(job, msg)

    def _ctrl_closed(self, job: Job) -> None:
        """EOF on the control channel: the process is exiting (its exit status, soon
        reported by waitpid, says how) or closed fd 3 itself (then a check batch can no
        longer report and ends at its exit or deadline)."""
        if job.child is not None:
            self.loop.unwatch(job.child.sock)
        job.ctrl_open = False

    def _on_message(self, job: Job, msg: dict[str, Any]) -> None:
        if msg.get("id") != job.token:
            return  # not from our request (a forged or garbled frame): ignored
        if job.kind == "exec":
            if msg.get("status") == "oom":
                job.memory_error = True
            return
        if msg.get("ready") is True and not job.ready:  # states restored: the check's own time starts now
            now = time.monotonic()
            job.ready = True
            job.check_started = now
            job.oom_baseline = oom_kills()
            job.deadline = min(now + job.timeout_s, job.budget_deadline)
            return
        index = msg.get("index")
        if type(index) is int and index < job.next:
            return  # a check that forked: its copy answers checks already answered
        result = requests.check_result_at(msg, job.next)
        if result is None:
            self._process_failed(job, "crashed", "the check process sent a malformed result")
            return
        if (result["status"] == "crashed" and msg.get("signal") == signal.SIGKILL
                and oom_kills() > job.oom_baseline):
            result["status"], result["error"] = "oom", "the check ran out of memory (killed by the kernel's OOM killer)"
        self._drain(job)
        job.results[job.next] = {**result, "stdout": job.out.text(True), "stderr": job.err.text(True)}
        job.out.reset()
        job.err.reset()
        job.next += 1
        if msg.get("fatal") is True:  # it ran out of memory and exits: go on in a new process
            self._end_process(job)
            job.restarts += 1
            self._next_checks(job)
        elif job.next >= len(job.results):
            self._finish_checks(job, keep=msg.get("stays") is True and job.restarts == 0)
        else:  # the process waits for this go-ahead: its pipes now hold nothing of the next check
            self.children.sweep()  # nothing a check left behind meets the next one
            now = time.monotonic()
            job.oom_baseline = oom_kills()
            job.check_started = now
            job.deadline = min(now + job.timeout_s, job.budget_deadline)
            try:
                if job.child is not None:
                    job.child.send({"op": "next", "index": job.next})
            except (OSError, ValueError):
                pass  # it died or closed the channel: its exit or deadline says so

    def _claim_exit(self, pid: int, wait_status: int) -> bool:
        """A reaped pid: a job's process (its job goes on or ends) or the process forked
        ahead for the next batch (forgotten). False when it is neither."""
        if self.job_spare is not None and self.job_spare.pid == pid:
            self.job_spare.alive = False
            self.job_spare.kill()
            self.job_spare = None
            return True
        if pid not in self.by_pid:
            return False
        self._on_exit(pid, wait_status)
        return True

    def _on_exit(self, pid: int, wait_status: int) -> None:
        job = self.by_pid.get(pid)
        if job is None or job.child is None or job.child.pid != pid:
            return
        job.child.alive = False
        self._read_final_frames(job)
        if job.child is None or job.child.pid != pid:
            return  # its last frames already ended the job or moved it to a new process
        if job.kind == "exec":
            self._finish_exec(job, wait_status)
        elif not job.ready and not job.replaced:
            # died before restoring the states (e.g. a spare or the jobs template killed by
            # an earlier check, not reaped yet when it was taken): no check ran in it, so
            # no check is charged; the batch goes on once in a newly spawned process
            job.replaced = True
            self._end_process(job)
            self._next_checks(job, spawn=True)
        else:
            oom = oom_kills() > job.oom_baseline
            detail = describe_exit(wait_status)
            self._process_failed(job, "oom" if oom else "crashed",
                                 "the check ran out of memory" if oom else f"the check process crashed ({detail})")

    def check_deadlines(self, now: float) -> float | None:
        """Time out jobs past their deadline; returns seconds until the next deadline."""
        wait = None
        for job in list(self.active):
            if job.child is None:
                continue
            remaining = job.deadline - now
            if remaining <= 0:
                if job.kind == "exec":
                    self._timeout_exec(job)
                elif now >= job.budget_deadline:
                    self._process_failed(job, "timeout", f"the batch's time budget of "
                                         f"{job.budget_deadline - job.started:g} s ran out during this check")
                elif not job.ready:
                    self._process_failed(job, "timeout", f"the check's process did not start within "
                                         f"{job.timeout_s + STARTUP_S:g} s (restoring the states)")
                else:
                    self._process_failed(job, "timeout", f"timed out after {job.timeout_s:g} s")
            else:
                wait = remaining if wait is None else min(wait, remaining)
        return wait

    # -- checks ------------------------------------------------------------------------
    def _next_checks(self, job: Job, spawn: bool = False) -> None:
        """Start a process for the checks not run yet (``spawn``: a newly spawned one),
        or finish the batch."""
        count = len(job.results)
        if job.next >= count:
            self._finish_checks(job)
            return
        now = time.monotonic()
        if now >= job.budget_deadline:
            budget = job.budget_deadline - job.started
            for index in range(job.next, count):
                job.results[index] = requests.failed("timeout", f"not run: the batch's time budget of {budget:g} s ran out",
                                             0.0)
            job.next = count
            self._finish_checks(job)
            return
        pending = [{"index": i, "check_func": job.request["checks"][i]} for i in range(job.next, count)]
        job.check_started = now
        job.ready = False
        job.deadline = min(now + job.timeout_s + STARTUP_S, job.budget_deadline)
        self._launch(job, {"checks": pending}, spawn)

    def _process_failed(self, job: Job, status: str, message: str) -> None:
        """The current process of ``job`` timed out, died or misbehaved: an exec job ends;
        a check batch records ``status`` for the current check and goes on in a new process."""
        if job.kind == "exec":
            if status == "timeout":
                self._timeout_exec(job)
            else:
                self._kill(job)
                self._drain(job)
                self._end_process(job)
                self._reply_exec(job, status, None, message)
                self._cleanup(job)
            return
        self._kill(job)
        self._drain(job)
        if job.next < len(job.results):
            elapsed = (time.monotonic() - job.check_started) * 1000.0
            job.results[job.next] = requests.failed(status, message, elapsed, job.out.text(True), job.err.text(True))
            job.next += 1
        job.out.reset()
        job.err.reset()
        self._end_process(job)
        job.restarts += 1
        self._next_checks(job)

    def _finish_checks(self, job: Job, keep: bool = False) -> None:
        """Reply with the batch's results and end it; with ``keep`` (its zygote ran every
        check in place and waits for another batch: ``child_checks.run_checks``), the
        zygote becomes the next batch's process (:meth:`_keep`) instead of being killed."""
        kept = job.child is not None and keep and self._keep(job)
        self.kept_only = self.kept_only and kept
        if job.child is not None:
            self._kill(job)
            self._end_process(job)
        if job not in self.active:
            return
        results = [result for result in job.results if result is not None]  # all there: the batch ended
        self.host.reply({"id": job.rid, "status": "ok", "results": results, "restarts": job.restarts})
        self._cleanup(job)

    # -- exec --------------------------------------------------------------------------
    def _timeout_exec(self, job: Job) -> None:
        self._kill(job)
        self._drain(job)
        self._end_process(job)  # leftovers are gone before the caller hears back
        self._reply_exec(job, "timeout", None, f"timed out after {job.timeout_s:g} s")
        self._cleanup(job)

    def _finish_exec(self, job: Job, wait_status: int) -> None:
        self._drain(job)
        exit_code = os.waitstatus_to_exitcode(wait_status)
        if exit_code == 0:
            status, error = "ok", None
        elif exit_code > 0:
            status = "oom" if job.memory_error else "error"
            error = ("uncaught MemoryError: the script ran out of memory" if job.memory_error
                     else f"exited with status {exit_code}")
        elif -exit_code == signal.SIGKILL and oom_kills() > job.oom_baseline:
            status, error = "oom", "killed by the kernel's OOM killer (out of memory)"
        else:
            status, error = "crashed", f"killed by signal {signal_name(-exit_code)}"
        self._end_process(job)
        self._reply_exec(job, status, exit_code, error)
        self._cleanup(job)

    def _reply_exec(self, job: Job, status: str, exit_code: int | None, error: str | None) -> None:
        self.kept_only = False
        if job not in self.active:
            return
        self.host.reply({
            "id": job.rid, "status": status, "exit_code": exit_code,
            "stdout": job.out.text(), "stderr": job.err.text(),
            "stdout_truncated": job.out.dropped > 0, "stderr_truncated": job.err.dropped > 0,
            "duration_ms": (time.monotonic() - job.started) * 1000.0, "error": error,
        })

    # -- process handling --------------------------------------------------------------
    def _kill(self, job: Job) -> None:
        """SIGKILL the job's process group while its leader is not reaped (so the group id
        cannot have been reused)."""
        child = job.child
        if child is not None and child.alive:
            child.alive = False
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass

    def _drain(self, job: Job) -> None:
        """Read what the process wrote before its result or its end (bounded)."""
        child = job.child
        if child is None:
            return
        drain(child.out_r, job.out, DRAIN_MAX_READS)
        drain(child.err_r, job.err, DRAIN_MAX_READS)

    def _read_final_frames(self, job: Job) -> None:
        """Frames the process wrote just before exiting (still in the socket)."""
        child = job.child
        while child is not None and job.ctrl_open and job.child is child:
            data = protocol.recv_ready(child.sock)
            if not data:
                return
            self._feed(job, child, data)

    def _keep(self, job: Job) -> bool:
        """Make ``job``'s zygote the process of the next check batch (``job_spare``) when
        none is kept yet: forgotten by the job like an ended process, but alive, its
        channels open, and everything else in its process session killed. False (nothing
        done) when a process is already kept, the zygote is dead, or it holds more than
        ``ZYGOTE_KEEP_MAX_BYTES`` of private memory (``pid1_children.private_bytes``)."""
        child = job.child
        if child is None or not child.alive or (self.job_spare is not None and self.job_spare.alive):
            return False
        held = private_bytes(child.pid)
        if held is not None and held > ZYGOTE_KEEP_MAX_BYTES:  # large states' memory would stay with it
            return False
        job.child = None
        for obj in (child.sock, child.out_r, child.err_r):
            self.loop.unwatch(obj)
        if self.by_pid.get(child.pid) is job:
            del self.by_pid[child.pid]
        if self.job_spare is not None:
            self.job_spare.kill()
        self.job_spare = child
        self.children.sweep(own=child.pid)  # it forked nothing; nothing else of its session lives on
        return True

    def _end_process(self, job: Job) -> None:
        """Forget the job's current process: selector, fds, pid map; kill leftovers."""
        child = job.child
        if child is None:
            return
        job.child = None
        for obj in (child.sock, child.out_r, child.err_r):
            self.loop.unwatch(obj)
        for fd in (child.out_r, child.err_r):
            try:
                os.close(fd)
            except OSError:
                pass
        child.sock.close()
        if self.by_pid.get(child.pid) is job:
            del self.by_pid[child.pid]
        if not child.alive:  # killed here: collect it before the sweep, which would see it dying
            await_exit(child.pid, JOB_EXIT_WAIT_S)
        self.children.sweep()

    def _cleanup(self, job: Job) -> None:
        self._kill(job)
        self._end_process(job)
        if job in self.active:
            self.active.remove(job)
        self.children.remove_workdir(job.workdir)
        self._ended(job.kind)

    # -- processes for jobs ------------------------------------------------------------
    def _job_child(self, kind: str) -> Child:
        """A process for a one-shot job: for a check batch, the waiting ``job_spare``
        (forked ahead from the jobs template, or a kept zygote), else one forked from the
        ready jobs template now, else (and for ``exec``) the spare or a new one. Raises
        OSError when none can be started (pids limit)."""
        if kind == "checks":
            child = self.job_spare
            self.job_spare = None
            if child is not None and child.alive:
                child.discard_output()
                return child
            if child is not None:
                child.kill()
            child = self.templates.fork(JOBS_KEY)
            if child is not None:
                return child
        return self.children.take()

    def _ended(self, kind: str) -> None:
        """A job finished: keep a spare (the host asks for ``recycle`` before the sandbox
        serves anything else); after a check batch, start the jobs template
        (``pid1_templates``) for the next batches, now that this one has its reply, and,
        when the sandbox serves sessions (so no ``recycle`` follows), fork the next
        batch's process from it ahead (:meth:`_ensure_job_spare`; not in a sandbox
        without sessions, which is recycled next and then holds only PID 1, the spare and
        the jobs template). Not while a batch runs: its checks would see one more process."""
        self.children.ensure_spare()
        if kind == "checks":
            self.templates.want_jobs()
            if self.children.sessions_open():
                self.loop.later(self._ensure_job_spare)

    def _ensure_job_spare(self) -> None:
        """Fork a process from the ready jobs template ahead of the next check batch and
        keep it (``job_spare``), as ``Children.ensure_spare`` keeps a spawned one: followed
        like the spare (never a stray, forgotten when it dies, killed by ``recycle``), it
        takes the fork and the process's set-up off the batch's path."""
        if self.job_spare is not None and self.job_spare.alive:
            return
        self.job_spare = self.templates.fork(JOBS_KEY)

    def kill_spare(self) -> None:
        """Kill and forget the process forked ahead (``recycle``)."""
        if self.job_spare is not None:
            self.job_spare.kill()
        self.job_spare = None

