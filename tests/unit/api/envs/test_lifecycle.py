"""Creating, reading, deleting envs (:mod:`sandpit.api.envs.lifecycle`) on the fake executor: step 0
and the tools, deletion and storage collection, tenant isolation, quotas before anything
runs, instantiation failures."""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from api_fakes import SOURCE, caller
from env_calls import ME, create, state, step
from sandpit.api.app import Services
from sandpit.api.db import models
from sandpit.api.envs.lifecycle import count_open_envs
from sandpit.api.errors import InvalidRequest, NotFound, QuotaExceeded
from sandpit.api.schemas.environments import EnvironmentCreate
from sandpit.api.schemas.envs import (
    EnvCreate,
    StepRequest,
)
from sandpit.api.services.common import utcnow
from sandpit.executor.fake import FakeExecutor
from sqlalchemy import func, select
from threads import held_elsewhere


def test_an_env_starts_at_step_zero_with_the_environment_tools(services: Services, environment_id: str) -> None:
    env = services.envs.create(ME, EnvCreate(environment_id=environment_id, init_config={"count": 5})).public
    assert (env.episode, env.step, env.status, env.episode_status) == (1, 0, "live", "running")
    assert {t["function"]["name"] for t in env.tools} == {"bump", "set_record", "fail"}
    assert state(services, env.id) == {"count": 5, "records": {}, "log": []}
    assert services.envs.read(ME, env.id).id == env.id
    assert services.envs.page(ME, 10, 0).count == 1


def test_a_create_writes_every_row_of_the_env_with_its_defaults(services: Services, environment_id: str) -> None:
    # the create's rows go in through Core (insert_objects): every column as the ORM would write it
    env = services.envs.create(ME, EnvCreate(environment_id=environment_id, init_config={"count": 2})).public
    with services.db.read() as db:
        row = db.get(models.Env, env.id)
        assert row is not None
        assert (row.tenant, row.environment_id, row.episode, row.step, row.closed, row.attempt, row.init_config,
                row.forked_from, row.attempt_token) == ("team-a", environment_id, 1, 0, False, 0, {}, None, None)
        assert row.init_config_hash and row.expires_at > row.created_at
        zero = db.get(models.Step, (env.id, 1, 0))
        assert zero is not None
        assert (zero.action, zero.observation, zero.status, zero.duration_ms, zero.reward, zero.info) == (
            None, "", "ok", 0.0, None, None)
        first = db.get(models.Episode, (env.id, 1))
        assert first is not None
        assert (first.status, first.failure, first.reward, first.checks, first.ended_at, first.environment_id) == (
            "running", "none", None, None, None, environment_id)
        event = db.scalars(select(models.AuditEvent).where(models.AuditEvent.action == "env.create",
                                                           models.AuditEvent.resource_id == env.id)).one()
        assert (event.tenant, event.detail) == ("team-a", {"environment_id": environment_id, "scenario_id": None})
        assert event.id is not None
        assert db.get(models.InitConfig, row.init_config_hash) is not None
        assert db.get(models.Blob, zero.state_root) is not None
    assert services.envs.read(ME, env.id).model_dump(exclude={"status"}) == env.model_dump(exclude={"status"})


def test_delete_frees_the_session_and_collection_frees_the_storage(services: Services, fake: FakeExecutor,
                                                                     environment_id: str) -> None:
    env_id = create(services, environment_id)
    step(services, env_id, "set_record", key="k", value="v" * 5000)
    services.envs.delete(ME, env_id)
    assert all(s.closed for s in fake.sessions.values() if s.tenant == "team-a")
    assert services.collector.collect_if_wanted() > 0
    with services.db.read() as db:
        assert (db.scalar(select(func.count()).select_from(models.Blob)) or 0) == 0
    with pytest.raises(NotFound):
        services.envs.read(ME, env_id)


def test_other_tenants_ids_are_not_found(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    other = caller("team-b")
    for attempt in (lambda: services.envs.read(other, env_id),
                    lambda: services.steps.step(other, env_id, StepRequest(name="bump"), None).public(),
                    lambda: services.history.state(other, env_id, None, None),
                    lambda: services.envs.delete(other, env_id),
                    lambda: services.environments.read(other, environment_id),
                    lambda: services.envs.create(other, EnvCreate(environment_id=environment_id)).public):
        with pytest.raises(NotFound) as raised:
            attempt()
        assert "team-a" not in raised.value.message
    assert services.envs.page(other, 10, 0).count == 0


def test_quotas_are_applied_before_anything_runs(services: Services, fake: FakeExecutor,
                                                 environment_id: str) -> None:
    tight = caller(max_live_envs=1, max_concurrent_calls=1)
    services.envs.create(tight, EnvCreate(environment_id=environment_id))
    opened = len(fake.sessions)
    with pytest.raises(QuotaExceeded) as raised:
        services.envs.create(tight, EnvCreate(environment_id=environment_id))
    assert raised.value.limit == "max_live_envs" and len(fake.sessions) == opened


def test_the_live_envs_quota_counts_only_the_tenants_open_envs(services: Services, environment_id: str) -> None:
    ids = [create(services, environment_id) for _ in range(4)]
    other = services.environments.register(caller("team-b"), EnvironmentCreate(
        name="counter", source_code=SOURCE, class_name="Counter")).id
    services.envs.create(caller("team-b"), EnvCreate(environment_id=other))
    with services.db.write() as db:
        db.get(models.Env, ids[0]).closed = True  # type: ignore[union-attr]
        db.get(models.Env, ids[1]).expires_at = utcnow() - timedelta(seconds=1)  # type: ignore[union-attr]
    services.envs.delete(ME, ids[2])
    assert count_open_envs(services.db, "team-a") == 1
    assert count_open_envs(services.db, "team-b") == 1
    assert count_open_envs(services.db, "team-c") == 0
    assert count_open_envs(services.db, "team-a' OR '1'='1") == 0  # a bound parameter, not text


def test_instantiation_failures_name_init_config(services: Services, environment_id: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        create(services, environment_id, init_config={"explode": True})
    assert raised.value.field == "init_config" and "init refused" in raised.value.message


def test_idle_envs_stay_while_the_sandboxes_are_less_full_than_the_threshold(services: Services, fake: FakeExecutor,
                                                                            environment_id: str) -> None:
    env_id = create(services, environment_id)
    lifecycle = services.envs
    lifecycle.settings = lifecycle.settings.model_copy(update={"env_idle_evict_s": 1e-6,
                                                               "env_idle_evict_fullness": 0.5})
    assert services.sandboxes.fullness() == pytest.approx(1 / fake.settings.max_sandboxes)
    assert lifecycle.evict_idle() == 0 and env_id in services.live
    fake.settings = fake.settings.model_copy(update={"max_sandboxes": 2})  # 1 of 2: half full
    assert lifecycle.evict_idle() == 1 and env_id not in services.live
    assert step(services, env_id, "bump").recovered  # back from its committed state


def test_without_a_fullness_threshold_idle_envs_leave_whatever_the_load(services: Services,
                                                                        environment_id: str) -> None:
    env_id = create(services, environment_id)
    lifecycle = services.envs
    lifecycle.settings = lifecycle.settings.model_copy(update={"env_idle_evict_s": 1e-6})
    assert lifecycle.settings.env_idle_evict_fullness == 0.0  # the default
    assert services.sandboxes.fullness() < 0.1
    assert lifecycle.evict_idle() == 1 and env_id not in services.live


def test_a_busy_env_is_never_evicted_for_idleness(services: Services, environment_id: str) -> None:
    env_id = create(services, environment_id)
    lifecycle = services.envs
    lifecycle.settings = lifecycle.settings.model_copy(update={"env_idle_evict_s": 1e-6,
                                                               "env_idle_evict_fullness": 0.01})
    with services.live.lock(env_id):  # a request in progress
        assert lifecycle.evict_idle() == 0
    assert lifecycle.evict_idle() == 1


def test_idle_eviction_stops_once_the_sandboxes_are_below_the_threshold(services: Services, fake: FakeExecutor,
                                                                       environment_id: str) -> None:
    older, newer = create(services, environment_id), create(services, environment_id)
    step(services, newer, "bump")  # used last
    lifecycle = services.envs
    lifecycle.settings = lifecycle.settings.model_copy(update={"env_idle_evict_s": 1e-6,
                                                               "env_idle_evict_fullness": 0.75})
    fake.settings = fake.settings.model_copy(update={"max_sandboxes": 2})  # 2 of 2: full
    assert lifecycle.evict_idle() == 1  # then 1 of 2: below 0.75, the rest stay
    assert older not in services.live and newer in services.live


def test_idle_eviction_below_the_threshold_asks_once_and_lists_no_live_entry(services: Services,
                                                                           environment_id: str) -> None:
    env_id = create(services, environment_id)
    asked: list[bool] = []

    def keep_going() -> bool:
        asked.append(False)
        return False

    # the registry held by another thread: a pass that lists the entries would block
    with held_elsewhere(lambda: services.live._registry):
        done: list[int] = []
        passing = threading.Thread(target=lambda: done.append(services.live.evict_idle(0, keep_going=keep_going)))
        passing.start()
        passing.join(2)  # listing would wait for the holder (10 s)
        assert done == [0] and asked == [False]
    assert env_id in services.live
    answers = iter([True, False])  # before the first: go on; after it: stop
    assert services.live.evict_idle(0, keep_going=lambda: next(answers)) == 1
    assert env_id not in services.live and next(answers, None) is None


def test_janitor_passes_that_find_nothing_expired_never_wait_for_the_write_lock(
        services: Services, database_kind: str, db_path: Path, environment_id: str) -> None:
    if database_kind != "sqlite":
        pytest.skip("holds SQLite's one write lock from another connection")
    env_id = create(services, environment_id)
    writers = services.db._write_lock  # this process's one writer at a time: held, as a commit holds it
    writers.acquire()
    holder = sqlite3.connect(db_path, timeout=0)
    holder.execute("BEGIN IMMEDIATE")  # and SQLite's write lock: every writer now waits
    try:
        passed: list[tuple[int, int, int]] = []
        janitor = threading.Thread(target=lambda: passed.append(
            (services.envs.close_expired(), services.idempotency.expire(), services.ui_sessions.expire())))
        janitor.start()
        janitor.join(5)
        assert passed == [(0, 0, 0)]
    finally:
        holder.rollback()
        holder.close()
        writers.release()
    with services.db.write() as db:  # now one is past its lifetime: the pass writes
        db.get(models.Env, env_id).expires_at = utcnow() - timedelta(seconds=1)
    assert services.envs.close_expired() == 1 and env_id not in services.live
    with services.db.read() as db:
        assert db.get(models.Env, env_id).closed
    assert services.envs.close_expired() == 0


class _SlowToRead:
    """A live entry whose ``last_used`` (later than any other's: never the one evicted) is
    read only once ``go`` is set (``reading`` says the eviction pass has reached it)."""

    def __init__(self) -> None:
        self.reading, self.go = threading.Event(), threading.Event()

    @property
    def last_used(self) -> float:
        self.reading.set()
        assert self.go.wait(10)
        return float("inf")


@pytest.mark.parametrize("evict", [lambda live: live.evict_idle(1e9), lambda live: live.evict_lru(exclude="none")])
def test_an_eviction_pass_reads_the_live_entries_without_holding_up_requests(
        services: Services, environment_id: str, evict: object) -> None:
    env_id = create(services, environment_id)
    slow = _SlowToRead()
    services.live._live["env_slow"] = slow  # type: ignore[assignment]  # read by the pass, never dropped
    passing = threading.Thread(target=evict, args=(services.live,))
    passing.start()
    try:
        assert slow.reading.wait(10)  # the pass is in the middle of its listing
        locked: list[bool] = []
        request = threading.Thread(target=lambda: locked.append(services.live._lock_of(env_id).acquire(timeout=5)))
        request.start()
        request.join(2)  # a pass holding the registry would keep this request waiting (5 s)
        assert locked == [True]
        services.live._lock_of(env_id).release()
    finally:
        slow.go.set()
        passing.join(10)
        services.live._live.pop("env_slow", None)
