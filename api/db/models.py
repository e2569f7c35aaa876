"""SQLAlchemy 2 models of the control database (schema owned by ``migrations/``).

``environments`` registered code · ``envs`` live instances (head = ``episode``/``step``) ·
``steps`` one row per acknowledged step (step 0 = state after instantiation) pointing at a
content-addressed state root in ``blobs`` (see :mod:`sandpit.api.db.store`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID_LENGTH = 40


class Base(DeclarativeBase):
    """Declarative base; ``Base.metadata`` is what Alembic migrates."""


class Environment(Base):
    """Registered environment code (EnvScaler: a class whose public methods are tools)."""

    __tablename__ = "environments"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    class_name: Mapped[str] = mapped_column(String(200))
    source_code: Mapped[str] = mapped_column(Text)
    code_sha256: Mapped[str] = mapped_column(String(64))
    tools: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    description: Mapped[str | None] = mapped_column(Text)
    inline: Mapped[bool] = mapped_column(Boolean, default=False)
    """Created implicitly by ``POST /v1/envs`` with inline ``source_code``."""
    policy: Mapped[str] = mapped_column(String(32), default="standard")
    """Static policy the code was checked with (``sandpit.policy``)."""
    policy_report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The static policy report (findings with rule, line, column, severity)."""
    introduction: Mapped[str | None] = mapped_column(Text)
    """EnvScaler ``environment_introduction``: what the agent is told about the environment."""
    rules: Mapped[list[str] | None] = mapped_column(JSON)
    """EnvScaler ``constraints_rules``: rules the agent must follow (listed after the introduction)."""
    argument_checking: Mapped[str] = mapped_column(String(8), default="off")
    """Default for its envs: ``off`` (Python decides), ``warn`` (findings in the step
    result) or ``strict`` (a call that does not fit the tool's schema is ``rejected``)."""
    declared_tools: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Tool schemas declared at registration (EnvScaler's released ``tools``): when set,
    what the agent sees instead of ``tools`` (derived from the class)."""
    tool_differences: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Where the declared tools differ from the derived ones (computed at registration)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_environments_tenant_code", "tenant", "code_sha256", "class_name"),)


class Env(Base):
    """A live instance of an environment. Its state at every step is in ``steps``."""

    __tablename__ = "envs"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    environment_id: Mapped[str] = mapped_column(ForeignKey("environments.id", ondelete="RESTRICT"), index=True)
    init_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    profile: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Caller's lowering overrides of the resource profile (memory_mib, cpus, call_timeout_s)."""
    episode: Mapped[int] = mapped_column(Integer, default=1)
    step: Mapped[int] = mapped_column(Integer, default=0)
    """Head: the last acknowledged step of the current episode."""
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    forked_from: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    forked_at_step: Mapped[int | None] = mapped_column(Integer)
    scenario_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    """The scenario of the current episode (its checks give the episode's reward)."""
    argument_checking: Mapped[str | None] = mapped_column(String(8))
    """Override of the environment's ``argument_checking`` (None: the environment's)."""
    init_config_hash: Mapped[str | None] = mapped_column(String(64))
    """The ``init_configs`` row holding this env's ``init_config`` (then the column above is
    ``{}``); None for rows written before configs were stored once (:mod:`.configs`)."""
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """How many times the env was resumed (``POST /v1/envs/{id}/attempts``); 0: never."""
    attempt_token: Mapped[str | None] = mapped_column(String(64))
    """The current attempt's token: calls carrying another token are 409 ``stale_attempt``
    (:mod:`sandpit.api.db.attempts`); None: never resumed."""


class Episode(Base):
    """One episode of an env (EnvScaler ``reset()`` .. termination): its scenario, its
    options, how it ended and its reward. Its steps are ``steps`` rows of the same
    ``(env_id, episode)``; a reset starts the next episode and never hides this one."""

    __tablename__ = "episodes"

    env_id: Mapped[str] = mapped_column(ForeignKey("envs.id", ondelete="CASCADE"), primary_key=True)
    episode: Mapped[int] = mapped_column(Integer, primary_key=True)
    environment_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    scenario_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Episode options without secrets (:class:`sandpit.api.envs.rulebook.EpisodeConfig`)."""
    user_key_enc: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The simulated user's model API key given at create/reset, encrypted; never returned."""
    status: Mapped[str] = mapped_column(String(16))
    """``running`` | ``terminated`` | ``truncated``."""
    observation: Mapped[str] = mapped_column(Text, default="")
    """The initial observation (the task, or the simulated user's first message)."""
    task: Mapped[str | None] = mapped_column(Text)
    reward: Mapped[float | None] = mapped_column(Float)
    """EnvScaler reward at the end (mean of the checks' results, 4 places); None while running."""
    checks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Per-check outcomes at the end."""
    user_messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Conversational episodes: the simulated user's chat (system, user=agent, assistant=user)."""
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    failure: Mapped[str | None] = mapped_column(String(16), default="none")
    """The episode's failure so far (:mod:`sandpit.api.envs.failures`), updated by the step
    that changes it; None on rows written before it was recorded (derived from ``checks``)."""

    __table_args__ = (Index("ix_episodes_scenario_started", "scenario_id", "started_at"),)
    """Scenario statistics (:mod:`sandpit.api.services.stats`) read one scenario's episodes."""


class DeletedEnvEpisode(Base):
    """An episode of a deleted env that scenario statistics count
    (:mod:`sandpit.api.services.stats`): what of its ``episodes`` row they read, copied when
    ``DELETE /v1/envs/{id}`` deletes the env (an MCP or OpenEnv scenario session's env
    goes when its session ends). Nothing else reads it; the trajectory is gone."""

    __tablename__ = "deleted_env_episodes"

    env_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    episode: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(ID_LENGTH))
    scenario_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When it finished (``terminated`` or ``truncated`` with a reward); None: it had not."""
    reward: Mapped[float | None] = mapped_column(Float)
    """Its reward when it finished, else None."""

    __table_args__ = (Index("ix_deleted_env_episodes_scenario_started", "scenario_id", "started_at"),)


class Step(Base):
    """One acknowledged step: the tool call, its result, and the state after it."""

    __tablename__ = "steps"

    env_id: Mapped[str] = mapped_column(ForeignKey("envs.id", ondelete="CASCADE"), primary_key=True)
    episode: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """``{"name", "arguments"}``; null for step 0 (instantiation)."""
    observation: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    duration_ms: Mapped[float] = mapped_column(Float)
    state_root: Mapped[str] = mapped_column(String(64))
    """Hash of the state manifest blob (content-addressed, see ``store``)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    reward: Mapped[float | None] = mapped_column(Float)
    """The step's reward (EnvScaler: 0.0 until the step that ends the episode); None for step 0."""
    done: Mapped[str | None] = mapped_column(String(16))
    """``terminated`` or ``truncated`` when this step ended the episode."""
    info: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Extras: ``observation_role`` (tool/user), ``error`` (why a call was rejected),
    ``argument_findings``, ``traceback``, ``stdout``/``stderr``."""


class Blob(Base):
    """Content-addressed bytes (zlib-compressed); identical content is stored once."""

    __tablename__ = "blobs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    """Uncompressed size, bytes."""


class InitConfig(Base):
    """An ``init_config`` stored once however many envs use it (:mod:`sandpit.api.db.configs`):
    keyed by a 128-bit SHA-256 prefix of its canonical JSON bytes, zlib-compressed."""

    __tablename__ = "init_configs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    """Canonical JSON size, bytes."""


class Scenario(Base):
    """An EnvScaler ScenGenerator scenario: a task on an environment, its initial state
    and a checklist whose check functions give the rule-based reward."""

    __tablename__ = "scenarios"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    environment_id: Mapped[str] = mapped_column(ForeignKey("environments.id", ondelete="RESTRICT"), index=True)
    task: Mapped[str] = mapped_column(Text)
    init_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    checklist: Mapped[list[str]] = mapped_column(JSON)
    checklist_with_func: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    """``[{"check_item": str, "check_func": str}]``."""
    external_id: Mapped[str | None] = mapped_column(String(200))
    """Identifier in the imported file (EnvScaler ``task_id``/index), if any."""
    episode_profile: Mapped[str | None] = mapped_column(String(16))
    """The episode rulebook of its envs unless a create/reset names one: ``sandpit``
    (None means this) or ``envscaler`` (EnvScaler's RL environment, byte for byte)."""
    check_objects: Mapped[str | None] = mapped_column(String(16))
    """How its checks see objects of the environment's classes: ``standins`` (None
    means this; no environment code runs where a verdict is computed) or
    ``environment`` (the environment's module is loaded for the checks)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Evaluation(Base):
    """Result of ``POST /v1/envs/{id}/evaluate``: per-check outcomes and the reward."""

    __tablename__ = "env_evaluations"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    env_id: Mapped[str] = mapped_column(ForeignKey("envs.id", ondelete="CASCADE"), index=True)
    episode: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float] = mapped_column(Float)
    results: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Tenant(Base):
    """A team sharing the service. Every object's ``tenant`` column names one of these;
    ``quotas`` holds only the limits the operator overrode (defaults come from settings)."""

    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Slug (``[a-z0-9][a-z0-9_-]{0,63}``), chosen by the operator."""
    display_name: Mapped[str | None] = mapped_column(String(200))
    quotas: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    """Overrides of :class:`sandpit.api.settings.Quotas` fields (missing = the default)."""
    model_base_url: Mapped[str | None] = mapped_column(String(2000))
    """Default OpenAI-compatible endpoint for rollout evaluations of this tenant."""
    model_api_key_enc: Mapped[bytes | None] = mapped_column(LargeBinary)
    """Default model API key for rollouts, encrypted (:mod:`sandpit.api.secrets`); never returned."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ApiKey(Base):
    """An API key of a tenant. Only the SHA-256 of the key is stored; the key itself is
    shown once, at creation."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    """First characters of the key, to recognise it in listings."""
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    """Hex SHA-256 of the whole key (keys are 256-bit random, so no salt or stretching is needed)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AuditEvent(Base):
    """Who created, deleted or evaluated what (append-only)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    actor: Mapped[str] = mapped_column(String(64))
    """The API key id that made the request, or ``operator``."""
    action: Mapped[str] = mapped_column(String(64))
    """``<resource>.<verb>``, e.g. ``env.create``, ``evaluation.cancel``, ``api_key.revoke``."""
    resource_id: Mapped[str | None] = mapped_column(String(64))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class EvaluationJob(Base):
    """A batch evaluation (``/v1/evaluations``): replay or rollout over scenarios."""

    __tablename__ = "evaluations"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    mode: Mapped[str] = mapped_column(String(16))
    """``replay`` or ``rollout``."""
    status: Mapped[str] = mapped_column(String(16), index=True)
    """``queued`` -> ``running`` -> ``completed`` | ``cancelled`` | ``failed``."""
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Mode parameters without secrets (model, base_url, max_steps, temperature, ...)."""
    model_api_key_enc: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The request's model API key, encrypted, so a restart can resume; never returned."""
    concurrency: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)


class EvaluationEpisode(Base):
    """One scenario of an evaluation: its env, transcript, trajectory and reward.
    Exactly one row per (evaluation, index); a rerun after a restart overwrites it."""

    __tablename__ = "evaluation_episodes"

    evaluation_id: Mapped[str] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    scenario_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    environment_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Replay mode: the tool calls to replay."""
    status: Mapped[str] = mapped_column(String(16), index=True)
    """``pending`` | ``running`` | ``done`` | ``error`` | ``cancelled``."""
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    env_id: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    reward: Mapped[float | None] = mapped_column(Float)
    passed: Mapped[int | None] = mapped_column(Integer)
    checks_total: Mapped[int | None] = mapped_column(Integer)
    checks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    error_status: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    transcript: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Rollout mode: every chat message (system, user, assistant with tool calls, tool)."""
    trajectory: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """Every step: action, observation, status, duration_ms."""
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """Rollout mode: token totals (prompt_tokens, completion_tokens) and model requests."""
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claimed_by: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    """The :class:`Replica` running it (``running`` only): recovery resets only the episodes
    of replicas that stopped heart-beating, never those of a live one."""

    __table_args__ = (Index("ix_evaluation_episodes_scenario", "scenario_id"),
                      Index("ix_evaluation_episodes_env", "env_id"))
    """Scenario statistics (:mod:`sandpit.api.services.stats`) read one scenario's runs."""


class Replica(Base):
    """An API process serving this database (``sandpit serve``; several share a PostgreSQL
    database). Its evaluation runner writes ``heartbeat_at`` every few seconds; a replica
    silent for longer than the runner's lease is dead and its running episodes are reset."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class EnvHost(Base):
    """Env -> sandbox host affinity of a multi-host executor (Ray backend): where the env's
    live session is (or was last) placed, so any replica reaches it there. A host that is
    gone is replaced on the env's next use (its session resumes from the head state)."""

    __tablename__ = "env_hosts"

    env_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), index=True)
    placed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class HostDrain(Base):
    """A sandbox host an operator drains (``POST /v1/admin/cluster/hosts/{host}/drain``):
    every replica's executor reads these rows and places nothing new on such a host; the
    drain moves its envs' affinity elsewhere, then shuts its pool down. ``status`` is
    ``draining`` until the host is empty and shut down, then ``drained`` (kept: a drained
    host is not re-created). An undrain (``POST .../undrain``) deletes the row: the host
    takes work again (a drained one is re-created on its node if that node still lives)."""

    __tablename__ = "host_drains"

    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    """``draining`` or ``drained``."""
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    envs_moved: Mapped[int] = mapped_column(Integer, default=0)
    """Envs whose affinity the drain moved to another host (or dropped when none was left)."""
    owner: Mapped[str | None] = mapped_column(String(ID_LENGTH))
    """The :class:`Replica` whose executor runs the drain (``draining`` only matters). When
    its heartbeat is older than the evaluation runner's lease (``settings.LEASE_S``, the rule
    that resets a dead replica's episodes) or its row is gone, a live replica's janitor
    claims the drain (compare-and-set on this column) and resumes it. None: recorded
    before migration 0008; claimed like a dead owner's."""


IDEMPOTENCY_KEY_LENGTH = 255
"""Longest ``Idempotency-Key`` (characters, printable ASCII)."""


class IdempotencyKey(Base):
    """A request's ``Idempotency-Key`` and, once it finished, its stored response
    (:mod:`sandpit.api.db.idempotency`). The primary key (tenant, key) is what holds a key
    to one request across replicas and restarts: a second claim of the same key inserts
    nothing and finds the first. A step's response is written in the transaction of the step's own row."""

    __tablename__ = "idempotency_keys"

    tenant: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(IDEMPOTENCY_KEY_LENGTH))
    digest: Mapped[str] = mapped_column(String(64))
    """SHA-256 (hex) of the request: method, route template, env id, query and body."""
    claim: Mapped[str] = mapped_column(String(32))
    """The token of the request that holds the key (a new one when a lapsed claim is taken over)."""
    status: Mapped[int | None] = mapped_column(Integer)
    """The stored response's HTTP status; None while the request is in flight."""
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The stored response's JSON body (bytes as sent)."""
    claimed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    """After this the key is forgotten (``idempotency_key_ttl_s`` after the claim)."""

    __table_args__ = (PrimaryKeyConstraint("tenant", "key", name="pk_idempotency_keys"),)


class UiSession(Base):
    """A signed-in session of the web viewer (:mod:`sandpit.api.services.ui_sessions`): the
    browser holds a random token in a cookie, this row holds only the token's SHA-256 and
    whose key signed in. The key itself is never stored; a revoked or expired key ends
    every session it opened."""

    __tablename__ = "ui_sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Hex SHA-256 of the session token (the cookie's value)."""
    tenant: Mapped[str | None] = mapped_column(String(64), index=True)
    """The tenant signed in; None for the operator."""
    actor: Mapped[str] = mapped_column(String(ID_LENGTH))
    """The :class:`ApiKey` id that signed in, or ``operator``."""
    csrf: Mapped[str] = mapped_column(String(64))
    """The token every form of this session posts back (``csrf`` field)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


def table(model: type[Base]) -> Table:
    """The Core table of an ORM class (``Step`` -> ``steps``): what statements that write
    many rows at once use (``table(Step).insert()`` with a list of rows is one
    ``executemany``, without the ORM's per-row bookkeeping)."""
    return cast(Table, model.__table__)
