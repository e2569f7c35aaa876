"""How PID 1 gets session processes forked from a template (``pid1_templates``): one
``fork`` at a time per template, answered either while PID 1 waits (an open that finds
nothing forked ahead) or through the loop (a fork ahead), and the forks ahead themselves
(``pid1_templates``' module docstring, "Forks ahead"). Stdlib only; a template is an
untrusted child: a pid it answers is taken only once /proc shows it PID 1's child and the
leader of its own process session and group, and not a process PID 1 already follows.
"""

from __future__ import annotations

import collections
import os
import secrets
import signal
import socket
import time

from . import protocol
from .limits import (
    FORK_AHEAD_DEFAULT,
    FORK_AHEAD_MAX_PER_SANDBOX,
    TEMPLATE_FORK_TIMEOUT_S,
    TEMPLATE_FRAME_MAX_BYTES,
)
from .pid1_children import Child, stream
from .pid1_cleanup import parent_of, proc_stat, waiting_child

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .pid1_children import Children
    from .pid1_loop import Loop

JOBS_KEY = "jobs"
"""Key of the jobs template (an environment's key always holds a ``:``)."""


class PendingFork:
    """A ``fork`` sent to a template and not answered yet: its token, PID 1's ends of the
    new session's channels (control socket, stdout and stderr pipes) and the deadline of
    the answer (monotonic seconds)."""

    def __init__(self, token: str, sock: socket.socket, out_r: int, err_r: int, deadline: float) -> None:
        self.token, self.sock, self.out_r, self.err_r, self.deadline = token, sock, out_r, err_r, deadline

    def close(self) -> None:
        """Close PID 1's ends (the fork was refused, failed or is no longer wanted)."""
        self.sock.close()
        for fd in (self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass


class Template:
    """One template process (a :class:`Child` whose first request was ``template``, or
    ``config_template`` for a config template)."""

    def __init__(self, key: str, child: Child, deadline: float, config_hash: str | None = None) -> None:
        self.key = key
        self.child = child
        self.token = secrets.token_hex(16)
        self.deadline: float | None = deadline
        """While loading: when it must have answered (monotonic seconds); None once ready."""
        self.ready = False
        self.forks = 0
        self.config_hash = config_hash
        """Config templates: the config's digest (None for an environment's template)."""
        self.snapshot: dict[str, Any] | None = None
        """Config templates: the encoded state of the kept instance (never mutated)."""
        self.digest = ""
        """Config templates: SHA-256 of ``protocol.snapshot_text(snapshot)``."""
        self.used = time.monotonic()
        self.ahead: Child | None = None
        """A session process forked ahead of the next open (module docstring), or None."""
        self.forking: PendingFork | None = None
        """The ``fork`` sent and not answered yet (at most one at a time), or None."""
        self.clean = False
        """The jobs template: it was ready before any request that may run untrusted code
        came since the start or the last full recycle (``pid1_templates``: kept through
        recycles)."""


class Forker:
    """Forks from the templates of ``by_key`` (the caller's dict of templates, by key):
    ``fail(template, reason)`` fails a template that broke a fork; ``limits`` are the
    sandbox's (``max_sessions``; ``forks_ahead``: how many templates keep a process forked
    ahead, FORK_AHEAD_DEFAULT when absent, within 0 and FORK_AHEAD_MAX_PER_SANDBOX)."""

    def __init__(self, loop: Loop, children: Children, limits: dict[str, Any], by_key: dict[str, Template],
                 fail: Callable[[Template, str], None]) -> None:
        self.loop = loop
        self.children = children
        self.limits = limits
        self.by_key = by_key
        self.fail = fail
        try:
            wanted = int(limits.get("forks_ahead", FORK_AHEAD_DEFAULT))
        except (TypeError, ValueError):
            wanted = FORK_AHEAD_DEFAULT
        self.most = max(0, min(wanted, FORK_AHEAD_MAX_PER_SANDBOX))
        """How many templates keep a process forked ahead at most."""
        self.keys: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Keys whose template keeps a process forked ahead, least recently forked from
        first (at most :attr:`most`)."""
        self.taken = 0
        """Sessions that took a process forked ahead since the last :meth:`clear`."""
        children.before_sweep(self.settle)

    def pids(self) -> set[int]:
        """Pids of the processes forked ahead and waiting."""
        return {t.ahead.pid for t in self.by_key.values() if t.ahead is not None}

    def clear(self) -> None:
        """Forget the keys and the count (``recycle``; the templates' failure kills the processes)."""
        self.keys.clear()
        self.taken = 0

    def close_pending(self, template: Template) -> None:
        """Kill ``template``'s process forked ahead and close a fork under way (its template
        failed: a process it may have forked is a stray, swept)."""
        self.drop(template)
        if template.forking is not None:
            template.forking.close()
            template.forking = None

    def claim_exit(self, pid: int) -> bool:
        """A reaped pid that was a process forked ahead: forgotten (the next open forks at once)."""
        for owner in self.by_key.values():
            if owner.ahead is not None and owner.ahead.pid == pid:
                owner.ahead.alive = False
                self.drop(owner)
                return True
        return False

    def take(self, template: Template) -> Child | None:
        """A verified process of the ready ``template``: the one forked ahead
        (:meth:`take_ahead`), else one forked now (:meth:`fork_now`); None when the fork
        failed (the template is then failed)."""
        return self.take_ahead(template) or self.fork_now(template)

    def fork_now(self, template: Template) -> Child | None:
        """A verified process forked from the ready ``template`` now (PID 1 waits for it:
        after the fork ahead under way, if any, which it then takes), or None (the
        template is then failed)."""
        if template.forking is None:
            self._send(template)
        return self._await(template)

    def _send(self, template: Template) -> None:
        """Make a session's three channels and send ``fork`` with the template's ends
        (SCM_RIGHTS holds them in flight, so PID 1's copies of them are closed at once); the
        request waits in ``template.forking`` for its answer. A send that fails fails the
        template."""
        parent, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = stream()
        err_r, err_w = stream()
        token = secrets.token_hex(16)
        sock = template.child.sock
        try:
            sock.settimeout(TEMPLATE_FORK_TIMEOUT_S)
            socket.send_fds(sock, [protocol.encode({"op": "fork", "id": token})], [theirs.fileno(), out_w, err_w])
        except (OSError, ValueError) as exc:
            parent.close()
            for fd in (out_r, err_r):
                os.close(fd)
            self.fail(template, f"fork failed: {type(exc).__name__}")
            return
        finally:
            theirs.close()
            os.close(out_w)
            os.close(err_w)
            try:  # the loop reads the answer (recv_ready): never with a timeout, which would wait
                sock.setblocking(False)
            except OSError:
                pass
        template.forking = PendingFork(token, parent, out_r, err_r, time.monotonic() + TEMPLATE_FORK_TIMEOUT_S)

    def _await(self, template: Template) -> Child | None:
        """Wait (up to the pending fork's deadline) for the answer to ``template.forking``
        and take its process: see :meth:`_adopted`. None when there is no fork pending or
        it failed (the template is then failed)."""
        pending = template.forking
        if pending is None:
            return None
        sock = template.child.sock
        reply: dict[str, Any] | None = None
        try:
            while reply is None:
                remaining = pending.deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(TEMPLATE_FRAME_MAX_BYTES)
                if not data:
                    raise EOFError
                for msg in template.child.frames.feed(data):
                    if reply is not None or msg.get("id") != pending.token:
                        raise ValueError("unsolicited message")
                    reply = msg
        except (OSError, EOFError, ValueError, protocol.ProtocolViolation) as exc:
            self.fail(template, f"fork failed: {type(exc).__name__}")
            return None
        finally:
            try:
                sock.setblocking(False)  # a socket with a timeout would make the loop's read wait for it
            except OSError:
                pass
        return self._adopted(template, reply)

    def _adopted(self, template: Template, reply: dict[str, Any]) -> Child | None:
        """The answer to ``template.forking``: the process adopted as a ``Child`` when
        /proc verifies its pid (:meth:`_verified`), else None and the template failed (a
        process of ours that is not a usable session is killed)."""
        pending, template.forking = template.forking, None
        if pending is None:
            return None
        pid = reply.get("pid")
        if reply.get("status") != "ok" or type(pid) is not int or not self._verified(pid):
            pending.close()
            if type(pid) is int and pid > 1 and parent_of(pid) == os.getpid():
                try:  # our child, but not a session we can use
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            fields = proc_stat(pid) if type(pid) is int and pid > 1 else None
            detail = fields[:4] if fields else None
            self.fail(template, f"fork answered a bad pid ({str(reply.get('status'))[:20]}, {pid!r:.20}, {detail})")
            return None
        return Child.adopt(pid, pending.sock, pending.out_r, pending.err_r)

    def take_ahead(self, template: Template) -> Child | None:
        """``template``'s process forked ahead when /proc still shows it PID 1's child and
        running or sleeping (not stopped by a signal, not dying), else it is killed; or None.
        One killed after that is replaced when the open finds it dead (``pid1_sessions``)."""
        child, template.ahead = template.ahead, None
        if child is None:
            return None
        if not child.alive or not waiting_child(child.pid):
            child.kill()
            return None
        self.taken += 1
        child.waited = True
        return child

    def drop(self, template: Template) -> None:
        """Kill and forget ``template``'s process forked ahead, if any."""
        child, template.ahead = template.ahead, None
        if child is not None:
            child.kill()

    def want(self, template: Template) -> None:
        """``template`` was forked from: keep a process forked ahead for it (not for the
        jobs template), dropping the one of the template forked from least recently beyond
        :attr:`most`, and fork it once the loop is quiet."""
        if template.key == JOBS_KEY:
            return
        self.keys.pop(template.key, None)
        self.keys[template.key] = None
        while len(self.keys) > self.most:
            old, _ = self.keys.popitem(last=False)
            stale = self.by_key.get(old)
            if stale is not None:
                self.drop(stale)
        if self.keys:  # none with forks_ahead 0
            self.loop.later(self.fork_ahead)

    def fork_ahead(self) -> None:
        """Fork a process ahead for every template of :attr:`keys` that has none (module
        docstring of ``pid1_templates``); asked for again later while a request or a job
        is in flight. Forgets keys whose template is gone or not ready. Never raises."""
        if self.loop.busy():
            self.loop.later(self.fork_ahead)
            return
        for key in list(self.keys):
            template = self.by_key.get(key)
            if template is None or not template.ready:
                del self.keys[key]
                continue
            if template.forking is not None or (template.ahead is not None and template.ahead.alive):
                continue
            self.drop(template)  # one that died: its descriptors are closed
            if self.children.sessions_open() >= int(self.limits.get("max_sessions", 1)):
                return  # no room for another session: nothing to fork ahead for
            self._send(template)  # answered through the loop (_on_control)

    def settle(self) -> None:
        """Wait for every fork ahead under way (``Children.before_sweep``): its process,
        forked but not yet PID 1's verified child, would look like a stray to a sweep. Each
        becomes its template's process forked ahead (or is killed, or fails its template,
        as through the loop). Never raises."""
        for template in list(self.by_key.values()):
            if template.forking is None:
                continue
            child = self._await(template)
            if child is not None:
                self._keep(template, child)

    def ahead_forked(self, template: Template, reply: dict[str, Any]) -> None:
        """The answer to a fork ahead arrived through the loop: its process is kept (:meth:`_keep`)."""
        child = self._adopted(template, reply)
        if child is not None:
            self._keep(template, child)

    def _keep(self, template: Template, child: Child) -> None:
        """Keep a verified process forked ahead as ``template.ahead`` while the key still
        wants one and has none; else kill it."""
        if template.key in self.keys and template.ahead is None:
            template.ahead = child
        else:
            child.kill()

    def _verified(self, pid: int) -> bool:
        """``pid`` is PID 1's child, leads its own process session and group, and is no
        process the runner tracks already (read from /proc: nothing the template says)."""
        if pid <= 1 or pid in self.children.tracked_pids():
            return False
        fields = proc_stat(pid)
        if fields is None or fields[0] in ("Z", "X", "x"):
            return False
        ppid, pgrp, sid = int(fields[1]), int(fields[2]), int(fields[3])
        return ppid == os.getpid() and pgrp == pid and sid == pid
