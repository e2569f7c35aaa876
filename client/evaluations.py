"""`client.evaluations`: batch evaluations that run on the server, replay or rollout
(sync and async), and waiting for them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import calls
from .models import EpisodeResult, EvaluationJob, Page
from .transport import AsyncTransport, SyncTransport

__all__ = ["AsyncEvaluations", "Evaluations"]

EpisodeResults = list[EpisodeResult]
"""What `results` returns (an alias: inside the classes `list` is the method)."""


class Evaluations:
    """`client.evaluations`: batch evaluations that run on the server (replay or rollout).

    Usage::

        job = client.evaluations.rollout(scenario_ids, model="qwen3-8b", base_url="http://.../v1",
                                         api_key=key, max_steps=30)
        job = client.evaluations.wait(job.id)
        job.summary.mean_reward, client.evaluations.results(job.id)
    """

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, body: Mapping[str, Any]) -> EvaluationJob:
        """Start an evaluation from the server's `EvaluationCreate` fields. Raises
        `NotFound` (a scenario id; `field` names the index), `InvalidRequest`,
        `RateLimited` (`max_active_evaluations`, `max_evaluation_concurrency`)."""
        return self._t.run(calls.evaluation_create(body))

    def replay(self, episodes: Iterable[Mapping[str, Any]], *, concurrency: int | None = None,
               keep_envs: bool | None = None) -> EvaluationJob:
        """Score given trajectories: `episodes` are `{"scenario_id", "tool_calls": [...]}`
        (tool calls as `{"name", "arguments"}` or OpenAI tool calls)."""
        return self.create(calls.replay_body(episodes, {"concurrency": concurrency, "keep_envs": keep_envs}))

    def rollout(self, scenario_ids: Iterable[str], *, model: str, base_url: str | None = None,
                api_key: str | None = None, **options: Any) -> EvaluationJob:
        """Let the server run the agent loop with `model` at `base_url` (default: the
        tenant's) on each scenario. `options`: `max_steps`, `temperature`, `max_tokens`,
        `request_timeout_s`, `retries`, `retry_initial_s`, `retry_max_s`, `concurrency`,
        `keep_envs`. The API key is sent once and never returned."""
        return self.create(calls.rollout_body(scenario_ids, model, {"base_url": base_url, "api_key": api_key, **options}))

    def get(self, evaluation_id: str) -> EvaluationJob:
        """Status and progress (`summary` once finished). Raises `NotFound`."""
        return self._t.run(calls.evaluation_get(evaluation_id))

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[EvaluationJob]:
        """A page of the tenant's evaluations, newest first."""
        return self._t.run(calls.evaluation_list(limit, offset))

    def cancel(self, evaluation_id: str) -> EvaluationJob:
        """Cancel (pending episodes are dropped, running ones stop at their next step).
        Raises `NotFound`, `Conflict` (already completed)."""
        return self._t.run(calls.evaluation_cancel(evaluation_id))

    def results(self, evaluation_id: str, *, include_transcript: bool = False) -> EpisodeResults:
        """Every finished episode, in index order. Raises `NotFound`."""
        return self._t.run(calls.evaluation_results(evaluation_id, include_transcript))

    def wait(self, evaluation_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None,
             on_progress: Callable[[EvaluationJob], None] | None = None) -> EvaluationJob:
        """Poll every `poll_s` seconds until the evaluation is finished; returns it.
        `on_progress(job)` sees every poll. Raises `TimeoutError` after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get(evaluation_id)
            if on_progress is not None:
                on_progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"evaluation {evaluation_id} not finished after {timeout_s} s "
                                   f"({job.progress.done + job.progress.errors}/{job.total} episodes)")
            time.sleep(poll_s)


class AsyncEvaluations:
    """`AsyncClient.evaluations`: see `Evaluations`."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, body: Mapping[str, Any]) -> EvaluationJob:
        return await self._t.run(calls.evaluation_create(body))

    async def replay(self, episodes: Iterable[Mapping[str, Any]], *, concurrency: int | None = None,
                     keep_envs: bool | None = None) -> EvaluationJob:
        return await self.create(calls.replay_body(episodes, {"concurrency": concurrency, "keep_envs": keep_envs}))

    async def rollout(self, scenario_ids: Iterable[str], *, model: str, base_url: str | None = None,
                      api_key: str | None = None, **options: Any) -> EvaluationJob:
        return await self.create(calls.rollout_body(scenario_ids, model,
                                               {"base_url": base_url, "api_key": api_key, **options}))

    async def get(self, evaluation_id: str) -> EvaluationJob:
        return await self._t.run(calls.evaluation_get(evaluation_id))

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[EvaluationJob]:
        return await self._t.run(calls.evaluation_list(limit, offset))

    async def cancel(self, evaluation_id: str) -> EvaluationJob:
        return await self._t.run(calls.evaluation_cancel(evaluation_id))

    async def results(self, evaluation_id: str, *, include_transcript: bool = False) -> EpisodeResults:
        return await self._t.run(calls.evaluation_results(evaluation_id, include_transcript))

    async def wait(self, evaluation_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None,
                   on_progress: Callable[[EvaluationJob], None] | None = None) -> EvaluationJob:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.get(evaluation_id)
            if on_progress is not None:
                on_progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"evaluation {evaluation_id} not finished after {timeout_s} s")
            await asyncio.sleep(poll_s)
