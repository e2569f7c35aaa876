"""Steps of many envs taken at once share transactions (group commit) and every one of them
is committed, in order, before it is acknowledged; a step whose write fails is not
acknowledged, leaves the database at the env's last committed step and does not affect
the steps of other envs committed with it (services on the fake executor, a real SQLite
file)."""

from __future__ import annotations

import threading
from typing import Any

from api_fakes import caller
from sandpit.api.app import Services
from sandpit.api.db import models
from sandpit.api.db.step_writes import StepWrite
from sandpit.api.errors import ServiceUnavailable
from sandpit.api.schemas.envs import EnvCreate, StepRequest
from sqlalchemy import Connection, select
from sqlalchemy.exc import OperationalError

ME = caller(max_concurrent_calls=256, max_running_calls=64)


def create(services: Services, environment_id: str) -> str:
    return services.envs.create(ME, EnvCreate(environment_id=environment_id)).public.id


def committed(services: Services, env_id: str) -> list[tuple[int, str]]:
    with services.db.read() as db:
        rows = db.execute(select(models.Step.step, models.Step.observation).where(
            models.Step.env_id == env_id, models.Step.step > 0).order_by(models.Step.step))
        return [(r.step, r.observation) for r in rows]


def run_threads(targets: list[Any]) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(target: Any) -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def test_concurrent_steps_of_many_envs_are_all_committed_in_order(services: Services, environment_id: str) -> None:
    env_ids = [create(services, environment_id) for _ in range(12)]
    steps = 20

    def drive(env_id: str) -> None:
        for i in range(1, steps + 1):
            reply = services.steps.step(ME, env_id, StepRequest(name="bump"), None).public()
            assert (reply.step, reply.observation) == (i, str(i))
            assert committed(services, env_id)[-1] == (i, str(i))  # acknowledged = committed

    assert run_threads([lambda e=e: drive(e) for e in env_ids]) == []
    for env_id in env_ids:
        assert committed(services, env_id) == [(i, str(i)) for i in range(1, steps + 1)]
        with services.db.read() as db:
            row = db.get(models.Env, env_id)
            assert row is not None and row.step == steps
    commits = services.steps.commits
    assert commits.items == len(env_ids) * steps and commits.batches <= commits.items


def test_a_failed_write_acknowledges_nothing_and_spares_the_other_envs(services: Services,
                                                                       environment_id: str) -> None:
    bad, *good = [create(services, environment_id) for _ in range(6)]
    commits = services.steps.commits
    write_batch = commits.write_batch

    def failing(conn: Connection, writes: list[StepWrite]) -> None:
        write_batch(conn, writes)
        if any(w.env_id == bad and w.row["step"] >= 3 for w in writes):
            raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    commits.write_batch = failing
    outcomes: dict[str, list[Any]] = {env_id: [] for env_id in [bad, *good]}

    def drive(env_id: str) -> None:
        for _ in range(6):
            try:
                outcomes[env_id].append(services.steps.step(ME, env_id, StepRequest(name="bump"), None).public().step)
            except ServiceUnavailable as exc:
                outcomes[env_id].append(exc)

    assert run_threads([lambda e=e: drive(e) for e in [bad, *good]]) == []
    for env_id in good:
        assert outcomes[env_id] == [1, 2, 3, 4, 5, 6]
        assert [s for s, _ in committed(services, env_id)] == [1, 2, 3, 4, 5, 6]
    assert outcomes[bad][:2] == [1, 2] and all(isinstance(o, ServiceUnavailable) for o in outcomes[bad][2:])
    assert [s for s, _ in committed(services, bad)] == [1, 2]  # nothing unacknowledged was kept
    assert bad not in services.live  # its session was dropped: the next request resumes from step 2
    commits.write_batch = write_batch
    resumed = services.steps.step(ME, bad, StepRequest(name="bump"), None).public()
    assert (resumed.step, resumed.observation, resumed.recovered) == (3, "3", True)


def test_a_session_that_refuses_a_call_is_reattached_within_the_same_step(services: Services, fake,
                                                                          environment_id: str) -> None:
    """Another API replica stepped the env (this one's handle is stale: the host refuses the
    call before running it). The step re-attaches from the committed head and succeeds in
    the same request; the refused attempt leaves no trace (issue 15)."""
    from sandpit.executor.errors import SessionClosed

    env_id = create(services, environment_id)
    for i in range(1, 3):
        assert services.steps.step(ME, env_id, StepRequest(name="bump"), None).public().observation == str(i)
    first = services.live.get(env_id)
    assert first is not None
    opened = len(fake.sessions)
    fake.fail("call", SessionClosed("stale handle: another replica used the session"), times=1)
    reply = services.steps.step(ME, env_id, StepRequest(name="bump"), None).public()
    assert (reply.step, reply.observation) == (3, "3")  # from the committed count 2, run once
    assert committed(services, env_id) == [(1, "1"), (2, "2"), (3, "3")]
    assert len(fake.sessions) == opened + 1  # re-opened from the committed head
    assert services.live.get(env_id) is not first


def test_a_session_refusing_twice_is_a_503_and_nothing_is_recorded(services: Services, fake,
                                                                   environment_id: str) -> None:
    from sandpit.executor.errors import SessionClosed

    env_id = create(services, environment_id)
    services.steps.step(ME, env_id, StepRequest(name="bump"), None).public()
    fake.fail("call", SessionClosed("stale"), times=2)
    try:
        services.steps.step(ME, env_id, StepRequest(name="bump"), None).public()
    except ServiceUnavailable as exc:
        assert exc.retry_after == 1
    else:
        raise AssertionError("a session refusing twice must be a 503")
    assert committed(services, env_id) == [(1, "1")]
    assert services.steps.step(ME, env_id, StepRequest(name="bump"), None).public().observation == "2"
