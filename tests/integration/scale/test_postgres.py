"""The control database on a real PostgreSQL server (``scripts/ensure-postgres``): Alembic
migrations up and down, and evaluation episodes claimed exactly once by replicas racing in
separate processes (``FOR UPDATE SKIP LOCKED`` + the guarded compare-and-set), with lease
recovery of a dead replica's episodes; host drain records (migration 0007 up and down on
SQLite and PostgreSQL, the last-host refusal under concurrent drains); drain owners and
undrains (migration 0008 up and down, drains orphaned only by dead replicas, exactly one
of eight racing replicas taking a dead owner's drain over, compare-and-delete undrains),
on both SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import postgres
import pytest
from databases import opened
from sandpit.api.db import models
from sandpit.api.db.affinity import DbAffinity
from sandpit.api.db.database import Database
from sandpit.api.db.engine import head_revision, make_engine, make_sessionmaker, require_current, upgrade
from sandpit.api.evaluations.claims import Replicas
from sandpit.api.services.common import utcnow
from sandpit.api.settings import LEASE_S
from sqlalchemy import inspect, select, update

EPISODES = 240


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh migrated database for this module."""
    with postgres.fresh_database() as url:
        yield url


@pytest.fixture
def database(pg_url: str) -> Iterator[Database]:
    with opened(pg_url) as db:
        yield db




def make_job(database: Database, job_id: str, episodes: int) -> None:
    now = utcnow()
    with database.write() as db:
        db.add(models.EvaluationJob(id=job_id, tenant="t", mode="replay", status="queued", config={}, concurrency=8,
                                    total=episodes, created_by="test", created_at=now))
        db.flush()
        db.add_all(models.EvaluationEpisode(evaluation_id=job_id, index=i, scenario_id=f"scn_{i}", status="pending",
                                            attempt=0, steps=0) for i in range(episodes))


def test_migrations_run_up_and_down_on_postgresql() -> None:
    with postgres.fresh_database(migrated=False) as url:
        upgrade(url)
        engine = make_engine(url)
        try:
            require_current(engine)
            tables = set(inspect(engine).get_table_names())
            assert {"envs", "steps", "blobs", "evaluations", "evaluation_episodes", "replicas", "env_hosts"} <= tables
        finally:
            engine.dispose()
        from alembic import command
        from sandpit.api.db.engine import alembic_config

        command.downgrade(alembic_config(url), "base")
        engine = make_engine(url)
        try:
            assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        finally:
            engine.dispose()
        upgrade(url)
        engine = make_engine(url)
        try:
            require_current(engine)
        finally:
            engine.dispose()
    assert head_revision()


RACER = textwrap.dedent('''
    import json, sys, threading
    from sandpit.api.db.database import Database
    from sandpit.api.db.engine import make_engine, make_sessionmaker
    from sandpit.api.evaluations.claims import Replicas

    url, job, go, ready = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    db = Database(make_sessionmaker(make_engine(url)))
    replica = Replicas(db)
    replica.register()
    claims, lock = [], threading.Lock()
    import os, time
    open(ready, "w").close()  # imported and registered: the test starts both at once
    while not os.path.exists(go):   # start together
        time.sleep(0.005)

    def work():
        while True:
            got = replica.claim(job)
            if got is None:
                with db.read() as s:
                    from sqlalchemy import text
                    left = s.execute(text("SELECT count(*) FROM evaluation_episodes WHERE evaluation_id = :j "
                                          "AND status = 'pending'"), {"j": job}).scalar()
                if not left:
                    return
                continue
            with lock:
                claims.append(got)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"replica": replica.id, "claims": claims}))
''')


def test_two_processes_racing_claim_every_episode_exactly_once(database: Database, pg_url: str, tmp_path) -> None:
    make_job(database, "eval_race", EPISODES)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{k}" for k in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RACER, pg_url, "eval_race", str(go), str(ready[k])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(2)]
    deadline = time.monotonic() + 120  # a loaded machine imports one much later than the other:
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:  # both must be set to race
        time.sleep(0.01)
    go.touch()
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    claimed = [tuple(c) for o in outs for c in o["claims"]]
    indexes = [index for index, _ in claimed]
    assert sorted(indexes) == list(range(EPISODES))  # every one, none twice
    assert all(attempt == 1 for _, attempt in claimed)
    with database.read() as db:
        rows = db.execute(select(models.EvaluationEpisode.index, models.EvaluationEpisode.claimed_by,
                                 models.EvaluationEpisode.status)
                          .where(models.EvaluationEpisode.evaluation_id == "eval_race")).all()
    owner = {index: o["replica"] for o in outs for index, _ in o["claims"]}
    assert all(status == "running" and claimed_by == owner[index] for index, claimed_by, status in rows)
    assert all(o["claims"] for o in outs), "both replicas should have claimed some (they raced)"


def test_only_a_dead_replicas_episodes_are_recovered(database: Database) -> None:
    make_job(database, "eval_lease", 4)
    alive, dead, other = Replicas(database), Replicas(database), Replicas(database)
    for replica in (alive, dead, other):
        replica.register()
    assert alive.claim("eval_lease") == (0, 1)
    assert dead.claim("eval_lease") == (1, 1)
    ours = {(job, index) for job, index, *_ in other.orphans(startup=True) if job == "eval_lease"}
    assert ours == set()  # both claimers heart-beat: nothing to recover
    with database.write() as db:
        db.execute(update(models.Replica).where(models.Replica.id == dead.id)
                   .values(heartbeat_at=utcnow() - timedelta(seconds=LEASE_S + 1)))
    ours = {(job, index) for job, index, *_ in other.orphans(startup=False) if job == "eval_lease"}
    assert ours == {("eval_lease", 1)}
    alive.unregister()  # a clean shutdown: its row is gone, its leftovers recoverable at once
    ours = {(job, index) for job, index, *_ in other.orphans(startup=False) if job == "eval_lease"}
    assert ours == {("eval_lease", 0), ("eval_lease", 1)}


@pytest.mark.parametrize("job_id", ["x' OR '1'='1", "eval_race; DROP TABLE replicas; --", "\x00", "é" * 40])
def test_hostile_job_ids_claim_nothing(database: Database, job_id: str) -> None:
    replica = Replicas(database)
    replica.register()
    if "\x00" in job_id:  # PostgreSQL refuses NUL in text: a database error, never a claim
        from sandpit.api.errors import ServiceUnavailable

        with pytest.raises(ServiceUnavailable):
            replica.claim(job_id)
    else:
        assert replica.claim(job_id) is None
    with database.read() as db:
        assert db.execute(select(models.Replica.id).where(models.Replica.id == replica.id)).first()


# -- host drains (migration 0007, DbAffinity) ------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """An empty database of each kind (no migration run)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'drains.db'}"
    else:
        with postgres.fresh_database(migrated=False) as url:
            yield url


def test_the_host_drains_migration_goes_up_down_and_up_keeping_placements(empty_url: str) -> None:
    from alembic import command
    from sandpit.api.db.engine import alembic_config

    upgrade(empty_url)
    engine = make_engine(empty_url)
    try:
        affinity = DbAffinity(Database(make_sessionmaker(engine)))
        affinity.put("env_a", "h1")
        row, created = affinity.start_drain("h1", {"h1", "h2"}, allow_last=False)
        assert created and row is not None and row.status == "draining"
        command.downgrade(alembic_config(empty_url), "0006")
        tables = set(inspect(engine).get_table_names())
        assert "host_drains" not in tables and "env_hosts" in tables
        assert affinity.get("env_a") == "h1"  # placements survive the downgrade
        upgrade(empty_url)
        require_current(engine)
        assert affinity.drains() == {} and affinity.get("env_a") == "h1"
    finally:
        engine.dispose()


def test_drain_records_refuse_the_last_host_and_move_envs_once(database: Database) -> None:
    affinity = DbAffinity(database)
    for i in range(3):
        affinity.put(f"env_{i}", "h1")
    affinity.put("env_x", "h2")
    assert affinity.start_drain("h1", {"h1"}, allow_last=False) == (None, False)  # the only host
    row, created = affinity.start_drain("h1", {"h1", "h2"}, allow_last=False)
    assert created and row is not None
    assert affinity.start_drain("h1", {"h1", "h2"}, allow_last=False)[1] is False  # idempotent
    assert affinity.start_drain("h2", {"h1", "h2"}, allow_last=False) == (None, False)  # h1 drains: h2 is last
    assert sorted(affinity.envs_on("h1")) == ["env_0", "env_1", "env_2"]
    assert affinity.move("env_0", "h1", "h2") and not affinity.move("env_0", "h1", "h2")  # compare-and-set
    assert affinity.move("env_1", "h1", None) and affinity.get("env_1") is None
    assert not affinity.move("env_x", "h1", "h3")  # not on h1
    affinity.finish_drain("h1", 2)
    record = affinity.drain_record("h1")
    assert record is not None and record.status == "drained" and record.envs_moved == 2
    assert affinity.drains() == {"h1": "drained"}
    affinity.drop("env_2")
    assert affinity.counts() == {"h2": 2}


def test_concurrent_drains_of_the_last_two_hosts_let_exactly_one_through(database: Database) -> None:
    live = {"race-a", "race-b"}
    outcomes: list[tuple[str, bool]] = []
    barrier = threading.Barrier(8)

    def drain(host: str) -> None:
        barrier.wait(timeout=30)
        row, _created = DbAffinity(database).start_drain(host, live, allow_last=False)
        outcomes.append((host, row is not None))

    threads = [threading.Thread(target=drain, args=(sorted(live)[i % 2],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    recorded = {host for host, status in DbAffinity(database).drains().items() if host in live}
    assert len(recorded) == 1, outcomes
    assert {host for host, accepted in outcomes if accepted} == recorded


# -- drain owners and undrains (migration 0008, DbAffinity) ----------------------------------
def test_the_drain_owner_migration_goes_up_down_and_up(empty_url: str) -> None:
    from alembic import command
    from sandpit.api.db.engine import alembic_config

    upgrade(empty_url)
    engine = make_engine(empty_url)
    try:
        affinity = DbAffinity(Database(make_sessionmaker(engine)))
        affinity.start_drain("h1", {"h1", "h2"}, allow_last=False, owner="rep_a")
        command.downgrade(alembic_config(empty_url), "0007")
        columns = {c["name"] for c in inspect(engine).get_columns("host_drains")}
        assert "owner" not in columns and "status" in columns
        upgrade(empty_url)
        require_current(engine)
        assert affinity.drains() == {"h1": "draining"}  # the drain survives; its owner is unknown now
        assert affinity.orphaned_drains(LEASE_S) == [("h1", None)]  # so any live replica may claim it
        assert affinity.claim_drain("h1", None, "rep_b")
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request: pytest.FixtureRequest, tmp_path) -> Iterator[Database]:
    """A migrated database of each kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'owners.db'}"
        upgrade(url)
        with opened(url) as db:
            yield db
    else:
        with postgres.fresh_database() as url, opened(url) as db:
            yield db


def test_only_drains_of_dead_replicas_are_orphaned(any_database: Database) -> None:
    affinity = DbAffinity(any_database)
    alive, dead, gone = Replicas(any_database), Replicas(any_database), Replicas(any_database)
    for replica in (alive, dead, gone):
        replica.register()
    for host, owner in (("h-alive", alive), ("h-dead", dead), ("h-gone", gone)):
        affinity.start_drain(host, {"h-alive", "h-dead", "h-gone", "h-other"}, allow_last=False, owner=owner.id)
    assert affinity.orphaned_drains(LEASE_S) == []  # every owner heart-beats
    with any_database.write() as db:
        db.execute(update(models.Replica).where(models.Replica.id == dead.id)
                   .values(heartbeat_at=utcnow() - timedelta(seconds=LEASE_S + 1)))
    gone.unregister()  # a clean shutdown: its drain is orphaned at once
    assert sorted(affinity.orphaned_drains(LEASE_S)) == [("h-dead", dead.id), ("h-gone", gone.id)]
    affinity.finish_drain("h-dead", 0)  # a drained host needs no owner any more
    assert affinity.orphaned_drains(LEASE_S) == [("h-gone", gone.id)]
    assert not affinity.claim_drain("h-gone", "rep_someone_else", alive.id)  # compare-and-set on the old owner
    assert not affinity.claim_drain("h-dead", dead.id, alive.id)  # drained: nothing to run
    assert affinity.claim_drain("h-gone", gone.id, alive.id)
    assert affinity.orphaned_drains(LEASE_S) == []
    record = affinity.drain_record("h-gone")
    assert record is not None and record.owner == alive.id and record.status == "draining"
    assert affinity.claim_drain("h-gone", alive.id, None)  # released (its executor could not start it)
    assert affinity.orphaned_drains(LEASE_S) == [("h-gone", None)]  # so the next pass claims it again


def test_exactly_one_of_racing_replicas_takes_a_dead_replicas_drain_over(any_database: Database) -> None:
    affinity = DbAffinity(any_database)
    racers = [Replicas(any_database) for _ in range(8)]
    for replica in racers:
        replica.register()
    for round_ in range(5):
        host = f"race-{round_}"
        affinity.start_drain(host, {host, "other"}, allow_last=False, owner=f"rep_dead_{round_}")
        outcomes: list[tuple[str, bool]] = []
        barrier = threading.Barrier(len(racers))

        def take(replica: Replicas, host: str = host, outcomes: list[tuple[str, bool]] = outcomes,
                 barrier: threading.Barrier = barrier) -> None:
            mine = DbAffinity(any_database)
            orphans = dict(mine.orphaned_drains(LEASE_S))
            barrier.wait(timeout=30)  # every racer read the same dead owner first
            outcomes.append((replica.id, mine.claim_drain(host, orphans[host], replica.id)))

        threads = [threading.Thread(target=take, args=(replica,)) for replica in racers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        winners = [rid for rid, won in outcomes if won]
        assert len(outcomes) == len(racers) and len(winners) == 1, outcomes
        record = affinity.drain_record(host)
        assert record is not None and record.owner == winners[0]


def test_an_undrain_deletes_only_the_status_it_saw(any_database: Database) -> None:
    affinity = DbAffinity(any_database)
    affinity.start_drain("u1", {"u1", "u2"}, allow_last=False, owner="rep_x")
    assert affinity.finish_drain("u1", 3)
    assert not affinity.undrain("u1", "draining")  # it finished meanwhile: the caller sees drained
    assert affinity.undrain("u1", "drained")
    assert affinity.drain_record("u1") is None and affinity.drains() == {}
    assert not affinity.undrain("u1", "drained")  # idempotent
    assert not affinity.finish_drain("u1", 1)  # a drain thread finishing after the undrain writes nothing
    assert affinity.drains() == {}
    for hostile in ("x' OR '1'='1", "u1; DROP TABLE host_drains; --", "é" * 40):
        assert not affinity.undrain(hostile, "draining")
        assert not affinity.claim_drain(hostile, None, "rep_x")
