"""BFCL import and replay through the API (``sandpit import bfcl``).

Registers every BFCL environment combination of :func:`.suite.load_suite`
through ``POST /v1/environments`` (tools derived in a sandbox), then replays each
episode's ground-truth trajectory in a fresh env (``POST /v1/envs`` + one ``step`` per
call), ``concurrency`` episodes at a time, and summarizes: episodes, steps, statuses,
client-side step latency p50/p99 (milliseconds, HTTP round trip), wall time.
Everything runs through the HTTP API, so BFCL code only ever executes in sandboxes.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from sandpit.client import Client, SandpitError, every_item

from .codegen import embedded_modules
from .suite import BfclEpisode, BfclSuite


@dataclass
class EpisodeReplay:
    """Outcome of one replayed episode."""

    episode_id: str
    env_id: str | None
    steps: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    error: str | None = None
    """Why the episode could not be replayed (API error), or None."""
    final_state: dict[str, Any] | None = None
    """The env's state after the last step (``GET /state``), when asked for."""
    observations: list[str] = field(default_factory=list)
    """Every step's observation, in order (what a comparison of two runs checks)."""


@dataclass
class ReplaySummary:
    """Totals of a replay run (latencies in milliseconds, wall time in seconds)."""

    environments: int
    episodes: int
    steps: int
    statuses: dict[str, int]
    failed_episodes: dict[str, str]
    step_p50_ms: float
    step_p99_ms: float
    wall_s: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s if self.wall_s else 0.0


def check_policy(client: Client, suite: BfclSuite) -> dict[str, int]:
    """Judge every BFCL module the environments embed with the ``standard`` static policy,
    through the API (``POST /v1/validate``, ``kind`` ``snippet``: the server compiles with
    ``ast``/RestrictedPython, nothing runs). Returns counts of the findings by
    ``<rule> (<severity>)``; raises :class:`SandpitError` naming the module when one has
    an error (or the API refuses it)."""
    totals: Counter[str] = Counter()
    seen: set[str] = set()
    for environment in suite.environments.values():
        for dotted, source in embedded_modules(environment.source_code).items():
            if dotted in seen:
                continue
            seen.add(dotted)
            verdict = client.validate({"kind": "snippet", "source_code": source, "policy": "standard"})
            findings = [f for f in (verdict.get("policy_report") or {}).get("findings") or [] if isinstance(f, dict)]
            if verdict.get("verdict") != "valid":
                first = next((f for f in findings if f.get("severity") == "error"), None)
                detail = (f"line {first.get('line')} {first.get('rule')}: {first.get('message')}" if first
                          else "; ".join(map(str, verdict.get("reasons") or ["invalid"])))
                raise SandpitError(f"{dotted} fails the standard policy: {detail}")
            totals.update(f"{f.get('rule')} ({f.get('severity')})" for f in findings)
    return dict(totals)


def register_environments(client: Client, suite: BfclSuite) -> dict[str, str]:
    """Register each BFCL environment (reusing ones already registered with the same
    name and code); returns environment name -> environment id.
    Raises :class:`SandpitError` when the API refuses one (message names it)."""
    ids: dict[str, str] = {}
    # reuse what an earlier import registered (same name, same code)
    existing = {(e.name, e.code_sha256): e.id for e in every_item(client.environments.list)}
    for name, environment in suite.environments.items():
        digest = hashlib.sha256(environment.source_code.encode("utf-8")).hexdigest()
        if (name, digest) in existing:
            ids[name] = existing[(name, digest)]
            continue
        try:
            # BFCL's modules passed `standard` in check_policy(); the generated wrapper that
            # installs them inside the sandbox (exec/compile by design) is registered `audit`
            created = client.environments.create(environment.source_code, environment.class_name, name=name,
                                                 description=f"BFCL {suite.version}: {', '.join(environment.classes)}",
                                                 policy="audit")
        except SandpitError as exc:
            raise SandpitError(f"registering {name} failed: {exc}", status_code=exc.status_code, code=exc.code,
                               field=exc.field) from exc
        ids[name] = created.id
    return ids


def replay_episode(client: Client, episode: BfclEpisode, environment_id: str, *, keep: bool = False,
                   want_state: bool = False) -> EpisodeReplay:
    """Replay one episode's ground truth in a fresh env; API errors end the episode and
    are reported in ``error`` (never raised). The env is deleted unless ``keep``."""
    outcome = EpisodeReplay(episode.id, None)
    handle = None
    try:
        handle = client.envs.create(environment_id, init_config=episode.init_config)
        outcome.env_id = handle.id
        for turn in episode.turns:
            for call in turn:
                started = time.perf_counter()
                # arguments go to the method as given (a ground-truth argument of another type
                # than the schema says is Python's to judge, as in BFCL's own executor)
                result = handle.step_call({"name": call.name, "arguments": call.arguments})
                outcome.latencies_ms.append((time.perf_counter() - started) * 1000.0)
                outcome.steps += 1
                outcome.statuses[result.status] += 1
                outcome.observations.append(result.observation)
        if want_state:
            outcome.final_state = handle.state()
    except SandpitError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        if handle is not None and not keep:
            try:
                handle.delete()
            except SandpitError:
                pass
    return outcome


def replay_suite(client: Client, suite: BfclSuite, environment_ids: dict[str, str], *, concurrency: int = 4,
                 limit: int | None = None, on_episode: Callable[[EpisodeReplay], None] | None = None,
                 want_state: bool = False) -> tuple[ReplaySummary, list[EpisodeReplay]]:
    """Replay ``limit`` (default all) episodes, ``concurrency`` at a time (each episode's
    final state read too when ``want_state``); results in completion order."""
    episodes = list(suite.episodes[:limit] if limit else suite.episodes)
    started = time.perf_counter()
    results: list[EpisodeReplay] = []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as workers:
        futures = [workers.submit(replay_episode, client, ep, environment_ids[ep.environment_name],
                                  want_state=want_state) for ep in episodes]
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            if on_episode is not None:
                on_episode(result)
    wall = time.perf_counter() - started
    latencies = sorted(ms for r in results for ms in r.latencies_ms)
    statuses: Counter[str] = Counter()
    for r in results:
        statuses.update(r.statuses)

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0

    summary = ReplaySummary(environments=len(environment_ids), episodes=len(results),
                            steps=sum(r.steps for r in results), statuses=dict(statuses),
                            failed_episodes={r.episode_id: r.error for r in results if r.error},
                            step_p50_ms=pct(0.5), step_p99_ms=pct(0.99), wall_s=wall)
    return summary, results
