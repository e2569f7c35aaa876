"""Steps: one action of an env's episode, run and committed (``POST /v1/envs/{id}/step``).

A step is EnvScaler's ``step()`` (:mod:`.rulebook`): a malformed action is a recorded
``rejected`` step, never an HTTP error; the termination action ends a non-conversational
episode, ``chat_with_user`` talks to a conversational episode's simulated user; any other
action is a tool call in the env's sandbox. The episode ends by its termination action,
its simulated user, a tool error (``on_tool_error: terminate``) or ``max_steps``, and the
step that ends it carries the reward from the scenario's checks
(:mod:`sandpit.api.envs.rewards`).

Every acknowledged step is committed (action, observation, status, duration, reward,
state root) before the call returns. Steps of different envs that finish at the same
time share one transaction (:class:`~sandpit.api.db.group_commit.GroupCommit`, written
by :func:`~sandpit.api.db.step_writes.write_steps`); a step whose transaction fails is retried alone,
and if its write still fails after the sandbox ran the call, the env's session is
dropped, so the next request restores the last *committed* state.

The HTTP reply is built here as JSON bytes (:meth:`StepService.take_json`, orjson; the
same document as :class:`~sandpit.api.schemas.envs.StepResult`), so neither the FastAPI
route nor the lean ASGI path (:mod:`sandpit.api.lean_step`) round-trips it through a
pydantic model. :class:`StepClock` adds each phase's CPU and wall time to
``sandpit_step_phase_*_seconds_total`` (the per-step budget ``benchmarks/api.py`` prints).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from sandpit.client.llm import ModelError

from ..db.database import Database
from ..db.group_commit import GroupCommit
from ..db.step_writes import StepWrite, write_steps
from ..db.store import PendingBlobs, apply_delta
from ..errors import EpisodeEnded, InvalidRequest, ServiceUnavailable
from ..metrics import Metrics
from ..sandboxes import CallResult, CallRules, SandboxError, SessionClosedError
from ..schemas.common import Status
from ..schemas.envs import StepRequest, StepResult
from ..schemas.scenarios import CheckOutcome
from ..services.common import clean_text, utcnow
from ..services.diff import state_diff
from ..services.quotas import QuotaService, TenantContext
from ..settings import ApiSettings
from . import envscaler
from .actions import INVALID_ACTION, Action, parse_step, valid_text
from .lifecycle import EnvService
from .live import LiveEnv
from .rewards import Rewards
from .rulebook import CHAT_ACTION, STOP_TOKEN, TASK_FINISHED, EpisodeService
from .state import state_view

FAILURE_STATUSES = ("timeout", "oom", "crashed")
INCLUDES = {"state_diff", "state"}
"""What ``?include=`` may name."""



class _SessionMoved(Exception):
    """The env's session refused or lost a call before its result was known (another API
    replica attached to it since, or it closed): the step is not recorded and may be
    carried out again after re-attaching from the committed head."""

class StepClock:
    """Per-phase CPU (``time.thread_time``) and wall (``time.perf_counter``) seconds of
    one request, added to the metrics' phase counters by :meth:`flush`. Phases:
    ``parse`` (body and action), ``auth`` (API key, quotas), ``sandbox`` (the tool call,
    slot included), ``persist`` (state encoding and the commit), ``serialize`` (the JSON
    reply), ``other`` (the rest of the step: locks, episode bookkeeping, metrics)."""

    __slots__ = ("cpu", "wall", "_cpu", "_wall")

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap (or creation) to ``phase``."""
        cpu, wall = time.thread_time(), time.perf_counter()
        self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu - self._cpu
        self.wall[phase] = self.wall.get(phase, 0.0) + wall - self._wall
        self._cpu, self._wall = cpu, wall

    def flush(self, metrics: Metrics) -> None:
        """Add the laps to ``metrics`` (one step counted)."""
        metrics.observe_phases(self.cpu, self.wall)


@dataclass
class StepRun:
    """What one action did (before it is committed): the step's record."""

    status: Status
    observation: str
    role: Literal["tool", "user"] = "tool"
    """EnvScaler's observation type: ``tool`` or ``user``."""
    duration_ms: float = 0.0
    result: CallResult | None = None
    """The sandbox's result, when a tool ran."""
    error: str | None = None
    findings: list[str] | None = None
    terminated: bool = False
    end_reason: str | None = None
    """``action``, ``user`` or ``tool_error`` when ``terminated``."""
    user_messages: list[dict[str, Any]] | None = None
    action: dict[str, Any] | None = None
    """The action to record when the profile parsed it differently from the request's
    Sandpit parse (``envscaler``); None: the parsed action's own record."""


@dataclass
class StepOutcome:
    """What :meth:`StepService.step` returns."""

    env_id: str
    episode: int
    step: int
    action: dict[str, Any]
    run: StepRun
    recovered: bool
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    checks: list[CheckOutcome] | None = None
    state_before: dict[str, Any] | None = None
    state_after: dict[str, Any] | None = None

    @property
    def result(self) -> CallResult:
        """The step as an executor result (rejected and non-tool steps included)."""
        run = self.run
        if run.result is not None:
            return run.result
        return CallResult(status=run.status, observation=run.observation,
                          duration_ms=run.duration_ms)

    def diff(self) -> dict[str, Any] | None:
        """EnvScaler ``get_state_diff`` of the step (when both states were asked for)."""
        if self.state_before is None or self.state_after is None:
            return None
        return state_diff(self.state_before, self.state_after)

    def document(self, wanted: set[str]) -> dict[str, Any]:
        """The step as the API shows it (:class:`StepResult`'s fields, in its order), with
        the ``?include=`` parts in ``wanted``: plain JSON data."""
        run, r = self.run, self.result
        return {"env_id": self.env_id, "episode": self.episode, "step": self.step, "action": self.action,
                "observation": run.observation, "status": run.status, "observation_role": run.role,
                "reward": float(self.reward), "terminated": self.terminated, "truncated": self.truncated,
                "duration_ms": float(run.duration_ms), "stdout": clean_text(r.stdout), "stderr": clean_text(r.stderr),
                "traceback": clean_text(r.traceback) if r.traceback else None, "error": run.error,
                "argument_findings": run.findings,
                "checks": [c.model_dump() for c in self.checks] if self.checks is not None else None,
                "recovered": self.recovered,
                "state_diff": self.diff() if "state_diff" in wanted else None,
                "state": self.state_after if "state" in wanted else None}

    def public(self, wanted: set[str]) -> StepResult:
        """The step as the API shows it, with the ``?include=`` parts in ``wanted``."""
        return StepResult.model_validate(self.document(wanted))

    def json(self, wanted: set[str]) -> bytes:
        """:meth:`public` as JSON bytes (orjson; a value orjson refuses, such as an
        integer beyond 64 bits in a state, goes through the pydantic model instead)."""
        document = self.document(wanted)
        try:
            return orjson.dumps(document)
        except TypeError:
            return StepResult.model_validate(document).model_dump_json().encode("utf-8")


def _step_info(run: StepRun) -> dict[str, Any]:
    """The ``info`` stored with a step: its observation role and what explains it."""
    info: dict[str, Any] = {"observation_role": run.role}
    if run.error:
        info["error"] = run.error[:2000]
    if run.findings:
        info["argument_findings"] = run.findings
    result = run.result
    if result is not None:
        if result.traceback:
            info["traceback"] = clean_text(result.traceback)
        if result.observation_truncated:
            info["observation_truncated"] = True
    if run.end_reason:
        info["end_reason"] = run.end_reason
    return info


class StepService:
    """Runs and commits steps (see the module docstring)."""

    def __init__(self, settings: ApiSettings, db: Database, envs: EnvService, episodes: EpisodeService,
                 rewards: Rewards, quotas: QuotaService, metrics: Metrics) -> None:
        self.settings = settings
        self.db = db
        self.envs = envs
        self.live = envs.live
        self.environments = envs.environments
        self.episodes = episodes
        self.rewards = rewards
        self.quotas = quotas
        self.metrics = metrics
        self.commits: GroupCommit[StepWrite] = GroupCommit(db, write_steps)
        """Steps committed together when they finish together (module docstring)."""

    # -- the HTTP contract -------------------------------------------------------------------
    def take(self, caller: TenantContext, env_id: str, body: StepRequest, include: str | None) -> StepResult:
        """``POST /step`` as a model (see :meth:`take_json`, which the routes use)."""
        outcome, wanted = self._take(caller, env_id, body, include, None)
        return outcome.public(wanted)

    def take_json(self, caller: TenantContext, env_id: str, body: StepRequest, include: str | None,
                  clock: StepClock | None = None) -> bytes:
        """``POST /step``: parse the action (the tenant's ``max_arguments_bytes``), then
        one token of ``steps_per_minute`` and a concurrent call for :meth:`step`; the
        reply as :class:`StepResult` JSON bytes. ``clock`` (the lean path's) times the
        phases; without one, the step is timed from here. Raises InvalidRequest
        (``include``), and what :meth:`step` raises."""
        clock = clock or StepClock()
        outcome, wanted = self._take(caller, env_id, body, include, clock)
        data = outcome.json(wanted)
        clock.lap("serialize")
        clock.flush(self.metrics)
        return data

    def _take(self, caller: TenantContext, env_id: str, body: StepRequest, include: str | None,
              clock: StepClock | None) -> tuple[StepOutcome, set[str]]:
        wanted = set(filter(None, (include or "").split(",")))
        if not wanted <= INCLUDES:
            raise InvalidRequest(f"include may name {sorted(INCLUDES)}, got {sorted(wanted - INCLUDES)}",
                                 field="include")
        action = parse_step(body, self.settings.max_arguments_bytes, self.settings.max_json_depth,
                            lambda size: self.quotas.check_size(caller, "max_arguments_bytes", size, "arguments"))
        if clock is not None:
            clock.lap("parse")
        with self.quotas.call(caller):
            self.quotas.take_step(caller)
            if clock is not None:
                clock.lap("auth")
            outcome = self.step(caller.tenant, env_id, action, want_diff="state_diff" in wanted,
                                want_state="state" in wanted, clock=clock)
        return outcome, wanted

    def parse(self, request: StepRequest) -> Action:
        """The action of ``request`` under the server's caps (no tenant quota). Raises
        PayloadTooLarge."""
        return parse_step(request, self.settings.max_arguments_bytes, self.settings.max_json_depth)

    # -- one step ------------------------------------------------------------------------------
    def _act(self, tenant: str, env_id: str, entry: LiveEnv, action: Action) -> StepRun:
        """Carry out one action of the episode (module docstring of :mod:`.rulebook`)."""
        run = entry.run
        config = run.config
        if config.envscaler and action.request is not None:
            return self._act_envscaler(tenant, env_id, entry, envscaler.parse_action(action.request), action)
        if action.problem is not None:
            return StepRun("rejected", action.problem, "user", error=action.error)
        name, arguments = action.name, action.arguments
        toolset = self.environments.cached_toolset(entry.environment_id)
        assert toolset is not None  # compiled by live_entry
        chat_is_action = name == CHAT_ACTION and (config.conversational or config.termination_action == CHAT_ACTION)
        if chat_is_action and not isinstance(arguments.get("content"), str):
            return StepRun("rejected", INVALID_ACTION, "user", error="chat_with_user needs a string argument 'content'")
        if not config.conversational and config.termination_action is not None and name == config.termination_action:
            return StepRun("ok", TASK_FINISHED, "user", terminated=True, end_reason="action")
        if config.conversational and name == CHAT_ACTION:
            return self._chat(tenant, entry, arguments["content"])
        if name not in toolset:
            return StepRun("rejected", INVALID_ACTION, "user", error=toolset.unknown(name))
        call = action.call
        findings = toolset.findings(call) if entry.argument_checking != "off" else []
        if findings and entry.argument_checking == "strict":
            return StepRun("rejected", INVALID_ACTION, "user", findings=findings,
                           error="the arguments do not fit the tool's schema (argument_checking: strict)")
        result = self._call(env_id, entry, call.name, call.arguments, "sandpit")
        terminated = result.status == "error" and config.on_tool_error == "terminate"
        role: Literal["tool", "user"] = "user" if terminated else "tool"  # EnvScaler reports a tool's exception as a user message
        return StepRun(result.status, clean_text(result.observation), role, result.duration_ms, result,
                       findings=findings or None, terminated=terminated,
                       end_reason="tool_error" if terminated else None)

    def _call(self, env_id: str, entry: LiveEnv, name: str, arguments: dict[str, Any], rules: CallRules) -> CallResult:
        """The tool call in the env's session. A session that closed or moved (another
        replica) raises :class:`_SessionMoved`; a SandboxError propagates. Either way the
        env's live entry is dropped, so the next request re-attaches from the committed head."""
        try:
            return entry.session.call(name, arguments, rules)
        except SessionClosedError:
            self.live.drop(env_id)
            raise _SessionMoved from None
        except SandboxError:
            self.live.drop(env_id)
            raise

    def _act_envscaler(self, tenant: str, env_id: str, entry: LiveEnv, action: envscaler.EnvScalerAction,
                       parsed: Action) -> StepRun:
        """One action under the ``envscaler`` profile (:mod:`.envscaler`): EnvScaler's
        parse messages, ``hasattr`` validity in the sandbox, ``chat_with_user`` as the end
        (non-conversational) or a message to the simulated user, and a raising tool that
        ends the episode with reward 0.0 and EnvScaler's traceback observation.
        ``parsed`` (the request's Sandpit parse) gives the record of an action that does
        not parse (the raw text, as the ``sandpit`` profile records it)."""
        if action.problem is not None:
            return StepRun("rejected", action.problem, "user", error=action.error, action=parsed.record())
        name, arguments = valid_text(action.name)[0], valid_text(action.arguments)[0]
        record = {"name": name, "arguments": arguments}
        problem = envscaler.validity_problem(action)
        if problem is not None:
            return StepRun("rejected", envscaler.INVALID_ACTION, "user", error=problem, action=record)
        config = entry.run.config
        if name == envscaler.CHAT_ACTION:
            if config.conversational:
                chat = self._chat(tenant, entry, envscaler.chat_content(arguments))
                chat.action = record
                return chat
            return StepRun("ok", envscaler.TASK_FINISHED, "user", terminated=True, end_reason="action", action=record)
        result = self._call(env_id, entry, name, arguments, "envscaler")
        if result.status == "rejected":  # hasattr found nothing (or the name is no attribute name at all)
            return StepRun("rejected", envscaler.INVALID_ACTION, "user", result.duration_ms, result,
                           error="the environment has no attribute of that name (hasattr)", action=record)
        terminated = result.status == "error"
        return StepRun(result.status, clean_text(result.observation), "user" if terminated else "tool",
                       result.duration_ms, result, terminated=terminated,
                       end_reason="tool_error" if terminated else None, action=record)

    def _chat(self, tenant: str, entry: LiveEnv, content: str) -> StepRun:
        """``chat_with_user`` in a conversational episode: the simulated user's reply."""
        started = time.perf_counter()
        simulator = self.episodes.simulator(tenant, entry.run)
        try:
            reply = simulator.reply(content)
        except ModelError as exc:
            raise ServiceUnavailable(f"the simulated user's model failed ({exc.status}): {exc.message}; "
                                     "the step was not recorded, retry it", retry_after=5) from None
        done = STOP_TOKEN in reply
        return StepRun("ok", reply, "user", (time.perf_counter() - started) * 1000.0, terminated=done,
                       end_reason="user" if done else None, user_messages=simulator.messages)

    def step(self, tenant: str, env_id: str, action: Action, *, want_diff: bool, want_state: bool,
             clock: StepClock | None = None) -> StepOutcome:
        """Run one action and commit it (EnvScaler ``step()``, see :mod:`.rulebook`): a
        malformed action is recorded as ``rejected``; the step that ends the episode
        (termination action, simulated user, ``max_steps``) carries the reward.

        Raises NotFound, Conflict (expired), EpisodeEnded (409: reset first),
        NoCapacity (503 + Retry-After), ServiceUnavailable (database, Docker Engine or
        the simulated user's model failed; the step is not acknowledged and the env
        resumes from its last committed state), QuotaExceeded (no execution slot).
        ``clock`` (optional) is charged the ``sandbox``, ``persist`` and ``other`` phases.

        A session that refuses the call before running it (another API replica stepped the
        env since this one's handle was made: issue 15, any replica answers any request) is
        re-attached from the committed head and the action carried out once more within
        this request; only a second refusal is a 503."""
        started = time.perf_counter()
        with self.live.lock(env_id):
            for attempt in range(2):
                entry, restored = self.envs.live_entry(tenant, env_id)
                run = entry.run
                if run.ended:
                    raise EpisodeEnded(f"episode {entry.episode} of env {env_id!r} has {run.status} "
                                       f"(reward {run.reward}); reset the env to start the next one")
                before = entry.cache
                if clock is not None:
                    clock.lap("other")
                try:
                    outcome_run = self._act(tenant, env_id, entry, action)
                    break
                except _SessionMoved:
                    if attempt:
                        raise ServiceUnavailable("the env's session closed during the call twice; retry",
                                                 retry_after=1) from None
                    # another API replica used the env since this one did (its handle is
                    # stale; the host refused the call before running it) or the session
                    # closed: re-attach from the committed head and act once more
            if clock is not None:
                clock.lap("sandbox")
            result = outcome_run.result
            pending = PendingBlobs()
            after = before
            if result is not None and result.status in ("ok", "error"):
                after = apply_delta(before, result.delta.set, result.delta.deleted, pending)
            number = entry.step + 1
            terminated = outcome_run.terminated
            truncated = (not terminated and run.config.max_steps is not None and number >= run.config.max_steps)
            reward, checks = 0.0, None
            if terminated and outcome_run.end_reason != "tool_error" or truncated and run.config.score_truncated:
                reward, checks = self.rewards.score(tenant, run.scenario_id, entry.environment_id, run.initial_root,
                                                   after)
            done = "terminated" if terminated else "truncated" if truncated else None
            info = _step_info(outcome_run)
            if outcome_run.user_messages is not None:
                info["user_turns"] = len(outcome_run.user_messages)
            now = utcnow()
            recorded = outcome_run.action if outcome_run.action is not None else action.record()
            write = StepWrite(env_id, entry.episode, {
                "env_id": env_id, "episode": entry.episode, "step": number, "action": recorded,
                "observation": outcome_run.observation, "status": outcome_run.status,
                "duration_ms": outcome_run.duration_ms, "state_root": after.root, "created_at": now,
                "reward": reward, "done": done, "info": info or None}, pending, now)
            if outcome_run.user_messages is not None:
                write.episode_changes["user_messages"] = outcome_run.user_messages
            if done is not None:
                write.episode_changes.update(status=done, reward=reward, ended_at=now,
                                             checks=[c.model_dump() for c in checks] if checks is not None else None)
            try:
                self.commits.submit(write)
            except BaseException:
                self.live.drop(env_id)  # the sandbox is ahead of the database: resync on next use
                raise
            if clock is not None:
                clock.lap("persist")
            entry.cache = after
            entry.step = number
            entry.last_used = time.monotonic()
            if outcome_run.user_messages is not None:
                run.user_messages = outcome_run.user_messages
            if done is not None:
                run.status, run.reward = done, reward
        self.metrics.step_seconds.labels(outcome_run.status).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.inc(pending.stored_bytes)
        if outcome_run.status in FAILURE_STATUSES:
            self.metrics.failures.labels(outcome_run.status).inc()
        recovered = restored or bool(result is not None and result.recovered)
        outcome = StepOutcome(env_id, entry.episode, number, recorded, outcome_run, recovered, reward,
                              terminated, truncated, checks)
        if want_diff or want_state:
            outcome.state_after = state_view(after)
            if want_diff:
                outcome.state_before = state_view(before)
        if clock is not None:
            clock.lap("other")
        return outcome
