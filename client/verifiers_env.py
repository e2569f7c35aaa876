"""verifiers environments (PrimeIntellect's `verifiers`, its classic `vf.ToolEnv` API) whose
rollouts run through Sandpit: the tools run in Sandpit's sandboxes, never in the trainer's
process, and the reward is the scenario's, computed by the server.

`SandpitToolEnv(scenario_ids)` is a `vf.ToolEnv`. Its dataset has one row per scenario:
the scenario's task as the prompt (`question`), its id in `info["scenario_id"]`. Each
rollout (verifiers' `evaluate`, `generate`, `run_rollout`):

1. `setup_state` starts a Sandpit env of the row's scenario (one per rollout, through its
   own `AsyncClient`) and gives the model the tools the agent sees (`Env.tools`, the
   env's own OpenAI schemas, as `vf.Tool`s in `state["tool_defs"]`); in a conversational
   episode the simulated user's first message replaces the task as the last prompt message.
2. `env_response` sends each tool call of the model's turn as one recorded Sandpit step
   (arguments as the model wrote them: a name that is no tool or arguments that are not a
   JSON object are `rejected` steps, judged by the server) and answers with the
   observations as tool messages. A turn without tool calls is sent as text (EnvScaler's
   `chat_with_user`), answered by a user message.
3. The episode ends on the scenario's rules (the termination action, the simulated user,
   `max_steps`), decided by the server: the step that ends it sets `final_env_response`,
   tool calls after it in the same turn are not run, and verifiers' `no_tools_called` stop
   condition is off (a reply without tool calls is an action here). verifiers' own limits
   (`max_turns`, default -1: none; `timeout_seconds`) still stop a rollout early.
4. The `@vf.cleanup` hook deletes the env and closes the client, also after an error.
5. `SandpitRubric` scores it: the reward the server gave the step that ended the episode
   (the mean of the scenario's checks, run in Sandpit's sandbox); 0.0 when the episode did
   not end (verifiers stopped the rollout first, or it failed).

`state["sandpit"]` holds what a trainer may want to read: `scenario_id`, `env_id`,
`episode`, `ended`, `reward`, `checks` (`[{"check_item", "passed", ...}]` once ended),
`steps` (one `step_info` per step). The same per-step dicts are in the `extras["sandpit"]`
of the trajectory step whose tool calls they ran.

Errors. Unknown scenario ids and a wrong API key raise `NotFound` / `Unauthorized` from
the constructor (it reads the scenarios). Inside a rollout a failure of Sandpit (no
capacity after retries, the env deleted, the server gone) becomes `SandpitRolloutError`,
a `vf.InfraError`: verifiers records it in `state["error"]` and stops that rollout (stop
condition `has_error`); a failing model endpoint is verifiers' own `vf.ModelError`. Either
way the cleanup hook deletes the env.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import verifiers as vf
from datasets import Dataset

from .calls import stand_in_body
from .clients import AsyncClient, Client
from .envs import AsyncEnvHandle
from .errors import InvalidRequest, NotFound, PayloadTooLarge, SandpitError
from .models import StepResult

__all__ = ["STATE_KEY", "SandpitRolloutError", "SandpitRubric", "SandpitToolEnv", "sandpit_reward",
           "scenario_dataset", "step_info", "tool_defs"]

logger = logging.getLogger(__name__)

STATE_KEY = "sandpit"
"""Key of the rollout's Sandpit record in verifiers' `state` (module docstring)."""
NOT_RUN = "Error: not run: the episode ended at an earlier tool call of this turn"
"""Tool message of a tool call that follows the one that ended the episode."""


class SandpitRolloutError(vf.InfraError):
    """A failure of Sandpit inside a rollout (its `__cause__` is the `SandpitError`);
    verifiers records it in `state["error"]` and stops the rollout."""


def step_info(result: StepResult) -> dict[str, Any]:
    """What a rollout records of one Sandpit step: `env_id`, `episode` (the server's episode
    number), `step` (1-based within the episode), `status` (`ok`, `error`, `timeout`,
    `oom`, `crashed`, `rejected`), and the server's failure verdict: `failure` / `mask` of
    the step, `episode_failure` / `episode_mask` of the episode so far (an episode whose
    `episode_mask` is true should be left out of training; docs/failures.md). The one
    place that builds it."""
    return {"env_id": result.env_id, "episode": result.episode, "step": result.step, "status": result.status,
            "failure": result.failure, "mask": result.mask, "episode_failure": result.episode_failure,
            "episode_mask": result.episode_mask}


def tool_defs(tools: Sequence[Mapping[str, Any]]) -> list[Any]:
    """`vf.Tool`s (`name`, `description`, `parameters`) from OpenAI function-calling schemas
    (`{"type": "function", "function": {...}}`, as `Env.tools` gives them). Raises
    `ValueError` for an entry without a function name."""
    defs = []
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"not an OpenAI function tool schema: {tool!r}")
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        defs.append(vf.Tool(name=function["name"], description=function.get("description") or "",
                            parameters=dict(parameters)))
    return defs


def scenario_dataset(client: Client, scenario_ids: str | Sequence[str]) -> Dataset:
    """The dataset of `SandpitToolEnv`: per scenario, in the order given, a row
    `{"question": <task>, "answer": "", "info": {"scenario_id": <id>}}` (verifiers makes
    the question the user message of the prompt). Raises `ValueError` for no ids or an id
    that is not a non-empty string; `NotFound` for an unknown (or another tenant's)
    scenario, `Unauthorized` for a wrong key, other `SandpitError`s from the server. Every id
    is checked before the first call."""
    ids = [scenario_ids] if isinstance(scenario_ids, str) else list(scenario_ids)
    if not ids:
        raise ValueError("give at least one scenario id")
    for sid in ids:
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"scenario ids must be non-empty strings, not {sid!r}")
    return Dataset.from_list([{"question": client.scenarios.get(sid).task, "answer": "", "info": {"scenario_id": sid}}
                              for sid in ids])


async def sandpit_reward(state: Mapping[str, Any]) -> float:
    """The reward Sandpit gave the rollout's episode (0.0 if it did not end)."""
    record = state.get(STATE_KEY) or {}
    return float(record.get("reward", 0.0))


class SandpitRubric(vf.Rubric):
    """A `vf.Rubric` whose one reward function (weight 1.0) is `sandpit_reward`: the
    scenario's reward as the server computed it. Keyword arguments go to `vf.Rubric`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(funcs=[sandpit_reward], weights=[1.0], **kwargs)


@dataclass
class _Rollout:
    """The live objects of one rollout (kept off `state`, which verifiers serializes)."""

    client: AsyncClient
    handle: AsyncEnvHandle | None = None


class SandpitToolEnv(vf.ToolEnv):
    """A `vf.ToolEnv` over Sandpit scenarios (module docstring).

    Args:
        scenario_ids: one scenario id or several; one dataset row each (also the eval dataset).
        base_url, api_key: the Sandpit server (default the `SANDPIT_URL` / `SANDPIT_API_KEY`
            environment variables).
        timeout: seconds per HTTP call to Sandpit.
        episode: episode options (`mode`, `max_steps`, `termination_action`, `user`, ...;
            the server's `EpisodeOptions`); default: the server's.
        rubric: default `SandpitRubric()`.
        max_turns: verifiers' limit on model turns; -1 (default) leaves the end to Sandpit.
        **kwargs: to `vf.ToolEnv` / `vf.Environment` (`system_prompt`, `sampling_args`,
            `timeout_seconds`, ...).

    Raises (constructor): `ValueError` for bad scenario ids, `NotFound`, `Unauthorized`
    and other `SandpitError`s while reading the scenarios.
    """

    def __init__(self, scenario_ids: str | Sequence[str], *, base_url: str | None = None,
                 api_key: str | None = None, timeout: float = 60.0, episode: Mapping[str, Any] | None = None,
                 rubric: Any = None, max_turns: int = -1, **kwargs: Any) -> None:
        with Client(base_url, api_key, timeout=timeout) as client:
            dataset = scenario_dataset(client, scenario_ids)
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.episode = dict(episode) if episode is not None else None
        self._rollouts: dict[str, _Rollout] = {}
        super().__init__(tools=[], max_turns=max_turns, dataset=dataset, eval_dataset=dataset,
                         rubric=rubric if rubric is not None else SandpitRubric(), **kwargs)

    async def setup_state(self, state: Any) -> Any:
        """Start the rollout's Sandpit env and give the model its tools. Raises
        `SandpitRolloutError` (recorded by verifiers) when the env cannot be started."""
        info = state.get("info")
        scenario_id = info.get("scenario_id") if isinstance(info, Mapping) else None
        if not isinstance(scenario_id, str):
            raise SandpitRolloutError(f"the dataset row has no info['scenario_id'] (info={info!r})")
        record: dict[str, Any] = {"scenario_id": scenario_id, "env_id": None, "episode": None, "ended": False,
                                  "reward": 0.0, "checks": None, "steps": []}
        state[STATE_KEY] = record
        rollout = _Rollout(AsyncClient(self.base_url, self.api_key, timeout=self.timeout))
        self._rollouts[state["trajectory_id"]] = rollout
        try:
            rollout.handle = await rollout.client.envs.create(scenario_id=scenario_id, episode=self.episode)
        except SandpitError as exc:
            raise SandpitRolloutError(f"could not start an env of scenario {scenario_id}: {exc}") from exc
        env = rollout.handle.env
        record.update(env_id=env.id, episode=env.episode)
        try:
            state["tool_defs"] = tool_defs(env.tools)
        except ValueError as exc:
            raise SandpitRolloutError(f"env {env.id} has a tool schema verifiers cannot take: {exc}") from exc
        if env.observation and env.observation != env.task and state["prompt"]:
            state["prompt"] = [*state["prompt"][:-1], vf.UserMessage(content=env.observation)]
        return state

    async def no_tools_called(self, state: Any) -> bool:
        """Not a stop condition here: a turn without tool calls is an action (sent as text)."""
        return False

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        """Run the last assistant turn as Sandpit steps and answer with the observations
        (see the module docstring). Raises `SandpitRolloutError` for a failure of Sandpit."""
        rollout = self._rollouts.get(state["trajectory_id"])
        if rollout is None or rollout.handle is None:
            raise SandpitRolloutError("the rollout has no Sandpit env (setup_state did not run or failed)")
        last = messages[-1]
        calls = list(getattr(last, "tool_calls", None) or [])
        replies: list[Any] = []
        if not calls:
            result = await self._step(rollout.handle, {"text": _text(getattr(last, "content", None))}, state)
            replies.append(vf.UserMessage(content=result.observation))
        for call in calls:
            if state[STATE_KEY]["ended"]:
                replies.append(vf.ToolMessage(tool_call_id=call.id, content=NOT_RUN))
                continue
            body = {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            result = await self._step(rollout.handle, body, state)
            replies.append(vf.ToolMessage(tool_call_id=call.id, content=result.observation))
        if state[STATE_KEY]["ended"]:
            state["final_env_response"] = replies
        return replies

    async def _step(self, handle: AsyncEnvHandle, body: Mapping[str, Any], state: Any) -> StepResult:
        """One recorded step, and its record in `state`. An action over the server's size
        limits (413; text over its request limit, 422 on `text`) is sent as the stand-in
        call of every adapter instead (`calls.stand_in_body`: `NOT_A_TOOL_CALL` with the
        action's type and a short repr; a `rejected` step)."""
        try:
            try:
                result = await handle.step_call(body)
            except (PayloadTooLarge, InvalidRequest) as exc:
                if isinstance(exc, InvalidRequest) and exc.field != "text":
                    raise
                stand_in, _ = stand_in_body(body, f"the action is over the server's size limit: {exc.message}")
                result = await handle.step_call(stand_in)
        except SandpitError as exc:
            raise SandpitRolloutError(f"step of env {handle.id} failed: {exc}") from exc
        record = state[STATE_KEY]
        info = step_info(result)
        record["steps"].append(info)
        if state["trajectory"]:
            state["trajectory"][-1]["extras"].setdefault(STATE_KEY, []).append(info)
        if result.terminated or result.truncated:
            record.update(ended=True, reward=float(result.reward),
                          checks=[c.model_dump() for c in result.checks] if result.checks is not None else None)
        return result

    @vf.cleanup
    async def delete_sandpit_env(self, state: Any) -> None:
        """Delete the rollout's env and close its client; runs after every rollout, also
        one that failed. A failure to delete is logged and kept in
        `state["sandpit"]["cleanup_error"]` (the server reaps the env when it expires)."""
        rollout = self._rollouts.pop(state.get("trajectory_id", ""), None)
        if rollout is None:
            return
        try:
            if rollout.handle is not None:
                await rollout.handle.delete()
        except NotFound:
            pass
        except SandpitError as exc:
            logger.warning("could not delete Sandpit env %s: %s", rollout.handle.id if rollout.handle else "?", exc)
            if isinstance(state.get(STATE_KEY), dict):
                state[STATE_KEY]["cleanup_error"] = str(exc)
        finally:
            await rollout.client.aclose()


def _text(content: Any) -> str:
    """The text of a message's content (a string, or a list of parts with `text`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part.get("text") if isinstance(part, Mapping) else getattr(part, "text", None) for part in content)
        return "".join(p for p in parts if isinstance(p, str))
    return str(content)
