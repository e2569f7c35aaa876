"""``/healthz`` and ``/readyz``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: Literal["ok", "not_ready"]
    checks: dict[str, str] = Field(default_factory=dict)
