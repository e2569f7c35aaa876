"""Running one-shot jobs (check batches, scripts) in a pool slot: :class:`JobSlot` holds one
slot of a sandbox of the caller's tenant for the duration of a call, and
:func:`run_checks` / :func:`run_script` / :func:`run_scripts` send the runner its
``checks`` and ``exec`` requests there. Arguments are checked before (:mod:`.jobs`), and
replies validated after, by :mod:`.jobs`; a sandbox lost under a job is a result with the
loss's status (``crashed``, ``oom``, ``timeout``), never an exception.
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from ..errors import SandboxLost
from ..profiles import ResourceProfile
from ..results import CheckResult, ExecResult
from . import jobs
from .warm import PooledSandbox

if TYPE_CHECKING:
    from sandpit.sandbox_images.runner.protocol import ChecksReply, ExecReply

Reserve = Callable[[str, ResourceProfile, str], PooledSandbox]
"""``reserve(tenant, profile, slot_id)``: a sandbox with ``slot_id`` placed in it (the
pool's placement; raises CapacityError and the driver's errors)."""
Free = Callable[[PooledSandbox, str], None]
"""``free(sandbox, slot_id)``: the slot is done; the sandbox is recycled off the caller's path."""
Lose = Callable[[PooledSandbox, str], None]
"""``lose(sandbox, slot_id)``: the sandbox died under the slot; destroy and drop it."""


class JobSlot:
    """One sandbox slot of ``(tenant, profile)`` held for the duration of a one-shot call
    (taken on first use, shared by the call's threads). A sandbox that dies is lost and the
    next :meth:`get` takes a slot elsewhere; :meth:`release` frees the slot (the sandbox
    goes back to the warm set when nothing else uses it)."""

    def __init__(self, tenant: str, profile: ResourceProfile, reserve: Reserve, free: Free, lose: Lose) -> None:
        self.tenant = tenant
        self.profile = profile
        self._reserve, self._free, self._lose = reserve, free, lose
        self._lock = threading.Lock()
        self._sandbox: PooledSandbox | None = None
        self._id = ""

    def get(self) -> PooledSandbox:
        """The slot's sandbox, reserved on first use (or again after a loss). Raises what
        the reserve raises (CapacityError, the driver's errors)."""
        with self._lock:
            if self._sandbox is not None and not self._sandbox.handle.alive:
                self._lose(self._sandbox, self._id)
                self._sandbox = None
            if self._sandbox is None:
                self._id = "job-" + secrets.token_hex(8)
                self._sandbox = self._reserve(self.tenant, self.profile, self._id)
            return self._sandbox

    def lost(self, sandbox: PooledSandbox) -> None:
        """``sandbox`` died under this slot (once per loss, whichever thread saw it)."""
        with self._lock:
            if self._sandbox is sandbox:
                self._lose(sandbox, self._id)
                self._sandbox = None

    def release(self) -> None:
        """Free the slot (idempotent)."""
        with self._lock:
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            self._free(sandbox, self._id)


def run_checks(slot: JobSlot, checks: list[dict[str, Any]], initial_text: bytes, final_text: bytes,
               timeout_s: float, source: str | None, grace_s: float,
               failures: collections.Counter[str]) -> tuple[list[CheckResult], int]:
    """One ``checks`` batch in ``slot``'s sandbox on two states' JSON texts
    (``jobs.check_state``: the runner forwards them to the checks' process unparsed, as
    the two attachments of its frame: ``protocol.ChecksRequest``), each check at most ``timeout_s`` seconds
    and the batch ``timeout_s * len(checks) + BATCH_SLACK_S + grace_s + 5``. Returns one
    result per check and how many fresh processes the batch needed beyond the first;
    every check reports the loss's status when the sandbox dies (counted in ``failures``).
    Raises SessionError: the runner refused the batch or answered malformed data."""
    budget_s = timeout_s * len(checks) + jobs.BATCH_SLACK_S
    sandbox = slot.get()
    try:
        reply = sandbox.handle.request(
            "checks", timeout_s=budget_s + grace_s + 5.0, time_limit_s=timeout_s,
            checks=[{"check_func": c["check_func"]} for c in checks],
            attached=[initial_text, final_text], source=source)
    except SandboxLost as exc:
        slot.lost(sandbox)
        failures[exc.status] += 1
        return jobs.lost_checks(checks, exc.status, f"the sandbox was lost: {exc}"), 0
    return jobs.parse_check_results(cast("ChecksReply", reply), checks)


def run_script(slot: JobSlot, request: jobs.ExecRequest, grace_s: float,
               failures: collections.Counter[str]) -> ExecResult:
    """One ``exec`` in ``slot``'s sandbox, bounded by the request's timeout plus
    ``grace_s + 5`` seconds; a lost sandbox is a result with the loss's status (counted
    in ``failures``). Raises SessionError: refused or malformed reply."""
    sandbox = slot.get()
    started = time.perf_counter()
    try:
        reply = sandbox.handle.request("exec", timeout_s=request.timeout_s + grace_s + 5.0, **request.fields())
    except SandboxLost as exc:
        slot.lost(sandbox)
        failures[exc.status] += 1
        return jobs.lost_exec(exc.status, f"the sandbox was lost: {exc}", (time.perf_counter() - started) * 1000)
    return jobs.parse_exec_result(cast("ExecReply", reply), slot.profile, (time.perf_counter() - started) * 1000.0)


def run_scripts(slot: JobSlot, requests: list[jobs.ExecRequest], concurrency: int, grace_s: float,
                failures: collections.Counter[str]) -> list[ExecResult]:
    """:func:`run_script` for each request, at most ``concurrency`` at once, results in
    order."""
    if concurrency == 1 or len(requests) == 1:
        return [run_script(slot, request, grace_s, failures) for request in requests]
    with ThreadPoolExecutor(min(concurrency, len(requests)), thread_name_prefix="sandpit-exec") as workers:
        return list(workers.map(lambda request: run_script(slot, request, grace_s, failures), requests))

