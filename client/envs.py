"""`client.envs`: live envs, and the handles that step, reset, read, restore, fork,
evaluate and delete one of them (sync and async; each method is one HTTP call).

Attempts: `resume()` gives the env a new attempt and keeps its token on the handle; from
then on the handle's step, reset, restore and delete carry it (`Sandpit-Attempt`), and a
handle still holding an older attempt's token gets `Conflict` (`stale_attempt`) for
them. A handle that never resumed (`attempt` None) is not fenced. Hand the token to
another process's handle with `client.envs.get(env_id, attempt=token)`."""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from . import calls
from .attempts import Attempt
from .batch import BatchStepOutcome, BatchStepReply
from .errors import NotFound
from .models import Env, Episode, Evaluation, Include, Page, Profile, StateView, StepResult, Trajectory
from .transport import AsyncTransport, SyncTransport

__all__ = ["AsyncEnvHandle", "AsyncEnvs", "EnvHandle", "Envs"]

T = TypeVar("T")


class _HandleBase:
    """What sync and async env handles share: the `Env`, its id and tools, and the
    attempt token its mutating calls carry."""

    def __init__(self, env: Env, attempt: str | None = None) -> None:
        self.env = env
        self.attempt = attempt
        """The env's attempt token this handle's step, reset, restore and delete carry
        (`resume()` sets it); None: not fenced."""

    def _fenced(self, call: calls.Call[T]) -> calls.Call[T]:
        """`call` carrying this handle's attempt token (if any)."""
        return call if self.attempt is None else dataclasses.replace(call, attempt=self.attempt)

    @property
    def id(self) -> str:
        """The env id (`/v1/envs/{id}`)."""
        return self.env.id

    @property
    def tools(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas of the env's tools."""
        return self.env.tools

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, environment_id={self.env.environment_id!r})"


class EnvHandle(_HandleBase):
    """A live env on the server; every method is one HTTP call.

    `env` is the `Env` as of create/get/reset/restore/refresh (its `step` is not advanced by
    `step()`; use the `StepResult`). All methods raise `SandpitError` subclasses: `NotFound`
    once the env is deleted, `Conflict` for a closed/evicted env, `SandpitConnectionError`
    without a response (see the module docstring for what is retried).
    """

    def __init__(self, transport: SyncTransport, env: Env, attempt: str | None = None) -> None:
        super().__init__(env, attempt)
        self._t = transport

    def resume(self) -> Attempt:
        """Resume the env as a new attempt (`POST /v1/envs/{id}/attempts`) and keep its
        token: this handle's later calls carry it, and every handle holding an earlier
        token (a stale worker) gets `Conflict` (`code == "stale_attempt"`) for step,
        reset, restore and delete. The env itself is unchanged. Raises `NotFound`,
        `Conflict` (expired env)."""
        attempt = self._t.run(calls.env_resume(self.id))
        self.attempt = attempt.token
        return attempt

    def step(self, call: object = None, /, **arguments: Any) -> StepResult:
        """Take one step: `step("bump", by=2)` calls tool `bump` with keyword `arguments`
        (any names, `name` and `text` included); `step(tool_call)` runs a tool call given as
        an OpenAI chat tool call dict (`{"id", "type": "function", "function": {"name",
        "arguments": "<json string>"}}`), a `{"name", "arguments"}` dict or an openai SDK
        tool call object; `step(text=output)` sends raw model output (the `<tool_call>`
        format, parsed by the server; plain text is a reply). See `calls.step_action`.

        Returns the `StepResult`; a tool that raised, timed out or was refused (an unknown
        tool, arguments that are not a JSON object) is a result with that `status`, not an
        exception. Sent with an `Idempotency-Key`, so a retry after a lost connection
        runs it at most once.

        Raises:
            TypeError, before sending (no step is recorded): keyword arguments beside a
            tool call dict or object, `text=` beside other keywords, no action at all, or
            a `call` that is no tool call (a dict with neither `name`, `function` nor `text`).
        """
        return self._t.run(self._fenced(calls.env_step(self.id, calls.step_action(call, arguments), None)))

    def step_call(self, call: object, *, include: Iterable[Include] | None = None) -> StepResult:
        """Run a tool call given as a dict or an openai SDK object (see `tool_call_body`).

        Args:
            call: `{"name", "arguments"}`, an OpenAI tool call dict, or an object with
                `.function.name` / `.function.arguments`.
            include: any of `"state_diff"`, `"state"`: also return the diff / the state
                after the call.

        Raises:
            TypeError: `call` is not a tool call; ValueError: unknown `include` value.
        """
        return self._t.run(self._fenced(calls.env_step(self.id, call, include)))

    def reset(self, init_config: Mapping[str, Any] | None = None, *, scenario_id: str | None = None,
              episode: Mapping[str, Any] | None = None, seed: int | None = None) -> Env:
        """Start a new episode (EnvScaler `reset()`): the returned `Env` has the initial
        `observation`, `tools` and `introduction`. `init_config` None: the scenario's, else
        the env's current one; `scenario_id` None: the current scenario; `episode` None:
        the current episode options; `seed` (0 to 2**64-1) seeds the session's `random`
        before the environment is constructed, as EnvScaler's `reset(seed=...)` does. The
        previous episode stays readable."""
        self.env = self._t.run(self._fenced(calls.env_reset(self.id, init_config, scenario_id, episode, seed)))
        return self.env

    def state(self, step: int | None = None, *, episode: int | None = None) -> dict[str, Any]:
        """The state after `step` of the current episode or of `episode` (None: the latest)."""
        return self.state_view(step, episode=episode).state

    def state_view(self, step: int | None = None, *, episode: int | None = None) -> StateView:
        """Like `state()`, with the episode and step the state belongs to."""
        return self._t.run(calls.env_state(self.id, step, episode))

    def trajectory(self, episode: int | None = None, *, limit: int | None = None,
                   offset: int | None = None) -> Trajectory:
        """Steps of the current episode (or `episode`): action, observation, status,
        reward, duration (ms); `limit`/`offset` give one page (`count` is the total)."""
        return self._t.run(calls.env_trajectory(self.id, episode, limit, offset))

    def episodes(self, limit: int | None = None, offset: int | None = None) -> Page[Episode]:
        """Every episode of the env, oldest first (scenario, status, steps, reward)."""
        return self._t.run(calls.env_episodes(self.id, limit, offset))

    def restore(self, step: int) -> Env:
        """Rewind the current episode to right after `step` (0: the initial state)."""
        self.env = self._t.run(self._fenced(calls.env_restore(self.id, step)))
        return self.env

    def fork(self, step: int | None = None, count: int = 1) -> list[EnvHandle]:
        """`count` new envs, each a copy of this one as of `step` (None: the latest step).

        Raises:
            ValueError: `count` < 1 (checked before sending).
        """
        page = self._t.run(calls.env_fork(self.id, step, count))
        return [EnvHandle(self._t, env) for env in page.data]

    def refresh(self) -> Env:
        """Re-read the env (`GET /v1/envs/{id}`) and return it."""
        self.env = self._t.run(calls.env_get(self.id))
        return self.env

    def evaluate(self, checks: list[Mapping[str, str]] | None = None, *,
                 check_objects: str | None = None) -> Evaluation:
        """Run check functions (`[{"check_item", "check_func"}]`, or the env's scenario's
        when None) on its initial and current state. `check_objects`: `standins` (objects
        of the environment's classes rebuilt without its code) or `environment` (its
        module loaded; its code takes part in the verdict); None: the scenario's setting.
        Raises `Conflict` (no scenario)."""
        return self._t.run(calls.env_evaluate(self.id, checks, check_objects))

    def delete(self) -> None:
        """Close and delete the env; afterwards every call raises `NotFound`."""
        self._t.run(self._fenced(calls.env_delete(self.id)))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.delete()
        except NotFound:
            pass


class Envs:
    """`client.envs`: live env instances (`Client.envs`)."""

    def __init__(self, transport: SyncTransport) -> None:
        self._t = transport

    def create(self, environment_id: str | None = None, *, source_code: str | None = None,
               class_name: str | None = None, init_config: Mapping[str, Any] | None = None,
               profile: Profile | Mapping[str, Any] | None = None, scenario_id: str | None = None,
               episode: Mapping[str, Any] | None = None, argument_checking: str | None = None,
               seed: int | None = None) -> EnvHandle:
        """Start an env from a registered environment, a scenario (`scenario_id`: its
        environment and, unless given, its `init_config`; the env is an episode of it), or
        `source_code` + `class_name`.

        Args:
            init_config: the environment's initial configuration (default `{}`).
            profile: lowered limits (`Profile` or a dict of its fields).
            episode: episode options (`mode`, `max_steps`, `termination_action`,
                `on_tool_error`, `score_truncated`, `user`); see the server's `EpisodeOptions`.
            argument_checking: `off` | `warn` | `strict` (default: the environment's).
            seed: seeds the session's `random` before the environment is constructed
                (EnvScaler's `reset(seed=...)`), 0 to 2**64-1.

        Raises:
            ValueError: neither or both of environment_id / source_code.
            pydantic.ValidationError: `profile` has unknown or mistyped fields.
            NotFound, InvalidRequest, PayloadTooLarge, Unavailable (after retries), ...
        """
        return EnvHandle(self._t, self._t.run(calls.env_create(environment_id, source_code, class_name,
                                                          init_config, profile, scenario_id, episode,
                                                          argument_checking, seed)))

    def get(self, env_id: str, *, attempt: str | None = None) -> EnvHandle:
        """A handle on an existing env, carrying `attempt` (an attempt token another
        handle's `resume()` returned) on its mutating calls. Raises `NotFound`."""
        return EnvHandle(self._t, self._t.run(calls.env_get(env_id)), attempt)

    def list(self, limit: int | None = None, offset: int | None = None) -> Page[Env]:
        """A page of the tenant's envs; `client.envs.get(env.id)` gives a handle."""
        return self._t.run(calls.env_list(limit, offset))

    def delete(self, env_id: str) -> None:
        """Close and delete an env. Raises `NotFound`."""
        self._t.run(calls.env_delete(env_id))

    def step_many(self, steps: Sequence[tuple[str | EnvHandle, object]], *,
                  include: Iterable[Include] | None = None) -> builtins.list[BatchStepOutcome]:
        """One step for each of several envs in one request (`POST /v1/envs:step`, at most
        256, each env once): `steps` is `(env id or handle, action)` with an action as
        `EnvHandle.step_call` takes it; a handle's attempt token goes with its step. The
        envs step concurrently on the server. Returns one `BatchStepOutcome` per step, in
        order: `.ok` and `.result`, or the step's refusal (`.exception()`, `.unwrap()`
        raises it); a refused step never fails the others. Each action carries its own
        idempotency key, so a batch resent after a lost connection runs every step once.

        Raises:
            ValueError, TypeError: a malformed batch (before sending); InvalidRequest: the
            server refused the batch as a whole (nothing ran); Unavailable, ... as any call.
        """
        return self._t.run(_batch_call(steps, include)).results


def _batch_call(steps: Sequence[tuple[str | _HandleBase, object]],
                include: Iterable[Include] | None) -> calls.Call[BatchStepReply]:
    """`calls.envs_step` of `(env id or handle, action)` pairs, each handle's attempt token
    going with its step."""
    ids = [target.id if isinstance(target, _HandleBase) else target for target, _ in steps]
    attempts = [target.attempt if isinstance(target, _HandleBase) else None for target, _ in steps]
    return calls.envs_step([(env_id, action) for env_id, (_, action) in zip(ids, steps, strict=True)], include,
                           attempts if any(a is not None for a in attempts) else None)


class AsyncEnvHandle(_HandleBase):
    """Async `EnvHandle`: the same methods, awaited; same results and errors."""

    def __init__(self, transport: AsyncTransport, env: Env, attempt: str | None = None) -> None:
        super().__init__(env, attempt)
        self._t = transport

    async def resume(self) -> Attempt:
        """See `EnvHandle.resume`."""
        attempt = await self._t.run(calls.env_resume(self.id))
        self.attempt = attempt.token
        return attempt

    async def step(self, call: object = None, /, **arguments: Any) -> StepResult:
        """See `EnvHandle.step`: the same actions and the same `TypeError`s, raised before sending."""
        return await self._t.run(self._fenced(calls.env_step(self.id, calls.step_action(call, arguments), None)))

    async def step_call(self, call: object, *, include: Iterable[Include] | None = None) -> StepResult:
        """See `EnvHandle.step_call`."""
        return await self._t.run(self._fenced(calls.env_step(self.id, call, include)))

    async def reset(self, init_config: Mapping[str, Any] | None = None, *, scenario_id: str | None = None,
                    episode: Mapping[str, Any] | None = None, seed: int | None = None) -> Env:
        """See `EnvHandle.reset`."""
        self.env = await self._t.run(self._fenced(calls.env_reset(self.id, init_config, scenario_id, episode, seed)))
        return self.env

    async def state(self, step: int | None = None, *, episode: int | None = None) -> dict[str, Any]:
        """See `EnvHandle.state`."""
        return (await self.state_view(step, episode=episode)).state

    async def state_view(self, step: int | None = None, *, episode: int | None = None) -> StateView:
        """See `EnvHandle.state_view`."""
        return await self._t.run(calls.env_state(self.id, step, episode))

    async def trajectory(self, episode: int | None = None, *, limit: int | None = None,
                         offset: int | None = None) -> Trajectory:
        """See `EnvHandle.trajectory`."""
        return await self._t.run(calls.env_trajectory(self.id, episode, limit, offset))

    async def episodes(self, limit: int | None = None, offset: int | None = None) -> Page[Episode]:
        """See `EnvHandle.episodes`."""
        return await self._t.run(calls.env_episodes(self.id, limit, offset))

    async def restore(self, step: int) -> Env:
        """See `EnvHandle.restore`."""
        self.env = await self._t.run(self._fenced(calls.env_restore(self.id, step)))
        return self.env

    async def fork(self, step: int | None = None, count: int = 1) -> list[AsyncEnvHandle]:
        """See `EnvHandle.fork`."""
        page = await self._t.run(calls.env_fork(self.id, step, count))
        return [AsyncEnvHandle(self._t, env) for env in page.data]

    async def refresh(self) -> Env:
        """See `EnvHandle.refresh`."""
        self.env = await self._t.run(calls.env_get(self.id))
        return self.env

    async def delete(self) -> None:
        """See `EnvHandle.delete`."""
        await self._t.run(self._fenced(calls.env_delete(self.id)))

    async def evaluate(self, checks: list[Mapping[str, str]] | None = None, *,
                       check_objects: str | None = None) -> Evaluation:
        """See `EnvHandle.evaluate`."""
        return await self._t.run(calls.env_evaluate(self.id, checks, check_objects))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.delete()
        except NotFound:
            pass


class AsyncEnvs:
    """`async_client.envs`; see `Client.envs` for arguments and errors."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def create(self, environment_id: str | None = None, *, source_code: str | None = None,
                     class_name: str | None = None, init_config: Mapping[str, Any] | None = None,
                     profile: Profile | Mapping[str, Any] | None = None,
                     scenario_id: str | None = None, episode: Mapping[str, Any] | None = None,
                     argument_checking: str | None = None, seed: int | None = None) -> AsyncEnvHandle:
        """See `Client.envs.create`."""
        call = calls.env_create(environment_id, source_code, class_name, init_config, profile, scenario_id, episode,
                                argument_checking, seed)
        return AsyncEnvHandle(self._t, await self._t.run(call))

    async def get(self, env_id: str, *, attempt: str | None = None) -> AsyncEnvHandle:
        """See `Client.envs.get`."""
        return AsyncEnvHandle(self._t, await self._t.run(calls.env_get(env_id)), attempt)

    async def list(self, limit: int | None = None, offset: int | None = None) -> Page[Env]:
        """See `Client.envs.list`."""
        return await self._t.run(calls.env_list(limit, offset))

    async def delete(self, env_id: str) -> None:
        """See `Client.envs.delete`."""
        await self._t.run(calls.env_delete(env_id))

    async def step_many(self, steps: Sequence[tuple[str | AsyncEnvHandle, object]], *,
                        include: Iterable[Include] | None = None) -> builtins.list[BatchStepOutcome]:
        """See `Client.envs.step_many`: one request for every step, the same outcomes and errors."""
        return (await self._t.run(_batch_call(steps, include))).results
