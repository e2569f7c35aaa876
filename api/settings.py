"""API settings (pydantic-settings, environment prefix ``SANDPIT_``).

Every limit here is enforced by the API layer before anything reaches a sandbox; the
executor's own limits (memory, CPU, per-call timeout) live in
:class:`sandpit.executor.settings.ExecutorSettings` (prefix ``SANDPIT_EXECUTOR_``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

KiB = 1024
MiB = 1024 * KiB


class ApiSettings(BaseSettings):
    """Server, database and request limits. Sizes in bytes, times in seconds."""

    model_config = SettingsConfigDict(env_prefix="SANDPIT_", extra="ignore")

    host: str = "127.0.0.1"
    """Address ``sandpit serve`` binds to (loopback by default)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8600
    data_dir: Path = Path.home() / ".local" / "share" / "sandpit"
    """Holds the default SQLite database file."""
    database_url: str | None = None
    """SQLAlchemy URL; default ``sqlite:///<data_dir>/sandpit.db`` (WAL mode). PostgreSQL
    works by URL (``postgresql+psycopg://...``) when its driver is installed."""
    tenant: str = "default"
    """Tenant every object belongs to until API keys exist (multi-tenancy issue)."""

    max_body_bytes: Annotated[int, Field(ge=1 * KiB)] = 8 * MiB
    """Whole request bodies above this get 413 before they are parsed."""
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
    env_max_lifetime_s: Annotated[float, Field(gt=0)] = 24 * 3600.0
    """An env older than this is closed and answers 409; deleting it frees its storage."""
    janitor_interval_s: Annotated[float, Field(gt=0)] = 5.0
    """How often idle eviction and expiry run."""
    capacity_retry_after_s: Annotated[int, Field(ge=1)] = 2
    """``Retry-After`` of a 503 when no sandbox capacity is left."""
    warm_on_start: bool = True
    """Fill the executor's warm pool for the default tenant at start-up (``/readyz``
    reports not ready until it is)."""

    def resolved_database_url(self) -> str:
        """The database URL: the setting, else a SQLite file under ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'sandpit.db'}"


@lru_cache
def get_api_settings() -> ApiSettings:
    """Process-wide settings (cached; tests pass their own instance to ``create_app``)."""
    return ApiSettings()
