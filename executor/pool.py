"""SandboxPool: warm pool, placement of sessions into sandboxes, idle reaping, cleanup.

* Warm pool: for every key ``(tenant, profile, runtime, image)`` that has been used (or
  :meth:`SandboxPool.warm`-ed) a background thread keeps ``pool_size`` started, idle
  sandboxes ready, starting at most ``pool_refill_concurrency`` containers at once.
  Containers carry their tenant label from creation, so a warm sandbox can only ever
  serve the tenant it was started for.
* Placement: a session goes to a live sandbox of its key with room (fullest first), else
  to a warm one, else a new one is started; beyond ``max_sandboxes`` :class:`CapacityError`
  is raised (with ``retry_after_s``).
* Admission by measured memory (with ``sessions_per_sandbox > 1``): a sandbox has room
  while it holds fewer than its hard cap of sessions (``sessions_per_sandbox``, lowered so
  that the runner's descriptors, 4 per session, fit the profile's ``nofile`` and the
  processes its ``pids``) *and* its cgroup's measured memory, plus the expected cost of the
  sessions placed since that sample and of one more, plus the headroom
  (``sandbox_memory_headroom_mib``, default the profile's ``memory_mib``), stays within
  its memory limit. The expected cost of a session is learnt from the sandboxes' own
  samples ((usage - usage when empty) / sessions, moving average). Across the pool, every
  placement must keep the sum of all sandboxes' projected memory within
  ``memory_budget_mib`` (default 80 % of the host's memory), else CapacityError.
* Sandboxes with no session return to the warm set; those beyond ``pool_size`` are
  removed after ``idle_timeout_s``. Dead sandboxes are removed at once.
* One-shot jobs (:meth:`SandboxPool.run_checks`, :meth:`SandboxPool.execute`,
  :meth:`SandboxPool.execute_many`) take a slot of a sandbox of the caller's tenant like a
  session does, for the duration of the call; inside, each runs in a fresh process (a
  pre-started spare) that never served an environment.
* Sessions depend on the pool only through the placement protocol it implements
  (:meth:`SandboxPool.place`, :meth:`SandboxPool.release`, :meth:`SandboxPool.forget`;
  :mod:`sandpit.executor.placement`).
* Leaks: every container is labeled ``sandpit=1``/``sandpit.pool=<id>`` and with its
  owner (``executor/owners.py``); start-up reaps leftovers of earlier runs
  (``reap_on_start``); :meth:`close` removes every container this pool started.
* Dead owners: a started pool holds a lease (:class:`~.owners.OwnerLease`, renewed by the
  maintenance thread) and sweeps the engine every ``reap_interval_s``, removing the
  sandboxes of owners proven dead (process gone, lease expired) while every other
  owner's keep running; a sweep runs on the start workers, so a slow engine never delays
  the lease renewal.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import docker
from sandpit.sandbox_images.runner.protocol import ProtocolViolation

from . import configs, engine, jobs, owners
from .errors import CapacityError, ExecutorError, SandboxLost, SessionError, SessionOpenError
from .images import resolve_image
from .placement import SandboxSlot, SessionSpec
from .profiles import MiB, ProfileOverrides, ResourceProfile, resolve_profile
from .results import CheckResult, EncodedValue, ExecResult, check_encoded, check_retyped
from .sandbox import PoolKey, Sandbox
from .session import Session, check_open_arguments
from .settings import ExecutorSettings, ImageSettings, get_image_settings, get_settings

if TYPE_CHECKING:
    from sandpit.sandbox_images.runner.protocol import ChecksReply, ExecReply, OpenReply, SnapshotReply

log = logging.getLogger(__name__)


class SandboxPool:
    """Owns every sandbox of this process. Use as a context manager (or start/close)."""

    def __init__(self, settings: ExecutorSettings | None = None, image_settings: ImageSettings | None = None,
                 client: docker.DockerClient | None = None) -> None:
        self.settings = settings or get_settings()
        self.image_settings = image_settings or get_image_settings()
        self.id = secrets.token_hex(4)
        self._client = client
        self.image = ""
        self._lock = threading.Condition()
        self._idle: dict[PoolKey, collections.deque[Sandbox]] = collections.defaultdict(collections.deque)
        self._active: dict[PoolKey, list[Sandbox]] = collections.defaultdict(list)
        self._all: dict[str, Sandbox] = {}
        self._starting: collections.Counter[PoolKey] = collections.Counter()
        self._recycling: collections.Counter[PoolKey] = collections.Counter()
        """Sandboxes of a key being recycled off their caller's path (:meth:`_release` with
        ``background``): invisible to placement, which waits for them (:meth:`_reserve_slot`)."""
        self._wanted: dict[PoolKey, ResourceProfile] = {}
        self._uids_in_use: set[int] = set()
        self._next_uid = secrets.randbelow(self.settings.uid_count)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._starter: ThreadPoolExecutor | None = None
        self.started_ms: collections.deque[float] = collections.deque(maxlen=1000)
        self.failures: collections.Counter[str] = collections.Counter()
        self._session_bytes = self.settings.session_memory_estimate_mib * MiB
        """Expected memory of one more session (bytes), learnt from samples."""
        self._empty_bytes = 24 * MiB
        """Expected memory of a sandbox with no session (runner, spare), learnt from samples."""
        self.memory_rejections = 0
        """Placements refused because the pool's memory budget was reached."""
        self.check_restarts = 0
        """Fresh processes check batches needed after a check timed out, crashed or ran
        out of memory (all calls of this pool)."""
        self.initial_snapshots = configs.InitialSnapshots()
        """Initial states by (tenant, digest): sessions forked from a config template get
        theirs from here instead of over the wire (``executor/configs.py``)."""
        self._lease: owners.OwnerLease | None = None
        self.reaped = 0
        """Containers of dead owners this pool removed (start-up reap and sweeps)."""
        self.sweeps = 0
        """Periodic sweeps of the engine finished (``reap_interval_s``)."""
        self._sweeping = False
        self._next_sweep = 0.0

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> SandboxPool:
        """Connect to Docker, check its runtime, resolve the image, reap leftovers, start
        background threads.

        Raises:
            DockerUnavailable: engine unreachable, or ``settings.runtime`` not registered as
                Sandpit needs it (``engine.check_runtime``). ImageError: image not built.
        """
        if self._client is None:
            self._client = engine.make_client(self.settings)
        engine.check_runtime(self._client, self.settings.runtime)
        self.image = resolve_image(self._client, self.settings.image, self.image_settings)
        self._lease = owners.OwnerLease(self.settings.resolved_lease_dir(), engine.owner_id(), owners.owner_ns(),
                                        self.id, self.settings.owner_lease_timeout_s)
        self._lease.acquire()  # before any container of this pool exists
        if self.settings.reap_on_start:
            self.reaped += engine.reap(self._client, exclude_pool=self.id, leases=self._lease_view())
        self._next_sweep = time.monotonic() + self.settings.reap_interval_s
        self._starter = ThreadPoolExecutor(self.settings.pool_refill_concurrency, thread_name_prefix="sandpit-start")
        for target in (self._refill_loop, self._maintenance_loop):
            thread = threading.Thread(target=target, name=f"sandpit-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __enter__(self) -> SandboxPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop background work and remove every container this pool started; then give up
        the lease (marked expired instead when a removal failed, so that any other
        pool's sweep removes what is left).

        Raises:
            DockerUnavailable: the engine did not answer the final listing or a removal.
        """
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._starter is not None:
            self._starter.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            sandboxes = list(self._all.values())
            self._all.clear()
            self._idle.clear()
            self._active.clear()
        lease, self._lease = self._lease, None
        try:
            for sandbox in sandboxes:
                sandbox.destroy()
            if self._client is not None:
                for container in engine.list_sandboxes(self._client, pool=self.id):
                    engine.remove_container(self._client, container.id)
        except BaseException:
            if lease is not None:
                lease.expire()
            raise
        if lease is not None:
            lease.release()

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            raise ExecutorError("pool not started")
        return self._client

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
            ValueError: bad arguments (empty tenant, oversize source, non-dict config).
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
            ValueError: bad arguments (empty tenant, oversize source, bad class name).
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

    def run_checks(self, *, tenant: str, checks: list[dict[str, Any]], initial_state: dict[str, Any],
                   final_state: dict[str, Any], profile: ResourceProfile | None = None,
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
        (~2-3 ms of sandbox CPU). Only a returned
        ``True`` passes. A check that exceeds ``per_check_timeout_s`` gets ``timeout``
        (the next ones run in a fresh process); one that dies gets ``crashed`` (``oom`` when
        the kernel's OOM killer did it); the whole call is bounded by
        ``per_check_timeout_s * len(checks) + 5`` seconds.

        Args:
            checks: ``[{"check_item": str, "check_func": str}]`` (ScenGenerator's
                ``checklist_with_func``), at most 256, each source at most 64 KiB.
            initial_state, final_state: encoded states (attribute name -> ``["j", value]``
                | ``["p", base64 pickle]`` | ``["u", rendering]``; :func:`jobs.encode_json_state`
                turns a plain JSON state into one), at most 16 MiB of JSON each.
            profile: limits of the sandbox and of the check processes (default profile).
            per_check_timeout_s: wall-clock limit per check, seconds; default
                ``min(5, profile.call_timeout_s)``; at most ``profile.call_timeout_s``.
            source: the environment's code (needed only when a pickle refers to its classes).

        Returns:
            One :class:`CheckResult` per check, in order (``[]`` for no checks, without
            touching a sandbox). If the sandbox itself dies, every check reports its
            status (``crashed``, ``oom`` or ``timeout``).

        Raises:
            ValueError: bad arguments (caps, types, timeout above the profile's).
            SessionError: the sandbox refused the batch or answered malformed data.
            CapacityError, ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        timeout_s = jobs.check_checks(checks, initial_state, final_state, profile, per_check_timeout_s, source)
        if not checks:
            return []
        budget_s = timeout_s * len(checks) + jobs.BATCH_SLACK_S
        slot = _Slot(self, tenant, profile)
        try:
            sandbox = slot.get()
            try:
                reply = sandbox.request(
                    "checks", timeout_s=budget_s + self.settings.watchdog_grace_s + 5.0, time_limit_s=timeout_s,
                    checks=[{"check_func": c["check_func"]} for c in checks],
                    initial_state=_without_renderings(initial_state), final_state=_without_renderings(final_state),
                    source=source)
            except SandboxLost as exc:
                slot.lost(sandbox)
                self.failures[exc.status] += 1
                return jobs.lost_checks(checks, exc.status, f"the sandbox was lost: {exc}")
        finally:
            slot.release()
        results, restarts = jobs.parse_check_results(cast("ChecksReply", reply), checks)
        with self._lock:
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
            ValueError: bad arguments (caps, hostile paths, timeout above the profile's).
            SessionError: the sandbox refused the run or answered malformed data.
            CapacityError, ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        request = jobs.check_exec(code, stdin, files, timeout_s, profile)
        slot = _Slot(self, tenant, profile)
        try:
            return self._exec(slot, request)
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
            ValueError: bad arguments, naming the snippet. SessionError, CapacityError,
                ProfileError, DockerUnavailable, ImageError, SandboxStartError.
        """
        jobs.check_tenant(tenant)
        profile = profile or self.profile()
        requests = jobs.check_snippets(snippets, concurrency, profile)
        if not requests:
            return []
        slot = _Slot(self, tenant, profile)
        try:
            if concurrency == 1 or len(requests) == 1:
                return [self._exec(slot, request) for request in requests]
            with ThreadPoolExecutor(min(concurrency, len(requests)), thread_name_prefix="sandpit-exec") as workers:
                return list(workers.map(lambda request: self._exec(slot, request), requests))
        finally:
            slot.release()

    def _exec(self, slot: _Slot, request: jobs.ExecRequest) -> ExecResult:
        sandbox = slot.get()
        started = time.perf_counter()
        try:
            reply = sandbox.request("exec", timeout_s=request.timeout_s + self.settings.watchdog_grace_s + 5.0,
                                    **request.fields())
        except SandboxLost as exc:
            slot.lost(sandbox)
            self.failures[exc.status] += 1
            return jobs.lost_exec(exc.status, f"the sandbox was lost: {exc}", (time.perf_counter() - started) * 1000)
        return jobs.parse_exec_result(cast("ExecReply", reply), slot.profile, (time.perf_counter() - started) * 1000.0)

    def warm(self, tenant: str, profile: ResourceProfile | None = None, count: int | None = None,
             timeout_s: float = 120.0) -> int:
        """Register ``(tenant, profile)`` for warm-keeping and wait until ``count``
        (default ``pool_size``) idle sandboxes are ready. Returns how many are idle."""
        profile = profile or self.profile()
        key = self._key(tenant, profile)
        want = self.settings.pool_size if count is None else count
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._wanted[key] = profile
            self._lock.notify_all()
            while len(self._idle[key]) < want and time.monotonic() < deadline and not self._stop.is_set():
                self._lock.wait(0.1)
            return len(self._idle[key])

    def ping(self) -> None:
        """Ask the Docker Engine whether it answers (what ``/readyz`` reports).

        Raises:
            DockerUnavailable: the engine does not answer. ExecutorError: the pool was
                never started.
        """
        engine.ping(self.client)

    def stats(self) -> dict[str, Any]:
        """Counts for metrics: sandboxes by state, sessions, starts, failures by status."""
        with self._lock:
            return {
                "sandboxes": len(self._all),
                "idle": sum(len(q) for q in self._idle.values()),
                "active": sum(len(v) for v in self._active.values()),
                "starting": sum(self._starting.values()),
                "recycling": sum(self._recycling.values()),
                "sessions": sum(len(s.sessions) for s in self._all.values()),
                "failures": dict(self.failures),
                "check_restarts": self.check_restarts,
                "memory_projected_mib": round(self._projected_total_locked() / MiB, 1),
                "memory_budget_mib": round(self._memory_budget() / MiB, 1),
                "session_estimate_mib": round(self._session_bytes / MiB, 3),
                "memory_rejections": self.memory_rejections,
                "reaped": self.reaped,
                "sweeps": self.sweeps,
            }

    # -- placement (the protocol sessions depend on) ----------------------------------
    def _key(self, tenant: str, profile: ResourceProfile) -> PoolKey:
        return (tenant, profile.name, self.settings.runtime, self.image)

    def place(self, spec: SessionSpec, snapshot: dict[str, EncodedValue]) -> tuple[Sandbox, dict[str, EncodedValue]]:
        """Open ``spec`` in some sandbox of its tenant and profile (a live one with a free
        slot, else a warm one, else a new one), ``snapshot`` restored; retried in another
        sandbox when one is lost while opening (three attempts). Called by a session with
        its lock held. Raises as :meth:`sandpit.executor.placement.Placement.place` says."""
        affinity = _config_key(spec)
        for attempt in range(3):
            sandbox = self._reserve_slot(spec.tenant, spec.profile, spec.session_id, affinity)
            fields: dict[str, Any] = {"describe_only": True} if spec.describe_only else {}
            try:
                reply = self._open(sandbox, spec, snapshot, fields)
            except SandboxLost as exc:
                self._lost_while_opening(sandbox, spec, exc, last=attempt == 2)
                continue
            except (ValueError, TypeError) as exc:
                self.release(sandbox, spec.session_id, close=False)
                raise ValueError(f"init_config is not JSON-encodable: {exc}") from exc
            status = reply.get("status")
            if status == "ok":
                try:
                    return sandbox, self._opened(sandbox, spec, reply, bool(snapshot))
                except (SessionError, ProtocolViolation) as exc:
                    self.release(sandbox, spec.session_id)
                    raise SessionError(f"sandbox opened the session with a malformed state: {exc}") from exc
                except SandboxLost as exc:
                    self._lost_while_opening(sandbox, spec, exc, last=attempt == 2)
                    continue
            self.release(sandbox, spec.session_id, close=False)
            if status == "fault":
                raise SessionError(f"sandbox refused to open the session: {reply.get('message')}")
            self.failures[str(status)] += 1
            raise SessionOpenError(str(status), str(reply.get("observation", "")), reply.get("traceback"))
        raise AssertionError("unreachable")

    def _lost_while_opening(self, sandbox: Sandbox, spec: SessionSpec, exc: SandboxLost, last: bool) -> None:
        """``sandbox`` died while opening ``spec`` (sending the open or reading its reply):
        destroy it and count the loss; on the ``last`` attempt raise SessionOpenError
        with the loss's status, else the caller tries another sandbox."""
        self.forget(sandbox, spec.session_id)
        self.failures[exc.status] += 1
        if last:
            raise SessionOpenError(exc.status, f"Error: sandbox lost while opening: {exc}") from exc

    def _open(self, sandbox: Sandbox, spec: SessionSpec, snapshot: dict[str, EncodedValue],
              fields: dict[str, Any]) -> OpenReply:
        """The runner's reply to ``open``. A config with wire bytes goes by hash when the
        sandbox was sent it before, else as base64 bytes with the hash; a ``missing_config``
        answer (the runner let it go) is asked again with the bytes. Raises SandboxLost,
        ValueError/TypeError (not JSON-encodable)."""
        common = {"session": spec.session_id, "source": spec.source, "class_name": spec.class_name,
                  "snapshot": snapshot or None, **fields}
        if spec.seed is not None:
            common["seed"] = spec.seed
        if spec.config_json is None or spec.config_hash is None:
            return cast("OpenReply", sandbox.request("open", init_config=spec.init_config, **common))
        if spec.config_hash in sandbox.configs:
            reply = cast("OpenReply", sandbox.request("open", config_hash=spec.config_hash, **common))
            if reply.get("status") != "fault" or reply.get("missing_config") is not True:
                sandbox.configs.move_to_end(spec.config_hash)
                return reply
            sandbox.configs.pop(spec.config_hash, None)
        reply = cast("OpenReply", sandbox.request("open", config_hash=spec.config_hash,
                                                  config_b64=base64.b64encode(spec.config_json).decode("ascii"),
                                                  **common))
        if reply.get("status") != "fault":
            sandbox.configs[spec.config_hash] = None
            while len(sandbox.configs) > 64:
                sandbox.configs.popitem(last=False)
        return reply

    def _opened(self, sandbox: Sandbox, spec: SessionSpec, reply: OpenReply,
                restored: bool) -> configs.OpenedSnapshot:
        """The encoded state of a session the runner opened: the reply's, or, for a session
        forked from a config template (``template: true``, no snapshot), the one known by
        its digest for this tenant, else asked of the runner once (``snapshot``). Raises
        SandboxLost, SessionError (malformed reply)."""
        digest: object = reply.get("snapshot_digest")
        digest = digest if isinstance(digest, str) and len(digest) == 64 and not restored else None
        key = _config_key(spec)
        if key is not None:
            sandbox.config_keys.add(key)
        if reply.get("template") is True and digest is None:
            raise SessionError("sandbox opened a session from a template without naming its state")
        if reply.get("template") is True and digest is not None:
            known = self.initial_snapshots.get(spec.tenant, digest)
            if known is None:
                asked = cast("SnapshotReply", sandbox.request("snapshot", session=spec.session_id))
                if asked.get("status") != "ok":
                    raise SessionError(f"sandbox refused the opened state: {asked.get('message')}")
                known = check_encoded(asked.get("snapshot") or {}, "snapshot")
                self.initial_snapshots.put(spec.tenant, digest, known)
            opened = configs.OpenedSnapshot(known)
        else:
            opened = configs.OpenedSnapshot(check_encoded(reply.get("snapshot") or {}, "snapshot"))
            if digest is not None and spec.config_hash is not None:
                self.initial_snapshots.put(spec.tenant, digest, dict(opened))
        opened.digest = digest
        opened.retyped = check_retyped(reply.get("retyped"))
        return opened

    def _reserve_slot(self, tenant: str, profile: ResourceProfile, slot_id: str,
                      affinity: tuple[str, str, str] | None = None) -> Sandbox:
        """A sandbox of ``(tenant, profile)`` with ``slot_id`` added to its sessions: a
        live one with a free slot (one that opened ``affinity``, a (source, class, config)
        key, before the fullest), else a warm one, else one of that key being recycled
        once it is proven clean (waiting up to the recycle's own timeout: ~20 ms against
        a container start's hundreds), else a new one. Raises CapacityError."""
        key = self._key(tenant, profile)
        per = self.session_cap(profile)
        wait_until = time.monotonic() + self.settings.watchdog_grace_s + 10.0  # Sandbox.recycle's timeout
        with self._lock:
            self._wanted.setdefault(key, profile)
            while True:
                candidates = [s for s in self._active[key] if s.alive and not s.retiring and len(s.sessions) < per]
                candidates = [s for s in candidates if self._fits_locked(s, profile)]
                if candidates or self._idle[key] or not self._recycling[key] or self._stop.is_set():
                    break
                remaining = wait_until - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)  # a recycle under way ends with notify_all
            if candidates:
                sandbox = max(candidates, key=lambda s: (affinity in s.config_keys, len(s.sessions)))
                self._check_budget_locked(self._session_bytes)
            else:
                sandbox = None
                while self._idle[key]:
                    candidate = self._idle[key].popleft()
                    if candidate.alive:
                        sandbox = candidate
                        break
                    self._drop_locked(candidate)
                self._lock.notify_all()  # refill
                if sandbox is None:
                    self._check_budget_locked(self._session_bytes + self._empty_bytes)
                    if (len(self._all) + sum(self._starting.values()) >= self.settings.max_sandboxes
                            and not self._reclaim_idle_locked(key)):
                        raise CapacityError(
                            f"all {self.settings.max_sandboxes} sandboxes are in use", retry_after_s=1.0)
                    self._starting[key] += 1
                    uid = self._take_uid_locked()
                else:
                    self._check_budget_locked(self._session_bytes, unless_back=sandbox, key=key)
                    self._active[key].append(sandbox)
            if sandbox is not None:
                sandbox.sessions.add(slot_id)
                return sandbox
        try:
            sandbox = self._start_sandbox(key, profile, uid)
        finally:
            with self._lock:
                self._starting[key] -= 1
        with self._lock:
            self._all[sandbox.id] = sandbox
            self._active[key].append(sandbox)
            sandbox.sessions.add(slot_id)
        return sandbox

    # -- memory admission ----------------------------------------------------------------
    def session_cap(self, profile: ResourceProfile) -> int:
        """Hard cap of sessions in one sandbox of ``profile``: ``sessions_per_sandbox``,
        lowered so the runner's descriptors (4 per session: control socket, two output
        streams, selector) fit the profile's ``nofile`` and processes (a session, the spare,
        templates) its ``pids``; at least 1."""
        per = self.settings.sessions_per_sandbox
        if per == 1:
            return 1
        return max(1, min(per, (profile.nofile - 32) // 4, profile.pids - 16))

    def _memory_budget(self) -> int:
        if self.settings.memory_budget_mib:
            return self.settings.memory_budget_mib * MiB
        return int(engine.host_memory_total() * 0.8) or 1 << 62

    def _projected_locked(self, sandbox: Sandbox) -> int:
        """Measured memory of ``sandbox`` plus the expected cost of sessions placed since
        the sample (bytes); the expected empty sandbox when it cannot be measured."""
        used = sandbox.sample_memory(self.settings.memory_sample_s)
        if used is None:
            return self._empty_bytes + len(sandbox.sessions) * int(self._session_bytes)
        if sandbox.memory_empty is not None and sandbox.sessions_at_sample >= 2:
            per_session = (used - sandbox.memory_empty) / sandbox.sessions_at_sample
            floor = self.settings.session_memory_floor_mib * MiB
            self._session_bytes = max(floor, 0.8 * self._session_bytes + 0.2 * per_session)
        if sandbox.memory_empty is not None:
            self._empty_bytes = int(0.8 * self._empty_bytes + 0.2 * sandbox.memory_empty)
        return used + max(0, len(sandbox.sessions) - sandbox.sessions_at_sample) * int(self._session_bytes)

    def _projected_total_locked(self) -> int:
        starting = sum(self._starting.values())
        return sum(self._projected_locked(s) for s in self._all.values()) + starting * int(self._empty_bytes)

    def _fits_locked(self, sandbox: Sandbox, profile: ResourceProfile) -> bool:
        """Room for one more session in ``sandbox`` by its measured memory (see the module
        docstring); True for one-session sandboxes and when the limit is unknown."""
        if self.settings.sessions_per_sandbox == 1 or not sandbox.memory_limit:
            return True
        headroom = (self.settings.sandbox_memory_headroom_mib or profile.memory_mib) * MiB
        return self._projected_locked(sandbox) + self._session_bytes + headroom <= sandbox.memory_limit

    def _check_budget_locked(self, extra: float, unless_back: Sandbox | None = None,
                             key: PoolKey | None = None) -> None:
        """Raise CapacityError when ``extra`` more bytes would take the pool's projected
        memory past ``memory_budget_mib``. ``unless_back``: a warm sandbox taken for this
        placement, put back first."""
        if self._projected_total_locked() + extra <= self._memory_budget():
            return
        self.memory_rejections += 1
        if unless_back is not None and key is not None:
            self._idle[key].appendleft(unless_back)
        raise CapacityError(f"the sandboxes' memory budget ({self._memory_budget() // MiB} MiB) is reached",
                            retry_after_s=1.0)

    def _start_sandbox(self, key: PoolKey, profile: ResourceProfile, uid: int) -> Sandbox:
        if self._lease is not None:
            self._lease.renew_if_due()  # a new container is never covered by a stale lease
        try:
            sandbox = Sandbox.start(client=self.client, settings=self.settings, profile=profile, image=self.image,
                                    tenant=key[0], pool_id=self.id, uid=uid)
        except BaseException:
            with self._lock:
                self._uids_in_use.discard(uid)
            self.failures["start"] += 1
            raise
        self.started_ms.append(sandbox.started_ms)
        return sandbox

    def _take_uid_locked(self) -> int:
        for _ in range(self.settings.uid_count):
            uid = self.settings.uid_base + self._next_uid
            self._next_uid = (self._next_uid + 1) % self.settings.uid_count
            if uid not in self._uids_in_use:
                self._uids_in_use.add(uid)
                return uid
        raise CapacityError("no free sandbox uid", retry_after_s=1.0)

    def release(self, sandbox: SandboxSlot, session_id: str, close: bool = True) -> None:
        """Free ``session_id``'s slot (a session's or a one-shot job's). A sandbox left
        empty is recycled (the runner empties it and proves it empty,
        :meth:`Sandbox.recycle`) while no placement can see it, then becomes warm (same
        key); one that cannot be proven empty is destroyed."""
        self._release(self._own(sandbox), session_id, close)

    def _release(self, sandbox: Sandbox, session_id: str, close: bool, background: bool = False) -> None:
        """:meth:`release`; with ``background`` (a one-shot job's slot: ``run_checks``,
        ``execute``) the recycle runs in a thread of its own and this returns at once (the
        caller's reply no longer waits ~20 ms for it): the sandbox stays out of placement
        until it is proven clean exactly as in the foreground, and a placement of its key
        that finds no other sandbox waits for it instead of starting a container."""
        if close and sandbox.alive:
            try:
                sandbox.request("close", session=session_id, timeout_s=sandbox.watchdog_grace_s + 5)
            except SandboxLost:
                pass
        recycle = False
        with self._lock:
            sandbox.sessions.discard(session_id)
            if not sandbox.alive:
                self._drop_locked(sandbox)
            elif not sandbox.sessions and sandbox in self._active[sandbox.key]:
                self._active[sandbox.key].remove(sandbox)  # in _all only: invisible to placement
                recycle = True
            self._lock.notify_all()
        if not recycle:
            return
        if background:
            with self._lock:
                self._recycling[sandbox.key] += 1
            try:
                threading.Thread(target=self._recycle, args=(sandbox, True), name="sandpit-recycle",
                                 daemon=True).start()
            except BaseException:  # no thread (resource exhaustion): recycle here
                self._recycle(sandbox, True)
            return
        self._recycle(sandbox)

    def _recycle(self, sandbox: Sandbox, background: bool = False) -> None:
        """Recycle an empty ``sandbox`` that placement cannot see: warm again when the runner
        proved it clean, destroyed otherwise (``failures["unclean"]``)."""
        clean = False
        try:
            clean = sandbox.recycle()
        finally:
            with self._lock:
                if background:
                    self._recycling[sandbox.key] -= 1
                if clean and sandbox.alive and not self._stop.is_set() and sandbox.id in self._all:
                    sandbox.idle_since = time.monotonic()
                    self._idle[sandbox.key].append(sandbox)
                else:
                    if not clean:
                        self.failures["unclean"] += 1
                    self._drop_locked(sandbox)
                self._lock.notify_all()

    def forget(self, sandbox: SandboxSlot, session_id: str) -> None:
        """The sandbox died under ``session_id``: destroy it and drop it from the pool."""
        self._forget(self._own(sandbox), session_id)

    def _forget(self, sandbox: Sandbox, session_id: str) -> None:
        sandbox.destroy()
        with self._lock:
            sandbox.sessions.discard(session_id)
            self._drop_locked(sandbox)

    @staticmethod
    def _own(sandbox: SandboxSlot) -> Sandbox:
        if not isinstance(sandbox, Sandbox):
            raise TypeError(f"{sandbox!r} is not a sandbox of a SandboxPool")
        return sandbox

    def _reclaim_idle_locked(self, key: PoolKey) -> bool:
        """At capacity: destroy the longest-idle warm sandbox kept for another (tenant,
        profile), so a request of ``key`` can start one. False when none is idle."""
        idle = [s for k, queue in self._idle.items() if k != key for s in queue]
        if not idle:
            return False
        self._drop_locked(min(idle, key=lambda s: s.idle_since or 0.0))
        return True

    def _drop_locked(self, sandbox: Sandbox) -> None:
        self._all.pop(sandbox.id, None)
        self._uids_in_use.discard(sandbox.uid)
        if sandbox in self._active[sandbox.key]:
            self._active[sandbox.key].remove(sandbox)
        if sandbox in self._idle[sandbox.key]:
            self._idle[sandbox.key].remove(sandbox)
        if not sandbox.destroyed:
            threading.Thread(target=sandbox.destroy, daemon=True).start()

    # -- background --------------------------------------------------------------------
    def _refill_loop(self) -> None:
        while not self._stop.is_set():
            jobs: list[tuple[PoolKey, ResourceProfile, int]] = []
            with self._lock:
                for key, profile in self._wanted.items():
                    deficit = self.settings.pool_size - len(self._idle[key]) - self._starting[key]
                    room = self.settings.max_sandboxes - len(self._all) - sum(self._starting.values())
                    for _ in range(max(0, min(deficit, room, self.settings.pool_refill_concurrency))):
                        self._starting[key] += 1
                        jobs.append((key, profile, self._take_uid_locked()))
                if not jobs:
                    self._lock.wait(0.5)
                    continue
            futures = [self._starter.submit(self._start_sandbox, *job) for job in jobs]  # type: ignore[union-attr]
            for (key, _, _), future in zip(jobs, futures, strict=True):
                try:
                    sandbox = future.result()
                except Exception as exc:  # noqa: BLE001 - logged, retried after a pause
                    log.warning("warm sandbox start failed: %s", exc)
                    with self._lock:
                        self._starting[key] -= 1
                    self._stop.wait(1.0)
                    continue
                with self._lock:
                    self._starting[key] -= 1
                    if self._stop.is_set():
                        sandbox.destroy()
                        continue
                    self._all[sandbox.id] = sandbox
                    sandbox.idle_since = time.monotonic()
                    self._idle[key].append(sandbox)
                    self._lock.notify_all()

    def _maintenance_loop(self) -> None:
        """Every few seconds (at most 5, half ``idle_timeout_s``, half the lease's renewal
        period, ``reap_interval_s``): renew the lease when due, drop dead idle sandboxes
        and those idle beyond the warm quota for ``idle_timeout_s``, and hand a sweep to
        the start workers when one is due. Only filesystem work here, never a Docker call:
        nothing the engine does can hold up the lease."""
        periods = [5.0, self.settings.idle_timeout_s / 2]
        if self._lease is not None:
            periods.append(self._lease.renew_period_s / 2)
        if self.settings.reap_interval_s:
            periods.append(self.settings.reap_interval_s)
        while not self._stop.wait(min(periods)):
            try:
                if self._lease is not None:
                    self._lease.renew_if_due()
                self._drop_idle()
                self._schedule_sweep()
            except Exception:  # noqa: BLE001 - the loop must outlive a bug: it renews the lease
                log.exception("pool maintenance failed")

    def _drop_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            for key, queue in list(self._idle.items()):
                keep = self.settings.pool_size if key in self._wanted else 0
                for sandbox in list(queue):
                    if not sandbox.alive:
                        self._drop_locked(sandbox)
                    elif len(queue) > keep and now - sandbox.idle_since > self.settings.idle_timeout_s:
                        self._drop_locked(sandbox)

    def _schedule_sweep(self) -> None:
        """Submit :meth:`_sweep` to the start workers when ``reap_interval_s`` has passed
        since the last one was submitted and none is pending."""
        if not self.settings.reap_interval_s or self._sweeping or time.monotonic() < self._next_sweep:
            return
        self._sweeping = True
        self._next_sweep = time.monotonic() + self.settings.reap_interval_s
        try:
            self._starter.submit(self._sweep)  # type: ignore[union-attr]
        except RuntimeError:  # the workers were shut down: the pool is closing
            self._sweeping = False

    def _sweep(self) -> None:
        """One sweep: remove the sandboxes of dead owners on the engine (never this
        pool's, never unlabeled ones, never those of owners it cannot judge), then the
        lease files long expired that no container names."""
        try:
            if self._stop.is_set():
                return
            view = self._lease_view()
            removed = engine.reap(self.client, exclude_pool=self.id, unowned=False, leases=view)
            view.collect_garbage()
            with self._lock:
                self.reaped += removed
                self.sweeps += 1
        except Exception as exc:  # noqa: BLE001 - logged; the next sweep tries again
            log.warning("sweep for leftover sandboxes failed: %s", exc)
        finally:
            self._sweeping = False

    def _lease_view(self) -> owners.LeaseView:
        """The lease directory as of now: this pool's lease renewed first, its mtime the
        clock every other lease is judged by (the filesystem's; the host's when the
        lease cannot be written)."""
        now = self._lease.renew() if self._lease is not None else None
        return owners.LeaseView(self.settings.resolved_lease_dir(), time.time() if now is None else now)


class _Slot:
    """One sandbox slot of ``(tenant, profile)`` held for the duration of a one-shot call
    (taken on first use, shared by the call's threads). A sandbox that dies is forgotten
    and the next :meth:`get` takes a slot elsewhere; :meth:`release` frees the slot
    (the sandbox goes back to the warm pool when nothing else uses it)."""

    def __init__(self, pool: SandboxPool, tenant: str, profile: ResourceProfile) -> None:
        self.pool = pool
        self.tenant = tenant
        self.profile = profile
        self._lock = threading.Lock()
        self._sandbox: Sandbox | None = None
        self._id = ""

    def get(self) -> Sandbox:
        with self._lock:
            if self._sandbox is not None and not self._sandbox.alive:
                self.pool.forget(self._sandbox, self._id)
                self._sandbox = None
            if self._sandbox is None:
                self._id = "job-" + secrets.token_hex(8)
                self._sandbox = self.pool._reserve_slot(self.tenant, self.profile, self._id)
            return self._sandbox

    def lost(self, sandbox: Sandbox) -> None:
        with self._lock:
            if self._sandbox is sandbox:
                self.pool.forget(sandbox, self._id)
                self._sandbox = None

    def release(self) -> None:
        with self._lock:
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            self.pool._release(sandbox, self._id, close=False, background=True)


def _config_key(spec: SessionSpec) -> tuple[str, str, str] | None:
    """(source sha256, class name, config hash) of a session whose config goes by hash."""
    if spec.config_hash is None or spec.describe_only:
        return None
    return (hashlib.sha256(spec.source.encode("utf-8", "surrogatepass")).hexdigest(), spec.class_name,
            spec.config_hash)


def _without_renderings(state: dict[str, Any]) -> dict[str, Any]:
    """An encoded state without the renderings of pickled values (the check's process
    restores the pickle itself; the rendering would only add to the frame)."""
    return {name: entry[:2] if entry[0] == "p" else entry for name, entry in state.items()}
