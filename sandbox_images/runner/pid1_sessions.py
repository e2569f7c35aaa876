"""PID 1's side of the sessions: one environment instance each, in a process of its own
(stdlib only; PID 1 never runs environment code).

A session is opened by the host (``open``), gets a private work directory and a process
(:meth:`Sessions._child_for`: forked from its config's or its environment's ready template,
``pid1_templates``, else the spare or a newly spawned one), and is sent ``init`` (source,
class, config, snapshot). Requests then queue per session and go to its process one at a
time (:meth:`Sessions.pump`); each is matched to its reply by a random token. A newly
spawned process is sent ``hello`` right before its first request: the request's own time
limit (``call_timeout_s``) starts at the answer, and a process that does not answer within
``session_startup_s`` fails the request as ``crashed``.

PID 1 keeps each session's last good snapshot (the encoded state after the last
``ok``/``error`` call: ``init``'s full state, then every call's delta applied, keyed deltas
through ``protocol.apply_keyed``); ``snapshot`` is answered from it without asking the
process. A call that exceeds its time limit, runs out of memory (a ``MemoryError`` the
process reports, or the cgroup's OOM-kill counter rising) or whose process dies or breaks
the protocol is answered ``timeout``/``oom``/``crashed`` (``wire.call_failure_observation``);
the process is killed, what it left behind swept, and the session re-created from its
source and restored to that snapshot before its next request. A session whose re-creation
fails is *broken*: every later request is answered ``crashed``.

Nothing a session's process sends is trusted beyond its own session: replies are matched
by token, frames are size-capped (``protocol.FrameBuffer``), a malformed reply or keyed
delta counts as a crash, and a ``describe`` reply is capped (:func:`describe_reply`).
"""

from __future__ import annotations

import collections
import hashlib
import secrets
import time

from . import protocol
from .limits import BROKEN_MAX_CHARS, JOB_EXIT_WAIT_S, REPLACE_MAX, SESSION_ID_MAX_CHARS, SESSION_STARTUP_S
from .pid1_children import Child, Output, await_exit, drain, oom_kills, read_once
from .pid1_configs import Configs
from .pid1_deadlines import Deadlines
from .pid1_forks import Template
from .pid1_replies import call_reply, describe_reply, failure_text, state_of
from .pid1_session_requests import QUEUED_OPS, open_request, snapshot_text
from .pid1_templates import template_key
from .pid1_verdicts import verdict
from .wire import call_failure_observation

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox

    from .pid1_children import Children
    from .pid1_groups import GroupingHost
    from .pid1_loop import Loop
    from .pid1_templates import Templates
    from .protocol import CallReply, OpenReply, OpenRequest

class Session:
    """One session: its spec, process, request queue, last good snapshot and output."""

    def __init__(self, sid: str, spec: dict[str, Any], workdir: str, output_cap: int) -> None:
        self.sid = sid
        self.spec = spec  # source, class_name, init_config, describe_only, seed?
        self.key = template_key(spec["source"], spec["class_name"])
        self.workdir = workdir
        self.child: Child | None = None
        self.queue: collections.deque[dict[str, Any]] = collections.deque()
        self.current: dict[str, Any] | None = None
        """The in-flight item (``rid``, ``msg`` or ``internal``, ``token``, ``deadline``, ``hello``?)."""
        self.snapshot: dict[str, Any] = {}
        self.broken: str | None = None
        self.opened = False
        self.out = Output(output_cap)
        self.err = Output(output_cap)
        self.config: bytes | None = None
        """The ``init_config`` JSON bytes when it came by hash (``spec["init_config"]`` is None)."""
        self.config_hash: str | None = None
        self.forked_from: Template | None = None
        """The config template the current child was forked from, until its init answers."""
        self.construction: dict[str, Any] = {}
        """How its current process got its instance (``pid1_verdicts``), for the open's reply."""


class Sessions:
    """The sandbox's sessions (module docstring). ``limits`` are the sandbox's."""

    def __init__(self, loop: Loop, host: GroupingHost, children: Children, templates: Templates,
                 limits: dict[str, Any]) -> None:
        self.loop = loop
        self.host = host
        self.children = children
        self.templates = templates
        self.limits = limits
        self.by_sid: dict[str, Session] = {}
        self.by_pid: dict[int, Session] = {}
        self.closed: set[str] = set()
        """Session ids closed since the last ``recycle`` (ids are single-use)."""
        self.configs = Configs()
        self.oom_seen = oom_kills()
        self.timeout_s = float(limits["call_timeout_s"])
        self.startup_s = float(limits.get("session_startup_s", SESSION_STARTUP_S))
        """Seconds a new session process has to answer ``hello`` (see :meth:`pump`)."""
        self.max_sessions = int(limits.get("max_sessions", 1))
        self.deadlines = Deadlines(lambda session, item: session.current is item)
        children.follow(lambda: set(self.by_pid), self._claim_exit)
        children.sessions_open = lambda: len(self.by_sid)
        loop.add_deadlines(self.check_deadlines)
        loop.add_busy(lambda: any(s.current is not None for s in self.by_sid.values()))

    # -- host requests -----------------------------------------------------------------------
    def handle(self, rid: object, op: object, msg: Any) -> None:
        """A host request naming a session: ``open``, ``close`` or one of QUEUED_OPS;
        anything malformed is answered ``fault``."""
        sid = msg.get("session")
        if not isinstance(sid, str) or not sid or len(sid) > SESSION_ID_MAX_CHARS:
            self.host.fault(rid, "field 'session' must be a non-empty string")
            return
        if op == "open":
            self.open(rid, sid, msg)
            return
        session = self.by_sid.get(sid)
        if session is None:
            self.host.fault(rid, f"unknown session {sid!r}")
            return
        if op == "close":
            self.close(session)
            self.host.reply({"id": rid, "status": "ok"})
            return
        if op not in QUEUED_OPS:
            self.host.fault(rid, f"unknown op {op!r}")
            return
        session.queue.append({"rid": rid, "msg": msg})
        self.pump(session)

    def open(self, rid: object, sid: str, msg: OpenRequest) -> None:
        """``open {session, source, class_name, init_config | config_hash [config_b64],
        snapshot?, describe_only?, seed?}``: validated, then the session's ``init`` is
        queued; its templates are asked for once the loop is quiet."""
        if sid in self.by_sid:
            self.host.fault(rid, f"session {sid!r} already exists")
            return
        if len(self.by_sid) >= self.max_sessions:
            self.host.fault(rid, "sandbox is full")
            return
        if sid in self.closed:
            self.host.fault(rid, f"session {sid!r} was closed; session ids are single-use")
            return
        try:
            spec, snapshot = open_request(msg)
        except ValueError as exc:
            self.host.fault(rid, str(exc))
            return
        config_hash, config = msg.get("config_hash"), None
        if config_hash is not None:
            if not isinstance(config_hash, str) or len(config_hash) != 64 or spec["init_config"] is not None:
                self.host.fault(rid, "field 'config_hash' must be a SHA-256 hex digest, without 'init_config'")
                return
            try:
                config = self.configs.resolve(config_hash, msg.get("config_b64"))
            except ValueError as exc:
                self.host.fault(rid, str(exc))
                return
            if config is None:
                self.host.reply({"id": rid, "status": "fault", "message": "unknown config", "missing_config": True})
                return
        session = Session(sid, spec, self.children.make_workdir(), int(self.limits["output_cap_bytes"]))
        session.config, session.config_hash = config, config_hash
        self.by_sid[sid] = session
        session.queue.append({"internal": "init", "rid": rid, "snapshot": snapshot})
        self.pump(session)
        key = session.key  # the environment's template starts once the loop is quiet after the reply
        self.loop.later(lambda: self.templates.want(key, spec), quiet=True)
        if config is not None and config_hash is not None and not spec["describe_only"]:  # wanted by opens now
            self.loop.later(lambda: self.templates.want_config(key, config_hash, config))

    def close(self, session: Session) -> None:
        """End ``session``: its process killed, its queued requests answered ``fault``,
        leftovers swept (its process reaped first, so the sweep need not list /proc), its
        work directory removed, a spare wanted; its id cannot be opened again."""
        child = session.child if session.child is not None and session.child.alive else None
        self._detach(session)
        if child is not None:  # not reaped yet: its pid is still its own
            await_exit(child.pid, JOB_EXIT_WAIT_S)
        self.by_sid.pop(session.sid, None)
        self.closed.add(session.sid)
        for item in session.queue:
            if item.get("rid") is not None:
                self.host.fault(item["rid"], "session closed")
        session.queue.clear()
        self.children.sweep()
        self.children.remove_workdir(session.workdir)
        spare, forked = self.children.ensure_spare, self.templates.spares_from_jobs()
        self.loop.later(spare, quiet=True) if forked else spare()  # forked once quiet: a recycle drops it

    def recycle(self) -> None:
        """Forget what only matters while the sandbox is in use (closed ids, configs): at ``recycle``."""
        self.configs.clear()
        self.closed.clear()

    # -- processes ---------------------------------------------------------------------------
    def _child_for(self, session: Session, fresh: bool = False) -> Child:
        """The process for ``session``: for a ``fresh`` open (no snapshot) of a config
        sent by hash, forked from its ready config template; else forked from its
        environment's ready template; else the spare or a new one. A seeded session
        (``seed``) is never forked from a template: it seeds ``random`` before it runs the
        module and constructs the instance, as EnvScaler's reset does. Raises OSError
        when no process can be started."""
        seeded = session.spec.get("seed") is not None
        if fresh and session.config_hash is not None and not seeded:
            template = self.templates.config_template(session.key, session.config_hash)
            if template is not None:
                child = self.templates.fork(template.key)
                if child is not None:
                    session.forked_from, session.construction = template, {"path": "template"}
                    return child
        session.construction = verdict(self.templates, session.key, session.config_hash, session.spec, fresh)
        if not session.spec.get("describe_only") and not seeded:
            child = self.templates.fork(session.key)
            if child is not None:
                return child
        return self.children.take()

    def _attach(self, session: Session, child: Child) -> None:
        session.child = child
        self.by_pid[child.pid] = session
        self.loop.watch(child.sock, lambda _sock: self._on_control(session))
        self.loop.watch(child.out_r, lambda _fd: self._on_output(session, "out"))
        self.loop.watch(child.err_r, lambda _fd: self._on_output(session, "err"))

    def _detach(self, session: Session) -> None:
        child = session.child
        if child is None:
            return
        for obj in (child.sock, child.out_r, child.err_r):
            self.loop.unwatch(obj)
        child.kill()
        self.by_pid.pop(child.pid, None)
        session.child = None

    def _claim_exit(self, pid: int, wait_status: int) -> bool:
        """A reaped pid: a session's process died (a reply sent just before exiting still
        counts; an in-flight request fails as ``crashed``). False when not a session's."""
        session = self.by_pid.get(pid)
        if session is None:
            return False
        child = session.child
        if child is not None and child.pid == pid:
            child.alive = False
            if session.current is not None:
                self._read_final_frames(session)
            if session.child is not child:
                pass  # that reply already failed the child over to a new one
            elif session.current is not None:
                self.child_failed(session, "crashed")
            else:
                self._detach(session)
        return True

    # -- requests to the process -------------------------------------------------------------
    def pump(self, session: Session) -> None:
        """Send the next queued item to the session's process if it is idle; start a
        process (init from source + restore of the last snapshot) first when it has none."""
        while session.current is None and session.queue:
            item = session.queue[0]
            is_init = item.get("internal") == "init"
            msg = item.get("msg")
            if session.broken and not is_init:
                session.queue.popleft()
                self.host.reply({"id": item["rid"], "status": "crashed",
                                 "observation": f"Error: session cannot be restored: {session.broken}"})
                continue
            if msg is not None and msg["op"] == "snapshot":
                session.queue.popleft()
                self.host.reply({"id": item["rid"], "status": "ok", "snapshot": session.snapshot})
                continue
            if session.child is None:
                if not is_init:
                    session.queue.appendleft({"internal": "init", "snapshot": session.snapshot})
                fresh = is_init and item.get("rid") is not None and not item.get("snapshot") and not session.opened
                self._attach(session, self._child_for(session, fresh))
                continue
            session.queue.popleft()
            request, raw = self._request(session, item, msg)
            if request is None:
                continue
            token = request["id"]
            item["token"] = token
            session.current = item
            try:
                frame = protocol.encode_raw(request, raw) if raw else protocol.encode(request)
                if session.child.booted:
                    item.pop("hello", None)  # a re-queued item is timed afresh
                    self.deadlines.arm(session, item, time.monotonic() + self.timeout_s)
                    if request["op"] == "call":  # what a timeout is measured against
                        item["sched"] = session.child.sched_times()
                else:  # a new process: its start is not the request's time (``hello``)
                    item["hello"] = secrets.token_hex(16)
                    self.deadlines.arm(session, item, time.monotonic() + self.startup_s)
                    frame = protocol.encode({"op": "hello", "id": item["hello"]}) + frame
                session.child.sock.sendall(frame)
            except (OSError, ValueError, TypeError):
                self.child_failed(session, "crashed", note="request could not be delivered")

    def _request(self, session: Session, item: dict[str, Any],
                 msg: dict[str, Any] | None) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
        """The frame for ``item`` (with a fresh token) and its raw JSON members; None
        when the host's request was malformed (it is answered ``fault``)."""
        token = secrets.token_hex(16)
        raw: dict[str, bytes] = {}
        if item.get("internal") == "init" and session.forked_from is not None:  # the instance exists already
            return {"op": "init", "id": token, "workdir": session.workdir, "from_template": True,
                    "source": session.spec["source"], "class_name": session.spec["class_name"]}, raw
        if item.get("internal") == "init":
            request = {"op": "init", "id": token, "workdir": session.workdir, **session.spec}
            snapshot = item.get("snapshot")  # the host's text (forwarded unparsed) or the last good one
            if isinstance(snapshot, bytes):
                raw["snapshot"] = snapshot
            else:
                request["snapshot"] = snapshot
            if session.config is not None:  # the host's bytes, forwarded without parsing
                request.pop("init_config", None)
                raw["init_config"] = session.config
            return request, raw
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
        elif msg["op"] == "restore":  # the host's text, forwarded unparsed: the process parses it
            try:
                raw["snapshot"] = snapshot_text(msg)
            except ValueError as exc:
                self.host.fault(item["rid"], str(exc))
                return None, raw
        return request, raw

    def _drain(self, session: Session, discard: bool = False) -> None:
        """Read what the process's output streams hold now into its buffers (``discard``:
        drop it, and what the buffers held)."""
        child = session.child
        if child is None:
            return
        drain(child.out_r, None if discard else session.out)
        drain(child.err_r, None if discard else session.err)
        if discard:
            session.out.take()
            session.err.take()

    # -- what the process sends ----------------------------------------------------------------
    def _on_control(self, session: Session) -> None:
        child = session.child
        if child is None:
            return
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

    def _on_output(self, session: Session, kind: str) -> None:
        child = session.child
        if child is None:
            return
        fd = child.out_r if kind == "out" else child.err_r
        chunk = read_once(fd)
        if chunk is None:
            return
        if not chunk:
            self.loop.unwatch(fd)
            return
        (session.out if kind == "out" else session.err).add(chunk)

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
        """One frame from the session's process: the answer to ``hello`` (the request's
        time limit starts), or the reply to the in-flight request (anything else is
        ignored: it cannot answer anything)."""
        item = session.current
        if item is not None and "hello" in item and msg.get("id") == item["hello"]:
            # the new process runs and reads the request sent right behind ``hello``:
            # the request's own time limit starts now
            del item["hello"]
            if session.child is not None:
                session.child.booted = True
            self.deadlines.arm(session, item, time.monotonic() + self.timeout_s)
            return
        if item is None or msg.get("id") != item["token"]:
            return  # unsolicited or stale frame
        session.current = None
        if session.child is not None:
            session.child.waited = False  # it answered: a later death is its own (child_failed)
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
            go_on = self._on_init_reply(session, item, status, msg)
        elif kind == "call":
            go_on = self._on_call_reply(session, item, status, msg)
        else:
            go_on = True
            if kind == "state":
                self.host.reply({"id": rid, "status": "ok", "state": msg.get("state")})
            elif kind == "describe":
                self._drain(session, discard=True)  # what introspection printed is nobody's output
                self.host.reply(describe_reply(rid, status, msg))
            elif kind == "restore":
                state = state_of(msg)
                if state is None:
                    self.child_failed(session, "crashed", item=item, note="malformed reply from session")
                    return
                session.snapshot = state  # the host holds what it sent: the reply does not echo it
                self.host.reply({"id": rid, "status": "ok"})
        if go_on:
            self.pump(session)

    def _on_init_reply(self, session: Session, item: dict[str, Any], status: str, msg: dict[str, Any]) -> bool:
        """The process made (or failed to make) the instance; False when the session is
        closed or failed over (nothing to pump)."""
        rid = item.get("rid")
        if status != "ok":
            if rid is None:  # a re-creation failed: the session is unusable
                session.broken = str(msg.get("observation"))[:BROKEN_MAX_CHARS]
                self._detach(session)
                return True
            observation, traceback = failure_text(msg)
            self.host.reply({"id": rid, "status": status, "observation": observation, "traceback": traceback})
            self.close(session)
            return False
        template = session.forked_from
        state = state_of(msg)
        forked_wrong = template is not None and (template.snapshot is None or msg.get("from_template") is not True)
        if state is None or forked_wrong:
            self.child_failed(session, "crashed", item=item, note="malformed reply from session")
            return False
        session.forked_from = None
        session.opened = True
        reply: OpenReply = {"id": rid, "status": "ok", "construction": session.construction}
        if isinstance(msg.get("retyped"), list):
            reply["retyped"] = msg["retyped"]
        if template is not None and template.snapshot is not None:
            session.snapshot = dict(template.snapshot)  # entries are replaced, never changed in place
            if rid is not None:
                reply["template"], reply["snapshot_digest"] = True, template.digest
                self.host.reply(reply)
            return True
        session.snapshot = state
        if rid is not None and isinstance(item.get("snapshot"), bytes):  # the host holds the state it sent
            self.host.reply(reply)
        elif rid is not None:
            text = protocol.snapshot_text(session.snapshot)
            reply["snapshot_digest"] = hashlib.sha256(text).hexdigest()
            self.host.reply_raw(reply, {"snapshot": text})
        return True

    def _on_call_reply(self, session: Session, item: dict[str, Any], status: str, msg: dict[str, Any]) -> bool:
        """A tool call's result: its delta applied to the snapshot (``ok``/``error``),
        leftovers swept, then the reply. False when a keyed delta does not apply (the
        process is failed over)."""
        self._drain(session)
        out = call_reply(item.get("rid"), status, msg, session.out.take(), session.err.take())
        if out is None:
            self.child_failed(session, "crashed", item=item, note="malformed reply from session")
            return False
        if status in ("ok", "error"):
            for key, entry in out["delta"]["set"].items():
                value = protocol.apply_keyed(session.snapshot.get(key), entry[1]) if entry[0] == "k" else entry
                if value is None:  # our snapshot can no longer follow the session
                    self.child_failed(session, "crashed", item=item, note="malformed keyed delta")
                    return False
                session.snapshot[key] = value
            for key in out["delta"]["del"]:
                session.snapshot.pop(key, None)
        self.children.sweep(own=session.child.pid if session.child is not None else None)  # before the reply
        self.host.reply(out)
        return True

    # -- failures ------------------------------------------------------------------------------
    def child_failed(self, session: Session, status: str, item: dict[str, Any] | None = None, note: str = "",
                     not_started: bool = False) -> None:
        """The process timed out, ran out of memory or died: kill it, answer the in-flight
        request with ``status``, and schedule re-creation from the last good snapshot.
        ``not_started``: it never answered ``hello`` (its start took too long; the reply says so)."""
        item = item or session.current
        session.current = None
        template, session.forked_from = session.forked_from, None
        unproven = session.child is not None and (session.child.waited or not session.child.booted)
        replace = bool(unproven and status == "crashed" and not not_started and item
                       and item.get("replaced", 0) < REPLACE_MAX)
        if item is not None and item.get("internal") == "init" and not session.opened and (template or replace):
            # a process that never answered (a spare or one forked ahead, killed while it waited) is replaced
            if replace:
                item["replaced"] = item.get("replaced", 0) + 1
            elif template is not None:  # a config template whose fork went wrong: not used again
                self.templates.fail(template, f"a forked session failed ({status})")
            if session.child is not None:
                self._drain(session, discard=True)
            self._detach(session)
            self.children.sweep()
            session.queue.appendleft(item)
            self.pump(session)
            return
        oom_now = oom_kills()
        if status == "crashed" and oom_now > self.oom_seen:
            status = "oom"
        self.oom_seen = oom_now
        usage = self._usage(session, item) if status == "timeout" else None
        if session.child is not None:
            self._drain(session)
        self._detach(session)
        self.children.sweep()
        observation = call_failure_observation(status, self.timeout_s, note)
        if item is not None:
            kind = item.get("internal") or item["msg"]["op"]
            rid = item.get("rid")
            if kind == "init" and rid is not None and not session.opened:
                self.host.reply({"id": rid, "status": status, "observation": observation})
                self.close(session)
                return
            if kind == "init" and rid is None:
                session.broken = observation
            elif rid is not None:
                reply: CallReply = {"id": rid, "status": status, "observation": observation,
                                    "stdout": session.out.take(), "stderr": session.err.take(),
                                    "delta": {"set": {}, "del": []}}
                if usage is not None:
                    reply["cpu_ms"], reply["wait_ms"] = usage
                if not_started:
                    reply["not_started"] = True
                self.host.reply(reply)
        if session.sid in self.by_sid and not session.broken:
            session.queue.appendleft({"internal": "init", "snapshot": session.snapshot})
            self.pump(session)

    @staticmethod
    def _usage(session: Session, item: dict[str, Any] | None) -> tuple[float, float] | None:
        """``(cpu_ms, wait_ms)`` of the session's process since ``item`` (a call) was
        sent: its CPU time and its run-queue wait in milliseconds (``Child.sched_times``),
        read before the process is killed; None when either reading is missing."""
        start = item.get("sched") if item is not None else None
        now = session.child.sched_times() if session.child is not None and start is not None else None
        if start is None or now is None:
            return None
        return max(0, now[0] - start[0]) / 1e6, max(0, now[1] - start[1]) / 1e6

    def check_deadlines(self, now: float) -> float | None:
        """Fail in-flight requests past their deadline (a process that never answered
        ``hello`` is ``crashed``, a request ``timeout``); seconds to the next deadline
        (``pid1_deadlines``: only due entries are read, not every session)."""
        for owner, item in self.deadlines.due(now):
            session: Session = owner
            if self.by_sid.get(session.sid) is not session:
                continue  # closed (its id may be a later session's after a recycle)
            if "hello" in item:
                self.child_failed(session, "crashed",
                                  note=f"the new session process did not start within {self.startup_s:g} s",
                                  not_started=True)
            else:
                self.child_failed(session, "timeout")
        return self.deadlines.next_in(now)
