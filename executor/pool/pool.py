"""SandboxPool: placement of sessions into sandboxes that a driver starts, warm sets,
admission, recycling and one-shot jobs; it is an :class:`~sandpit.executor.interface.Executor`.

The pool is backend-neutral: sandboxes are started, measured and destroyed by a
:class:`~sandpit.executor.pool.driver.SandboxDriver` (the Docker backend's is
:class:`~sandpit.executor.docker.driver.DockerDriver`), and every sandbox speaks the
runner protocol, whatever carries it.

* Warm sets (:mod:`.warm`): for every key ``(tenant, profile)`` that has been used (or
  :meth:`SandboxPool.warm`-ed) a background thread keeps ``pool_size`` started, idle
  sandboxes ready, starting at most ``pool_refill_concurrency`` at once. A sandbox is
  started for one tenant, so a warm sandbox can only ever serve the tenant it was started
  for.
* Placement: a session goes to a live sandbox of its key with room (one that opened the
  same config before, then the fullest), else to a warm one, else a new one is started;
  beyond ``max_sandboxes`` :class:`CapacityError` is raised (with ``retry_after_s``).
* Admission by measured memory (:mod:`.admission`): a sandbox takes one more session only
  while its measured memory says it fits, and the pool grows only within its memory
  budget (else CapacityError).
* Sandboxes with no session are recycled (the runner empties them and proves them empty)
  and return to the warm set; those beyond ``pool_size`` are removed after
  ``idle_timeout_s``. Dead sandboxes are removed at once.
* One-shot jobs (:meth:`SandboxPool.run_checks`, :meth:`SandboxPool.execute`,
  :meth:`SandboxPool.execute_many`) take a slot of a sandbox of the caller's tenant like a
  session does, for the duration of the call; inside, each runs in a fresh process (a
  pre-started spare) that never served an environment.
* Sessions depend on the pool only through the placement protocol it implements
  (:meth:`SandboxPool.place`, :meth:`SandboxPool.release`, :meth:`SandboxPool.forget`;
  :mod:`sandpit.executor.pool.placement`).
* Cleanup: :meth:`SandboxPool.close` destroys every sandbox of the pool, then lets the
  driver remove whatever is left of it; the driver's maintenance (leases, sweeps of dead
  owners' sandboxes) runs from the pool's maintenance thread, its slow part on the start
  workers.
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandpit.sandbox_images.runner.protocol import ProtocolViolation

from ..errors import ArgumentError, CapacityError, SandboxLost, SessionError, SessionOpenError
from ..profiles import MiB, ProfileOverrides, ResourceProfile, resolve_profile
from ..results import CheckResult, EncodedValue, ExecResult, OpenedState, check_encoded
from ..settings import ExecutorSettings, get_settings
from . import configs, jobs, oneshot
from .admission import Admission
from .driver import SandboxDriver, SandboxHandle
from .placement import SandboxSlot, SessionSpec
from .session import Session, check_open_arguments
from .warm import PooledSandbox, PoolKey, WarmSets

log = logging.getLogger(__name__)


class SandboxPool:
    """Owns every sandbox of one driver: places sessions and one-shot jobs in them. Use as
    a context manager (or :meth:`start` / :meth:`close`).

    Args:
        driver: what starts this pool's sandboxes (opened by :meth:`start`, closed by
            :meth:`close`).
        settings: placement, warm sets, admission and limits (default: this process's
            ``SANDPIT_EXECUTOR_*``).
    """

    def __init__(self, driver: SandboxDriver, settings: ExecutorSettings | None = None) -> None:
        self.driver = driver
        self.settings = settings or get_settings()
        self.id = secrets.token_hex(4)
        """The pool's id: the driver labels its sandboxes with it."""
        self.sets = WarmSets(self.settings)
        """Every sandbox of the pool by key and state, and the lock over them (:mod:`.warm`)."""
        self.admission = Admission(self.settings, driver.memory_total)
        """Memory estimates and budget (:mod:`.admission`)."""
        self._threads: list[threading.Thread] = []
        self._starter: ThreadPoolExecutor | None = None
        self.started_ms: collections.deque[float] = collections.deque(maxlen=1000)
        """Start times of the last 1,000 sandboxes, milliseconds (request to hello)."""
        self.failures: collections.Counter[str] = collections.Counter()
        """Sandbox failures by kind: ``start``, ``unclean``, and the lost calls' statuses."""
        self.check_restarts = 0
        """Fresh processes check batches needed after a check timed out, crashed or ran
        out of memory (all calls of this pool)."""

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> SandboxPool:
        """Open the driver (:meth:`SandboxDriver.open`), then start the refill and
        maintenance threads.

        Raises:
            DockerUnavailable (or the driver's other ExecutorError): the backend cannot
                start sandboxes. ImageError: the sandbox image is missing.
        """
        self.driver.open(self.id)
        starter = self._starter = ThreadPoolExecutor(self.settings.pool_refill_concurrency,
                                                     thread_name_prefix="sandpit-start")
        for name, target, args in (("refill", self.sets.refill_loop, (self._start_sandbox, starter)),
                                   ("maintenance", self.sets.maintenance_loop, (self.driver, starter))):
            thread = threading.Thread(target=target, args=args, name=f"sandpit-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop background work, destroy every sandbox of the pool (eight at a time), then
        close the driver (which removes whatever of the pool is left on its backend).

        Raises:
            DockerUnavailable (or the driver's other ExecutorError): the backend did not
                answer a removal.
        """
        self.sets.stop.set()
        with self.sets.lock:
            self.sets.lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._starter is not None:
            self._starter.shutdown(wait=True, cancel_futures=True)
        try:
            handles = [sandbox.handle for sandbox in self.sets.take()]
            with ThreadPoolExecutor(max(1, min(8, len(handles))), thread_name_prefix="sandpit-destroy") as destroyer:
                futures = [destroyer.submit(handle.destroy) for handle in handles]  # 8 removals at once
            for future in futures:
                future.result()  # the first failure, once every removal was tried
        finally:
            self.driver.close()

    # -- public API --------------------------------------------------------------------
    def profile(self, name: str | None = None, overrides: ProfileOverrides | None = None) -> ResourceProfile:
        """Resolve a named profile (default: ``default_profile``) lowered by ``overrides``.

        Raises: ProfileError."""
        return resolve_profile(self.settings.profiles, self.settings.max_profile,
                               name or self.settings.default_profile, overrides)

    def open_session(self, *, tenant: str, source: str, class_name: str,
                     init_config: dict[str, Any] | None = None, profile: ResourceProfile | None = None,
                     snapshot: dict[str, list[Any]] | None = None, session_id: str | None = None,
                     seed: int | None = None) -> Session:
        """Instantiate ``class_name`` from ``source`` with ``init_config`` in a sandbox of
        ``tenant`` (EnvScaler: ``cls(init_config)`` or ``cls()`` + setattr per key) and,
        if given, restore ``snapshot`` (encoded attributes) on top. ``seed`` (0 to
        2**64-1) seeds the session's ``random`` before the constructor runs, as
        EnvScaler's ``reset(seed=...)`` does (such a session is never forked from a config
        template: its instance must be made after the seed).

        Raises:
            SessionOpenError: the environment code failed (status error/timeout/oom/crashed).
            CapacityError: no sandbox can be placed (``max_sandboxes`` reached).
            ProfileError, DockerUnavailable, ImageError, SandboxStartError.
            ArgumentError: bad arguments (empty tenant, oversize source, non-dict config).
        """
        check_open_arguments(tenant, source, class_name, init_config)
        wire = None
        if init_config and self.settings.sessions_per_sandbox > 1:
            wire = init_config.wired() if isinstance(init_config, configs.SharedConfig) else configs.wire_config(init_config)
        session = Session(placement=self, spec=SessionSpec(
            session_id=session_id or secrets.token_hex(8), tenant=tenant, profile=profile or self.profile(),
            source=source, class_name=class_name, init_config=init_config or {},
            config_json=wire[0] if wire else None, config_hash=wire[1] if wire else None, seed=seed))
        session.open(check_encoded(snapshot or {}, "snapshot"))
        return session

    def describe(self, *, tenant: str, source: str, class_name: str,
                 profile: ResourceProfile | None = None) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of ``class_name`` in ``source``, derived inside a
        sandbox of ``tenant`` without instantiating the class (registration has no
        ``init_config``; ``__init__`` never runs). A short-lived describe-only session:
        opened (the module is executed, under the profile's ``call_timeout_s``), asked
        once, closed; its sandbox returns to the warm pool.

        Returns:
            The tool list, shape and rules as in :meth:`Session.describe`.

        Raises:
            SessionOpenError: the module raised, timed out, ran out of memory or crashed
                at import, or ``class_name`` is missing or not a class (``status``,
                ``observation``, ``traceback``).
            ToolSchemaError (a SessionOpenError): more than ``schemas.MAX_TOOLS`` public
                methods or schemas over ``schemas.MAX_SCHEMAS_BYTES`` (``rejected``), or
                introspection raised/timed out.
            SessionError: the sandbox's reply is malformed.
            CapacityError, ProfileError, DockerUnavailable, ImageError, SandboxStartError.
            ArgumentError: bad arguments (empty tenant, oversize source, bad class name).
        """
        check_open_arguments(tenant, source, class_name, None)
        session = Session(placement=self, spec=SessionSpec(
            session_id=secrets.token_hex(8), tenant=tenant, profile=profile or self.profile(), source=source,
            class_name=class_name, init_config={}, describe_only=True))
        session.open({})
        try:
            return session.describe()
        finally:
            session.close()

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any] | jobs.PreparedState,
                   final_state: dict[str, Any] | jobs.PreparedState, profile: ResourceProfile | None = None,
                   per_check_timeout_s: float | None = None, source: str | None = None) -> list[CheckResult]:
        """EnvScaler rule-based reward: run every check function against a pair of states
        in a sandbox of ``tenant``, each check in a fresh process of its own.

        The states are restored as real Python objects in the sandbox (pickled attributes
        are unpickled; when they hold instances of the environment's own classes, its
        module is loaded from ``source`` there, never instantiated). Each ``check_func``
        source is executed in a module namespace of its own whose global ``initial_state``
        is that process's private copy of the initial state, then ``check_func(<its copy of
        the final state>)`` is called; the checks' processes are forked one after the
        other from one process that restored the states, so nothing a check does reaches
        another check or the aggregation. A check the sandbox proves read-only (it changes
        only objects it made and names only its states and harmless builtins:
        ``runner/child_readonly.py``) runs in that process itself when the states hold no
        pickled objects: it cannot change what another check sees, and skips a fork
        (milliseconds of sandbox CPU). Only a returned
        ``True`` passes. A check that exceeds ``per_check_timeout_s`` gets ``timeout``
        (the next ones run in a fresh process); one that dies gets ``crashed`` (``oom`` when
        the kernel's OOM killer did it); the whole call is bounded by
        ``per_check_timeout_s * len(checks) + 5`` seconds.

        Args:
            checks: ``[{"check_item": str, "check_func": str}]`` (ScenGenerator's
                ``checklist_with_func``), at most 256, each source at most 64 KiB.
            initial_state, final_state: encoded states (name -> ``["j", value]`` | ``["p",
                base64 pickle]`` | ``["u", rendering]``; :func:`jobs.encode_json_state` makes one
                of plain JSON) or :class:`jobs.PreparedState` texts, at most 16 MiB of JSON each.
            profile: limits of the sandbox and of the check processes (default profile).
            per_check_timeout_s: wall-clock limit per check, seconds; default
                ``min(5, profile.call_timeout_s)``; at most ``profile.call_timeout_s``.
            source: the environment's code (needed only when a pickle refers to its classes).

        Returns:
            One :class:`CheckResult` per check, in order (``[]`` for no checks, without
            touching a sandbox). If the sandbox itself dies, every check reports its
            status (``crashed``, ``oom`` or ``timeout``).

        Raises:
            ArgumentError: bad arguments (caps, types, timeout above the profile's).
            SessionError: the sandbox refused the batch or answered malformed data.
            CapacityError, ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        timeout_s, initial_text, final_text = jobs.check_checks(checks, initial_state, final_state, profile,
                                                                per_check_timeout_s, source)
        if not checks:
            return []
        slot = self._job_slot(tenant, profile)
        try:
            results, restarts = oneshot.run_checks(slot, checks, initial_text, final_text, timeout_s, source,
                                                   self.settings.watchdog_grace_s, self.failures)
        finally:
            slot.release()
        with self.sets.lock:
            self.check_restarts += restarts
        return results

    def execute(self, *, tenant: str, code: str, stdin: str | None = None, files: dict[str, str] | None = None,
                timeout_s: float | None = None, profile: ResourceProfile | None = None) -> ExecResult:
        """Run ``code`` as a Python script in a fresh process of a sandbox of ``tenant``,
        like ``python3 -I main.py`` (``__name__ == "__main__"``, ``sys.argv == ["main.py"]``,
        neither the script's nor the runner's directory on ``sys.path``), in an empty
        working directory of its own holding ``files``, with ``stdin`` on standard input
        (empty when None). The process has the profile's memory limit (RLIMIT_DATA:
        ``memory_mib``); its stdout and stderr are captured up to the profile's
        ``output_cap_bytes`` each. Processes it leaves behind are killed when it exits; its
        working directory is removed. Reuses a warm sandbox and its pre-started process:
        no container is started per call when one is warm.

        Args:
            code: Python source, at most 4 MiB.
            stdin: text on standard input, at most 4 MiB.
            files: ``{relative path: text}`` written into the working directory first; at
                most 64 files, 4 MiB each, 8 MiB in all (and half the profile's
                ``tmpfs_mib``); no absolute paths, no ``..``, no empty components.
            timeout_s: wall-clock limit, seconds; default and maximum: the profile's
                ``call_timeout_s``.
            profile: limits (default profile).

        Returns:
            An :class:`ExecResult`; a script that fails, times out, runs out of memory or
            is killed is a result (``error``/``timeout``/``oom``/``crashed``).

        Raises:
            ArgumentError: bad arguments (caps, hostile paths, timeout above the profile's).
            SessionError: the sandbox refused the run or answered malformed data.
            CapacityError, ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        request = jobs.check_exec(code, stdin, files, timeout_s, profile)
        slot = self._job_slot(tenant, profile)
        try:
            return oneshot.run_script(slot, request, self.settings.watchdog_grace_s, self.failures)
        finally:
            slot.release()

    def execute_many(self, *, tenant: str, snippets: list[dict[str, Any]], concurrency: int = 4,
                     profile: ResourceProfile | None = None) -> list[ExecResult]:
        """Run each snippet as :meth:`execute` does, each in a fresh process, at most
        ``concurrency`` at once, all in one sandbox of ``tenant`` (so they share its CPU
        quota, memory and pids limits, which still hold: a memory-hungry snippet can push
        a concurrent one into ``oom``, and each snippet's ``timeout_s`` runs while it
        shares the CPU). If the sandbox dies, the snippets running in it report that
        status and the rest go on in another sandbox.

        Args:
            snippets: ``[{"code": str, "stdin"?: str, "files"?: {path: text},
                "timeout_s"?: float}]``, at most 1024, each as in :meth:`execute`.
            concurrency: snippets running at once, 1 to 8.
            profile: limits (default profile).

        Returns:
            One :class:`ExecResult` per snippet, in the order given.

        Raises:
            ArgumentError: bad arguments, naming the snippet. SessionError, CapacityError,
                ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        requests = jobs.check_snippets(snippets, concurrency, profile)
        if not requests:
            return []
        slot = self._job_slot(tenant, profile)
        try:
            return oneshot.run_scripts(slot, requests, concurrency, self.settings.watchdog_grace_s, self.failures)
        finally:
            slot.release()

    def _job_slot(self, tenant: str, profile: ResourceProfile) -> oneshot.JobSlot:
        """A slot of a sandbox of ``(tenant, profile)`` for one one-shot call; freed in the
        background (the caller's reply does not wait for the recycle)."""
        return oneshot.JobSlot(tenant, profile, self._reserve_slot,
                               lambda sandbox, slot_id: self._release(sandbox, slot_id, close=False, background=True),
                               self._forget)

    def warm(self, tenant: str, profile: ResourceProfile | None = None, count: int | None = None,
             timeout_s: float = 120.0) -> int:
        """Register ``(tenant, profile)`` for warm-keeping and wait until ``count``
        (default ``pool_size``) idle sandboxes are ready. Returns how many are idle."""
        profile = profile or self.profile()
        key: PoolKey = (tenant, profile.name)
        want = self.settings.pool_size if count is None else count
        deadline = time.monotonic() + timeout_s
        sets = self.sets
        with sets.lock:
            sets.wanted[key] = profile
            sets.lock.notify_all()
            while len(sets.idle[key]) < want and time.monotonic() < deadline and not sets.stop.is_set():
                sets.lock.wait(0.1)
            return len(sets.idle[key])

    def ping(self) -> None:
        """Ask the backend whether it answers (what ``/readyz`` reports).

        Raises:
            DockerUnavailable (or the driver's other ExecutorError): it does not, or the
                pool was never started.
        """
        self.driver.ping()

    def stats(self) -> dict[str, Any]:
        """Counts for metrics: sandboxes by state (``sandboxes``, ``idle``, ``active``,
        ``starting``, ``recycling``), ``sessions``, ``failures`` by kind,
        ``check_restarts``, ``max_sandboxes``, memory (``memory_projected_mib``,
        ``memory_budget_mib``, ``session_estimate_mib``, ``memory_rejections``) and the
        driver's counters."""
        sets, admission = self.sets, self.admission
        with sets.lock:
            counts = sets.counts_locked()
            return {
                **counts,
                "failures": dict(self.failures),
                "check_restarts": self.check_restarts,
                "max_sandboxes": self.settings.max_sandboxes,
                "memory_projected_mib": round(admission.projected_total_locked(sets.all.values(), counts["starting"]) / MiB, 1),
                "memory_budget_mib": round(admission.budget() / MiB, 1),
                "session_estimate_mib": round(admission.session_bytes / MiB, 3),
                "memory_rejections": admission.rejections,
                **self.driver.stats(),
            }

    # -- placement (the protocol sessions depend on) ----------------------------------
    def place(self, spec: SessionSpec, snapshot: dict[str, EncodedValue]
              ) -> tuple[SandboxHandle, OpenedState, list[dict[str, str]]]:
        """Open ``spec`` in some sandbox of its tenant and profile (a live one with a free
        slot, else a warm one, else a new one), ``snapshot`` restored; retried in another
        sandbox when one is lost while opening (three attempts). Called by a session with
        its lock held. Raises as :meth:`sandpit.executor.pool.placement.Placement.place` says."""
        affinity = configs.config_key(spec)
        snapshot_b64 = configs.snapshot_field(snapshot)
        for attempt in range(3):
            sandbox = self._reserve_slot(spec.tenant, spec.profile, spec.session_id, affinity)
            fields: dict[str, Any] = {"describe_only": True} if spec.describe_only else {}
            try:
                reply = configs.send_open(sandbox, spec, snapshot_b64, fields)
            except SandboxLost as exc:
                self._lost_while_opening(sandbox, spec, exc, last=attempt == 2)
                continue
            except (ValueError, TypeError) as exc:
                self._release(sandbox, spec.session_id, close=False)
                raise ArgumentError(f"init_config is not JSON-encodable: {exc}") from exc
            status = reply.get("status")
            if status == "ok":
                try:
                    opened, retyped = configs.opened_state(spec, sandbox, reply, bool(snapshot))
                    return sandbox.handle, opened, retyped
                except (SessionError, ProtocolViolation) as exc:
                    self._release(sandbox, spec.session_id, close=True)
                    raise SessionError(f"sandbox opened the session with a malformed state: {exc}") from exc
            self._release(sandbox, spec.session_id, close=False)
            if status == "fault":
                raise SessionError(f"sandbox refused to open the session: {reply.get('message')}")
            self.failures[str(status)] += 1
            raise SessionOpenError(str(status), str(reply.get("observation", "")), reply.get("traceback"))
        raise AssertionError("unreachable")

    def _lost_while_opening(self, sandbox: PooledSandbox, spec: SessionSpec, exc: SandboxLost, last: bool) -> None:
        """``sandbox`` died while opening ``spec`` (sending the open or reading its reply):
        destroy it and count the loss; on the ``last`` attempt raise SessionOpenError
        with the loss's status, else the caller tries another sandbox."""
        self._forget(sandbox, spec.session_id)
        self.failures[exc.status] += 1
        if last:
            raise SessionOpenError(exc.status, f"Error: sandbox lost while opening: {exc}") from exc

    def _reserve_slot(self, tenant: str, profile: ResourceProfile, slot_id: str,
                      affinity: tuple[str, str, str] | None = None) -> PooledSandbox:
        """A sandbox of ``(tenant, profile)`` with ``slot_id`` added to its sessions: a
        live one with a free slot (one that opened ``affinity``, a (source, class, config)
        key, before the fullest), else a warm one, else one of that key being recycled
        once it is proven clean (waiting up to the recycle's own timeout: ~20 ms against
        a container start's hundreds), else a new one. Raises CapacityError."""
        key: PoolKey = (tenant, profile.name)
        per = self.admission.session_cap(profile)
        wait_until = time.monotonic() + self.settings.watchdog_grace_s + 10.0  # a recycle's timeout
        sets, admission = self.sets, self.admission
        with sets.lock:
            sets.wanted.setdefault(key, profile)
            while True:
                candidates = [s for s in sets.active[key]
                              if s.handle.alive and not s.handle.retiring and len(s.sessions) < per]
                candidates = [s for s in candidates if admission.fits_locked(s, profile)]
                if candidates or sets.idle[key] or not sets.recycling[key] or sets.stop.is_set():
                    break
                remaining = wait_until - time.monotonic()
                if remaining <= 0:
                    break
                sets.lock.wait(remaining)  # a recycle under way ends with notify_all
            if candidates:
                sandbox = max(candidates, key=lambda s: (affinity in s.config_keys, len(s.sessions)))
                admission.require_locked(sets, admission.session_bytes)
            else:
                sandbox = None
                while sets.idle[key]:
                    candidate = sets.idle[key].popleft()
                    if candidate.handle.alive:
                        sandbox = candidate
                        break
                    sets.drop_locked(candidate)
                sets.lock.notify_all()  # refill
                if sandbox is None:
                    admission.require_locked(sets, admission.session_bytes + admission.empty_bytes)
                    if sets.room_locked() <= 0 and not sets.reclaim_idle_locked(key):
                        raise CapacityError(
                            f"all {self.settings.max_sandboxes} sandboxes are in use", retry_after_s=1.0)
                    uid = sets.take_uid_locked()
                    sets.starting[key] += 1
                else:
                    admission.require_locked(sets, admission.session_bytes, unless_back=sandbox)
                    sets.active[key].append(sandbox)
            if sandbox is not None:
                sandbox.sessions.add(slot_id)
                return sandbox
        try:
            sandbox = self._start_sandbox(key, profile, uid)
        finally:
            with sets.lock:
                sets.starting[key] -= 1
        with sets.lock:
            sets.all[sandbox.id] = sandbox
            sets.active[key].append(sandbox)
            sandbox.sessions.add(slot_id)
        return sandbox

    def _start_sandbox(self, key: PoolKey, profile: ResourceProfile, uid: int) -> PooledSandbox:
        """A new sandbox of ``key`` from the driver, running as ``uid`` (freed if it fails)."""
        try:
            handle = self.driver.start(key[0], profile, uid)
        except BaseException:
            with self.sets.lock:
                self.sets.free_uid_locked(uid)
            self.failures["start"] += 1
            raise
        self.started_ms.append(handle.started_ms)
        return PooledSandbox(handle, key, uid)

    def release(self, sandbox: SandboxSlot, session_id: str, close: bool = True) -> None:
        """Free ``session_id``'s slot (a session's or a one-shot job's). A sandbox left
        empty is recycled (:meth:`SandboxHandle.recycle`: the runner empties it and proves
        it empty) while no placement can see it, then becomes warm (same key); one that
        cannot be proven empty is destroyed. A sandbox the pool dropped meanwhile has
        nothing left to free. Raises TypeError for a sandbox of another pool."""
        _, record = self._record(sandbox)
        if record is not None:
            self._release(record, session_id, close)

    def _release(self, sandbox: PooledSandbox, session_id: str, close: bool, background: bool = False) -> None:
        """:meth:`release`; with ``background`` (a one-shot job's slot: ``run_checks``,
        ``execute``) the recycle runs in a thread of its own and this returns at once (the
        caller's reply does not wait for it): the sandbox stays out of placement
        until it is proven clean exactly as in the foreground, and a placement of its key
        that finds no other sandbox waits for it instead of starting a container."""
        handle = sandbox.handle
        if close and handle.alive:
            try:
                handle.request("close", session=session_id, timeout_s=self.settings.watchdog_grace_s + 5)
            except SandboxLost:
                pass
        recycle = False
        sets = self.sets
        with sets.lock:
            sandbox.sessions.discard(session_id)
            if not handle.alive:
                sets.drop_locked(sandbox)
            elif not sandbox.sessions and sandbox in sets.active[sandbox.key]:
                sets.active[sandbox.key].remove(sandbox)  # in all only: invisible to placement
                recycle = True
            sets.lock.notify_all()
        if not recycle:
            return
        if background:
            with sets.lock:
                sets.recycling[sandbox.key] += 1
            try:
                threading.Thread(target=self._recycle, args=(sandbox, True), name="sandpit-recycle",
                                 daemon=True).start()
            except BaseException:  # no thread (resource exhaustion): recycle here
                self._recycle(sandbox, True)
            return
        self._recycle(sandbox)

    def _recycle(self, sandbox: PooledSandbox, background: bool = False) -> None:
        """Recycle an empty ``sandbox`` that placement cannot see: warm again when the runner
        proved it clean, destroyed otherwise (``failures["unclean"]``)."""
        clean = False
        sandbox.forget_configs()  # the runner forgets its configs and templates
        try:
            clean = sandbox.handle.recycle()
        finally:
            sets = self.sets
            with sets.lock:
                if background:
                    sets.recycling[sandbox.key] -= 1
                if clean and sandbox.handle.alive and not sets.stop.is_set() and sandbox.id in sets.all:
                    sets.add_idle_locked(sandbox)
                else:
                    if not clean:
                        self.failures["unclean"] += 1
                    sets.drop_locked(sandbox)
                sets.lock.notify_all()

    def forget(self, sandbox: SandboxSlot, session_id: str) -> None:
        """The sandbox died under ``session_id``: destroy it and drop it from the pool.
        Raises TypeError for a sandbox of another pool."""
        handle, record = self._record(sandbox)
        if record is None:
            handle.destroy()
        else:
            self._forget(record, session_id)

    def _forget(self, sandbox: PooledSandbox, session_id: str) -> None:
        sandbox.handle.destroy()
        with self.sets.lock:
            sandbox.sessions.discard(session_id)
            self.sets.drop_locked(sandbox)

    def _record(self, sandbox: SandboxSlot) -> tuple[SandboxHandle, PooledSandbox | None]:
        """``sandbox`` as a handle of this pool's driver, and the pool's record of it (None:
        dropped already). Raises TypeError for anything this pool did not place into."""
        if not isinstance(sandbox, SandboxHandle):
            raise TypeError(f"{sandbox!r} is not a sandbox of a SandboxPool")
        with self.sets.lock:
            record = self.sets.all.get(sandbox.id)
        if record is not None and record.handle is not sandbox:
            raise TypeError(f"{sandbox!r} is not a sandbox of this pool")
        return sandbox, record

