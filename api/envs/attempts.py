"""Attempts: fencing a resumed env against the workers of its earlier attempts
(``POST /v1/envs/{id}/attempts``).

A trainer that restarts and resumes an env takes a new attempt (:meth:`Attempts.resume`):
the env's attempt number grows by one and a new random token replaces the previous one
in the env's row, so every replica sees it at once and it survives restarts. Calls that
carry a token (header ``Sandpit-Attempt``) run only while it is the env's current one,
else 409 ``stale_attempt`` and nothing is done: a step is checked before its action runs
and again in the transaction that commits it (:mod:`..db.attempts`), reset, restore and
delete before they start. Calls without the header are not fenced (the fence is opt-in).
Resuming changes nothing else: the env's episode, head and sandbox stay as they are.
"""

from __future__ import annotations

from ..db.attempts import check_attempt, new_attempt
from ..db.database import Database
from ..schemas.envs import AttemptPublic
from ..services.quotas import TenantContext
from .sessions import Sessions


class Attempts:
    """Resume (a new attempt) and the fence of the other verbs (module docstring).

    Args:
        db: the control database (the ``envs`` rows).
        sessions: who may use an env (:meth:`Sessions.usable`).
    """

    def __init__(self, db: Database, sessions: Sessions) -> None:
        self.db = db
        self.sessions = sessions

    def resume(self, ctx: TenantContext, env_id: str) -> AttemptPublic:
        """``POST /v1/envs/{id}/attempts``: the env's next attempt and its token; every
        earlier token is stale from now on. Raises NotFound (unknown or another tenant's
        env), Conflict (expired), ServiceUnavailable (database)."""
        with self.db.read() as db:
            self.sessions.usable(db, ctx.tenant, env_id)
        number, token = new_attempt(self.db, env_id)
        return AttemptPublic(env_id=env_id, attempt=number, token=token)

    def check(self, ctx: TenantContext, env_id: str, token: str | None) -> None:
        """Refuse a call on ``env_id`` carrying ``token`` unless it is the env's current
        attempt's (None: an unfenced call, always allowed). Raises StaleAttempt (409),
        ServiceUnavailable (database)."""
        if token is not None:
            check_attempt(self.db, ctx.tenant, env_id, token)
