"""What every schema family shares: step statuses, timestamps, the strict request base."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict

Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
ArgumentChecking = Literal["off", "warn", "strict"]
PolicyName = Literal["strict", "standard", "audit"]


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(_aware)]
"""A point in time, always with its zone in JSON (ISO 8601, ``...+00:00``): SQLite hands
timestamps back without one; they are UTC."""


class _Request(BaseModel):
    # strict: a request is what the OpenAPI document says (no false -> 0, no "yes" -> True)
    model_config = ConfigDict(extra="forbid", strict=True)
