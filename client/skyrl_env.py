"""A SkyRL text environment (`skyrl-gym`, import name `skyrl_gym`) whose episode is a
Sandpit scenario's episode: the tools run in Sandpit's sandboxes, the scenario's check
functions give the reward.

Importing this module registers `SandpitTextEnv` with skyrl-gym under `SKYRL_ID`
(``"sandpit"``), so dataset rows with ``"env_class": "sandpit"`` are Sandpit episodes.
SkyRL's generator (``SkyRLGymGenerator.agent_loop``) makes one env per trajectory and
drives it like this (possibly in a thread pool, ``max_env_workers``)::

    env = skyrl_gym.make(env_class, env_config=<environment.skyrl_gym.<env_class>, {} if unset>,
                         extras=<the row's columns but prompt and env_class, with max_turns set>)
    messages, _ = env.init(<the row's prompt messages>)
    while not done: output = model(messages); out = env.step(output); done = out["done"]
    env.close()

Settings: the row's columns (``extras``) say which episode; the trainer's ``env_config``
(a mapping, an OmegaConf ``DictConfig`` or a dataclass) says which server. Values that are
None count as absent.

==============  ==========  =========================================================
key             from        meaning
==============  ==========  =========================================================
scenario_id     extras      the scenario (required); an unknown id is `NotFound` at init
episode         both        episode options (the server's ``EpisodeOptions``: ``mode``,
                            ``max_steps``, ``user``, ...); the row's override env_config's
init_config     extras      the environment's initial configuration (default: the scenario's)
seed            extras      seeds the scenario's session (``random``) before it is built
max_turns       extras      SkyRL's ``generator.max_turns``: the episode's ``max_steps``
                            unless ``episode`` gives one
base_url        env_config  the server (default ``SANDPIT_URL``, else loopback:8600)
api_key         env_config  the tenant's key (default ``SANDPIT_API_KEY``); refused in
                            extras, which are dataset rows
timeout         env_config  seconds per HTTP call (default 60)
observations    env_config  ``"roles"`` (default: a tool's output is a ``tool`` message, a
                            simulated user's reply or a parse error a ``user`` one) or
                            ``"user"`` (every observation a ``user`` message, as
                            skyrl-gym's own envs do, for chat templates without a tool role)
==============  ==========  =========================================================

`init(prompt)` creates the server-side env (one episode of the scenario) and returns the
chat the model starts from: the row's prompt messages, with `system_text` (the environment's
introduction and its tools in the ``<tool_call>`` text format) appended to the prompt's
leading system message or put first as one, then the task (a conversational episode: the
simulated user's first message) as the last ``user`` message. `step(output)` sends the
model's raw text to the server, which parses it (an optional ``<think>`` block, then the
first ``<tool_call>{"name", "arguments"}</tool_call>``; plain text is ``chat_with_user``,
which ends a non-conversational episode) and runs it; malformed output never raises: it
is a recorded ``rejected`` step whose observation says what was wrong, and the episode goes
on. The step returns skyrl-gym's ``BaseTextEnvStepOutput``: ``observations`` (the
observation as one chat message; ``[]`` once done, as skyrl-gym's envs do), ``reward`` (0.0
until the step that ends the episode, which carries the mean of the scenario's checks),
``done`` (terminated or truncated) and ``metadata`` (`step_metadata`). `close()` deletes
the server-side env. SkyRL does not call ``close()`` when a trajectory raises; such an env
is reaped by the server when its lifetime ends (24 h by default).

Errors: `ValueError`/`TypeError` from the constructor for settings it cannot use;
`sandpit.client.SandpitError` subclasses from `init`/`step` for failures of Sandpit (a
wrong key is `Unauthorized`, an unknown scenario `NotFound`, no capacity after the
client's retries `Unavailable`); `RuntimeError` for `step` before `init`, after the
episode ended, or after `close`.

The episode machinery is `sandpit.client.rl.RLEnv`'s (creation, the stand-in step for an
action over the server's size limit, the step `info`), so this adapter needs gymnasium
too; the ``skyrl`` extra installs both.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from .clients import Client
from .rl import RLEnv

__all__ = ["SKYRL_ID", "SandpitTextEnv", "chat_prompt", "step_metadata", "system_text"]

SKYRL_ID = "sandpit"
"""The skyrl-gym id (a dataset row's ``env_class``) of `SandpitTextEnv`."""
EXTRAS_KEYS = frozenset({"scenario_id", "episode", "init_config", "seed", "max_turns"})
"""The row columns this env reads; the others (``data_source``, ``reward_spec``, ...) are
the trainer's and are ignored."""
CONFIG_KEYS = frozenset({"base_url", "api_key", "timeout", "episode", "observations"})
"""The ``env_config`` keys this env reads; others are refused (a misspelt key is an error)."""
TOOLS_INTRO = ("# Tools\n\nYou may call one of these tools per reply. Their signatures are within "
               "<tools></tools> XML tags:\n<tools>\n")
TOOLS_OUTRO = ("\n</tools>\n\nTo call a tool, reply with a JSON object holding its name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <tool-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>\nA reply without a tool call is a message to the user.")


def system_text(introduction: str | None, tools: Sequence[Mapping[str, Any]]) -> str:
    """What the model is told about the environment: its `introduction` (omitted when
    empty), then `tools` (OpenAI function schemas, one JSON object a line) inside
    ``<tools>`` tags with how to call one (``<tool_call>{"name", "arguments"}</tool_call>``,
    the format of the Hermes/Qwen chat templates, which the server's text parsing reads)."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    intro = (introduction or "").strip()
    return (f"{intro}\n\n" if intro else "") + TOOLS_INTRO + listed + TOOLS_OUTRO


def chat_prompt(prompt: object, system: str, first: str) -> list[dict[str, Any]]:
    """The chat an episode starts from: copies of the `prompt` messages (a list of chat
    messages; None for none), `system` appended (after a blank line) to the content of a
    leading ``system`` message or put first as a new one, and `first` (the task, or the
    simulated user's first message) last as a ``user`` message.

    Raises:
        TypeError: `prompt` is not a list of messages (mappings with a ``role`` string and
            a ``content`` string), e.g. a bare string.
    """
    if prompt is None:
        prompt = []
    if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
        raise TypeError(f"the prompt must be a list of chat messages, not {type(prompt).__name__}")
    messages: list[dict[str, Any]] = []
    for number, message in enumerate(prompt):
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise TypeError(f"prompt message {number} must be a mapping with 'role' and 'content' strings, "
                            f"not {str(message)[:200]!r}")
        messages.append(dict(message))
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{system}" if messages[0]["content"] else system
    else:
        messages.insert(0, {"role": "system", "content": system})
    messages.append({"role": "user", "content": first})
    return messages


def step_metadata(info: Mapping[str, Any], observation: str, terminated: bool, truncated: bool,
                  episode: int | None, scenario_id: str | None) -> dict[str, Any]:
    """A step's ``metadata``: the step ``info`` of `sandpit.client.rl.RLEnv` (``env_id``,
    ``step``, ``status``, ``observation_role``, ``duration_ms``, ``error``, ``checks``,
    ``action``, ``argument_findings``, ``traceback``, ``recovered``, and whatever that
    `info` gains) with the ``episode`` number and ``scenario_id`` of the reset, the
    ``observation`` text (kept here when ``observations`` is ``[]`` at the end) and
    ``terminated``/``truncated`` (skyrl-gym's ``done`` is either)."""
    return {**info, "episode": episode, "scenario_id": scenario_id, "observation": observation,
            "terminated": terminated, "truncated": truncated}


def _plain(value: Any) -> Any:
    """Mappings and sequences (OmegaConf's ``DictConfig``/``ListConfig`` too) as dicts and
    lists, recursively; other values as they are."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    return value


def _settings(value: Any, what: str) -> dict[str, Any]:
    """`value` (None, a mapping or a dataclass instance) as a plain dict without None values."""
    if value is None:
        return {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping (or a dataclass), not {type(value).__name__}")
    return {k: v for k, v in _plain(value).items() if v is not None}


def _optional_mapping(settings: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = settings.get(key, {})
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}[{key!r}] must be a mapping, not {type(value).__name__}")
    return dict(value)


def _whole(settings: Mapping[str, Any], key: str, where: str, lowest: int) -> int | None:
    value = settings.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"{where}[{key!r}] must be an integer >= {lowest}, not {value!r}")
    return value


class SandpitTextEnv(BaseTextEnv):
    """One trajectory of SkyRL = one episode of a Sandpit scenario (module docstring).

    Args:
        env_config: the trainer's settings (``base_url``, ``api_key``, ``timeout``,
            ``episode``, ``observations``); None, a mapping, a ``DictConfig`` or a dataclass.
        extras: the dataset row's settings (``scenario_id``, ``episode``, ``init_config``,
            ``seed``, ``max_turns``); other keys are ignored.
        client: a `sandpit.client.Client` to use (not closed by `close`); then ``base_url``,
            ``api_key`` and ``timeout`` must not be set. None: one is made and owned.

    Raises:
        ValueError: no ``scenario_id``; an ``api_key`` or ``base_url`` in ``extras``; an
            unknown ``env_config`` key; ``max_turns`` or ``seed`` not a whole number in
            range; ``timeout`` not a positive number; ``observations`` not ``"roles"``/``"user"``;
            a client beside connection settings.
        TypeError: ``env_config``/``extras`` (or their ``episode``, ``init_config``) not mappings.
    """

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None, *,
                 client: Client | None = None) -> None:
        super().__init__()
        config = _settings(env_config, "env_config")
        row = _settings(extras, "extras")
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ValueError(f"unknown env_config keys {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        secret = {"api_key", "base_url"} & set(row)
        if secret:
            raise ValueError(f"{sorted(secret)} in extras (a dataset row): give the server in env_config or "
                             "SANDPIT_URL / SANDPIT_API_KEY instead")
        scenario_id = row.get("scenario_id")
        if not isinstance(scenario_id, str) or not scenario_id:
            raise ValueError(f"extras['scenario_id'] must name a scenario (a non-empty string), not {scenario_id!r}")
        self.observations = config.get("observations", "roles")
        if self.observations not in ("roles", "user"):
            raise ValueError(f"env_config['observations'] must be 'roles' or 'user', not {self.observations!r}")
        episode = {**_optional_mapping(config, "episode", "env_config"), **_optional_mapping(row, "episode", "extras")}
        max_turns = _whole(row, "max_turns", "extras", 1)
        if max_turns is not None:
            self.max_turns = max_turns
            episode.setdefault("max_steps", max_turns)
        self.seed = _whole(row, "seed", "extras", 0)
        init_config = _optional_mapping(row, "init_config", "extras") if "init_config" in row else None
        connection = {k: config[k] for k in ("base_url", "api_key", "timeout") if k in config}
        timeout = connection.get("timeout", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
            raise ValueError(f"env_config['timeout'] must be a positive number of seconds, not {timeout!r}")
        if client is not None and connection:
            raise ValueError(f"give a client or env_config {sorted(connection)}, not both")
        self.scenario_id: str = scenario_id
        self.episode_options = episode
        self.init_config = init_config
        self._owns_client = client is None
        self.client = client if client is not None else Client(
            connection.get("base_url"), connection.get("api_key"), timeout=float(timeout))
        self._rl: RLEnv | None = RLEnv(self.client, scenario_id, init_config=init_config, episode=episode)
        self._episode: int | None = None
        self._done = False
        self._rejected = 0
        self._truncated = False
        self._reward = 0.0

    def init(self, prompt: object) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode (the first call creates the server-side env; a later one starts
        its next episode) and return `(messages, info)`: the chat to generate from
        (`chat_prompt`) and the reset's info (``env_id``, ``episode``, ``scenario_id``,
        ``environment_id``, ``task``, ``introduction``, ``tools``, ``episode_config``).

        Raises: TypeError for a prompt that is no list of messages (before any call);
        `SandpitError` subclasses (`Unauthorized`, `NotFound`, `InvalidRequest` for episode
        options the server refuses, `Unavailable`); RuntimeError after `close`."""
        if self._rl is None:
            raise RuntimeError("this env is closed: make a new one")
        chat_prompt(prompt, "", "")  # a malformed prompt fails before the server is asked
        observation, info = self._rl.reset(seed=self.seed)
        self._episode, self._done, self.turns = info["episode"], False, 0
        self._rejected, self._truncated, self._reward = 0, False, 0.0
        return chat_prompt(prompt, system_text(info["introduction"], info["tools"]), observation), info

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Send the model's output (any text; a structured tool call is taken too) as one
        step; returns ``BaseTextEnvStepOutput`` as the module docstring says.

        Raises: `SandpitError` subclasses for failures of Sandpit; RuntimeError before
        `init`, after the episode ended, or after `close`."""
        if self._rl is None:
            raise RuntimeError("this env is closed: make a new one")
        if self._episode is None:
            raise RuntimeError("no episode is running: call init(prompt) first")
        if self._done:
            raise RuntimeError("the episode has ended: init(prompt) starts the next one")
        observation, reward, terminated, truncated, info = self._rl.step(action)
        self.turns += 1
        self._rejected += info["status"] == "rejected"
        self._truncated, self._reward = truncated, float(reward)
        done = self._done = terminated or truncated
        role = info["observation_role"] if self.observations == "roles" else "user"
        return BaseTextEnvStepOutput(
            observations=[] if done else [{"role": role, "content": observation}], reward=float(reward), done=done,
            metadata=step_metadata(info, observation, terminated, truncated, self._episode, self.scenario_id))

    def get_metrics(self) -> dict[str, Any]:
        """The episode's numbers for SkyRL's logs (averaged over trajectories): ``steps``,
        ``rejected_steps`` (malformed outputs), ``truncated`` (1 when ``max_steps`` ended
        it), ``reward`` (the last step's)."""
        return {"steps": self.turns, "rejected_steps": self._rejected, "truncated": int(self._truncated),
                "reward": self._reward}

    def close(self) -> None:
        """Delete the server-side env and close the client if this env made it. Idempotent;
        raises `SandpitError` only when the server answers the delete with an error other
        than `NotFound`."""
        rl, self._rl = self._rl, None
        if rl is None:
            return
        try:
            rl.close()
        finally:
            if self._owns_client:
                self.client.close()


if SKYRL_ID not in skyrl_gym.registry:
    skyrl_gym.register(SKYRL_ID, entry_point=f"{__name__}:{SandpitTextEnv.__name__}")
