"""Gymnasium adapters over Sandpit envs: `RLEnv`, `AsyncRLEnv` and `SandpitVectorEnv`.

An episode is a server-side episode of a Sandpit env (EnvScaler semantics, computed by the
server: see docs/rl.md): `reset()` starts one, bound to a scenario (its task
is the first observation, its checks give the reward when it ends) or open-ended on a
registered environment (no reward); `step(action)` sends one action and returns the
server's `(observation, reward, terminated, truncated, info)`.

Spaces (`sandpit.client.spaces`). Observations are text of any Unicode characters, and actions are raw model text
(EnvScaler's `<tool_call>{...}</tool_call>` prompt format; plain text is `chat_with_user`)
or a structured tool call. gymnasium's `Text` space only admits the characters of its
charset (alphanumeric by default), and a charset of every code point would cost a table
of a million entries, so both spaces are `Text` subclasses whose `contains()` admits any
string within the length bounds (`UnicodeText`; `ToolCallSpace` admits tool-call dicts and
objects too) while `sample()` draws short strings of printable ASCII. Being `Text`s, they
batch like `Text` in gymnasium's vector utilities. They are not flattenable
(`is_np_flattenable` is False): a character outside the sampling charset has no index.

Determinism. Seeding (`reset(seed=...)`) fixes the client's choice of scenario, nothing
on the server: environment code is LLM-written and may use randomness or the clock, a
conversational episode's user is a model, and `info` carries wall-clock durations. The
envs are therefore declared `nondeterministic` (their `spec`, and the gymnasium
registration `sandpit/Sandpit-v0` made when this module is imported).

Malformed actions never raise: whatever the model wrote, the server records it as a
`rejected` step with EnvScaler's observation (`Error: Invalid action`, `Error: Failed to
parse response to action`) and the episode goes on. Actions that cannot even be sent (not
a tool call or text, arguments that are not JSON, text over the server's size limit) are
sent as a stand-in call that the server records the same way; `info["error"]` says why.
Errors of Sandpit itself (`SandpitError`: unknown scenario, no capacity after retries,
server down) do raise.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, SupportsFloat, TypeVar, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import EnvCreator, EnvSpec, VectorEnvCreator
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .clients import AsyncClient, Client
from .envs import AsyncEnvHandle, EnvHandle
from .errors import Conflict, NotFound, PayloadTooLarge, SandpitError
from .models import Env, StepResult
from .spaces import (
    MAX_ACTION_CHARS,
    MAX_OBSERVATION_CHARS,
    ToolCallSpace,
    UnicodeText,
    action_body,
    stand_in_body,
)
from .step_batch import StepBatch

__all__ = [
    "GYMNASIUM_ID",
    "MAX_ACTION_CHARS",
    "MAX_OBSERVATION_CHARS",
    "AsyncRLEnv",
    "RLEnv",
    "SandpitVectorEnv",
    "ToolCallSpace",
    "UnicodeText",
    "action_body",
]

GYMNASIUM_ID = "sandpit/Sandpit-v0"
"""`gymnasium.make(GYMNASIUM_ID, client=..., scenario_ids=[...])` makes an `RLEnv`;
`gymnasium.make_vec(GYMNASIUM_ID, num_envs=n, vectorization_mode="vector_entry_point",
...)` a `SandpitVectorEnv`."""
RESET_OPTIONS = frozenset({"scenario_id", "init_config", "episode"})

T = TypeVar("T")


# --------------------------------------------------------------------------- episodes (shared)


@dataclass(frozen=True)
class _Plan:
    """What one reset asks the server for."""

    scenario_id: str | None
    init_config: dict[str, Any] | None
    episode: dict[str, Any] | None
    seed: int | None = None
    """``reset(seed=...)``'s seed, sent to the server: it seeds the session's ``random``
    before the environment is constructed (EnvScaler's reset)."""


def _scenario_tuple(scenario_ids: str | Sequence[str] | None) -> tuple[str, ...]:
    if scenario_ids is None:
        return ()
    ids = (scenario_ids,) if isinstance(scenario_ids, str) else tuple(scenario_ids)
    for sid in ids:
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"scenario ids must be non-empty strings, not {sid!r}")
    return ids


def _reset_info(env: Env) -> dict[str, Any]:
    """`info` of a reset: the new episode as the server describes it (fresh objects)."""
    return {"env_id": env.id, "episode": env.episode, "scenario_id": env.scenario_id,
            "environment_id": env.environment_id, "task": env.task, "introduction": env.introduction,
            "tools": copy.deepcopy(env.tools), "episode_config": copy.deepcopy(env.episode_config)}


def _step_return(result: StepResult, note: str | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
    info = {"env_id": result.env_id, "step": result.step, "status": result.status,
            "observation_role": result.observation_role, "duration_ms": result.duration_ms,
            "error": note if note is not None else result.error,
            "checks": [c.model_dump() for c in result.checks] if result.checks is not None else None,
            "action": copy.deepcopy(result.action), "argument_findings": copy.copy(result.argument_findings),
            "traceback": result.traceback, "recovered": result.recovered, "failure": result.failure,
            "mask": result.mask, "episode_failure": result.episode_failure, "episode_mask": result.episode_mask}
    return result.observation, float(result.reward), bool(result.terminated), bool(result.truncated), info


def _expired(env: Env) -> bool:
    return env.status == "closed" or (env.expires_at is not None and env.expires_at <= datetime.now(UTC))


class _Episodes:
    """What `RLEnv` and `AsyncRLEnv` share: configuration, spaces, the seeded choice of
    scenario and the translation of server answers. No I/O."""

    scenario_ids: tuple[str, ...]
    environment_id: str | None
    init_config: dict[str, Any] | None
    episode: dict[str, Any] | None
    observation_space: spaces.Space[str]
    """A `UnicodeText`."""
    action_space: spaces.Space[Any]
    """A `ToolCallSpace`."""

    def _configure(self, scenario_ids: str | Sequence[str] | None, environment_id: str | None,
                   init_config: Mapping[str, Any] | None, episode: Mapping[str, Any] | None) -> None:
        ids = _scenario_tuple(scenario_ids)
        if bool(ids) == (environment_id is not None):
            raise ValueError("give scenario ids (episodes with a task and a reward) or environment_id "
                             "(open-ended episodes), not both or neither")
        self.scenario_ids = ids
        self.environment_id = environment_id
        self.init_config = dict(init_config) if init_config is not None else None
        self.episode = dict(episode) if episode is not None else None
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = ToolCallSpace(MAX_ACTION_CHARS)

    def _plan(self, options: Mapping[str, Any] | None, rng: np.random.Generator) -> _Plan:
        """The reset to ask for. Options apply to this episode only (the constructor's
        values otherwise). Raises ValueError for unknown options."""
        options = dict(options or {})
        unknown = set(options) - RESET_OPTIONS
        if unknown:
            raise ValueError(f"unknown reset options {sorted(unknown)}; known: {sorted(RESET_OPTIONS)}")
        scenario_id = options.get("scenario_id")
        if self.scenario_ids:
            if scenario_id is None:
                scenario_id = self.scenario_ids[int(rng.integers(len(self.scenario_ids)))]
            # sent every time so a one-off option does not stay in force on the server
            episode = options.get("episode", self.episode if self.episode is not None else {})
            return _Plan(scenario_id, options.get("init_config", self.init_config), episode)
        if scenario_id is not None:
            raise ValueError("options['scenario_id'] needs an env made from scenario ids "
                             "(this one runs open-ended episodes of an environment)")
        return _Plan(None, options.get("init_config", self.init_config or {}), options.get("episode", self.episode))


# --------------------------------------------------------------------------- sync


class RLEnv(_Episodes, gym.Env[str, Any]):
    """A `gymnasium.Env` over one Sandpit env, one server-side episode per `reset()`.

    Args:
        client: a `Client`; None makes one from `base_url`/`api_key` (default the
            `SANDPIT_URL`/`SANDPIT_API_KEY` environment variables), owned and closed by `close()`.
        scenario_ids: one scenario id or several: each `reset()` picks one with the env's
            seeded RNG (`np_random`) unless `options["scenario_id"]` names one (EnvScaler
            picks a random task the same way). The episode ends by the termination action,
            the simulated user or `max_steps`, with the mean of the scenario's checks as reward.
        environment_id: instead of scenarios, open-ended episodes of a registered
            environment (reward 0.0; no end unless `episode` options give one).
        init_config: the environment's initial configuration (default: the scenario's;
            `{}` for an environment).
        episode: episode options (`mode`, `max_steps`, `termination_action`,
            `on_tool_error`, `score_truncated`, `user`; the server's `EpisodeOptions`);
            default: the server's (30 steps, `chat_with_user` ends the episode).

    `reset(seed=None, options=None)` returns `(observation, info)`: the task (or the
    simulated user's first message; "" open-ended) and `info` with `env_id`, `episode`
    (the server's episode number), `scenario_id`, `environment_id`, `task`,
    `introduction`, `tools` (OpenAI schemas, every episode), `episode_config`. `options`
    may give `scenario_id`, `init_config`, `episode` for this episode. The first reset
    creates the env on the server; later ones start its next episode (a new env when the
    old one expired or was deleted, so `env_id` may change).

    `step(action)` takes raw model text, a `{"name", "arguments"}` dict or an OpenAI tool
    call (dict or SDK object) and returns the server's `(observation, reward, terminated,
    truncated, info)`; `info`: `env_id`, `step`, `status` (`ok`, `error`, `timeout`, `oom`,
    `crashed`, `rejected`), `observation_role` (`tool`/`user`), `duration_ms`, `error`,
    `checks` (at the end of a scenario's episode), `action` (as recorded),
    `argument_findings`, `traceback`, `recovered`, and the server's failure verdict:
    `failure` / `mask` of the step, `episode_failure` / `episode_mask` of the episode so
    far (on the last step, with its checks: `episode_mask` True means drop the episode
    from training; docs/failures.md). There is no `info["episode"]` on steps:
    gymnasium's `RecordEpisodeStatistics` writes that key.

    Raises (reset, step): `SandpitError` subclasses for failures of Sandpit (e.g.
    `NotFound` for an unknown scenario id); `RuntimeError` for `step()` without a running
    episode (before the first reset, after the episode ended); `ValueError` for unknown
    reset options. `close()` deletes the env (idempotent).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, client: Client | None = None, scenario_ids: str | Sequence[str] | None = None, *,
                 environment_id: str | None = None, init_config: Mapping[str, Any] | None = None,
                 episode: Mapping[str, Any] | None = None, base_url: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0) -> None:
        self._configure(scenario_ids, environment_id, init_config, episode)
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError("give a client or base_url/api_key, not both")
        self._owns_client = client is None
        self.client = client if client is not None else Client(base_url, api_key, timeout=timeout)
        self._handle: EnvHandle | None = None
        self._running = False
        # spec.make() builds a sibling on the same client; no key is kept in the spec
        self.spec = EnvSpec(id=GYMNASIUM_ID, entry_point=cast(EnvCreator, type(self)), nondeterministic=True,
                            order_enforce=False, disable_env_checker=True,
                            kwargs={"client": self.client, "scenario_ids": scenario_ids,
                                    "environment_id": environment_id, "init_config": init_config, "episode": episode})

    @property
    def handle(self) -> EnvHandle | None:
        """The server-side env, once the first `reset()` created it."""
        return self._handle

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        env = self._start(replace(self._plan(options, self.np_random), seed=seed))
        self._running = True
        return env.observation, _reset_info(env)

    def _start(self, plan: _Plan) -> Env:
        if self._handle is not None:
            try:
                return self._handle.reset(plan.init_config, scenario_id=plan.scenario_id, episode=plan.episode,
                                          seed=plan.seed)
            except (NotFound, Conflict):
                if not self._gone(self._handle):
                    raise  # e.g. an unknown scenario id: the env itself is fine
                self._drop(self._handle)
        if plan.scenario_id is not None:
            self._handle = self.client.envs.create(scenario_id=plan.scenario_id, init_config=plan.init_config,
                                                   episode=plan.episode, seed=plan.seed)
        else:
            self._handle = self.client.envs.create(self.environment_id, init_config=plan.init_config,
                                                   episode=plan.episode, seed=plan.seed)
        return self._handle.env

    @staticmethod
    def _gone(handle: EnvHandle) -> bool:
        try:
            return _expired(handle.refresh())
        except NotFound:
            return True

    def _drop(self, handle: EnvHandle) -> None:
        self._handle = None
        try:
            handle.delete()
        except SandpitError:
            pass  # already gone, or expired: the server reaps it

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._handle is None or not self._running:
            raise RuntimeError("no episode is running: call reset() first (after the episode ended too)")
        body, note = action_body(action)
        try:
            result = self._handle.step_call(body)
        except PayloadTooLarge as exc:
            body, note = stand_in_body(action, f"the action is over the server's size limit: {exc.message}")
            result = self._handle.step_call(body)
        observation, reward, terminated, truncated, info = _step_return(result, note)
        self._running = not (terminated or truncated)
        return observation, reward, terminated, truncated, info

    def close(self) -> None:
        """Delete the server-side env (a later `reset()` creates a new one with the same
        client) and close the client if this env made it. Idempotent."""
        handle, self._handle = self._handle, None
        self._running = False
        try:
            if handle is not None:
                try:
                    handle.delete()
                except NotFound:
                    pass
        finally:
            if self._owns_client:
                self.client.close()
        super().close()


# --------------------------------------------------------------------------- async


class AsyncRLEnv(_Episodes):
    """`RLEnv` over an `AsyncClient`: the same arguments, spaces, results and errors, with
    `reset`, `step` and `close` awaited (`async with AsyncRLEnv(...) as env:` closes it).
    Not a `gymnasium.Env` (gymnasium has no async API); `SandpitVectorEnv` runs several of
    them concurrently behind gymnasium's vector API."""

    metadata: dict[str, Any] = {"render_modes": []}
    _np_random: np.random.Generator | None = None
    _np_random_seed: int | None = None

    def __init__(self, client: AsyncClient | None = None, scenario_ids: str | Sequence[str] | None = None, *,
                 environment_id: str | None = None, init_config: Mapping[str, Any] | None = None,
                 episode: Mapping[str, Any] | None = None, base_url: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0) -> None:
        self._configure(scenario_ids, environment_id, init_config, episode)
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError("give a client or base_url/api_key, not both")
        self._owns_client = client is None
        self.client = client if client is not None else AsyncClient(base_url, api_key, timeout=timeout)
        self._handle: AsyncEnvHandle | None = None
        self._running = False

    @property
    def np_random(self) -> np.random.Generator:
        """The RNG that picks scenarios (seeded by `reset(seed=...)`, as gymnasium's)."""
        if self._np_random is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        return self._np_random

    @property
    def handle(self) -> AsyncEnvHandle | None:
        return self._handle

    async def reset(self, *, seed: int | None = None,
                    options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """See `RLEnv.reset`."""
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
        env = await self._start(replace(self._plan(options, self.np_random), seed=seed))
        self._running = True
        return env.observation, _reset_info(env)

    async def _start(self, plan: _Plan) -> Env:
        if self._handle is not None:
            try:
                return await self._handle.reset(plan.init_config, scenario_id=plan.scenario_id, episode=plan.episode,
                                                seed=plan.seed)
            except (NotFound, Conflict):
                if not await self._gone(self._handle):
                    raise
                await self._drop(self._handle)
        if plan.scenario_id is not None:
            self._handle = await self.client.envs.create(scenario_id=plan.scenario_id, init_config=plan.init_config,
                                                         episode=plan.episode, seed=plan.seed)
        else:
            self._handle = await self.client.envs.create(self.environment_id, init_config=plan.init_config,
                                                         episode=plan.episode, seed=plan.seed)
        return self._handle.env

    @staticmethod
    async def _gone(handle: AsyncEnvHandle) -> bool:
        try:
            return _expired(await handle.refresh())
        except NotFound:
            return True

    async def _drop(self, handle: AsyncEnvHandle) -> None:
        self._handle = None
        try:
            await handle.delete()
        except SandpitError:
            pass

    async def step(self, action: Any, batch: StepBatch | None = None) -> tuple[
            str, SupportsFloat, bool, bool, dict[str, Any]]:
        """See `RLEnv.step`; `batch` (a vector step's `StepBatch`) sends it in that batch's request."""
        if self._handle is None or not self._running:
            raise RuntimeError("no episode is running: call reset() first (after the episode ended too)")
        body, note = action_body(action)
        try:
            result = await (self._handle.step_call(body) if batch is None else batch.step(self._handle, body))
        except PayloadTooLarge as exc:
            body, note = stand_in_body(action, f"the action is over the server's size limit: {exc.message}")
            result = await self._handle.step_call(body)
        observation, reward, terminated, truncated, info = _step_return(result, note)
        self._running = not (terminated or truncated)
        return observation, reward, terminated, truncated, info

    async def close(self) -> None:
        """See `RLEnv.close`."""
        handle, self._handle = self._handle, None
        self._running = False
        try:
            if handle is not None:
                try:
                    await handle.delete()
                except NotFound:
                    pass
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> AsyncRLEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --------------------------------------------------------------------------- vector


class _LoopThread:
    """An event loop in a daemon thread; `run(coro)` waits for a coroutine from any thread
    (also from one that runs an event loop of its own, e.g. a notebook)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandpit-vector-env", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


_Result = tuple[str, float, bool, bool, dict[str, Any], tuple[str, dict[str, Any]] | None]


class SandpitVectorEnv(VectorEnv[tuple[str, ...], tuple[Any, ...], np.ndarray]):
    """`num_envs` `AsyncRLEnv`s stepped concurrently (one `AsyncClient`, an event loop in a
    background thread), behind gymnasium's vector API. A vector step sends its steps in one request
    (`POST /v1/envs:step`, `StepBatch`; results and infos as each env's own step's), resets one per env.

    Observations are a tuple of `num_envs` strings, actions a sequence of as many actions
    (each as `RLEnv.step` takes them); rewards, terminations and truncations are numpy
    arrays; infos are gymnasium's dict of arrays with `_key` masks. Arguments as `RLEnv`
    (`client` an `AsyncClient`, used only on this env's loop thread), plus:

    Args:
        num_envs: how many envs (each its own server-side env, created on the first reset).
        autoreset_mode: `NEXT_STEP` (gymnasium's default: the step after an episode ended
            resets that env, ignores its action and returns reward 0.0), `SAME_STEP` (the
            step that ends an episode resets the env at once; the last observation and info
            are `info["final_obs"]` / `info["final_info"]`: no model call is wasted) or
            `DISABLED` (reset ended envs with `reset(options={"reset_mask": mask})`).

    `reset(seed=s)` seeds env i with `s + i` (a list gives one seed per env); `options`
    (`scenario_id`, `init_config`, `episode`) go to every env reset, and `reset_mask` (a
    bool array) resets only those envs. A failure of Sandpit in one env is raised after
    every env's call has finished. `close()` deletes every env.
    """

    def __init__(self, num_envs: int, scenario_ids: str | Sequence[str] | None = None, *,
                 environment_id: str | None = None, init_config: Mapping[str, Any] | None = None,
                 episode: Mapping[str, Any] | None = None, client: AsyncClient | None = None,
                 base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, not {num_envs}")
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError("give a client or base_url/api_key, not both")
        mode = AutoresetMode(autoreset_mode)
        self.num_envs = num_envs
        self.autoreset_mode = mode
        self.metadata = {"autoreset_mode": mode, "render_modes": []}
        self._owns_client = client is None
        self.client = client if client is not None else AsyncClient(base_url, api_key, timeout=timeout)
        self.envs = [AsyncRLEnv(self.client, scenario_ids, environment_id=environment_id, init_config=init_config,
                                episode=episode) for _ in range(num_envs)]
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._loop = _LoopThread()
        self._observations: list[str] = [""] * num_envs
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)

    def _gather(self, calls: Mapping[int, Callable[[], Coroutine[Any, Any, T]]]) -> tuple[dict[int, T], BaseException | None]:
        """Run `calls` concurrently; returns the results of those that succeeded and the
        first failure (None when all succeeded)."""
        async def all_of() -> list[Any]:
            results: list[Any] = await asyncio.gather(*(call() for call in calls.values()), return_exceptions=True)
            return results

        outcomes = dict(zip(calls, self._loop.run(all_of()), strict=True))
        errors = [o for o in outcomes.values() if isinstance(o, BaseException)]
        return {i: o for i, o in outcomes.items() if not isinstance(o, BaseException)}, errors[0] if errors else None

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[tuple[str, ...], dict[str, Any]]:
        if isinstance(seed, int):
            super().reset(seed=seed)
            seeds: list[int | None] = [seed + i for i in range(self.num_envs)]
        elif seed is None:
            seeds = [None] * self.num_envs
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds for {self.num_envs} envs")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        chosen = range(self.num_envs) if mask is None else [i for i in range(self.num_envs) if mask[i]]
        results, error = self._gather({i: partial(self.envs[i].reset, seed=seeds[i], options=options)
                                       for i in chosen})
        infos: dict[str, Any] = {}
        for i, (observation, info) in sorted(results.items()):
            self._observations[i] = observation
            self._autoreset[i] = False
            infos = self._add_info(infos, info, i)
        if error is not None:
            raise error
        return tuple(self._observations), infos

    def step(self, actions: Sequence[Any] | np.ndarray) -> tuple[
            tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} envs")
        if self.autoreset_mode is AutoresetMode.DISABLED and self._autoreset.any():
            ended = [i for i in range(self.num_envs) if self._autoreset[i]]
            raise RuntimeError(f"envs {ended} have ended: reset them (options={{'reset_mask': ...}}) first")
        batch = StepBatch(self.client)  # the steps of this vector step: one request
        results, error = self._gather({i: partial(self._one, i, actions[i], batch) for i in range(self.num_envs)})
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=np.bool_)
        truncations = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, (observation, reward, terminated, truncated, info, final) in sorted(results.items()):
            if final is not None:
                infos = self._add_info(infos, {"final_obs": final[0], "final_info": final[1]}, i)
            self._observations[i] = observation
            rewards[i], terminations[i], truncations[i] = reward, terminated, truncated
            self._autoreset[i] = terminated or truncated
            infos = self._add_info(infos, info, i)
        if error is not None:
            raise error  # the envs that answered are up to date; the failed one is as it was
        return tuple(self._observations), rewards, terminations, truncations, infos

    async def _one(self, i: int, action: Any, batch: StepBatch) -> _Result:
        env = self.envs[i]
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self._autoreset[i]:
            observation, info = await env.reset()
            return observation, 0.0, False, False, info, None
        observation, reward, terminated, truncated, info = await env.step(action, batch)
        if self.autoreset_mode is AutoresetMode.SAME_STEP and (terminated or truncated):
            final = (observation, info)
            observation, info = await env.reset()
            return observation, float(reward), terminated, truncated, info, final
        return observation, float(reward), terminated, truncated, info, None

    def close_extras(self, **kwargs: Any) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            _, error = self._gather({i: env.close for i, env in enumerate(self.envs)})
            if error is not None:
                raise error
        finally:
            try:
                if self._owns_client:
                    self._loop.run(self.client.aclose())
            finally:
                self._loop.stop()


if GYMNASIUM_ID not in gym.registry:
    # the classes are the creators gymnasium calls with keyword arguments (its protocols
    # want `**kwargs` only, which their signatures spell out)
    gym.register(GYMNASIUM_ID, entry_point=cast(EnvCreator, RLEnv),
                 vector_entry_point=cast(VectorEnvCreator, SandpitVectorEnv), nondeterministic=True)
