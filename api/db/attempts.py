"""Attempt fencing in the ``envs`` table: each resume of an env (a new attempt) writes a
new ``attempt_token``; a call that carries a token is refused unless it is the current
one.

:func:`new_attempt` moves an env to its next attempt. :func:`check_attempt` refuses a
stale token before a call runs; :func:`fence_core` refuses it again inside the
transaction that commits a step (a conditional update of the env's row: on PostgreSQL it
waits for a concurrent resume's row lock and sees its token; on SQLite writes are one at
a time), so a step of an older attempt is never committed, even when the resume lands
while the step runs.
"""

from __future__ import annotations

import secrets

from sqlalchemy import Connection, bindparam, select, update

from ..errors import StaleAttempt
from .database import Database
from .models import Env, table

_ENVS = table(Env)
_TOKEN_OF = select(_ENVS.c.attempt_token).where(_ENVS.c.id == bindparam("env"), _ENVS.c.tenant == bindparam("tenant"))
"""The attempt token of ``(:env, :tenant)``'s row (built once, as the fence's update)."""
_FENCE = update(_ENVS).where(_ENVS.c.id == bindparam("env"), _ENVS.c.attempt_token == bindparam("token")).values(
    attempt_token=bindparam("same_token"))
"""The fence's conditional update: the row is written (and locked) only while ``:token``
is its current token (built once: built per call, its construction and compilation cost
more than the update)."""


def _stale(env_id: str) -> StaleAttempt:
    return StaleAttempt(f"env {env_id!r} was resumed by a newer attempt; this call's Sandpit-Attempt token is stale "
                        "and nothing was done", field="Sandpit-Attempt")


def new_attempt(db: Database, env_id: str) -> tuple[int, str]:
    """Give ``env_id`` its next attempt: ``(attempt number, token)`` (a fresh random token,
    32 URL-safe characters). The caller has checked the env is the tenant's and usable.
    Raises ServiceUnavailable (database)."""
    token = secrets.token_urlsafe(24)
    envs = table(Env)
    with db.write_connection() as conn:
        conn.execute(update(envs).where(envs.c.id == env_id).values(attempt=envs.c.attempt + 1, attempt_token=token))
        number = conn.execute(select(envs.c.attempt).where(envs.c.id == env_id)).scalar_one()
    return int(number), token


def check_attempt(db: Database, tenant: str, env_id: str, token: str) -> None:
    """Raise StaleAttempt (409) unless ``token`` is the current attempt token of
    ``tenant``'s env ``env_id`` (an env never resumed has none, so every token is stale
    there). An env that is not ``tenant``'s passes: the call itself answers 404 for it.
    Raises ServiceUnavailable (database)."""
    with db.read_connection() as conn:
        found = conn.execute(_TOKEN_OF, {"env": env_id, "tenant": tenant}).first()
    if found is None:
        return
    current = found.attempt_token
    if current is None or not secrets.compare_digest(current, token):
        raise _stale(env_id)


def fence_core(conn: Connection, env_id: str, token: str) -> None:
    """:func:`check_attempt` inside ``conn``'s transaction, as a conditional update of the
    env's row (it locks the row until the transaction ends). Raises StaleAttempt: the
    caller's transaction must then roll back."""
    done = conn.execute(_FENCE, {"env": env_id, "token": token, "same_token": token})
    if done.rowcount != 1:
        raise _stale(env_id)
