"""Warm per-environment templates of the runner (PID 1): sessions forked copy-on-write from
a process that already executed the environment's module. Stdlib only; runs in the runner
and never executes environment code (the template is an untrusted child, ``child_template.py``).

Key: sha256 of the source plus the class name. Two environments never share a template,
and a template serves only the sandbox's tenant (sandboxes are per tenant).

    open of a session of key K, no template for K yet:
        the session starts the normal way (spare process, source executed);
        a spare is sent ``template {source, class_name}`` and becomes K's template (loading)
    template answers ``ok`` before its deadline (``call_timeout_s``)  -> ready
    any later (re)start of a session of K:
        PID 1 makes the session's three channels, sends ``fork`` with them (SCM_RIGHTS) and
        waits up to TEMPLATE_FORK_TIMEOUT_S for ``{status: ok, pid}``; it accepts the pid
        only if /proc says it is PID 1's child and the leader of its own process session
        and process group, and it is not already tracked. The session is then exactly a
        spawned one for PID 1: same Child object, same kill (``killpg``), same sweeps,
        reaped by PID 1, its own work directory, and the same ``init`` request (the child
        skips executing the source it already has).
    anything else (``unsuitable``, a malformed or late answer, the template's death, a
    bad pid)  -> the template is killed and K is marked: its sessions start the normal way.
    A verdict (``unsuitable``) or a protocol violation stands until the sandbox is
    recycled; a failure a loaded machine causes (late, died, closed, a fork that failed or
    gave a pid PID 1 could not verify) is retried: the next session of K after
    TEMPLATE_REBUILD_BACKOFF_S (x4 each time) builds it again, at most TEMPLATE_REBUILDS
    times per recycle (a template that keeps failing costs a few spare processes, never a
    loop).

Forks ahead: a template that a session was forked from (an environment's or a config's,
not the jobs template, whose batches keep their own: ``Jobs.job_spare``) gets its next
session process forked ahead, once the loop is quiet (``Loop.later``; not while a request
or a job is in flight, where the process would compete with it), for at most
``forks_ahead`` templates (the host's limit, else FORK_AHEAD_DEFAULT; the most recently
forked from; the others' processes are killed) and only while the sandbox has room for
another session. The next open of that key takes it, so its path holds no fork: no
channels made, no ``fork`` request, no two forks, no wait for the pid. The process was
verified as above when it was forked; it is taken only while /proc still shows it PID 1's
child, running or sleeping (not stopped by a session's signal), else killed and the
session forked at once; one that dies before its first answer is replaced
(``pid1_sessions.Sessions.child_failed``). Until taken it is the template's (never a stray; its process
session holds only it), dies with its template (failure, eviction, ``recycle``) and is
forgotten when it exits.

A template is not a session: its pid is known to the sweeps (it is not a stray), but every
other process in its process session is (it must fork nothing outside a ``fork`` request).
``recycle`` kills every template with everything else and forgets all keys.

The jobs template (key JOBS_KEY, with ``templates`` enabled, in any sandbox) executes no
environment: it is started after the sandbox's first check batch ends (``want_jobs``) and
again after a ``recycle`` that killed one, and each check batch's zygote is forked from it
(same ``fork`` request, same verification) instead of taking the spare, whose replacement
would cost a Python start-up on the sandbox's CPU quota per batch. In a sandbox that serves
sessions, PID 1 forks the next batch's process from it ahead, after each batch
(``Jobs.job_spare``, ``pid1_jobs``), so that batch's path holds no fork.
When it is not ready or fails, the batch takes the spare.
With ``spares_from_template`` (the host's choice under runc) it is started at boot too, the
spares are forked from it (:meth:`Templates.fork_spare`; a Python start-up only while it is
not ready), and a full recycle keeps it when :meth:`Templates.keepable_jobs` says it is
clean; a recycle that keeps none starts a new one and answers once it is ready, before any
code can run, so the next one keeps it.
Config templates (an environment *instance* kept, keyed by the environment's key plus
the SHA-256 of the exact ``init_config`` bytes):

    the second open of a session of K with config H (sent by hash, ``pid1_configs.Configs``) in
    this sandbox, K's template ready (a config opened once costs nothing more):
        a process is forked from K's template and sent ``config_template {config}``
        (``child_template.run_config_template``): it constructs the instance twice (once in
        a probe process of its own), and is *suitable* only when both encoded states are
        byte-identical, the module-level state is unchanged by construction, and no thread,
        descriptor or process is left; it then sends its encoded state, which PID 1 keeps
        (with its digest, ``protocol.snapshot_text``) and answers forks like K's template
    a later open of (K, H) with no snapshot: the session is forked from it (copy-on-write:
        no parse, no construction, no encoding) and starts with the template's state;
        PID 1 answers the host with the state's digest only
    at most CONFIG_TEMPLATE_MAX_PER_SANDBOX, and only while the cgroup uses less than
    CONFIG_TEMPLATE_MEMORY_FRACTION of its limit; any failure marks (K, H) failed until
    recycle, and its sessions are constructed the normal way.

Making room (least recently used first, by count and by memory):

    a new config template would be one too many, or the cgroup is over the fraction:
        the candidates are the ready config templates last used before the newcomer's
        previous open (a template used since then is more recent than the newcomer:
        two configs opened in turn never evict each other, and a tenant cycling through
        more configs than fit gets no more construction work than without templates)
    by count: the least recently used candidate is killed; none -> no new template
    by memory: the fewest least recently used candidates whose private memory
        (``pid1_children.private_bytes``: an upper bound of what killing them frees) brings the cgroup
        under the fraction are killed, and the new template is built; when all of them
        together would not (memory held by sessions), none is killed and none is built
    an evicted config's key is not failed: its next opens may build it again.
"""

from __future__ import annotations

import collections
import hashlib
import time

from . import protocol
from .limits import (
    CONFIG_TEMPLATE_MAX_PER_SANDBOX,
    CONFIG_TEMPLATE_MEMORY_FRACTION,
    MAX_FRAME_BYTES,
    TEMPLATE_FRAME_MAX_BYTES,
    TEMPLATE_MAX_PER_SANDBOX,
    TEMPLATE_REBUILD_BACKOFF_S,
    TEMPLATE_REBUILDS,
)
from .pid1_children import Child, memory_over, private_bytes, read_once
from .pid1_cleanup import waiting_child
from .pid1_forks import JOBS_KEY, Forker, Template

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable  # annotations only: never evaluated in the sandbox
    from typing import Any

    from .pid1_children import Children
    from .pid1_loop import Loop
    from .protocol import TemplateStats
CONFIG_OPENS_REMEMBERED = 256


def template_key(source: str, class_name: str) -> str:
    """The template key of an environment: sha256 of its UTF-8 source, ``:``, class name."""
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{digest}:{class_name}"


def config_template_key(key: str, config_hash: str) -> str:
    """The key of the config template of environment ``key`` and config ``config_hash``."""
    return f"{key}|{config_hash}"


class Templates:
    """The sandbox's templates (see the module docstring). ``limits`` are the sandbox's."""

    def __init__(self, loop: Loop, children: Children, limits: dict[str, Any]) -> None:
        self.loop = loop
        self.children = children
        self.limits = limits
        self.timeout_s = float(limits["call_timeout_s"])
        self.by_key: dict[str, Template] = {}
        self.failed: dict[str, str] = {}
        """Keys whose template failed (key -> reason): no new template until recycle, or
        until ``rebuild_at`` says (a failure that may not recur)."""
        self.rebuild_at: dict[str, float] = {}
        """Failed keys that may be built again, and from when (monotonic seconds)."""
        self.rebuilds: dict[str, int] = {}
        """Keys -> failures that may not recur since the last recycle (TEMPLATE_REBUILDS)."""
        self.forked = 0
        self.fallbacks = 0
        self.pending: dict[str, tuple[str, bytes, float]] = {}
        """Environment key -> (config hash, bytes, previous open) wanted as a config
        template once the environment's template is ready."""
        self.config_builds = 0
        """Config templates started (processes forked for them are not counted in ``forked``)."""
        self.config_evictions = 0
        """Ready config templates killed to make room (by count or by memory)."""
        self.config_opens: collections.OrderedDict[str, float] = collections.OrderedDict()
        """When each config template key was last opened (monotonic seconds; the last
        CONFIG_OPENS_REMEMBERED keys): a template is built for a config opened twice, not
        for one-off configs, and only evicts templates used less recently than that."""
        self.no_room: set[str] = set()
        """Config template keys not built for want of room at their last try (``pid1_verdicts``)."""
        self.forker = Forker(loop, children, limits, self.by_key, self.fail)
        """Forks from the templates, ahead of opens or on their path (``pid1_forks``)."""
        self.spares_forked = self.spares_rehearsed = 0
        """Spares forked from the jobs template since the last recycle, and of them those
        sent ``rehearse`` (``fork_spare``)."""
        self.jobs_kept = 0
        """Full recycles that kept the jobs template, since the sandbox started."""
        self.jobs_waiters: list[Callable[[], None]] = []
        """Actions waiting for the loading jobs template to be ready or to fail
        (:meth:`when_jobs_settled`)."""
        children.fork_spare = self.fork_spare
        children.follow(self.pids, self._claim_exit, settled=self.ready_pids)
        loop.add_deadlines(self.check_deadlines)

    def enabled(self) -> bool:
        """Environment and config templates: on with ``templates`` in a shared sandbox."""
        return bool(self.limits.get("templates", False)) and int(self.limits.get("max_sessions", 1)) > 1

    def jobs_enabled(self) -> bool:
        """The jobs template: on with ``templates``, in any sandbox."""
        return bool(self.limits.get("templates", False))

    def spares_from_jobs(self) -> bool:
        """The jobs template started at boot, forking the spares and kept through recycles
        while clean: on with ``spares_from_template`` (the host sets it under runc)."""
        return self.jobs_enabled() and bool(self.limits.get("spares_from_template", False))

    def pids(self) -> set[int]:
        """Pids of every template, loading or ready, and of the processes forked ahead."""
        return {t.child.pid for t in self.by_key.values()} | self.forker.pids()

    def ready_pids(self) -> set[int]:
        """Pids of the ready templates: each one's process session holds only it. A
        loading one's also holds, while it builds, the process it forked to construct the
        instance a second time (``child_template.run_config_template``'s probe), which it
        kills itself; a sweep must not (it did: the probe died, the two constructions
        "differed", and the config never got its template while other sessions were busy).
        The processes forked ahead are settled too: each leads a process session of its own."""
        return {t.child.pid for t in self.by_key.values() if t.ready} | self.forker.pids()

    def by_pid(self, pid: int) -> Template | None:
        for template in self.by_key.values():
            if template.child.pid == pid:
                return template
        return None

    def stats(self) -> TemplateStats:
        """For ``ping``: environment templates ready/loading, sessions forked, fallbacks,
        failed keys; the jobs template (``jobs``: none, loading, ready or clean, i.e. kept
        through recycles), ``jobs_kept`` (full recycles that kept it since the start),
        ``spares_forked`` (spares forked from it since the last recycle) and
        ``spares_rehearsed`` (of those, the ones forked ahead and sent ``rehearse``);
        ``configs_lru``: the first 16 hex digits of each ready config template's config
        hash, least recently used first; ``ahead``: processes forked ahead and alive now,
        ``ahead_taken``: sessions that took one since the last recycle."""
        configs = [t for t in self.by_key.values() if t.config_hash is not None]
        modules = [t for k, t in self.by_key.items() if t.config_hash is None and k != JOBS_KEY]
        failed = [k for k in self.failed if "|" not in k and k != JOBS_KEY]
        jobs = self.by_key.get(JOBS_KEY)
        return {"ready": sum(t.ready for t in modules), "loading": sum(not t.ready for t in modules),
                "jobs": "none" if jobs is None else "clean" if jobs.clean else "ready" if jobs.ready else "loading",
                "jobs_kept": self.jobs_kept, "spares_forked": self.spares_forked,
                "spares_rehearsed": self.spares_rehearsed,
                "forked": self.forked, "fallbacks": self.fallbacks, "failed": len(failed),
                "reasons": sorted({self.failed[k] for k in failed})[:4],
                "configs_ready": sum(t.ready for t in configs), "configs_loading": sum(not t.ready for t in configs),
                "configs_built": self.config_builds, "configs_evicted": self.config_evictions,
                "configs_lru": [str(t.config_hash)[:16] for t in sorted(configs, key=lambda t: t.used) if t.ready],
                "configs_failed": len(self.failed) - len(failed),
                "config_reasons": sorted({v for k, v in self.failed.items() if "|" in k})[:4],
                "ahead": sum(t.ahead is not None and t.ahead.alive for t in self.by_key.values()),
                "ahead_taken": self.forker.taken}

    # -- loading --------------------------------------------------------------------------
    def want(self, key: str, spec: dict[str, Any]) -> None:
        """A session of ``key`` was opened: start its template unless one exists, failed,
        or the sandbox holds TEMPLATE_MAX_PER_SANDBOX already. Never raises."""
        if not self.enabled() or key in self.by_key or self.still_failed(key) or spec.get("describe_only"):
            return
        if sum(t.config_hash is None and k != JOBS_KEY for k, t in self.by_key.items()) >= TEMPLATE_MAX_PER_SANDBOX:
            return
        self._start(key, {"source": spec["source"], "class_name": spec["class_name"]})

    def want_jobs(self) -> None:
        """Start the jobs template unless it exists or failed since the last recycle (or
        templates are off). Never raises."""
        if self.jobs_enabled() and JOBS_KEY not in self.by_key and not self.still_failed(JOBS_KEY):
            self._start(JOBS_KEY, {"jobs": True})

    def when_jobs_settled(self, action: Callable[[], None]) -> None:
        """Run ``action()`` once no jobs template is loading: now, or when the loading one
        is ready or fails (its load deadline bounds the wait)."""
        jobs = self.by_key.get(JOBS_KEY)
        if jobs is None or jobs.ready:
            action()
        else:
            self.jobs_waiters.append(action)

    def _jobs_settled(self) -> None:
        waiters, self.jobs_waiters = self.jobs_waiters, []
        for action in waiters:
            action()

    def _start(self, key: str, fields: dict[str, Any]) -> None:
        """Make a spare the template of ``key``: send it ``template {id, **fields}``."""
        try:
            child = self.children.take()
        except OSError:
            return  # pids limit: the template is only an optimisation
        child.frames = protocol.FrameBuffer(TEMPLATE_FRAME_MAX_BYTES)
        template = Template(key, child, time.monotonic() + self.timeout_s)
        self.by_key[key] = template
        self._watch(template)
        try:
            child.send({"op": "template", "id": template.token, **fields})
        except (OSError, ValueError, TypeError):
            self.fail(template, "request could not be delivered")

    def _watch(self, template: Template) -> None:
        child = template.child
        self.loop.watch(child.sock, lambda sock: self._on_control(template, sock))
        self.loop.watch(child.out_r, lambda fd: self._on_output(template, fd))
        self.loop.watch(child.err_r, lambda fd: self._on_output(template, fd))

    def _on_output(self, template: Template, fd: int) -> None:
        """What a template printed (at import) belongs to nobody: read and dropped."""
        if self.by_key.get(template.key) is not template:
            self.loop.unwatch(fd)
            return
        if read_once(fd) == b"":
            self.loop.unwatch(fd)

    def _on_control(self, template: Template, sock: Any) -> None:
        """The template's control socket is readable: its one answer (``ok`` with, for a
        config template, its encoded state; or ``unsuitable``), or anything else, which
        fails it."""
        if self.by_key.get(template.key) is not template:
            self.loop.unwatch(sock)
            return
        data = protocol.recv_ready(template.child.sock)
        if data is None:
            return
        if not data:
            self.fail(template, "closed its channel")
            return
        try:
            messages = template.child.frames.feed(data)
        except protocol.ProtocolViolation:
            self.fail(template, "broke the protocol", final=True)
            return
        for msg in messages:
            if template.ready and template.forking is not None and msg.get("id") == template.forking.token:
                self.forker.ahead_forked(template, msg)
                if self.by_key.get(template.key) is not template:
                    return
                continue
            if template.ready or msg.get("id") != template.token:
                self.fail(template, "unsolicited message", final=True)
                return
            if msg.get("status") != "ok":
                self.fail(template, f"unsuitable: {str(msg.get('reason'))[:200]}", final=True)
                return
            if template.config_hash is not None:
                delta = msg.get("delta")
                snapshot = delta.get("set") if isinstance(delta, dict) else None
                if not isinstance(snapshot, dict):
                    self.fail(template, "malformed state", final=True)
                    return
                template.snapshot = snapshot
                try:
                    template.digest = hashlib.sha256(protocol.snapshot_text(snapshot)).hexdigest()
                except (TypeError, ValueError):
                    self.fail(template, "state not encodable", final=True)
                    return
            template.ready = True
            template.deadline = None
            template.clean = template.key == JOBS_KEY and not self.children.code_ran and self.spares_from_jobs()
            if template.key == JOBS_KEY:
                self._jobs_settled()
            template.child.sock.setblocking(False)  # read by the loop: see Forker._await (pid1_forks)
            self.children.sweep()  # whatever its import left running dies now
            if template.config_hash is None and template.key in self.pending:
                self._build_config(template.key, *self.pending.pop(template.key))

    def check_deadlines(self, now: float) -> float | None:
        """Fail templates still loading, or with a fork ahead unanswered, past their
        deadline; seconds to the next one."""
        wait = None
        for template in list(self.by_key.values()):
            if template.forking is not None:
                if template.forking.deadline <= now:
                    self.fail(template, "fork failed: TimeoutError")
                    continue
                left = template.forking.deadline - now
                wait = left if wait is None else min(wait, left)
            if template.deadline is None:
                continue
            if template.deadline <= now:
                self.fail(template, "did not load in time")
            else:
                wait = template.deadline - now if wait is None else min(wait, template.deadline - now)
        return wait

    def fail(self, template: Template, reason: str, *, final: bool = False) -> None:
        """Kill ``template`` and mark its key: no new template until recycle when ``final``
        (a verdict or a protocol violation) or the key used up TEMPLATE_REBUILDS, else
        until its backoff has passed (module docstring)."""
        if self.by_key.get(template.key) is template:
            del self.by_key[template.key]
        self.failed[template.key] = reason
        self.rebuild_at.pop(template.key, None)
        count = self.rebuilds.get(template.key, 0)
        if not final and count < TEMPLATE_REBUILDS:
            self.rebuilds[template.key] = count + 1
            self.rebuild_at[template.key] = time.monotonic() + TEMPLATE_REBUILD_BACKOFF_S * 4 ** count
        child = template.child
        for obj in (child.sock, child.out_r, child.err_r):
            self.loop.unwatch(obj)
        child.kill()
        self.forker.close_pending(template)
        if template.key == JOBS_KEY:
            self._jobs_settled()

    def still_failed(self, key: str) -> bool:
        """Whether ``key``'s template failed and may not be built yet; a key whose rebuild
        time has come is forgotten as failed (its next want builds it). Never raises."""
        if key not in self.failed:
            return False
        due = self.rebuild_at.get(key)
        if due is None or time.monotonic() < due:
            return True
        del self.failed[key], self.rebuild_at[key]
        return False

    def _claim_exit(self, pid: int, wait_status: int) -> bool:
        """A reaped pid: a template's exit (its sessions live on; new ones fall back) or a
        process forked ahead (forgotten; the next open forks at once). False when ``pid``
        is neither."""
        if self.forker.claim_exit(pid):
            return True
        template = self.by_pid(pid)
        if template is None:
            return False
        template.child.alive = False
        self._on_control(template, template.child.sock)  # an answer sent before exiting wins
        if self.by_key.get(template.key) is template:
            self.fail(template, "exited")
        return True

    def keepable_jobs(self) -> Template | None:
        """The jobs template when a full recycle may keep it: ``clean`` (ready before any
        request that may run untrusted code came since the start or the last full
        recycle, so no such code existed between its spawn and the moment it became
        non-dumpable: nothing could trace it), alive, PID 1's child, running or sleeping
        (not stopped), no fork pending; else None. Kept, it is the same process as when
        it became ready: other processes of the uid cannot trace it or read or write its
        memory (non-dumpable; ``process_vm_*`` refused), change its limits or priority
        (``child_confine``), reach its channel, or deliver it a signal but SIGKILL and
        SIGSTOP (it blocks the rest: ``child_template``)."""
        jobs = self.by_key.get(JOBS_KEY)
        if jobs is None or not jobs.clean or not jobs.child.alive or jobs.forking is not None:
            return None
        return jobs if waiting_child(jobs.child.pid) else None

    def clear(self, keep: Template | None = None) -> bool:
        """Forget every template, failed key and count (``recycle``: the templates are killed
        with the rest), but ``keep`` (:meth:`keepable_jobs`), whose process forked ahead is
        killed. Returns whether a jobs template was among them (started or ready)."""
        had_jobs = JOBS_KEY in self.by_key
        for template in list(self.by_key.values()):
            if template is keep:
                self.forker.drop(template)
                continue
            self.fail(template, "recycled")
        self.by_key.clear()
        if keep is not None:
            self.by_key[JOBS_KEY] = keep
            self.jobs_kept += 1
        self.failed.clear()
        self.rebuild_at.clear()
        self.rebuilds.clear()
        self.pending.clear()
        self.config_opens.clear()
        self.no_room.clear()
        self.forker.clear()
        self.forked = self.fallbacks = self.config_builds = self.config_evictions = self.spares_forked = 0
        self.spares_rehearsed = 0
        return had_jobs

    # -- config templates -------------------------------------------------------------------
    def want_config(self, key: str, config_hash: str, data: bytes) -> None:
        """A session of ``key`` was opened with the config ``config_hash`` (``data``, its
        JSON): on its second open, build its config template unless one exists or failed
        (making room as the module docstring says); wait for ``key``'s template when it is
        not ready yet. Never raises."""
        ckey = config_template_key(key, config_hash)
        if not self.enabled():
            return
        previous = self.config_opens.pop(ckey, None)
        self.config_opens[ckey] = time.monotonic()
        while len(self.config_opens) > CONFIG_OPENS_REMEMBERED:
            self.config_opens.popitem(last=False)
        if previous is None or ckey in self.by_key or self.still_failed(ckey) or key in self.failed:
            return
        module = self.by_key.get(key)
        if module is None or not module.ready:
            self.pending[key] = (config_hash, data, previous)
            return
        self._build_config(key, config_hash, data, previous)

    def _build_config(self, key: str, config_hash: str, data: bytes, previous: float) -> None:
        """Fork the config template of (``key``, ``config_hash``) from ``key``'s ready
        template, after making room among the templates used before ``previous`` (the
        config's previous open, monotonic seconds). Never raises."""
        ckey = config_template_key(key, config_hash)
        if ckey in self.by_key or self.still_failed(ckey):
            return
        configs = [t for t in self.by_key.values() if t.config_hash is not None]
        older = sorted((t for t in configs if t.ready and t.used < previous), key=lambda t: t.used)
        victims: list[Template] = []
        if len(self.no_room) >= CONFIG_OPENS_REMEMBERED:
            self.no_room.clear()
        self.no_room.add(ckey)
        if len(configs) >= CONFIG_TEMPLATE_MAX_PER_SANDBOX:
            if not older:
                return
            victims.append(older.pop(0))
        over = memory_over(CONFIG_TEMPLATE_MEMORY_FRACTION) - sum(private_bytes(t.child.pid) or 0 for t in victims)
        if over > 0:
            more = make_room(older, over, private_bytes)
            if more is None:
                return  # nothing killed: it would not make room
            victims += more
        self.no_room.discard(ckey)
        for victim in victims:
            self.evict(victim)
        module = self.by_key.get(key)  # ready: the caller saw it so (a failed fork is a fallback, as in fork)
        child = self.forker.take(module) if module is not None and module.ready else None
        if child is None:
            self.fallbacks += 1
            return
        self.config_builds += 1
        child.frames = protocol.FrameBuffer(MAX_FRAME_BYTES)
        template = Template(ckey, child, time.monotonic() + 3 * self.timeout_s, config_hash)
        self.by_key[ckey] = template
        self._watch(template)
        try:
            child.sock.sendall(protocol.encode_raw({"op": "config_template", "id": template.token},
                                                   {"config": data}))
        except (OSError, ValueError, TypeError):
            self.fail(template, "request could not be delivered")

    def evict(self, template: Template) -> None:
        """Kill a ready config template to make room (its key may be built again)."""
        self.fail(template, "evicted")
        self.failed.pop(template.key, None)
        self.rebuild_at.pop(template.key, None)
        self.rebuilds.pop(template.key, None)
        self.config_evictions += 1

    def config_template(self, key: str, config_hash: str) -> Template | None:
        """The ready config template of (``key``, ``config_hash``), or None."""
        template = self.by_key.get(config_template_key(key, config_hash))
        if template is None or not template.ready:
            return None
        template.used = time.monotonic()
        return template

    # -- forking ----------------------------------------------------------------------------
    def fork(self, key: str) -> Child | None:
        """A session process forked from ``key``'s ready template, or None (no ready
        template, or the fork failed: the template is then failed and the caller starts
        the session the normal way): the one forked ahead when it is still there (module
        docstring), else one forked now. The verified process is adopted as a ``Child``
        (``pid1_children.Child.adopt``): from here on it is handled like a spawned one.
        The template's next process is then forked ahead once the loop is quiet."""
        template = self.by_key.get(key)
        if template is None or not template.ready:
            return None
        child = self.forker.take(template)
        if child is None:
            self.fallbacks += 1
            return None
        template.forks += 1
        self.forked += 1
        self.forker.want(template)
        return child

    def fork_spare(self, rehearse: bool = False) -> Child | None:
        """A fresh process forked from the ready jobs template now (``Children.take`` and
        ``ensure_spare``: instead of a Python start-up), or None: no ready jobs template,
        or the fork failed (the template is then failed). ``rehearse`` (a spare forked
        ahead, with no open waiting for it) sends it ``rehearse`` at once: it makes a
        throwaway instance of the runner's own class (``child_spare.rehearse``), so that
        the pages an open writes, shared with the template until then, are copied before
        an open needs them. Counted in ``spares_rehearsed``."""
        jobs = self.by_key.get(JOBS_KEY)
        if jobs is None or not jobs.ready or not self.spares_from_jobs():
            return None
        child = self.forker.fork_now(jobs)
        if child is not None:
            self.spares_forked += 1
            child.waited = True  # idle until taken: one that dies before it answers is replaced (pid1_sessions)
        if child is not None and rehearse:
            try:  # no reply: the spare serves its first real request after it
                child.send({"op": "rehearse", "id": ""})
                self.spares_rehearsed += 1
            except OSError:
                pass  # a spare that cannot take a frame fails its first request, and is replaced
        return child


def make_room(candidates: list[Template], over: int,
              private_bytes: Callable[[int], int | None]) -> list[Template] | None:
    """The fewest of ``candidates`` (least recently used first) whose private memory
    (``private_bytes(pid)``, bytes; None: unreadable) adds up to at least ``over`` bytes;
    None when all of them together do not (or a size is unreadable: killing them might
    free nothing, and a template lost costs two constructions to rebuild)."""
    victims: list[Template] = []
    freed = 0
    for template in candidates:
        size = private_bytes(template.child.pid)
        if size is None:
            return None
        victims.append(template)
        freed += size
        if freed >= over:
            return victims
    return None
