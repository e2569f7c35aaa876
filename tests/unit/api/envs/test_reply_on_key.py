"""A keyed create and reset store their reply on the key in the transaction that commits
them (:class:`sandpit.api.db.idempotency.ReplyOnKey`): the stored bytes are the reply,
and a claim that was taken over while the request ran fails the whole transaction, so
nothing of the env or the episode is committed and no session is left open. On the
fake executor, on SQLite (and on PostgreSQL in CI's PostgreSQL part)."""

from __future__ import annotations

import json

import pytest
from env_calls import ME, create, state, step
from sandpit.api.app import Services
from sandpit.api.db import models
from sandpit.api.db.idempotency import KeyClaim, ReplyOnKey
from sandpit.api.errors import IdempotencyKeyInFlight
from sandpit.api.schemas.envs import EnvCreate, ResetRequest
from sandpit.api.services.idempotency import Replay
from sandpit.executor.fake import FakeExecutor
from sqlalchemy import func, select, update


def _taken_over(services: Services, claim: KeyClaim) -> None:
    """Give ``claim``'s row another request's token, as a retry taking over a lapsed claim does."""
    keys = models.table(models.IdempotencyKey)
    with services.db.write_connection() as conn:
        conn.execute(update(keys).where(keys.c.tenant == claim.tenant, keys.c.key == claim.key)
                     .values(claim="a-retry-took-it"))


def _open_sessions(fake: FakeExecutor) -> int:
    return sum(not session._closed for session in fake.sessions.values())


def _envs(services: Services) -> int:
    with services.db.read() as db:
        return int(db.scalar(select(func.count()).select_from(models.Env)) or 0)


def test_a_keyed_create_stores_its_reply_with_the_env(services: Services, environment_id: str) -> None:
    claim = services.idempotency.begin(ME.tenant, "create-1", "digest-1")
    assert isinstance(claim, KeyClaim)
    reply_on = ReplyOnKey(claim, 201)
    created = services.envs.create(ME, EnvCreate(environment_id=environment_id, init_config={"count": 4}),
                                   reply_on=reply_on)
    assert reply_on.body is not None and created.json() == reply_on.body
    assert json.loads(reply_on.body)["id"] == created.public.id and created.public.init_config == {"count": 4}
    assert created.public.status == "live"  # rendered before the commit, as the env is once committed
    assert services.envs.read(ME, created.public.id).model_dump(exclude={"construction"}) == \
        created.public.model_dump(exclude={"construction"})
    # the retry is the stored reply, byte for byte, and nothing runs again
    assert services.idempotency.begin(ME.tenant, "create-1", "digest-1") == Replay(201, reply_on.body)
    assert state(services, created.public.id)["count"] == 4


def test_a_create_whose_claim_was_taken_over_commits_nothing(services: Services, fake: FakeExecutor,
                                                             environment_id: str) -> None:
    before_envs, before_sessions = _envs(services), _open_sessions(fake)
    claim = services.idempotency.begin(ME.tenant, "create-2", "digest-2")
    assert isinstance(claim, KeyClaim)
    _taken_over(services, claim)
    with pytest.raises(IdempotencyKeyInFlight):
        services.envs.create(ME, EnvCreate(environment_id=environment_id), reply_on=ReplyOnKey(claim, 201))
    assert _envs(services) == before_envs
    assert _open_sessions(fake) == before_sessions  # the new session was closed with the transaction's end
    assert services.envs.page(ME, 100, 0).count == before_envs
    with pytest.raises(IdempotencyKeyInFlight):  # the retry that took the key still holds it
        services.idempotency.begin(ME.tenant, "create-2", "digest-2")
    # the tenant's live-env reservation was given back: another create goes through
    assert services.envs.create(ME, EnvCreate(environment_id=environment_id)).public.step == 0


def test_a_keyed_reset_stores_its_reply_with_the_episode(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id, init_config={"count": 7})
    step(services, env_id, "bump")
    claim = services.idempotency.begin(ME.tenant, "reset-1", "digest-r1")
    assert isinstance(claim, KeyClaim)
    reply_on = ReplyOnKey(claim, 200)
    env = services.episodes.reset(ME, env_id, ResetRequest(init_config={"count": 2}), reply_on)
    assert reply_on.body == env.model_dump_json().encode("utf-8")
    assert (env.episode, env.step, env.init_config) == (2, 0, {"count": 2})
    assert services.envs.read(ME, env_id).model_dump(exclude={"construction"}) == \
        env.model_dump(exclude={"construction"})
    assert services.idempotency.begin(ME.tenant, "reset-1", "digest-r1") == Replay(200, reply_on.body)


@pytest.mark.parametrize("config", [None, {"count": 30}], ids=["the same config", "a new config"])
def test_a_reset_whose_claim_was_taken_over_commits_nothing(services: Services, environment_id: str,
                                                            config: dict[str, int] | None) -> None:
    env_id = create(services, environment_id, init_config={"count": 7})
    step(services, env_id, "bump")
    claim = services.idempotency.begin(ME.tenant, "reset-2", "digest-r2")
    assert isinstance(claim, KeyClaim)
    _taken_over(services, claim)
    with pytest.raises(IdempotencyKeyInFlight):
        services.episodes.reset(ME, env_id, ResetRequest(init_config=config), ReplyOnKey(claim, 200))
    env = services.envs.read(ME, env_id)
    assert (env.episode, env.step, env.init_config) == (1, 1, {"count": 7})
    assert [e.episode for e in services.history.episodes(ME, env_id, 10, 0).data] == [1]
    # the env goes on from its committed head, in a session opened again
    after = step(services, env_id, "bump")
    assert after.observation == "9" and after.step == 2
    assert services.episodes.reset(ME, env_id, None).episode == 2
