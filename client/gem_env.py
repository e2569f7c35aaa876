"""GEM environments (`gem-llm`, import name `gem`) served by Sandpit: EnvScaler's two RL
environments, with the tools running in Sandpit's sandboxes instead of the trainer's process.

Importing this module registers them with GEM:

=================================  ======================  =====================================
GEM id                              class                   EnvScaler's counterpart
=================================  ======================  =====================================
``sandpit:envscaler_non_conv_env``  `SandpitNonConvEnv`     ``envscaler_non_conv_env``
``sandpit:envscaler_conv_env``      `SandpitConvEnv`        ``envscaler_conv_env``
=================================  ======================  =====================================

so a ROLL/GEM trainer switches to Sandpit by importing ``sandpit.client.gem_env`` where it
registers its environments and changing the env id (``env_type``); its ``env_config``
(``mode``, ``user_model``, ``provider``) is accepted as it is. The scenarios are the
server's (``sandpit import envscaler`` loads EnvScaler's files), the server is found through
``base_url``/``api_key`` or the ``SANDPIT_URL``/``SANDPIT_API_KEY`` environment variables.

The interface is EnvScaler's GEM env's: ``reset(seed=None, task_index=None)`` returns
``({"type": "user", "content": <task or the simulated user's first message>}, info)`` with
``info`` = ``env_name`` (EnvScaler's: ``envscaler_non_conversation_rl`` /
``envscaler_conversation_rl``, which ROLL's env manager dispatches on), ``env_introduction``,
``tools`` (OpenAI schemas), ``task`` (``{"task", "scenario_id", "environment_id",
"init_config"}``), plus ``env_id``, ``scenario_id``, ``episode``; ``step(action)`` takes the
raw model text (or a structured tool call) and returns ``({"type": "tool"|"user",
"content": ...}, reward, terminated, truncated, info)`` with ``info["action"]`` the action as
parsed, and Sandpit's step record (``status``, ``error``, ``checks``, ...) with its failure
verdict (``failure``, ``mask``, ``episode_failure``, ``episode_mask``: docs/failures.md). With
``observation_format="text"`` observations are the plain strings instead (what GEM's own
observation wrappers take).

Episodes run under the server's ``envscaler`` profile: EnvScaler's RL environment byte for
byte (its introduction and tools, observation texts and kinds, parse messages, ``hasattr``
validity, a tool that raises ends the episode with reward 0.0 and its traceback), no step
limit of the server's (ROLL's env manager counts ``max_steps``) and no score for a truncated
episode; ``episode`` overrides what the profile leaves open. A ``seed`` given to ``reset``
seeds the session's ``random`` before the environment is constructed, as EnvScaler's does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

import gem
from gem.envs.registration import ENV_REGISTRY

from .clients import Client
from .models import every_item
from .rl import RLEnv

__all__ = ["CONV_ID", "NON_CONV_ID", "SandpitConvEnv", "SandpitEnvScalerEnv", "SandpitNonConvEnv"]

NON_CONV_ID = "sandpit:envscaler_non_conv_env"
CONV_ID = "sandpit:envscaler_conv_env"
ENVSCALER_EPISODE: dict[str, Any] = {"profile": "envscaler"}
"""EnvScaler's RL env, byte for byte (the server's ``envscaler`` episode profile): its
introduction and tools, its observation texts, a raising tool ends the episode at 0.0 with
its traceback, no step limit of the server's (the trainer counts steps)."""


class SandpitEnvScalerEnv(gem.Env):
    """Base of the two GEM environments (module docstring).

    Args:
        scenario_ids: the scenarios to draw episodes from; None: every scenario of the
            tenant, oldest first (listed at the first reset). `reset()` picks one with a
            seeded RNG unless `task_index` (an index into them) or `scenario_id` is given.
        client: a `sandpit.client.Client`; None makes one from `base_url`/`api_key`
            (default `SANDPIT_URL`/`SANDPIT_API_KEY`), closed by `close()`.
        episode: episode options over `ENVSCALER_EPISODE` (the server's `EpisodeOptions`).
        seed: seeds the first reset when it is given none (`gem.make_vec` passes one per env).
        observation_format: `"message"` (EnvScaler's `{"type", "content"}`) or `"text"`.
        mode: EnvScaler's (its datasets' split); only `"train"` exists there and here.
        env_items_path, task_items_path: EnvScaler's local files; refused with the way to
            import them instead.

    Raises (reset/step): `sandpit.client.SandpitError` for failures of Sandpit (an
    unknown scenario id is `NotFound`); `ValueError` for a bad `task_index` or no scenarios.
    """

    env_name = ""
    conversational = False

    def __init__(self, scenario_ids: str | Sequence[str] | None = None, *, client: Client | None = None,
                 base_url: str | None = None, api_key: str | None = None, episode: Mapping[str, Any] | None = None,
                 seed: int | None = None, observation_format: str = "message", mode: str = "train",
                 env_items_path: str | None = None, task_items_path: str | None = None,
                 timeout: float = 60.0) -> None:
        super().__init__()
        if env_items_path is not None or task_items_path is not None:
            raise ValueError("Sandpit serves environments and scenarios from its API: import EnvScaler's files "
                             "with `sandpit import envscaler --envs FILE --scenarios FILE` and pass scenario_ids "
                             "(or none: every scenario of the tenant)")
        if mode != "train":
            raise ValueError(f"mode must be 'train' (EnvScaler's only split), not {mode!r}")
        if observation_format not in ("message", "text"):
            raise ValueError(f"observation_format must be 'message' or 'text', not {observation_format!r}")
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError("give a client or base_url/api_key, not both")
        self.scenario_ids = [scenario_ids] if isinstance(scenario_ids, str) else (
            list(scenario_ids) if scenario_ids is not None else None)
        self.episode = {**ENVSCALER_EPISODE, **self._mode_options(), **dict(episode or {})}
        self.observation_format = observation_format
        self.seed = seed
        self._owns_client = client is None
        self.client = client if client is not None else Client(base_url, api_key, timeout=timeout)
        self._rl: RLEnv | None = None
        self._tools: list[dict[str, Any]] = []

    def _mode_options(self) -> dict[str, Any]:
        return {"mode": "non_conversational"}

    def _env(self) -> RLEnv:
        if self._rl is None:
            if self.scenario_ids is None:
                scenarios = sorted(every_item(self.client.scenarios.list), key=lambda s: (s.created_at, s.id))
                self.scenario_ids = [s.id for s in scenarios]
            if not self.scenario_ids:
                raise ValueError("no scenarios: create some (`sandpit import envscaler ...`) or pass scenario_ids")
            self._rl = RLEnv(self.client, self.scenario_ids, episode=self.episode)
        return self._rl

    def _observation(self, content: str, role: str) -> Any:
        return content if self.observation_format == "text" else {"type": role, "content": content}

    def reset(self, seed: int | None = None, task_index: int | None = None,
              scenario_id: str | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode: `scenario_id`, else scenario `task_index`, else a random one
        (seeded by `seed`, or by the constructor's `seed` on the first reset). Like
        EnvScaler's, a given `seed` also seeds `random` and `numpy.random` (GEM's `Env.reset`)."""
        super().reset(seed)
        rl = self._env()
        if seed is None and self.seed is not None and rl.handle is None:
            seed = self.seed
        if scenario_id is None and task_index is not None:
            if not 0 <= task_index < len(rl.scenario_ids):
                raise ValueError(f"task_index {task_index} is outside [0, {len(rl.scenario_ids)})")
            scenario_id = rl.scenario_ids[task_index]
        observation, info = rl.reset(seed=seed, options={"scenario_id": scenario_id} if scenario_id else None)
        self._tools = info["tools"]
        handle = rl.handle
        task = {"task": info["task"], "scenario_id": info["scenario_id"], "environment_id": info["environment_id"],
                "init_config": copy.deepcopy(handle.env.init_config) if handle is not None else {}}
        return self._observation(observation, "user"), {
            "env_name": self.env_name, "env_introduction": info["introduction"] or "", "tools": info["tools"],
            "task": task, "env_id": info["env_id"], "scenario_id": info["scenario_id"], "episode": info["episode"]}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """One action: raw model text (the server parses `<think>`/`<tool_call>`; plain text
        is `chat_with_user`) or a structured tool call. Never raises for a malformed action
        (it is a recorded `rejected` step). Raises RuntimeError without a running episode."""
        if self._rl is None:
            raise RuntimeError("no episode is running: call reset() first")
        observation, reward, terminated, truncated, info = self._rl.step(action)
        return self._observation(observation, info["observation_role"]), float(reward), terminated, truncated, info

    def sample_random_action(self) -> str:
        """A `<tool_call>` of one of the episode's tools, chosen at random, with no arguments."""
        if not self._tools:
            return "I cannot help with that."
        rng = self._env().np_random
        name = self._tools[int(rng.integers(len(self._tools)))].get("function", {}).get("name", "")
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': {}})}\n</tool_call>"

    def close(self) -> None:
        """Delete the server-side env; close the client if this env made it. Idempotent."""
        rl, self._rl = self._rl, None
        try:
            if rl is not None:
                rl.close()
        finally:
            if self._owns_client:
                self.client.close()


class SandpitNonConvEnv(SandpitEnvScalerEnv):
    """EnvScaler's ``envscaler_non_conv_env``: the task is the first observation and
    ``chat_with_user`` (plain text) ends the episode, the scenario's checks giving the reward."""

    env_name = "envscaler_non_conversation_rl"


class SandpitConvEnv(SandpitEnvScalerEnv):
    """EnvScaler's ``envscaler_conv_env``: a simulated user (an OpenAI-compatible model on
    the server's side) has the task; its first message is the first observation,
    ``chat_with_user`` talks to it and the episode ends when it says ``###STOP###``.

    Args (besides the base class's):
        user_model: the user's model name (EnvScaler's ``user_model``).
        provider: EnvScaler's user LLM provider; only ``openai`` (an OpenAI-compatible
            endpoint, which is what Sandpit calls).
        user_base_url, user_api_key: the endpoint and its key (default: the tenant's, set by
            the operator); sent to the server, which calls the model.
        user_temperature: sampling temperature of the user model.
    """

    env_name = "envscaler_conversation_rl"
    conversational = True

    def __init__(self, scenario_ids: str | Sequence[str] | None = None, *, user_model: str,
                 provider: str = "openai", user_base_url: str | None = None, user_api_key: str | None = None,
                 user_temperature: float | None = None, **kwargs: Any) -> None:
        if provider != "openai":
            raise ValueError(f"provider must be 'openai' (an OpenAI-compatible endpoint), not {provider!r}")
        user = {"model": user_model, "base_url": user_base_url, "api_key": user_api_key,
                "temperature": user_temperature}
        self._user = {k: v for k, v in user.items() if v is not None}
        super().__init__(scenario_ids, **kwargs)

    def _mode_options(self) -> dict[str, Any]:
        return {"mode": "conversational", "user": self._user}


for _id, _entry in ((NON_CONV_ID, SandpitNonConvEnv), (CONV_ID, SandpitConvEnv)):
    if _id not in ENV_REGISTRY:
        gem.register(_id, entry_point=f"{__name__}:{_entry.__name__}")
