"""The viewer's listings (:mod:`sandpit.api.envs.listings`, :mod:`sandpit.api.evaluations.listings`)
on a migrated database with rows written directly: filters, paging with totals, tenant
scoping, search text taken literally, the reward histogram's bins, a 10,000-episode
evaluation paged."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.envs.listings import EpisodeFilter, Listings
from sandpit.api.errors import NotFound
from sandpit.api.evaluations.listings import EvaluationListings
from sandpit.api.services.common import utcnow
from sandpit.api.services.quotas import TenantContext
from sandpit.api.settings import Quotas
from sqlalchemy import insert

A = TenantContext(tenant="team-a", actor="key_a", quotas=Quotas())
B = TenantContext(tenant="team-b", actor="key_b", quotas=Quotas())


def environment(db: Any, tenant: str, env_id: str, name: str | None, inline: bool = False) -> None:
    db.add(models.Environment(id=env_id, tenant=tenant, name=name, class_name="Counter", source_code="",
                              code_sha256="0" * 64, tools=[], inline=inline, created_at=utcnow()))


def episode(db: Any, tenant: str, env_id: str, environment_id: str, number: int, status: str,
            reward: float | None, steps: int, scenario: str | None = None, minutes: int = 0) -> None:
    now = utcnow()
    if db.get(models.Env, env_id) is None:
        db.add(models.Env(id=env_id, tenant=tenant, environment_id=environment_id, init_config={}, created_at=now,
                          last_used_at=now, expires_at=now + timedelta(hours=1)))
        db.flush()
    db.add(models.Episode(env_id=env_id, episode=number, environment_id=environment_id, scenario_id=scenario,
                          config={}, status=status, reward=reward, started_at=now + timedelta(minutes=minutes)))
    for step in range(steps + 1):
        db.add(models.Step(env_id=env_id, episode=number, step=step, observation="", status="ok", duration_ms=1.0,
                           state_root="r", created_at=now))


@pytest.fixture
def listings(database: Database) -> Listings:
    with database.write() as db:
        environment(db, "team-a", "envr_a", "counter 100%_x")
        environment(db, "team-a", "envr_inline", None, inline=True)
        environment(db, "team-b", "envr_b", "counter")
        db.flush()
        episode(db, "team-a", "env_1", "envr_a", 1, "terminated", 1.0, 3, "scn_1", minutes=1)
        episode(db, "team-a", "env_1", "envr_a", 2, "running", None, 1, "scn_1", minutes=2)
        episode(db, "team-a", "env_2", "envr_a", 1, "terminated", 0.5, 2, "scn_2", minutes=3)
        episode(db, "team-a", "env_3", "envr_inline", 1, "truncated", 0.0, 5, minutes=4)
        episode(db, "team-b", "env_b", "envr_b", 1, "terminated", 1.0, 1, "scn_1", minutes=5)
    return Listings(database)


def keys(rows: list[Any]) -> list[tuple[str, int]]:
    return [(r.env_id, r.episode) for r in rows]


@pytest.mark.parametrize("wanted, expected", [
    (EpisodeFilter(), [("env_3", 1), ("env_2", 1), ("env_1", 2), ("env_1", 1)]),
    (EpisodeFilter(environment_id="envr_a"), [("env_2", 1), ("env_1", 2), ("env_1", 1)]),
    (EpisodeFilter(scenario_id="scn_1"), [("env_1", 2), ("env_1", 1)]),
    (EpisodeFilter(status="terminated"), [("env_2", 1), ("env_1", 1)]),
    (EpisodeFilter(reward_min=0.5), [("env_2", 1), ("env_1", 1)]),
    (EpisodeFilter(reward_min=0.1, reward_max=0.9), [("env_2", 1)]),
    (EpisodeFilter(environment_id="envr_b"), []),  # another tenant's environment: nothing
    (EpisodeFilter(scenario_id="' OR 1=1 --"), []),
])
def test_episode_filters_newest_first_within_the_tenant(listings: Listings, wanted: EpisodeFilter,
                                                        expected: list[tuple[str, int]]) -> None:
    rows, total = listings.episodes(A, wanted, 50, 0)
    assert keys(rows) == expected and total == len(expected)


def test_episode_rows_carry_their_heads_and_environment_names(listings: Listings) -> None:
    rows, total = listings.episodes(A, EpisodeFilter(), 2, 1)
    assert total == 4 and keys(rows) == [("env_2", 1), ("env_1", 2)]
    assert [(r.steps, r.environment_name, r.reward) for r in rows] == [(2, "counter 100%_x", 0.5),
                                                                        (1, "counter 100%_x", None)]


@pytest.mark.parametrize("search, expected", [
    (None, ["envr_a"]), ("COUNTER", ["envr_a"]), ("100%", ["envr_a"]), ("%", ["envr_a"]), ("_x", ["envr_a"]),
    ("0%_", ["envr_a"]), ("1_0", []), ("c%r", []), ("envr_b", []), ("\\", []),
])
def test_environment_search_takes_the_text_literally(listings: Listings, search: str | None,
                                                      expected: list[str]) -> None:
    rows, total = listings.environments(A, search, 50, 0)
    assert [r.id for r in rows] == expected and total == len(expected)


def test_relatives_are_the_fork_family_of_the_tenant(database: Database, listings: Listings) -> None:
    now = utcnow()
    with database.write() as db:
        for env_id, parent, tenant in (("env_f1", "env_1", "team-a"), ("env_f2", "env_1", "team-a"),
                                       ("env_fb", "env_1", "team-b")):
            db.add(models.Env(id=env_id, tenant=tenant, environment_id="envr_a", init_config={}, created_at=now,
                              last_used_at=now, expires_at=now + timedelta(hours=1), forked_from=parent))
    assert {e.id for e in listings.relatives(A, "env_1")} == {"env_f1", "env_f2"}
    assert {e.id for e in listings.relatives(A, "env_f1")} == {"env_1", "env_f2"}
    assert listings.relatives(B, "env_1") == []


@pytest.fixture
def evaluations(database: Database) -> EvaluationListings:
    rewards = [0.0, 0.05, 0.1, 0.15, 0.5, 0.99, 1.0, 1.0, None, 1.5, -0.05]
    with database.write() as db:
        for job, tenant in (("evj_a", "team-a"), ("evj_b", "team-b")):
            db.add(models.EvaluationJob(id=job, tenant=tenant, mode="replay", status="completed", config={},
                                        concurrency=1, total=len(rewards), created_by="key", created_at=utcnow()))
        db.flush()
        for index, reward in enumerate(rewards):
            db.add(models.EvaluationEpisode(evaluation_id="evj_a", index=index, scenario_id="scn_1",
                                            status="done" if reward is not None else "error", reward=reward))
    return EvaluationListings(database)


def test_the_histogram_bins_rewards_and_counts_the_rest(evaluations: EvaluationListings) -> None:
    histogram = evaluations.histogram(A, "evj_a")
    assert histogram.counts == [2, 2, 0, 0, 0, 1, 0, 0, 0, 3] and histogram.outside == 2 and histogram.peak == 3


def test_evaluation_reads_are_the_tenants_only(evaluations: EvaluationListings) -> None:
    for read in (lambda: evaluations.histogram(B, "evj_a"), lambda: evaluations.episodes(B, "evj_a", None, 10, 0),
                 lambda: evaluations.episode(B, "evj_a", 0), lambda: evaluations.episode(A, "evj_a", 99),
                 lambda: evaluations.episode(A, "nope", 0)):
        with pytest.raises(NotFound):
            read()
    rows, total = evaluations.episodes(A, "evj_a", "error", 10, 0)
    assert [r.index for r in rows] == [8] and total == 1


def test_a_ten_thousand_episode_evaluation_pages(database: Database) -> None:
    with database.write() as db:
        db.add(models.EvaluationJob(id="evj_big", tenant="team-a", mode="replay", status="completed", config={},
                                    concurrency=1, total=10_000, created_by="key", created_at=utcnow()))
        db.flush()
        db.execute(insert(models.table(models.EvaluationEpisode)), [
            {"evaluation_id": "evj_big", "index": i, "scenario_id": f"scn_{i % 7}", "status": "done",
             "reward": (i % 11) / 10, "attempt": 0, "steps": 3,
             "trajectory": [{"observation": "x" * 200}] * 3} for i in range(10_000)])
    listings = EvaluationListings(database)
    started = time.perf_counter()
    rows, total = listings.episodes(A, "evj_big", None, 50, 9_950)
    histogram = listings.histogram(A, "evj_big")
    elapsed = time.perf_counter() - started
    assert total == 10_000 and [r.index for r in rows] == list(range(9_950, 10_000))
    assert sum(histogram.counts) == 10_000 - histogram.outside
    assert elapsed < 1.0, elapsed  # one page and one grouped query, whatever the size
