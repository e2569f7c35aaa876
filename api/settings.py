"""API settings (pydantic-settings, environment prefix ``SANDPIT_``).

Every limit here is enforced by the API layer before anything reaches a sandbox; the
executor's own limits (memory, CPU, per-call timeout) live in
:class:`sandpit.executor.settings.ExecutorSettings` (prefix ``SANDPIT_EXECUTOR_``), and
which backend runs sandboxes in :class:`sandpit.executor.settings.BackendSettings`
(``SANDPIT_EXECUTOR_BACKEND``, ``SANDPIT_RAY_ADDRESS``, ``SANDPIT_RAY_DIRECT_CALLS``).
"""

from __future__ import annotations

import math
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KiB = 1024
MiB = 1024 * KiB
LEASE_S = 30.0
"""An API replica silent for this many seconds is dead (no heartbeat on the database):
its running evaluation episodes are reset (:mod:`sandpit.api.evaluations.claims`) and
the host drains it owned are taken over (:mod:`sandpit.api.services.cluster`)."""


def default_running_calls() -> int:
    """Half the machine's CPU cores, at least 1 (the default ``max_running_calls``)."""
    return max(1, (os.cpu_count() or 2) // 2)


# ProfileCeiling's bounds are the executor's for each profile value (the tightest of
# ProfileOverrides' and ResourceProfile's), so a ceiling the executor would refuse is refused
# here. They are written out rather than read from sandpit.executor.profiles, so that loading
# the settings loads no executor module; tests/unit/api/schemas/test_profile_limits.py holds
# them equal to the executor's (sandpit.api.schemas.profile_limits.executor_bounds). The class
# docstring is the OpenAPI document's description of QuotaOverrides.max_profile.
class ProfileCeiling(BaseModel):
    """The largest resource profile a tenant's envs and snippets may use."""

    model_config = ConfigDict(extra="forbid")

    memory_mib: Annotated[int, Field(ge=32, le=65536)] = 1024
    """Per-session memory (MiB)."""
    cpus: Annotated[float, Field(gt=0, le=64)] = 1.0
    """CPU quota of a sandbox (CPUs)."""
    call_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    """Wall-clock limit of one tool call (seconds)."""


class Quotas(BaseModel):
    """Per-tenant limits. Sizes in bytes, rates per minute, times in seconds."""

    model_config = ConfigDict(extra="forbid")

    max_live_envs: Annotated[int, Field(ge=0)] = 1000
    max_concurrent_calls: Annotated[int, Field(ge=1)] = 64
    max_running_calls: Annotated[int, Field(ge=1)] = Field(default_factory=lambda: default_running_calls())
    """Calls of this tenant executing in sandboxes at once (each sandbox has its own CPU
    quota, so this bounds the CPU one tenant can take). Default: half the CPU cores, at
    least 1 (1 on a 2-core machine: a tenant spinning takes at most 0.5 CPU). What a noisy
    tenant costs a quiet one at each value is measured by ``benchmarks/tenancy.py``."""
    steps_per_minute: Annotated[int, Field(ge=1)] = 600_000
    step_burst: Annotated[int, Field(ge=1)] | None = None
    """Token bucket size; default: one second's worth of ``steps_per_minute`` (at least 10)."""
    max_profile: ProfileCeiling = Field(default_factory=ProfileCeiling)
    max_code_bytes: Annotated[int, Field(ge=1)] = 2 * MiB
    max_init_config_bytes: Annotated[int, Field(ge=1)] = 4 * MiB
    max_arguments_bytes: Annotated[int, Field(ge=1)] = 256 * KiB
    max_evaluation_concurrency: Annotated[int, Field(ge=1)] = 8
    """Evaluation episodes of this tenant running at once (over all its evaluations)."""
    max_active_evaluations: Annotated[int, Field(ge=1)] = 4
    """Evaluations of this tenant queued or running at once."""

    def burst(self) -> int:
        """The token bucket's size (``step_burst`` or one second's worth, at least 10)."""
        return self.step_burst or max(10, math.ceil(self.steps_per_minute / 60))

    def merged(self, overrides: dict[str, Any] | None, strict: bool = False) -> Quotas:
        """These quotas with the operator's ``overrides`` applied (nested for ``max_profile``).
        ``strict``: values must have their field's JSON type (as in request bodies).
        Raises pydantic ``ValidationError`` for unknown fields or bad values."""
        if not overrides:
            return self
        data = self.model_dump()
        for key, value in overrides.items():
            if key == "max_profile" and isinstance(value, dict):
                data["max_profile"] = {**data["max_profile"], **value}
            else:
                data[key] = value
        return Quotas.model_validate(data, strict=strict)



class ApiSettings(BaseSettings):
    """Server, database and request limits. Sizes in bytes, times in seconds."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_", extra="ignore", env_nested_delimiter="__")

    host: str = "127.0.0.1"
    """Address ``sandpit serve`` binds to (loopback by default)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8600
    data_dir: Path = Path.home() / ".local" / "share" / "sandpit"
    """Holds the default SQLite database file."""
    database_url: str | None = None
    """SQLAlchemy URL; default ``sqlite:///<data_dir>/sandpit.db`` (WAL mode). PostgreSQL
    works by URL (``postgresql+psycopg://...``) when its driver is installed."""
    tenant: str = "default"
    """Tenant whose warm pool is filled at start-up (``warm_on_start``)."""

    operator_key: SecretStr | None = None
    """The operator's key for ``/v1/admin/...`` and ``sandpit tenants`` (``Authorization:
    Bearer <key>``). At least 24 characters; well-known placeholders (``changeme``,
    ``secret``, ``xxx``...) are refused at start-up. Unset: the admin API answers 403."""
    metrics_require_auth: bool = False
    """``/metrics`` needs the operator key (else it is open, like ``/healthz``)."""
    auth_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = 5.0
    """How long a verified API key is trusted without reading the database again.
    Revocation through this server takes effect at once; through another server
    process sharing the database, within this many seconds."""
    secrets_key: SecretStr | None = None
    """Key that encrypts stored model API keys (rollout evaluations); default: a random
    key kept in ``<data_dir>/secrets.key`` (mode 0600), created on first use."""
    quotas: Quotas = Field(default_factory=Quotas)
    """Per-tenant limits every tenant gets unless the operator overrides them for it
    (environment: ``SANDPIT_QUOTAS__MAX_LIVE_ENVS=200``, ...)."""
    call_slots: Annotated[int, Field(ge=0, le=4096)] = 0
    """Tool calls (and other untrusted-code runs) executing in sandboxes at once, across
    all tenants; the fair scheduler queues the rest per tenant. 0 = 2 x CPU cores (min 4)."""
    call_queue_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    """A call waiting longer than this for a slot gets 429 (``max_running_calls``)."""
    http_threads: Annotated[int, Field(ge=8, le=8192)] = 512
    """Worker threads for request handlers (AnyIO's default is 40, which requests of one
    tenant waiting in the scheduler's queue could exhaust), and as many again for the steps
    the step door runs and for the creates and resets the create and reset doors run (a
    pool of each door's own, made on demand, resets sharing the creates':
    :mod:`sandpit.api.http.step`, :mod:`sandpit.api.http.create_env`,
    :mod:`sandpit.api.http.reset_env`)."""
    step_inline_wait_s: Annotated[float, Field(ge=0, le=0.05)] = 0.002
    """Seconds a step run on the event loop may hold it waiting for its tool call's reply
    (0: every step runs on a worker thread). A step runs on the event loop, which saves
    the hops to a worker thread and back, only while no other step or batch of this
    process runs; without a ``Sandpit-Attempt``; with an API key
    authenticated recently; and while its env is not busy. It moves to a worker thread as
    soon as it would wait for anything else: a reply not come within this many seconds,
    an execution slot, its session, another writer of the database (on databases other
    than SQLite, every commit), re-attaching the env, scoring, a simulated user
    (:func:`sandpit.api.envs.step_work.run_inline`)."""
    step_inline_spin_s: Annotated[float, Field(ge=0, le=0.05)] = 0.001
    """Of a step's wait on the event loop (``step_inline_wait_s``, which bounds it), the
    seconds the event loop polls the sandbox's socket for the tool call's reply without
    sleeping (0: it sleeps in ``poll`` at once). A reply that comes while it polls is read
    without a sleeping thread being woken, which on a virtual machine costs more than
    the poll: one client's step p50 was 5 to 10% lower with 1 ms here
    (``docs/performance.md``). Polling spends the API process's CPU for as long as it
    polls (about the sandbox's round trip per step); it happens only on the event loop,
    so only while this process runs no other step (steps on worker threads sleep), and
    only while the host has a CPU to spare (:class:`~sandpit.api.http.spare_cpu.SpareCpu`)."""
    keep_alive_s: Annotated[int, Field(ge=1, le=3600)] = 75
    """Seconds ``sandpit serve`` keeps an idle HTTP/1.1 keep-alive connection open between
    two requests (uvicorn's ``timeout_keep_alive``, whose own default is 5). An agent
    thinks for seconds between its steps, and a connection the server closed in that pause
    makes the client's next step fail or reconnect; under load the event loop may also
    read a waiting request only after a short timer fired. 75 is nginx's default."""
    sqlite_checkpoint_interval_s: Annotated[float, Field(ge=0, le=3600)] = 0.5
    """Seconds between the passive WAL checkpoints a thread of the app runs on a SQLite
    database (:mod:`sandpit.api.db.checkpoint`), so that no step's commit copies the WAL
    back and syncs the file (many times a commit's own cost). 0: SQLite's own checkpoint
    inside a commit every 1,000 pages.
    Ignored for PostgreSQL."""
    gc_young_threshold: Annotated[int, Field(ge=0, le=10_000_000)] = 50_000
    """Allocations of container objects between two collections of the youngest garbage
    collector generation in ``sandpit serve`` (:func:`~sandpit.api.app.tune_gc`;
    ``gc.set_threshold``'s first value; 0 = Python's default, 700). At 700, parsing a 3 MB
    request body collected the
    growing heap hundreds of times (orjson.loads of a 3.3 MB body: 92-126 ms, 28-30 ms
    at 50,000 or with the collector off). Objects that exist once the app has started
    are moved out of the collector's reach (``gc.freeze``) either way."""
    model_url_allow: list[str] = Field(default_factory=list)
    """URL prefixes a rollout's caller-given ``base_url`` must start with (JSON list, e.g.
    ``["https://api.openai.com/v1", "http://vllm.internal:8000/v1"]``); empty = any
    http(s) URL. Keeps tenants from making the server call internal addresses. A tenant's
    operator-set ``model_base_url`` is always allowed."""
    evaluation_workers: Annotated[int, Field(ge=1, le=1024)] = 32
    """Threads running evaluation episodes, across all tenants (each tenant is further
    bounded by its ``max_evaluation_concurrency``)."""

    access_log: bool = True
    """One line per HTTP request on the ``sandpit.access`` logger at INFO (method, path
    template, status, milliseconds, tenant; never a key or a query string:
    :mod:`sandpit.api.http.access_log`), written by ``sandpit serve --log-level info`` (or
    ``debug``); false: none, and no per-request cost (``SANDPIT_ACCESS_LOG``)."""

    server_timing: bool = True
    """A ``Server-Timing`` header on every step reply the step ran for: the wall-clock
    milliseconds of the step's phases in this process (``auth``, ``sandbox``, ``persist``,
    ``serialize``, ``other``) and ``total``, from the whole request body read to the reply
    ready (:meth:`sandpit.api.metrics.StepClock.server_timing`); a batched step's reply
    carries its ``total``. It separates the server's time from the network's and the
    client's. False: no header (``SANDPIT_SERVER_TIMING``)."""

    max_body_bytes: Annotated[int, Field(ge=1 * KiB)] = 8 * MiB
    """Whole request bodies above this get 413 before they are parsed."""
    body_read_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    """A request body must arrive whole within this many seconds of the request's start;
    a slower (stalled, trickling) one gets 408 and its connection is closed."""
    max_code_bytes: Annotated[int, Field(ge=1 * KiB)] = 2 * MiB
    """``source_code`` above this (UTF-8 bytes) gets 413."""
    max_init_config_bytes: Annotated[int, Field(ge=1 * KiB)] = 4 * MiB
    """``init_config`` above this (compact JSON bytes) gets 413."""
    max_arguments_bytes: Annotated[int, Field(ge=256)] = 256 * KiB
    """Tool-call ``arguments`` above this (compact JSON bytes) gets 413."""
    max_json_depth: Annotated[int, Field(ge=4, le=512)] = 64
    """Request JSON nested deeper than this gets 422."""
    max_fork_count: Annotated[int, Field(ge=1)] = 64
    """Largest ``count`` of one fork request."""
    max_list_limit: Annotated[int, Field(ge=1)] = 1000

    env_idle_evict_s: Annotated[float, Field(gt=0)] = 300.0
    """An env without a request for this long leaves its sandbox; its state stays in the
    database and the next request restores it (so live envs may exceed sandbox capacity)."""
    env_idle_evict_fullness: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Idle eviction (``env_idle_evict_s``) runs only while the sandboxes are at least this
    full, 0 to 1 (:meth:`sandpit.api.sandboxes.Sandboxes.fullness`: the larger of their
    projected memory over the executor's memory budget and the live sandboxes over
    ``max_sandboxes``). 0: always, whatever the load. Above 0, idle envs stay in their
    sandboxes (no restore on their next step) until their room is wanted; an open that
    finds no room still evicts the least recently used idle env."""
    env_max_lifetime_s: Annotated[float, Field(gt=0)] = 24 * 3600.0
    """An env older than this is closed and answers 409; deleting it frees its storage."""
    janitor_interval_s: Annotated[float, Field(gt=0)] = 5.0
    """How often idle eviction and expiry run."""
    idempotency_key_ttl_s: Annotated[float, Field(gt=0)] = 24 * 3600.0
    """How long a request's ``Idempotency-Key`` and its stored response are kept (seconds
    from the first request); the janitor deletes older ones, and a retry after that runs
    the request again."""
    idempotency_lease_s: Annotated[float, Field(gt=0)] = 600.0
    """Seconds after which a key whose first request has not finished (its replica died
    mid-request) may be claimed by a retry; until then a retry is 409
    ``idempotency_key_in_flight``. Keep it above the longest request (create, reset)."""
    capacity_retry_after_s: Annotated[int, Field(ge=1)] = 2
    """``Retry-After`` of a 503 when no sandbox capacity is left."""
    warm_on_start: bool = True
    """Fill the executor's warm pool for the default tenant at start-up (``/readyz``
    reports not ready until it is)."""

    @field_validator("operator_key")
    @classmethod
    def _no_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        key = value.get_secret_value()
        if is_placeholder(key):
            raise ValueError("SANDPIT_OPERATOR_KEY is a placeholder or too short; use at least 24 random "
                             "characters, e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`")
        return value

    def resolved_call_slots(self) -> int:
        """``call_slots``, or 2 x CPU cores (at least 4) when it is 0."""
        return self.call_slots or max(4, 2 * (os.cpu_count() or 1))

    def resolved_database_url(self) -> str:
        """The database URL: the setting, else a SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'sandpit.db'}"


PLACEHOLDERS = ("changeme", "change-me", "change_me", "replaceme", "replace-me", "secret", "password", "passw0rd",
                "operator", "admin", "example", "placeholder", "your-key", "yourkey", "your_key", "xxxx", "todo",
                "dummy", "test", "default", "sandpit", "<", "...")


def is_placeholder(key: str) -> bool:
    """True for keys that are too short (< 24 characters), made of one repeated
    character, or contain a well-known placeholder word."""
    lowered = key.strip().lower()
    if len(lowered) < 24 or len(set(lowered)) < 6:
        return True
    return any(word in lowered for word in PLACEHOLDERS)


def new_operator_key() -> str:
    """A fresh random operator key (``secrets.token_urlsafe(32)``, 43 characters) that
    :func:`is_placeholder` accepts: a random key spells one of PLACEHOLDERS' words
    (``test``, ``todo``, ``xxxx``...) now and then, and start-up would refuse it."""
    while True:
        key = secrets.token_urlsafe(32)
        if not is_placeholder(key):
            return key


@lru_cache
def get_api_settings() -> ApiSettings:
    """Process-wide settings (cached; tests pass their own instance to ``create_app``)."""
    return ApiSettings()
