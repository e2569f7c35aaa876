"""Per-tenant quotas: what one tenant may hold and do at once, and how fast.

:class:`~sandpit.api.settings.Quotas` are the limits (defaults in ``ApiSettings.quotas``;
the operator overrides single fields per tenant, stored in ``tenants.quotas``).
:class:`QuotaService` enforces the dynamic ones in this process:

* ``max_live_envs`` — open (not deleted, not expired) envs; checked with reservations
  so concurrent creates cannot overshoot; forks count ``count`` envs.
* ``max_concurrent_calls`` — requests that run untrusted code (steps, env creation,
  reset, evaluate, validate, execute, registration) in flight at once, queued or
  running; the one over it gets 429 at once.
* ``steps_per_minute`` — token bucket (``step_burst`` tokens, refilled at
  ``steps_per_minute / 60`` per second); an empty bucket gives 429 with the wait.
* ``max_running_calls`` — of the in-flight calls, how many may execute in sandboxes at
  once; the rest wait in the tenant's queue of the fair scheduler
  (:mod:`sandpit.api.scheduler`).
* ``max_evaluation_concurrency`` / ``max_active_evaluations`` — episodes at once and
  unfinished evaluation jobs (enforced by :mod:`sandpit.api.evaluations.jobs`).

Fixed limits (``max_profile``, ``max_*_bytes``) are checked against each request. Every
hit raises :class:`~sandpit.api.errors.QuotaExceeded` (429, ``limit`` named, ``Retry-After``), before
anything is created or run.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import PayloadTooLarge, QuotaExceeded
from ..schemas.tenants import TenantUsage
from ..settings import ApiSettings, Quotas

FIXED_RETRY_AFTER_S = 3600
"""``Retry-After`` of a fixed-limit hit (size, profile): waiting does not help; the
operator must raise the quota. Large so that clients honouring it do not hammer."""


@dataclass
class TenantContext:
    """Who is calling: the tenant, the key that authenticated the request (``actor`` in
    the audit log) and the tenant's effective quotas."""

    tenant: str
    actor: str
    quotas: Quotas


@dataclass
class _Bucket:
    tokens: float
    stamp: float = field(default_factory=time.monotonic)


class QuotaService:
    """Counts and buckets per tenant (in-process; one API process owns a tenant's traffic).

    ``count_live_envs(tenant) -> int`` reads the number of open envs from the database.
    """

    def __init__(self, count_live_envs: Callable[[str], int], hard_caps: ApiSettings | None = None) -> None:
        self._count_live_envs = count_live_envs
        self._hard_caps = hard_caps
        """Server-wide size caps (413) checked before the tenant's (429); None: none."""
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._reserved_envs: dict[str, int] = {}
        self._env_locks: dict[str, threading.Lock] = {}
        self._buckets: dict[str, _Bucket] = {}

    # -- dynamic limits ----------------------------------------------------------------
    @contextmanager
    def call(self, ctx: TenantContext, weight: int = 1) -> Iterator[None]:
        """Hold ``weight`` of the tenant's ``max_concurrent_calls`` for the block.
        Raises QuotaExceeded (retry after 1 s) when they are all in use."""
        limit = ctx.quotas.max_concurrent_calls
        with self._lock:
            used = self._in_flight.get(ctx.tenant, 0)
            if used + weight > limit:
                raise QuotaExceeded(f"tenant {ctx.tenant!r} has {used} tool call(s) in flight; max_concurrent_calls "
                                    f"is {limit}", limit="max_concurrent_calls", retry_after=1)
            self._in_flight[ctx.tenant] = used + weight
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[ctx.tenant] -= weight

    def usage(self, ctx: TenantContext) -> TenantUsage:
        """``GET /v1/tenant``: the caller's effective quotas, open envs and calls in flight."""
        return TenantUsage(tenant=ctx.tenant, key_id=ctx.actor, quotas=ctx.quotas.model_dump(),
                           live_envs=self._count_live_envs(ctx.tenant), calls_in_flight=self.in_flight(ctx.tenant))

    def in_flight(self, tenant: str) -> int:
        """Calls of ``tenant`` in flight now."""
        with self._lock:
            return self._in_flight.get(tenant, 0)

    def take_step(self, ctx: TenantContext) -> None:
        """Take one token of the tenant's step bucket. Raises QuotaExceeded with the
        seconds until a token is back."""
        rate = ctx.quotas.steps_per_minute / 60.0
        burst = ctx.quotas.burst()
        now = time.monotonic()
        with self._lock:
            bucket = self._buckets.get(ctx.tenant)
            if bucket is None:
                bucket = self._buckets[ctx.tenant] = _Bucket(tokens=float(burst), stamp=now)
            bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                wait = (1.0 - bucket.tokens) / rate
                raise QuotaExceeded(f"tenant {ctx.tenant!r} is over steps_per_minute={ctx.quotas.steps_per_minute} "
                                    f"(burst {burst}); next step in {wait:.2f} s", limit="steps_per_minute",
                                    retry_after=math.ceil(wait))
            bucket.tokens -= 1.0

    @contextmanager
    def reserve_envs(self, ctx: TenantContext, count: int = 1) -> Iterator[None]:
        """Reserve ``count`` of the tenant's ``max_live_envs`` while the block creates
        them (the reservation ends with the block: the rows then count themselves).
        Raises QuotaExceeded (retry after 5 s) when they would not fit."""
        limit = ctx.quotas.max_live_envs
        with self._lock:
            lock = self._env_locks.setdefault(ctx.tenant, threading.Lock())
        with lock:  # count + reserve atomically per tenant
            live = self._count_live_envs(ctx.tenant) + self._reserved_envs.get(ctx.tenant, 0)
            if live + count > limit:
                raise QuotaExceeded(f"tenant {ctx.tenant!r} has {live} live env(s); max_live_envs is {limit} "
                                    f"(delete envs to make room)", limit="max_live_envs", retry_after=5)
            self._reserved_envs[ctx.tenant] = self._reserved_envs.get(ctx.tenant, 0) + count
        try:
            yield
        finally:
            with lock:
                self._reserved_envs[ctx.tenant] -= count

    # -- fixed limits -------------------------------------------------------------------
    def check_size(self, ctx: TenantContext, limit: str, size: int, field: str) -> None:
        """Check ``size`` (bytes) against ``limit`` (``max_code_bytes``,
        ``max_init_config_bytes`` or ``max_arguments_bytes``): over the server-wide cap of
        that name raises PayloadTooLarge (413), over the tenant's quota QuotaExceeded (429)."""
        hard: int | None = getattr(self._hard_caps, limit) if self._hard_caps is not None else None
        if hard is not None and size > hard:
            raise PayloadTooLarge(f"{field} is {size} bytes, over the server's {limit}={hard}", field=field)
        cap = getattr(ctx.quotas, limit)
        if size > cap:
            raise QuotaExceeded(f"{field} is {size} bytes, over tenant {ctx.tenant!r}'s {limit}={cap} (a fixed quota: "
                                "waiting does not help, the operator can raise it)", limit=limit,
                                retry_after=FIXED_RETRY_AFTER_S, field=field, fixed=True)

    @staticmethod
    def profile_overrides(ctx: TenantContext, requested: dict[str, Any] | None,
                          defaults: dict[str, float]) -> dict[str, Any] | None:
        """The profile overrides to use: ``requested`` (caller's lowering of the default
        profile, whose values are ``defaults``) capped by the tenant's ``max_profile``.
        A value the caller asked for above the ceiling raises QuotaExceeded; a default
        above it is lowered silently."""
        ceiling = ctx.quotas.max_profile.model_dump()
        result = dict(requested or {})
        for name, cap in ceiling.items():
            asked = result.get(name)
            if asked is not None and asked > cap:
                raise QuotaExceeded(f"profile.{name}={asked} is above tenant {ctx.tenant!r}'s max_profile.{name}={cap} "
                                    "(a fixed quota: waiting does not help)", limit=f"max_profile.{name}",
                                    retry_after=FIXED_RETRY_AFTER_S, field=f"profile.{name}", fixed=True)
            if asked is None and defaults.get(name, 0) > cap:
                result[name] = int(cap) if name == "memory_mib" else cap
        return result or None
