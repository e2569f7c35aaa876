"""The control database on a real PostgreSQL server (``scripts/ensure-postgres``): Alembic
migrations up and down, and evaluation episodes claimed exactly once by replicas racing in
separate processes (``FOR UPDATE SKIP LOCKED`` + the guarded compare-and-set), with lease
recovery of a dead replica's episodes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta

import postgres
import pytest
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.db.engine import head_revision, make_engine, make_sessionmaker, require_current, upgrade
from sandpit.api.evaluations.claims import LEASE_S, Replicas
from sandpit.api.services.common import utcnow
from sqlalchemy import inspect, select, update

EPISODES = 240


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh migrated database for this module."""
    with postgres.fresh_database() as url:
        yield url


@pytest.fixture
def database(pg_url: str) -> Iterator[Database]:
    engine = make_engine(pg_url)
    try:
        yield Database(make_sessionmaker(engine))
    finally:
        engine.dispose()


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

    url, job, go = sys.argv[1], sys.argv[2], sys.argv[3]
    db = Database(make_sessionmaker(make_engine(url)))
    replica = Replicas(db)
    replica.register()
    claims, lock = [], threading.Lock()
    import os, time
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
    procs = [subprocess.Popen([sys.executable, "-c", RACER, pg_url, "eval_race", str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
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
