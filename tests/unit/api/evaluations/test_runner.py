"""The evaluation runner (:mod:`sandpit.api.evaluations.runner`) on the fake executor: an
episode goes through the same env verbs as the routes, as the job's tenant and key, so its
envs are metered by the tenant's quotas and audited under the key that started the job;
a replayed call over the tenant's ``max_arguments_bytes`` is a rejected record, not a
retried one."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from api_fakes import caller
from sandpit.api.app import Services
from sandpit.api.evaluations import runner
from sandpit.api.schemas.envs import EnvCreate, StepRequest
from sandpit.api.schemas.evaluations import EvaluationCreate, EvaluationJobPublic, ReplayEpisode
from sandpit.api.schemas.tenants import TenantCreate


def finished(services: Services, job_id: str, tenant: str = "team-a", timeout_s: float = 20.0) -> EvaluationJobPublic:
    """The job once nothing of it is pending or running (runner threads started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = services.evaluations.get(tenant, job_id)
        if job.status not in ("queued", "running"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"evaluation {job_id} still {job.status} after {timeout_s} s")


def replay(services: Services, scenario_id: str, calls: list[dict[str, Any]]) -> str:
    """Start a replay evaluation of ``calls`` as ``team-a``; its id. Its episodes run under
    the tenant's stored quotas."""
    body = EvaluationCreate(mode="replay", episodes=[ReplayEpisode(
        scenario_id=scenario_id, tool_calls=[StepRequest.model_validate(c) for c in calls])])
    return services.evaluations.start_evaluation(caller(), body).id


@pytest.fixture
def running(services: Services) -> Services:
    services.tenants.create(TenantCreate(id="team-a", create_key=False))
    services.start()
    return services


def test_an_episode_calls_the_verbs_as_the_jobs_key(running: Services, scenario_id: str) -> None:
    job_id = replay(running, scenario_id, [{"name": "bump", "arguments": {"by": 2}}])
    job = finished(running, job_id)
    assert (job.status, job.progress.done, job.progress.errors) == ("completed", 1, 0)
    assert job.summary is not None and job.summary.mean_reward == 1.0  # count 1 + 2 == 3, one bump
    events, _ = running.tenants.list_audit("team-a", 100, 0)
    mine = {(e.action, e.actor) for e in events}
    assert {("env.create", "key_team-a"), ("env.evaluate", "key_team-a"), ("env.delete", "key_team-a")} <= mine
    assert running.envs.page(caller(), 10, 0).count == 0  # the episode's env was deleted after it


def test_a_call_over_the_tenants_argument_quota_is_a_rejected_record(running: Services, scenario_id: str) -> None:
    running.tenants.update_tenant("team-a", quotas={"max_arguments_bytes": 100})
    started = time.monotonic()
    job_id = replay(running, scenario_id, [{"name": "bump", "arguments": {"pad": "x" * 300}},
                                          {"name": "bump", "arguments": {"by": 2}}])
    job = finished(running, job_id)
    assert time.monotonic() - started < 10  # a fixed quota is not retried with backoff
    lines = list(running.evaluations.results("team-a", job_id, False))
    assert job.status == "completed" and len(lines) == 1
    result = json.loads(lines[0])
    assert result["status"] == "done" and result["reward"] == 1.0
    first, second = result["trajectory"]
    assert first["status"] == "rejected" and first["action"]["arguments"] == "<over the size cap>"
    assert "max_arguments_bytes" in first["observation"]
    assert second["status"] == "ok"


def test_an_episode_counts_against_the_tenants_live_envs(running: Services, scenario_id: str, environment_id: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's creates reserve ``max_live_envs`` like a route's: with the tenant's
    only live env taken, the episode cannot create its env and ends ``no_capacity``
    (a dynamic quota, retried with backoff first: shortened here)."""
    monkeypatch.setattr(runner, "TRANSIENT_BACKOFF_S", 0.01)
    running.tenants.update_tenant("team-a", quotas={"max_live_envs": 1})
    running.envs.create(caller(max_live_envs=1), EnvCreate(environment_id=environment_id))
    job_id = replay(running, scenario_id, [{"name": "bump"}])
    job = finished(running, job_id, timeout_s=60)
    lines = list(running.evaluations.results("team-a", job_id, False))
    result = json.loads(lines[0])
    assert job.progress.errors == 1 and result["error_status"] == "no_capacity"
    assert "max_live_envs" in result["error"]
