"""SQLAlchemy 2 models of the control database (schema owned by ``migrations/``).

``environments`` registered code · ``envs`` live instances (head = ``episode``/``step``) ·
``steps`` one row per acknowledged step (step 0 = state after instantiation) pointing at a
content-addressed state root in ``blobs`` (see :mod:`sandpit.api.store`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
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
    """Static policy the code was checked with (``sandpit.executor.policy``)."""
    policy_report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """The static policy report (findings with rule, line, column, severity)."""
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
    """The scenario the env was created from (its checks give ``evaluate`` its reward)."""


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


class Blob(Base):
    """Content-addressed bytes (zlib-compressed); identical content is stored once."""

    __tablename__ = "blobs"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    """Uncompressed size, bytes."""


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
