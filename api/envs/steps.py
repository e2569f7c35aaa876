"""Steps: one action of an env's episode, run and committed (``POST /v1/envs/{id}/step``).

A step is EnvScaler's ``step()`` (:mod:`.rulebook`): a malformed action is a recorded
``rejected`` step, never an HTTP error; the termination action ends a non-conversational
episode, ``chat_with_user`` talks to a conversational episode's simulated user
(:mod:`.users`); any other action is a tool call in the env's sandbox. Under the
``envscaler`` profile the action is parsed and judged by EnvScaler's rules
(:mod:`.envscaler`). The episode ends by its termination action, its simulated user, a
tool error (``on_tool_error: terminate``) or ``max_steps``, and the step that ends it
carries the reward from the scenario's checks (:mod:`.rewards`).

Every acknowledged step is committed (action, observation, status, duration, reward,
state root) before the call returns. The API's live head (``LiveEnv.cache``) is the one
host copy of the state: the sandbox's delta is applied to it once, keyed changes of large
JSON values included. A call whose sandbox was lost is recorded with the loss's status
(``timeout``, ``oom``, ``crashed``) and no state change; its session handle closed, so
the next request re-opens the env from the head (reported as ``recovered``). Steps of different envs that finish at the same
time share one transaction (:class:`~sandpit.api.db.group_commit.GroupCommit`, written by
:func:`~sandpit.api.db.step_writes.write_steps`); a step whose transaction fails is
retried alone, and if its write still fails after the sandbox ran the call, the env's
session is dropped, so the next request restores the last *committed* state. The new
state is encoded incrementally from the live head (:func:`~sandpit.api.db.store.apply_delta`).

The reply is the :class:`~.outcomes.StepOutcome`, which renders itself as
``StepResult`` JSON bytes. A :class:`~sandpit.api.metrics.StepClock`, when the caller
gives one, is charged each phase of the step.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Literal

from sandpit.client.llm import ModelError

from ..db.attempts import check_attempt
from ..db.database import Database
from ..db.group_commit import GroupCommit
from ..db.idempotency import KeyClaim
from ..db.step_writes import StepWrite, write_steps
from ..db.store import PendingBlobs, StateCache, apply_delta
from ..errors import EpisodeEnded, HeadMoved, InvalidRequest, ServiceUnavailable
from ..metrics import Metrics, StepClock
from ..sandboxes import (
    CallResult,
    CallRules,
    SandboxError,
    SessionClosedError,
    SessionLostError,
    resolved_changes,
)
from ..schemas.envs import StepRequest
from ..schemas.scenarios import CheckOutcome
from ..services.common import clean_text, utcnow
from ..services.quotas import QuotaService, TenantContext
from ..settings import ApiSettings
from . import envscaler
from .actions import INVALID_ACTION, Action, parse_step, valid_text
from .failures import Failure, episode_failure, step_failure
from .live import LiveEnv
from .outcomes import StepOutcome, StepRun, step_info
from .rewards import Rewards
from .rulebook import CHAT_ACTION, TASK_FINISHED, EpisodeService
from .sessions import Sessions
from .state import state_view
from .step_work import BlockingNeed, CallNeed, CommitNeed, Work, run_alone
from .users import STOP_TOKEN

FAILURE_STATUSES = ("timeout", "oom", "crashed")
INCLUDES = frozenset({"state_diff", "state"})
"""What ``?include=`` may name."""


class _SessionMoved(Exception):
    """The env's session refused or lost a call before its result was known (another API
    replica attached to it since, or it closed): the step is not recorded and may be
    carried out again after re-attaching from the committed head. ``lost``: it closed
    because its sandbox was lost (``SessionLostError``)."""

    def __init__(self, lost: bool) -> None:
        super().__init__()
        self.lost = lost


def wanted_parts(include: str | None) -> frozenset[str]:
    """The parts ``?include=`` names (comma-separated; empty items ignored). Raises
    InvalidRequest (field ``include``) for a name not in :data:`INCLUDES`."""
    wanted = frozenset(filter(None, (include or "").split(",")))
    if not wanted <= INCLUDES:
        raise InvalidRequest(f"include may name {sorted(INCLUDES)}, got {sorted(wanted - INCLUDES)}",
                             field="include")
    return wanted


class Steps:
    """Runs and commits steps (see the module docstring).

    Args:
        settings: ``max_arguments_bytes``, ``max_json_depth``.
        db: the control database (the group commit's).
        sessions: the envs' live entries.
        rulebook: the simulated users of conversational episodes.
        rewards: the reward of the step that ends an episode.
        quotas: the tenant's quotas.
        metrics: step latency, failures, snapshot bytes.
    """

    def __init__(self, settings: ApiSettings, db: Database, sessions: Sessions, rulebook: EpisodeService,
                 rewards: Rewards, quotas: QuotaService, metrics: Metrics) -> None:
        self.settings = settings
        self.db = db
        self.sessions = sessions
        self.live = sessions.live
        self.rulebook = rulebook
        self.rewards = rewards
        self.quotas = quotas
        self.metrics = metrics
        self.commits: GroupCommit[StepWrite] = GroupCommit(db, write_steps)
        """Steps committed together when they finish together (module docstring)."""

    def step(self, ctx: TenantContext, env_id: str, request: StepRequest, include: str | None = None,
             clock: StepClock | None = None, key: KeyClaim | None = None,
             attempt: str | None = None) -> StepOutcome:
        """``POST /v1/envs/{id}/step``: run one action and commit it (EnvScaler ``step()``,
        the module docstring). First the action is parsed (arguments within the server's
        and the tenant's ``max_arguments_bytes``), then one token of the tenant's
        ``steps_per_minute`` and one of its concurrent calls are taken. ``include`` names
        the parts of the reply to add (:data:`INCLUDES`); ``clock`` (optional) is charged
        the ``parse``, ``auth``, ``sandbox``, ``persist`` and ``other`` phases. ``key``
        (the request's ``Idempotency-Key`` claim, :mod:`sandpit.api.services.idempotency`)
        gets the reply's bytes stored in the step's own transaction. ``attempt`` (the
        request's ``Sandpit-Attempt`` token) must be the env's current attempt, checked
        before the action runs and again in the step's transaction (:mod:`..db.attempts`).
        The step is :meth:`work` driven alone (:func:`.step_work.run_alone`: its write goes
        to the group commit); a batched step drives several together (:mod:`.batch`).

        A session that refuses the call before running it (another API replica stepped the
        env since this one's handle was made: any replica answers any request) is
        re-attached from the committed head and the action carried out once more within
        this request; only a second refusal is a 503.

        Raises InvalidRequest (``include``), PayloadTooLarge (arguments over the server's
        cap), QuotaExceeded (the tenant's ``max_arguments_bytes``, ``steps_per_minute``,
        ``max_concurrent_calls``; no execution slot), NotFound, Conflict (expired),
        EpisodeEnded (409: reset first), StaleAttempt (409: ``attempt`` is not the env's
        current attempt; nothing committed), IdempotencyKeyInFlight (409: ``key``'s claim was
        taken over; nothing committed), NoCapacity (503 + Retry-After),
        ServiceUnavailable (database, Docker Engine or the simulated user's model failed;
        the step is not acknowledged and the env resumes from its last committed state)."""
        return run_alone(self.work(ctx, env_id, request, include, clock, key, attempt), self.commits)

    def work(self, ctx: TenantContext, env_id: str, request: StepRequest, include: str | None = None,
             clock: StepClock | None = None, key: KeyClaim | None = None,
             attempt: str | None = None) -> Work[StepOutcome]:
        """:meth:`step` as resumable work (:mod:`.step_work`): it yields its tool call and
        its write for a driver to carry out, and returns the outcome (or raises what
        :meth:`step` lists). Nothing runs before the driver's first ``send``."""
        wanted = wanted_parts(include)
        if attempt is not None:
            check_attempt(self.db, ctx.tenant, env_id, attempt)
        action = parse_step(request, self.settings.max_arguments_bytes, self.settings.max_json_depth,
                            lambda size: self.quotas.check_size(ctx, "max_arguments_bytes", size, "arguments"))
        if clock is not None:
            clock.lap("parse")
        with self.quotas.call(ctx):
            self.quotas.take_step(ctx)
            if clock is not None:
                clock.lap("auth")
            outcome = yield from self._step(ctx.tenant, env_id, action, wanted, clock, key, attempt)
        return outcome

    def _step(self, tenant: str, env_id: str, action: Action, wanted: frozenset[str],
              clock: StepClock | None, key: KeyClaim | None, attempt: str | None) -> Work[StepOutcome]:
        """The step under the env's lock (:meth:`_step_locked`); metrics after the lock.
        A write that finds the env's head moved since the live entry was made
        (:class:`HeadMoved`: another replica stepped or reset the env, also by a step that
        made no sandbox call) committed nothing and dropped the entry: the step is carried
        out once more from the committed head; a second move in a row is the 503."""
        started = time.perf_counter()
        with self.live.lock(env_id):
            try:
                outcome, done_run, pending = yield from self._step_locked(tenant, env_id, action, wanted, clock,
                                                                          key, attempt)
            except HeadMoved:
                outcome, done_run, pending = yield from self._step_locked(tenant, env_id, action, wanted, clock,
                                                                          key, attempt)
        self.metrics.step_seconds.labels(done_run.status).observe(time.perf_counter() - started)
        self.metrics.snapshot_bytes.inc(pending.stored_bytes)
        if done_run.status in FAILURE_STATUSES:
            self.metrics.failures.labels(done_run.status).inc()
        if clock is not None:
            clock.lap("other")
        return outcome

    def _step_locked(self, tenant: str, env_id: str, action: Action, wanted: frozenset[str],
                     clock: StepClock | None, key: KeyClaim | None,
                     attempt: str | None) -> Work[tuple[StepOutcome, StepRun, PendingBlobs]]:
        """Act (:meth:`_act_once_more`), score an ending episode, render the reply (when
        ``key`` needs it stored), commit, move the live head. Call it holding the env's
        lock. Returns ``(outcome, what the action did, the blobs written)``. Raises
        HeadMoved (nothing committed, the live entry dropped) and what :meth:`step` lists."""
        entry, restored, after_loss, before, done_run = yield from self._act_once_more(tenant, env_id, action, clock)
        if clock is not None:
            clock.lap("sandbox")
        run = entry.run
        result = done_run.result
        pending = PendingBlobs()
        after = before
        if result is not None and result.status in ("ok", "error"):
            after = self._applied(env_id, before, result, pending)
        number = entry.step + 1
        terminated = done_run.terminated
        truncated = not terminated and run.config.max_steps is not None and number >= run.config.max_steps
        reward, checks = 0.0, None
        if terminated and done_run.end_reason != "tool_error" or truncated and run.config.score_truncated:
            score = partial(self.rewards.score, tenant, run.scenario_id, entry.environment_id, run.initial_root, after)
            reward, checks = score() if run.scenario_id is None else (yield BlockingNeed(score))
        done = "terminated" if terminated else "truncated" if truncated else None
        recorded = done_run.action if done_run.action is not None else action.record()
        recovered = restored or bool(result is not None and result.recovered)
        failure = step_failure(done_run.status, sandbox_lost=result is not None and result.sandbox_lost,
                               starved=result is not None and result.starved,
                               recovered=after_loss or bool(result is not None and result.recovered))
        episode_failed = episode_failure([run.failure, failure],
                                         [c.status for c in checks] if checks is not None else ())
        outcome = StepOutcome(env_id, entry.episode, number, recorded, done_run, recovered, reward,
                              terminated, truncated, checks, wanted=wanted, failure=failure,
                              episode_failure=episode_failed)
        if wanted:
            outcome.state_after = state_view(after)
            if "state_diff" in wanted:
                outcome.state_before = state_view(before)
        yield from self._commit(env_id, entry, number, recorded, done_run, after, pending, reward, done, checks,
                                key, outcome.json() if key is not None else b"", attempt, failure,
                                episode_failed if episode_failed != run.failure else None)
        if clock is not None:
            clock.lap("persist")
        entry.cache = after
        entry.step = number
        entry.last_used = time.monotonic()
        if done_run.user_messages is not None:
            run.user_messages = done_run.user_messages
        if done is not None:
            run.status, run.reward = done, reward
        run.failure = episode_failed
        return outcome, done_run, pending

    def _act_once_more(self, tenant: str, env_id: str, action: Action,
                       clock: StepClock | None) -> Work[tuple[LiveEnv, bool, bool, StateCache, StepRun]]:
        """Find the env's live entry and carry out ``action``; a session that moved or
        closed under the call is re-attached and the action carried out once more.
        Returns ``(entry, re-attached now, re-attached after a loss, head before the step,
        what the action did)``: a re-attach is after a loss when this process's entry
        held a session that had closed (a call that lost its sandbox closed it) or whose
        sandbox was found lost under this call (``SessionLostError``); a session another
        replica attached to since, and an env this process had no entry for (a fork's
        first step, an evicted env, after an API restart), are re-opened by design, not
        after a loss. Raises EpisodeEnded, ServiceUnavailable (refused twice), and what the live
        entry and the action raise."""
        lost_under_call = False
        for attempt in range(2):
            prior = self.live.get(env_id)
            after_loss = lost_under_call if attempt else prior is not None and prior.session.closed
            live = self.sessions.live_now(tenant, env_id)
            if live is not None:
                entry, restored = live, False
            else:  # re-attaching reads the database and opens a session: blocking work
                entry, restored = yield BlockingNeed(partial(self.sessions.live_entry, tenant, env_id))
            run = entry.run
            if run.ended:
                raise EpisodeEnded(f"episode {entry.episode} of env {env_id!r} has {run.status} "
                                   f"(reward {run.reward}); reset the env to start the next one")
            before = entry.cache
            if clock is not None:
                clock.lap("other")
            try:
                done_run = yield from self._act(tenant, env_id, entry, action)
                return entry, restored, restored and after_loss, before, done_run
            except _SessionMoved as moved:
                lost_under_call = moved.lost
                if attempt:
                    raise ServiceUnavailable("the env's session closed during the call twice; retry",
                                             retry_after=1) from None
                # another API replica used the env since this one did (its handle is stale; the
                # host refused the call before running it) or the session closed: re-attach from
                # the committed head and act once more
        raise AssertionError("unreachable")

    def _applied(self, env_id: str, before: StateCache, result: CallResult, pending: PendingBlobs) -> StateCache:
        """The head after ``result``'s delta: keyed changes applied to ``before``'s own
        values (the one host copy; untouched subtrees keep their identity, so encoding
        skips them), then encoded incrementally. A delta that does not apply (a hostile
        or broken sandbox) drops the env's session and raises SandboxUnavailable (503):
        nothing is committed, and the next request re-attaches from the committed head."""
        try:
            changed = resolved_changes(result.delta, before.entry)
        except SandboxError:
            self.live.drop(env_id)
            raise
        return apply_delta(before, changed, result.delta.deleted, pending)

    def _commit(self, env_id: str, entry: LiveEnv, number: int, recorded: dict[str, Any], done_run: StepRun,
                after: StateCache, pending: PendingBlobs, reward: float, done: str | None,
                checks: list[CheckOutcome] | None, key: KeyClaim | None, response: bytes,
                attempt: str | None, failure: Failure = "none",
                episode_failed: Failure | None = None) -> Work[None]:
        """Commit step ``number`` through the group commit: its row (``failure`` in its
        info), its new blobs, the env's head, the episode's changes (user transcript, its
        end, its new failure ``episode_failed`` when the step changed it) and, with ``key``,
        the reply's bytes ``response`` stored on the request's idempotency key, and the
        fence of the request's ``attempt`` token (a :class:`~.step_work.CommitNeed` for the
        driver: the group commit, a batched step's shared transaction). A failed write
        drops the env's session (the sandbox is ahead of the database: the next request
        resumes from the committed head). Raises ServiceUnavailable."""
        info = step_info(done_run, failure)
        if done_run.user_messages is not None:
            info["user_turns"] = len(done_run.user_messages)
        now = utcnow()
        write = StepWrite(env_id, entry.episode, {
            "env_id": env_id, "episode": entry.episode, "step": number, "action": recorded,
            "observation": done_run.observation, "status": done_run.status,
            "duration_ms": done_run.duration_ms, "state_root": after.root, "created_at": now,
            "reward": reward, "done": done, "info": info or None}, pending, now, key=key, response=response,
            attempt=attempt)
        if done_run.user_messages is not None:
            write.episode_changes["user_messages"] = done_run.user_messages
        if episode_failed is not None:
            write.episode_changes["failure"] = episode_failed
        if done is not None:
            write.episode_changes.update(status=done, reward=reward, ended_at=now,
                                         checks=[c.model_dump() for c in checks] if checks is not None else None)
        try:
            yield CommitNeed(write)
        except BaseException:
            self.live.drop(env_id)  # the sandbox is ahead of the database: resync on next use
            raise

    def _act(self, tenant: str, env_id: str, entry: LiveEnv, action: Action) -> Work[StepRun]:
        """Carry out one action of the episode (the module docstring; :mod:`.rulebook`)."""
        run = entry.run
        config = run.config
        if config.envscaler and action.request is not None:
            return (yield from self._act_envscaler(tenant, env_id, entry, envscaler.parse_action(action.request),
                                                   action))
        if action.problem is not None:
            return StepRun("rejected", action.problem, "user", error=action.error)
        name, arguments = action.name, action.arguments
        toolset = entry.toolset
        chat_is_action = name == CHAT_ACTION and (config.conversational or config.termination_action == CHAT_ACTION)
        if chat_is_action and not isinstance(arguments.get("content"), str):
            return StepRun("rejected", INVALID_ACTION, "user", error="chat_with_user needs a string argument 'content'")
        if not config.conversational and config.termination_action is not None and name == config.termination_action:
            return StepRun("ok", TASK_FINISHED, "user", terminated=True, end_reason="action")
        if config.conversational and name == CHAT_ACTION:
            return (yield from self._chat(tenant, entry, arguments["content"]))
        if name not in toolset:
            return StepRun("rejected", INVALID_ACTION, "user", error=toolset.unknown(name))
        call = action.call
        findings = toolset.findings(call) if entry.argument_checking != "off" else []
        if findings and entry.argument_checking == "strict":
            return StepRun("rejected", INVALID_ACTION, "user", findings=findings,
                           error="the arguments do not fit the tool's schema (argument_checking: strict)")
        result = yield from self._call(env_id, entry, call.name, call.arguments, "sandpit")
        terminated = result.status == "error" and config.on_tool_error == "terminate"
        role: Literal["tool", "user"] = "user" if terminated else "tool"  # EnvScaler reports a tool's exception as a user message
        return StepRun(result.status, clean_text(result.observation), role, result.duration_ms, result,
                       findings=findings or None, terminated=terminated,
                       end_reason="tool_error" if terminated else None)

    def _call(self, env_id: str, entry: LiveEnv, name: str, arguments: dict[str, Any],
              rules: CallRules) -> Work[CallResult]:
        """The tool call in the env's session. A session that closed or moved (another
        replica) raises :class:`_SessionMoved` (its handle is closed; the entry stays, and
        re-attaching uses its head when that is still the committed one); another
        SandboxError drops the env's live entry and propagates. A call whose sandbox was
        lost is a result with the loss's status, and its handle is closed: the next
        request re-attaches from the committed head (:meth:`.sessions.Sessions.attach`).
        The call is a :class:`~.step_work.CallNeed` its driver carries out."""
        try:
            result: CallResult = yield CallNeed(entry.session, name, arguments, rules)
            return result
        except SessionClosedError as exc:
            entry.session.close()
            raise _SessionMoved(isinstance(exc, SessionLostError)) from None
        except SandboxError:
            self.live.drop(env_id)
            raise

    def _act_envscaler(self, tenant: str, env_id: str, entry: LiveEnv, action: envscaler.EnvScalerAction,
                       parsed: Action) -> Work[StepRun]:
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
                chat = yield from self._chat(tenant, entry, envscaler.chat_content(arguments))
                chat.action = record
                return chat
            return StepRun("ok", envscaler.TASK_FINISHED, "user", terminated=True, end_reason="action", action=record)
        result = yield from self._call(env_id, entry, name, arguments, "envscaler")
        if result.status == "rejected":  # hasattr found nothing (or the name is no attribute name at all)
            return StepRun("rejected", envscaler.INVALID_ACTION, "user", result.duration_ms, result,
                           error="the environment has no attribute of that name (hasattr)", action=record)
        terminated = result.status == "error"
        return StepRun(result.status, clean_text(result.observation), "user" if terminated else "tool",
                       result.duration_ms, result, terminated=terminated,
                       end_reason="tool_error" if terminated else None, action=record)

    def _chat(self, tenant: str, entry: LiveEnv, content: str) -> Work[StepRun]:
        """``chat_with_user`` in a conversational episode: the simulated user's reply (a
        :class:`~.step_work.BlockingNeed`)."""
        started = time.perf_counter()
        simulator = self.rulebook.simulator(tenant, entry.run)
        try:
            reply: str = yield BlockingNeed(partial(simulator.reply, content))
        except ModelError as exc:
            raise ServiceUnavailable(f"the simulated user's model failed ({exc.status}): {exc.message}; "
                                     "the step was not recorded, retry it", retry_after=5) from None
        done = STOP_TOKEN in reply
        return StepRun("ok", reply, "user", (time.perf_counter() - started) * 1000.0, terminated=done,
                       end_reason="user" if done else None, user_messages=simulator.messages)
