"""An env's attempt (`EnvHandle.resume`): the token that fences off the workers of the
env's earlier attempts."""

from __future__ import annotations

from .models import _ResponseModel

__all__ = ["Attempt"]


class Attempt(_ResponseModel):
    """A new attempt of an env (`POST /v1/envs/{id}/attempts`): calls carrying `token`
    (`Sandpit-Attempt`) run; an earlier attempt's token is refused with `Conflict`
    (`code == "stale_attempt"`)."""

    env_id: str
    attempt: int
    """1 for the env's first resume, then 2, 3, ..."""
    token: str
    """What the handle sends as `Sandpit-Attempt` (32 URL-safe characters)."""
