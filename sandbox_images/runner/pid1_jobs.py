"""One-shot jobs of the runner (PID 1): scripts and check-function batches, each in a
fresh process that never served an environment session. Stdlib only; runs in the runner
process and never executes job code (that happens in the child, ``child_oneshot.py``).

A job takes a fresh process (a check batch: forked from the sandbox's jobs template when
it is ready, ``pid1_templates``; else, and for scripts, the pre-started spare, the runner's
``Child``), gives it a private
empty work directory under ``/work`` and one request, and watches it with the same
machinery as sessions: its stdout/stderr are pipes read here and capped, its control
channel is read frame by frame with a size cap, its deadline is checked by the runner's
event loop, its exit status comes from ``waitpid``. When the job ends, its process group
is killed, processes it left behind are swept, its work directory is removed.

Host requests (each has an integer ``id``; the reply echoes it):

  exec {code, stdin?, files?, time_limit_s}
      -> {status, exit_code, stdout, stderr, stdout_truncated, stderr_truncated,
          duration_ms, error}
      status: ``ok`` (exit 0), ``error`` (non-zero exit; an uncaught exception exits 1),
      ``timeout`` (killed at ``time_limit_s``, at most the profile's ``call_timeout_s``;
      exit_code None), ``oom`` (uncaught MemoryError, exit_code 1; or killed by the
      kernel's OOM killer), ``crashed`` (killed by a signal: exit_code ``-signal``; or
      the process could not be started). Output is capped at ``output_cap_bytes`` per
      stream; what is cut is dropped and flagged.
  checks {checks: [{check_func}], initial_state, final_state, source?, time_limit_s}
      -> {status: "ok", results: [{status, passed, result, error, traceback,
          duration_ms, stdout, stderr}], restarts}
      The states are encoded states (``{name: ["j", v] | ["p", b64] | ["u", rendering]}``);
      ``source`` is the environment's code, sent only for a scenario that opts in
      (``check_objects: environment``): then it is loaded to unpickle instances of its
      classes; without it they are rebuilt as stand-ins and no environment code runs
      in the job (``child_standins.py``). One job process (``child_checks.py``'s zygote) restores the states once and
      runs every check in a fresh process forked from it (or, for a check proven
      read-only on plain states, in itself), one after the other: after each
      result the runner sweeps leftover processes, then sends ``{"op": "next", "index"}``
      (so each check's output is attributed to it and no process of one check outlives
      it); ``time_limit_s`` bounds each check. A check that times out gets that status
      and the remaining checks go on in a fresh zygote (``restarts`` counts them); one
      that dies or runs out of memory is reported by the zygote (``crashed``; ``oom``
      when the cgroup's OOM-kill counter rose meanwhile); a process that dies before it has
      restored the states (no check ran in it) is replaced once by a newly spawned one,
      charging no check. The whole batch is bounded by
      ``time_limit_s * len(checks) + BATCH_SLACK_S``; checks not started by then are
      ``timeout`` ("not run").

Requests that are malformed (types, caps of ``limits.py``) get ``status: "fault"``.
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import time

from . import protocol
from .limits import (
    BATCH_SLACK_S,
    CHECK_OUTPUT_CAP_BYTES,
    CHECK_RESULT_TEXT_CAPS,
    DRAIN_MAX_READS,
    JOB_EXIT_WAIT_S,
    JOB_MAX_FRAME_BYTES,
    JOBS_PER_SLOT,
    MAX_CHECK_SOURCE_BYTES,
    MAX_CHECKS,
    MAX_CODE_BYTES,
    MAX_STDIN_BYTES,
    STARTUP_S,
    check_files,
)
from .wire import is_encoded_entry

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (pid1_runner imports this module at run time)
    from collections.abc import Callable
    from typing import Any

    from .pid1_runner import Child, Runner

CHECK_STATUSES = ("ok", "error", "rejected", "oom", "crashed")


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


class Job:
    """State of one job: its current process, work directory, deadline and results."""

    def __init__(self, kind: str, rid: object, workdir: str, timeout_s: float, output_cap: int) -> None:
        self.kind = kind
        self.rid = rid
        self.workdir = workdir
        self.timeout_s = timeout_s
        self.child: Child | None = None
        """The runner's Child, while a process runs."""
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
        self.results: list[dict[str, Any] | None] = []
        self.next = 0
        self.check_started = 0.0
        self.budget_deadline = 0.0
        self.restarts = 0
        self.ready = False  # checks: the current zygote has restored the states
        self.replaced = False  # checks: a process that died before restoring was replaced once


class Jobs:
    """The runner's one-shot jobs. ``runner`` provides ``sel``, ``limits``, ``reply``,
    ``fault``, ``job_child``, ``sweep_strays``, ``remove_workdir``, ``jobs_ended`` (see
    ``pid1_runner.py``)."""

    def __init__(self, runner: Runner, work_root: str, oom_kills: Callable[[], int]) -> None:
        self.runner = runner
        self.work_root = work_root
        self.oom_kills = oom_kills
        self.by_pid: dict[int, Job] = {}
        self.active: list[Job] = []

    # -- bookkeeping -----------------------------------------------------------------
    def pids(self) -> set[int]:
        return set(self.by_pid)

    def _max_jobs(self) -> int:
        return JOBS_PER_SLOT * max(1, int(self.runner.limits.get("max_sessions", 1)))

    def _timeout(self, msg: dict[str, Any]) -> float:
        limit = float(self.runner.limits["call_timeout_s"])
        value = msg.get("time_limit_s", limit)
        if not (type(value) is int or type(value) is float) or not value > 0:
            raise ValueError("field 'time_limit_s' must be a positive number")
        return min(float(value), limit)

    # -- host requests ---------------------------------------------------------------
    def start(self, rid: object, msg: dict[str, Any]) -> None:
        """Validate and start an ``exec`` or ``checks`` request (``fault`` if malformed)."""
        op = msg.get("op")
        if len(self.active) >= self._max_jobs():
            self.runner.fault(rid, f"too many jobs: at most {self._max_jobs()} run at once in this sandbox")
            return
        try:
            timeout_s = self._timeout(msg)
            request = _exec_request(msg) if op == "exec" else _checks_request(msg)
        except ValueError as exc:
            self.runner.fault(rid, str(exc))
            return
        workdir = os.path.join(self.work_root, secrets.token_hex(16))
        os.mkdir(workdir, 0o700)
        cap = int(self.runner.limits["output_cap_bytes"])
        if op == "checks":
            cap = min(cap, CHECK_OUTPUT_CAP_BYTES)
        job = Job(str(op), rid, workdir, timeout_s, cap)
        job.request = request
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
            child = self.runner.spawn_child() if spawn else self.runner.job_child(job.kind)
        except OSError as exc:
            self._no_process(job, f"could not start a process: {exc}")
            return False
        child.frames = protocol.FrameBuffer(JOB_MAX_FRAME_BYTES)
        job.child = child
        job.token = secrets.token_hex(16)
        job.ctrl_open = True
        job.oom_baseline = self.oom_kills()
        self.by_pid[child.pid] = job
        sel = self.runner.sel
        sel.register(child.sock, selectors.EVENT_READ, ("job-ctrl", job))
        sel.register(child.out_r, selectors.EVENT_READ, ("job-out", job))
        sel.register(child.err_r, selectors.EVENT_READ, ("job-err", job))
        request = {"op": job.kind, "id": job.token, "workdir": job.workdir, **job.request, **(fields or {})}
        try:
            child.send(request)
        except (OSError, ValueError, TypeError):
            pass  # the process died already: its exit is reported by waitpid
        return True

    def _no_process(self, job: Job, message: str) -> None:
        if job.kind == "exec":
            self._reply_exec(job, "crashed", None, message)
            self._cleanup(job)
        else:
            for index in range(job.next, len(job.results)):
                job.results[index] = _failed("crashed", message, 0.0)
            job.next = len(job.results)
            self._finish_checks(job)

    # -- events from the event loop ---------------------------------------------------
    def on_readable(self, kind: str, job: Job) -> None:
        child = job.child
        if child is None:
            return
        if kind == "job-ctrl":
            data = protocol.recv_ready(child.sock)
            if data is None:
                return
            if not data:
                self._ctrl_closed(job)
                return
            self._feed(job, child, data)
            return
        fd = child.out_r if kind == "job-out" else child.err_r
        try:
            chunk = os.read(fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            _unregister(self.runner.sel, fd)
            return
        (job.out if kind == "job-out" else job.err).add(chunk)

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
                _unregister(self.runner.sel, child.sock)
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
            _unregister(self.runner.sel, job.child.sock)
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
            job.oom_baseline = self.oom_kills()
            job.deadline = min(now + job.timeout_s, job.budget_deadline)
            return
        index = msg.get("index")
        if type(index) is int and index < job.next:
            return  # a check that forked: its copy answers checks already answered
        result = _check_result(msg, job.next)
        if result is None:
            self._process_failed(job, "crashed", "the check process sent a malformed result")
            return
        if (result["status"] == "crashed" and msg.get("signal") == signal.SIGKILL
                and self.oom_kills() > job.oom_baseline):
            result.update(status="oom", error="the check ran out of memory (killed by the kernel's OOM killer)")
        self._drain(job)
        result["stdout"], result["stderr"] = job.out.text(True), job.err.text(True)
        job.out.reset()
        job.err.reset()
        job.results[job.next] = result
        job.next += 1
        if msg.get("fatal") is True:  # it ran out of memory and exits: go on in a new process
            self._end_process(job)
            job.restarts += 1
            self._next_checks(job)
        elif job.next >= len(job.results):
            self._finish_checks(job)
        else:  # the process waits for this go-ahead: its pipes now hold nothing of the next check
            self.runner.sweep_strays()  # nothing a check left behind meets the next one
            now = time.monotonic()
            job.oom_baseline = self.oom_kills()
            job.check_started = now
            job.deadline = min(now + job.timeout_s, job.budget_deadline)
            try:
                if job.child is not None:
                    job.child.send({"op": "next", "index": job.next})
            except (OSError, ValueError):
                pass  # it died or closed the channel: its exit or deadline says so

    def on_exit(self, pid: int, wait_status: int) -> None:
        """``waitpid`` reported the exit of a job process."""
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
            oom = self.oom_kills() > job.oom_baseline
            detail = _death(wait_status)
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
                job.results[index] = _failed("timeout", f"not run: the batch's time budget of {budget:g} s ran out",
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
            result = _failed(status, message, elapsed)
            result["stdout"], result["stderr"] = job.out.text(True), job.err.text(True)
            job.results[job.next] = result
            job.next += 1
        job.out.reset()
        job.err.reset()
        self._end_process(job)
        job.restarts += 1
        self._next_checks(job)

    def _finish_checks(self, job: Job) -> None:
        if job.child is not None:
            self._kill(job)
            self._end_process(job)
        if job not in self.active:
            return
        self.runner.reply({"id": job.rid, "status": "ok", "results": job.results, "restarts": job.restarts})
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
        elif -exit_code == signal.SIGKILL and self.oom_kills() > job.oom_baseline:
            status, error = "oom", "killed by the kernel's OOM killer (out of memory)"
        else:
            status, error = "crashed", f"killed by signal {_signal_name(-exit_code)}"
        self._end_process(job)
        self._reply_exec(job, status, exit_code, error)
        self._cleanup(job)

    def _reply_exec(self, job: Job, status: str, exit_code: int | None, error: str | None) -> None:
        if job not in self.active:
            return
        self.runner.reply({
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
        for fd, output in ((child.out_r, job.out), (child.err_r, job.err)):
            for _ in range(DRAIN_MAX_READS):
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EAGAIN: nothing more now; EBADF: closed
                    break
                if not chunk:
                    break
                output.add(chunk)

    def _read_final_frames(self, job: Job) -> None:
        """Frames the process wrote just before exiting (still in the socket)."""
        child = job.child
        while child is not None and job.ctrl_open and job.child is child:
            data = protocol.recv_ready(child.sock)
            if not data:
                return
            self._feed(job, child, data)

    def _end_process(self, job: Job) -> None:
        """Forget the job's current process: selector, fds, pid map; kill leftovers."""
        child = job.child
        if child is None:
            return
        job.child = None
        sel = self.runner.sel
        for obj in (child.sock, child.out_r, child.err_r):
            _unregister(sel, obj)
        for fd in (child.out_r, child.err_r):
            try:
                os.close(fd)
            except OSError:
                pass
        child.sock.close()
        if self.by_pid.get(child.pid) is job:
            del self.by_pid[child.pid]
        if not child.alive:  # killed here: collect it before the sweep, which would see it dying
            _await_exit(child.pid, JOB_EXIT_WAIT_S)
        self.runner.sweep_strays()

    def _cleanup(self, job: Job) -> None:
        self._kill(job)
        self._end_process(job)
        if job in self.active:
            self.active.remove(job)
        self.runner.remove_workdir(job.workdir)
        self.runner.jobs_ended(job.kind)


def _await_exit(pid: int, limit_s: float) -> None:
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


def _unregister(sel: selectors.BaseSelector, obj: Any) -> None:
    try:
        sel.unregister(obj)
    except (KeyError, ValueError, OSError):
        pass


def _exec_request(msg: dict[str, Any]) -> dict[str, Any]:
    """The fields of an ``exec`` request forwarded to the job process, validated."""
    code, stdin, files = msg.get("code"), msg.get("stdin"), msg.get("files")
    if not isinstance(code, str) or len(code.encode("utf-8", "replace")) > MAX_CODE_BYTES:
        raise ValueError(f"field 'code' must be a string of at most {MAX_CODE_BYTES} bytes")
    if stdin is not None and (not isinstance(stdin, str)
                              or len(stdin.encode("utf-8", "replace")) > MAX_STDIN_BYTES):
        raise ValueError(f"field 'stdin' must be a string of at most {MAX_STDIN_BYTES} bytes")
    files = check_files({} if files is None else files)
    return {"code": code, "stdin": stdin or "", "files": files}


def _checks_request(msg: dict[str, Any]) -> dict[str, Any]:
    """The fields of a ``checks`` request forwarded to the job process, validated (the
    states' sizes were bounded by the host frame cap)."""
    checks = msg.get("checks")
    if not isinstance(checks, list) or not 1 <= len(checks) <= MAX_CHECKS:
        raise ValueError(f"field 'checks' must be a list of 1 to {MAX_CHECKS} checks")
    sources = []
    for index, check in enumerate(checks):
        source = check.get("check_func") if isinstance(check, dict) else None
        if not isinstance(source, str) or len(source.encode("utf-8", "replace")) > MAX_CHECK_SOURCE_BYTES:
            raise ValueError(f"checks[{index}].check_func must be a string of at most "
                             f"{MAX_CHECK_SOURCE_BYTES} bytes")
        sources.append(source)
    initial, final, source = msg.get("initial_state"), msg.get("final_state"), msg.get("source")
    for name, state in (("initial_state", initial), ("final_state", final)):
        if not isinstance(state, dict) or not all(is_encoded_entry(entry) for entry in state.values()):
            raise ValueError(f"field {name!r} must be an encoded state ({{name: [kind, data]}})")
    if source is not None and (not isinstance(source, str)
                               or len(source.encode("utf-8", "replace")) > MAX_CODE_BYTES):
        raise ValueError(f"field 'source' must be a string of at most {MAX_CODE_BYTES} bytes")
    return {"checks": sources, "initial_state": initial, "final_state": final, "source": source}


def _check_result(msg: dict[str, Any], index: int) -> dict[str, Any] | None:
    """One check result frame from the job process, validated and capped (None when
    malformed: the process is then treated as crashed)."""
    if msg.get("index") != index or msg.get("status") not in CHECK_STATUSES:
        return None
    passed, duration = msg.get("passed"), msg.get("duration_ms")
    if type(passed) is not bool or not (type(duration) is int or type(duration) is float) or not 0 <= duration < 1e9:
        return None
    fields = {}
    for name, cap in CHECK_RESULT_TEXT_CAPS.items():
        value = msg.get(name)
        if value is not None and not isinstance(value, str):
            return None
        fields[name] = value[:cap] if isinstance(value, str) else None
    status = msg["status"]
    return {"status": status, "passed": passed and status == "ok", **fields, "duration_ms": float(duration)}


def _failed(status: str, error: str, duration_ms: float) -> dict[str, Any]:
    return {"status": status, "passed": False, "result": None, "error": error, "traceback": None,
            "duration_ms": duration_ms, "stdout": "", "stderr": ""}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _death(wait_status: int) -> str:
    code = os.waitstatus_to_exitcode(wait_status)
    return f"killed by signal {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
