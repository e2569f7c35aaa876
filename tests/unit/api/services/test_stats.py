"""Scenario and environment statistics (:mod:`sandpit.api.services.stats`) as SQL aggregates
over rows written straight into a migrated database (SQLite here; ``scripts/test`` runs
this module on PostgreSQL too): exact figures, the training/evaluation split, ``since``,
fork copies, tenancy and bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from api_fakes import caller
from sandpit.api.db import models
from sandpit.api.db.database import Database
from sandpit.api.errors import InvalidRequest, NotFound
from sandpit.api.services.stats import StatsQuery, StatsService, keep_deleted_env_episodes
from sqlalchemy import delete, select

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ME = caller("team-a")


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def environment(db: Database, environment_id: str, tenant: str = "team-a") -> None:
    with db.write() as s:
        s.add(models.Environment(id=environment_id, tenant=tenant, name=None, class_name="C", source_code="",
                                 code_sha256="0" * 64, tools=[], description=None, created_at=T0))


def scenario(db: Database, scenario_id: str, environment_id: str, tenant: str = "team-a", minute: int = 0) -> None:
    with db.write() as s:
        s.add(models.Scenario(id=scenario_id, tenant=tenant, environment_id=environment_id, task="t",
                              init_config={}, checklist=[], checklist_with_func=[], created_at=at(minute)))


def env(db: Database, env_id: str, environment_id: str, tenant: str = "team-a", minute: int = 0,
        forked_from: str | None = None) -> None:
    with db.write() as s:
        s.add(models.Env(id=env_id, tenant=tenant, environment_id=environment_id, init_config={}, episode=1, step=0,
                         closed=False, created_at=at(minute), last_used_at=at(minute), expires_at=at(10_000),
                         forked_from=forked_from))


def episode(db: Database, env_id: str, number: int, scenario_id: str | None, status: str, reward: float | None,
            start: int, end: int | None = None, environment_id: str = "envr_a") -> None:
    with db.write() as s:
        s.add(models.Episode(env_id=env_id, episode=number, environment_id=environment_id, scenario_id=scenario_id,
                             config={}, status=status, observation="", task=None, reward=reward,
                             started_at=at(start), ended_at=None if end is None else at(end)))


def evaluation(db: Database, job_id: str, runs: list[tuple[str, str, float | None, int, int | None]],
               tenant: str = "team-a", env_id: str | None = None) -> None:
    """A batch evaluation with ``runs`` of (scenario, status, reward, start minute, end minute)."""
    with db.write() as s:
        s.add(models.EvaluationJob(id=job_id, tenant=tenant, mode="replay", status="running", config={},
                                   concurrency=1, total=len(runs), created_by="test", created_at=T0))
        s.flush()
        for index, (sid, status, reward, start, end) in enumerate(runs):
            s.add(models.EvaluationEpisode(
                evaluation_id=job_id, index=index, scenario_id=sid, environment_id="envr_a", status=status,
                attempt=1, steps=0, reward=reward, env_id=env_id if status == "running" else None,
                started_at=None if status == "pending" else at(start),
                finished_at=None if end is None else at(end)))


@pytest.fixture
def stats(database: Database) -> StatsService:
    """Environment ``envr_a`` with scenarios ``scn_1`` (newest) and ``scn_2``, env ``env_1``:
    training episodes of scn_1 with rewards 1.0, 0.5, 1.0 (ended at minutes 10, 20, 30),
    one still running; one of scn_2 truncated with 0.0; an episode without a scenario;
    a batch evaluation of scn_1: done 1.0 (minute 40), done 0.0 (minute 50), an error,
    a pending run."""
    environment(database, "envr_a")
    scenario(database, "scn_2", "envr_a", minute=0)
    scenario(database, "scn_1", "envr_a", minute=1)
    env(database, "env_1", "envr_a")
    episode(database, "env_1", 1, "scn_1", "terminated", 1.0, 5, 10)
    episode(database, "env_1", 2, "scn_1", "terminated", 0.5, 15, 20)
    episode(database, "env_1", 3, "scn_1", "truncated", 1.0, 25, 30)
    episode(database, "env_1", 4, "scn_1", "running", None, 35)
    episode(database, "env_1", 5, "scn_2", "truncated", 0.0, 36, 37)
    episode(database, "env_1", 6, None, "terminated", 0.0, 38, 39)
    evaluation(database, "evl_1", [("scn_1", "done", 1.0, 39, 40), ("scn_1", "done", 0.0, 41, 50),
                                   ("scn_1", "error", None, 42, 43), ("scn_1", "pending", None, 0, None)])
    return StatsService(database)


def test_a_scenario_counts_training_and_evaluation_episodes(stats: StatsService) -> None:
    got = stats.scenario(ME, "scn_1", StatsQuery())
    assert (got.attempts, got.finished, got.passed) == (7, 5, 3)  # 4 training + 3 started evaluation runs
    assert got.pass_rate == 0.6 and got.mean_reward == 0.7  # (1 + .5 + 1 + 1 + 0) / 5
    assert [(r.reward, r.kind, r.ended_at) for r in got.recent] == [
        (0.0, "evaluation", at(50)), (1.0, "evaluation", at(40)), (1.0, "training", at(30)),
        (0.5, "training", at(20)), (1.0, "training", at(10))]
    assert got.last_ended_at == at(50) and got.environment_id == "envr_a"


def test_kind_separates_training_from_evaluation(stats: StatsService) -> None:
    training = stats.scenario(ME, "scn_1", StatsQuery(kind="training"))
    assert (training.attempts, training.finished, training.passed, training.mean_reward) == (4, 3, 2, 0.8333)
    assert {r.kind for r in training.recent} == {"training"}
    evaluation_only = stats.scenario(ME, "scn_1", StatsQuery(kind="evaluation"))
    assert (evaluation_only.attempts, evaluation_only.finished, evaluation_only.pass_rate) == (3, 2, 0.5)


def test_since_and_recent_bound_what_is_counted_and_listed(stats: StatsService) -> None:
    got = stats.scenario(ME, "scn_1", StatsQuery(since=at(15), recent=2))
    assert (got.attempts, got.finished, got.passed) == (6, 4, 2)  # the episode started at minute 5 is out
    assert [r.reward for r in got.recent] == [0.0, 1.0]
    naive = stats.scenario(ME, "scn_1", StatsQuery(since=at(15).replace(tzinfo=None), recent=0))
    assert naive.attempts == 6 and naive.recent == [] and naive.since == at(15)
    shifted = stats.scenario(ME, "scn_1", StatsQuery(since=at(15).astimezone(timezone(timedelta(hours=5)))))
    assert shifted.attempts == 6
    later = stats.scenario(ME, "scn_1", StatsQuery(since=at(1000)))
    assert (later.attempts, later.finished, later.pass_rate, later.mean_reward, later.recent) == (0, 0, None, None, [])


def test_an_environment_gives_totals_and_a_page_of_its_scenarios(stats: StatsService) -> None:
    got = stats.environment(ME, "envr_a", StatsQuery(), limit=100, offset=0)
    assert [s.scenario_id for s in got.data] == ["scn_1", "scn_2"] and got.count == 2
    assert (got.totals.scenarios, got.totals.attempts, got.totals.finished, got.totals.passed) == (2, 8, 6, 3)
    assert got.totals.pass_rate == 0.5 and got.totals.mean_reward == 0.5833  # 3.5 / 6; no scenario-less episode
    assert (got.data[1].finished, got.data[1].pass_rate, [r.reward for r in got.data[1].recent]) == (1, 0.0, [0.0])
    page = stats.environment(ME, "envr_a", StatsQuery(), limit=1, offset=1)
    assert [s.scenario_id for s in page.data] == ["scn_2"] and page.totals == got.totals
    empty = stats.environment(ME, "envr_a", StatsQuery(), limit=10, offset=5)
    assert empty.data == [] and empty.count == 2


def test_a_fork_copy_of_an_ended_episode_is_not_counted_again(stats: StatsService, database: Database) -> None:
    env(database, "env_fork", "envr_a", minute=60, forked_from="env_1")
    episode(database, "env_fork", 1, "scn_1", "terminated", 1.0, 25, 30)  # the parent's episode 3, copied
    env(database, "env_branch", "envr_a", minute=60, forked_from="env_1")
    episode(database, "env_branch", 1, "scn_1", "terminated", 0.0, 25, 70)  # forked mid-way, ended after
    got = stats.scenario(ME, "scn_1", StatsQuery(kind="training"))
    assert (got.attempts, got.finished, got.passed) == (5, 4, 2)


def test_the_env_of_a_running_evaluation_is_counted_once(stats: StatsService, database: Database) -> None:
    env(database, "env_eval", "envr_a", minute=80)
    episode(database, "env_eval", 1, "scn_2", "running", None, 80)
    evaluation(database, "evl_2", [("scn_2", "running", None, 80, None)], env_id="env_eval")
    got = stats.scenario(ME, "scn_2", StatsQuery())
    assert (got.attempts, got.finished) == (2, 1)


def test_another_tenants_ids_are_not_found_and_their_episodes_do_not_count(stats: StatsService,
                                                                          database: Database) -> None:
    environment(database, "envr_b", tenant="team-b")
    scenario(database, "scn_b", "envr_b", tenant="team-b")
    with pytest.raises(NotFound) as raised:
        stats.scenario(ME, "scn_b", StatsQuery())
    with pytest.raises(NotFound) as unknown:
        stats.scenario(ME, "scn_nope", StatsQuery())
    assert str(raised.value).replace("scn_b", "X") == str(unknown.value).replace("scn_nope", "X")
    with pytest.raises(NotFound):
        stats.environment(ME, "envr_b", StatsQuery(), 10, 0)
    env(database, "env_b", "envr_a", tenant="team-b")  # another tenant's env naming my scenario
    episode(database, "env_b", 1, "scn_1", "terminated", 1.0, 90, 91)
    evaluation(database, "evl_b", [("scn_1", "done", 1.0, 90, 91)], tenant="team-b")
    assert stats.scenario(ME, "scn_1", StatsQuery()).attempts == 7


@pytest.mark.parametrize("recent", [-1, 101, 10**9])
def test_recent_out_of_bounds_is_refused(stats: StatsService, recent: int) -> None:
    with pytest.raises(InvalidRequest):
        stats.scenario(ME, "scn_1", StatsQuery(recent=recent))


def test_pass_rates_for_an_evaluation_report(stats: StatsService) -> None:
    assert stats.pass_rates("team-a", ["scn_1", "scn_2", "scn_1", "scn_nope"]) == {"scn_1": (0.6, 5),
                                                                                   "scn_2": (0.0, 1)}
    assert stats.pass_rates("team-a", []) == {}
    assert stats.pass_rates("team-b", ["scn_1"]) == {}


def test_a_deleted_envs_episodes_keep_counting(stats: StatsService, database: Database) -> None:
    """``DELETE /v1/envs/{id}`` copies what the statistics count of its episodes
    (``keep_deleted_env_episodes``, in the deletion's transaction): the figures do not
    change when the env goes, a fork's copy stays uncounted, ``since`` applies, and an env
    an evaluation made is left to its evaluation episode."""
    env(database, "env_fork", "envr_a", minute=60, forked_from="env_1")
    episode(database, "env_fork", 1, "scn_1", "terminated", 1.0, 25, 30)  # a copy: not counted
    episode(database, "env_fork", 2, "scn_1", "terminated", 0.0, 61, 62)
    env(database, "env_eval", "envr_a", minute=80)
    episode(database, "env_eval", 1, "scn_2", "terminated", 1.0, 80, 81)
    evaluation(database, "evl_2", [("scn_2", "done", 1.0, 80, 81)])
    with database.write() as s:
        s.get(models.EvaluationEpisode, ("evl_2", 0)).env_id = "env_eval"  # type: ignore[union-attr]
    before = [stats.scenario(ME, sid, StatsQuery(since=since)) for sid in ("scn_1", "scn_2") for since in (None, at(15))]
    for env_id in ("env_1", "env_fork", "env_eval"):
        with database.write() as s:
            keep_deleted_env_episodes(s, env_id)
            s.execute(delete(models.Episode).where(models.Episode.env_id == env_id))
    after = [stats.scenario(ME, sid, StatsQuery(since=since)) for sid in ("scn_1", "scn_2") for since in (None, at(15))]
    assert [(a.attempts, a.finished, a.passed, a.mean_reward, a.recent) for a in after] == [
        (b.attempts, b.finished, b.passed, b.mean_reward, b.recent) for b in before]
    assert after[2].attempts == 2  # scn_2: env_1's episode and the evaluation's (not env_eval's again)
    with database.read() as s:
        kept = sorted((r.env_id, r.episode) for r in s.scalars(select(models.DeletedEnvEpisode)))
    assert kept == [("env_1", 1), ("env_1", 2), ("env_1", 3), ("env_1", 4), ("env_1", 5), ("env_fork", 2)]
