"""Recorded episodes of an EnvScaler release, run twice and compared (``sandpit rl envscaler``).

A release directory holds the files ``sandpit import envscaler`` reads plus recorded model
output:

* ``environments.json``: environment records (:mod:`sandpit.importers.envscaler_files`
  shapes: a JSON list, an object keyed by id, fields as JSON or JSON text);
* ``rl_scenarios.json``: RL scenario records (``task_id``, ``env_id``, ``task``,
  ``init_config``, ``checklist_with_func``);
* ``episodes.jsonl``: one recorded episode a line, ``{"task_id": str, "outputs": [str, ...],
  "seed": int (optional), "note": str (optional)}``: the raw text a model wrote at each
  turn (``<think>...</think>`` and ``<tool_call>{"name", "arguments"}</tool_call>``, or a
  plain reply), and the ``reset`` seed it was recorded with.

Each episode runs

1. through the GEM env ``sandpit:envscaler_non_conv_env`` (:class:`SandpitNonConvEnv`, the
   server's ``envscaler`` episode profile) on the scenario ``sandpit import envscaler``
   made of the task: the one whose environment is named ``envscaler:<env_id>`` and holds
   the record's code, tools, introduction and rules, whose ``external_id`` is the task id
   and whose task, ``init_config`` and checks are the record's (content hashes, as the
   importer reuses items); and
2. through EnvScaler's RL-environment rules restated in
   ``sandbox_images/envscaler/reference.py``, inside a sandbox (``POST /v1/execute``: the
   module and the environment code are sent as files and text, never run here), with the
   environment record and the scenario as EnvScaler loads them (JSON text decoded).

Then the two are compared: the introduction, the tools the agent is shown, the first
observation, and at every step the observation text, its kind (``user``/``tool``),
termination and reward. Steps stop at the end of the episode; recorded outputs after it
are not sent. Nothing here runs environment or check code on the host.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandpit.client import Client, SandpitError, every_item
from sandpit.client.errors import SandpitConnectionError, Unauthorized
from sandpit.client.models import Page, Scenario

from .envscaler import (
    MAX_EXTERNAL_ID,
    PROFILE,
    code_sha256,
    environment_hash,
    environment_hash_of,
    environment_name,
    scenario_hash,
    scenario_hash_of,
)
from .envscaler_files import (
    EnvironmentRecord,
    EnvScalerFileError,
    ScenarioRecord,
    environment_record,
    json_field,
    read_records,
    scenario_record,
)

__all__ = ["ENVIRONMENTS_FILE", "EPISODES_FILE", "REFERENCE_FILES", "SCENARIOS_FILE", "EpisodeParity",
           "RecordedEpisode", "Release", "ReleaseEnvironment", "ReleaseError", "Totals", "compare", "find_scenarios",
           "gem_episode", "load_release", "reference_episode", "reference_files", "run_episode", "run_release"]

ENVIRONMENTS_FILE = "environments.json"
SCENARIOS_FILE = "rl_scenarios.json"
EPISODES_FILE = "episodes.jsonl"
MAX_OUTPUTS = 1000
"""Recorded outputs per episode (more refuses the line)."""
REFERENCE_FILES = {**{f"sandpit_runner/{name}": f"runner/{name}"
                      for name in ("__init__.py", "limits.py", "child_codec.py", "child_render.py")},
                   "envscaler_reference.txt": "envscaler/reference.py"}
"""The reference job's files: name in the job -> path under the sandbox image definition
(``sandpit.sandbox_images.DEFINITION_DIR``): the reference and the runner modules it needs,
as the runner's package (``child_render`` renders states as Sandpit serves them)."""
_REFERENCE_SCRIPT = '''\
import json, sys, types


def load(name, path, filename=None):
    module = types.ModuleType(name)
    sys.modules[name] = module
    with open(path, encoding="utf-8") as handle:
        exec(compile(handle.read(), filename or path, "exec"), module.__dict__)
    return module


sys.path.insert(0, ".")  # the job's files hold the runner's package
from sandpit_runner import child_render as render
reference = load("envscaler_reference", "envscaler_reference.txt", "envscaler_reference.py")
job = json.loads(sys.stdin.read())
out = reference.run(job["source"], job["class_name"], job["record"], job["scenario"], job["requests"],
                    render.render, seed=job["seed"])
sys.stdout.write(json.dumps(out))
'''
"""Runs in the sandbox: imports the runner's rendering and loads the reference from the
job's files, and runs one episode (the job itself comes on stdin). The reference's code is
compiled under the name ``envscaler_reference.py``, whose ``File`` lines it cuts from
tracebacks, but its file is ``envscaler_reference.txt``: with no file of the compiled name to
read, a traceback prints no source line under those frames either, which would survive the
cut."""


class ReleaseError(ValueError):
    """A release directory lacks a file, or a file is not in its shape (the message names
    the file, and the line of ``episodes.jsonl``)."""


@dataclass
class RecordedEpisode:
    """One line of ``episodes.jsonl``."""

    task_id: str
    outputs: list[str]
    """Raw model output, one string per turn."""
    seed: int | None = None
    """The ``reset`` seed the episode was recorded with (None: unseeded)."""
    note: str = ""
    """What the episode shows (free text)."""
    line: int = 0
    """1-based line number in ``episodes.jsonl``."""


@dataclass
class ReleaseEnvironment:
    """An environment record of the release, read."""

    record: EnvironmentRecord
    raw_tools: Any
    """``tools`` as the release has them (JSON text decoded, not rewrapped): what EnvScaler shows."""


@dataclass
class Release:
    """A release directory, read: environments by ``env_id`` (and in file order, for
    scenarios that index the list), scenarios by ``task_id`` (the first of a duplicate),
    and the recorded episodes in file order."""

    environments: dict[str, ReleaseEnvironment]
    order: list[str]
    shape: str
    """Shape of the environment file: ``list``, ``object`` or ``lines``."""
    scenarios: dict[str, ScenarioRecord]
    episodes: list[RecordedEpisode]

    def environment_of(self, scenario: ScenarioRecord) -> tuple[ReleaseEnvironment | None, str | None]:
        """The scenario's environment, resolved as the importer does (a record's
        ``env_id``, else an index into the list): ``(environment, None)`` or ``(None, why)``."""
        ref = scenario.env_ref
        if isinstance(ref, bool) or not isinstance(ref, int | str):
            return None, f"env_id must be text or an integer, got {type(ref).__name__}"
        text = str(ref).strip()
        if text in self.environments:
            return self.environments[text], None
        if self.shape != "object" and text.isdigit() and int(text) < len(self.order):
            return self.environments[self.order[int(text)]], None
        return None, f"env_id {ref!r} matches no record of {ENVIRONMENTS_FILE}"


def _episode(line: str, number: int, path: Path) -> RecordedEpisode:
    where = f"{path}:{number}"
    try:
        item = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ReleaseError(f"{where} is not JSON: {str(exc)[:200]}") from None
    if not isinstance(item, dict):
        raise ReleaseError(f"{where}: expected an object with task_id and outputs, got {type(item).__name__}")
    task_id, outputs, seed, note = item.get("task_id"), item.get("outputs"), item.get("seed"), item.get("note", "")
    if not isinstance(task_id, str) or not task_id.strip():
        raise ReleaseError(f"{where}: task_id must be non-empty text")
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str) for o in outputs):
        raise ReleaseError(f"{where}: outputs must be a non-empty list of strings (raw model output per turn)")
    if len(outputs) > MAX_OUTPUTS:
        raise ReleaseError(f"{where}: {len(outputs)} outputs; at most {MAX_OUTPUTS}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64):
        raise ReleaseError(f"{where}: seed must be an integer in [0, 2**64)")
    if not isinstance(note, str):
        raise ReleaseError(f"{where}: note must be text")
    return RecordedEpisode(task_id.strip(), outputs, seed, note, number)


def load_release(directory: Path) -> Release:
    """Read a release directory (module docstring). Records that cannot be used are kept
    (their problems refuse only the episodes that need them).

    Raises:
        ReleaseError: the directory or one of its three files is missing, a file is not
            in its shape, or a line of ``episodes.jsonl`` is not a recorded episode.
    """
    if not directory.is_dir():
        raise ReleaseError(f"{directory} is not a directory")
    missing = [name for name in (ENVIRONMENTS_FILE, SCENARIOS_FILE, EPISODES_FILE) if not (directory / name).is_file()]
    if missing:
        raise ReleaseError(f"{directory} has no {', '.join(missing)} (a release directory holds {ENVIRONMENTS_FILE}, "
                           f"{SCENARIOS_FILE} and {EPISODES_FILE})")
    try:
        shape, records = read_records(directory / ENVIRONMENTS_FILE)
        environments: dict[str, ReleaseEnvironment] = {}
        order: list[str] = []
        for raw in records:
            record = environment_record(raw)
            order.append(record.env_id)
            raw_tools = json_field(raw.value, "tools")[0] if isinstance(raw.value, dict) else None
            environments.setdefault(record.env_id, ReleaseEnvironment(record, raw_tools))
        scenarios: dict[str, ScenarioRecord] = {}
        for raw in read_records(directory / SCENARIOS_FILE)[1]:
            scenario = scenario_record(raw)
            scenarios.setdefault(scenario.task_id or f"#{scenario.index}", scenario)
    except EnvScalerFileError as exc:
        raise ReleaseError(str(exc)) from None
    path = directory / EPISODES_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"{path}: {exc}") from None
    episodes = [_episode(line, number, path) for number, line in enumerate(lines, start=1) if line.strip()]
    if not episodes:
        raise ReleaseError(f"{path} has no episodes")
    return Release(environments, order, shape, scenarios, episodes)


@dataclass
class EpisodeParity:
    """One recorded episode, run both ways.

    ``gem_reward``/``reference_reward`` are the reward of the step that ended the episode
    (None when it did not end, or did not run); ``difference`` is the first place the two
    runs differ (None: every compared value is equal); ``error`` says why the episode
    could not run on one side (no imported scenario, an API error, a failed sandbox)."""

    task_id: str
    environment: str = ""
    """``<env_id> (<class name>)``."""
    note: str = ""
    scenario_id: str | None = None
    seed: int | None = None
    gem_steps: int = 0
    reference_steps: int = 0
    gem_reward: float | None = None
    reference_reward: float | None = None
    difference: str | None = None
    error: str | None = None
    compared: int = 0
    """Values compared equal before the first difference (introduction, tools, first
    observation, then four per step)."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The GEM run's steps: ``{"observation", "role", "terminated", "reward"}``."""

    @property
    def rewards_equal(self) -> bool:
        """Both runs ended with the same reward."""
        return self.error is None and self.gem_reward is not None and self.gem_reward == self.reference_reward

    @property
    def equal(self) -> bool:
        """Both runs ran and every compared value is equal."""
        return self.error is None and self.difference is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``--json``)."""
        return {"task_id": self.task_id, "environment": self.environment, "note": self.note,
                "scenario_id": self.scenario_id, "seed": self.seed, "gem_steps": self.gem_steps,
                "reference_steps": self.reference_steps, "gem_reward": self.gem_reward,
                "reference_reward": self.reference_reward, "rewards_equal": self.rewards_equal,
                "equal": self.equal, "difference": self.difference, "error": self.error, "steps": self.steps}


def _fatal(exc: SandpitError) -> bool:
    return isinstance(exc, SandpitConnectionError | Unauthorized)


def find_scenarios(client: Client, release: Release) -> dict[str, Scenario]:
    """The tenant's scenarios that ``sandpit import envscaler`` made of the release's
    tasks, by task id (the newest when several match). Raises SandpitError."""
    wanted: dict[str, tuple[str, str]] = {}  # environment name -> (content hash, env_id)
    for env_id, entry in release.environments.items():
        record = entry.record
        if not record.problems:
            name = environment_name(env_id)
            wanted[name] = (environment_hash(name, record.class_name, code_sha256(record.code), record.tools,
                                             record.introduction, record.rules), env_id)
    env_ids: dict[str, str] = {}  # Sandpit environment id -> env_id
    for registered in every_item(client.environments.list):
        match = wanted.get(registered.name or "")
        if match is not None and environment_hash_of(registered) == match[0]:
            env_ids[registered.id] = match[1]
    hashes: dict[tuple[str, str, str], str] = {}  # (env_id, external id, content hash) -> task id
    for key, task in release.scenarios.items():
        environment = release.environment_of(task)[0] if not task.problems else None
        if environment is not None:
            digest = scenario_hash(task.task, task.init_config, task.checklist, task.checklist_with_func, PROFILE)
            hashes[(environment.record.env_id, key[:MAX_EXTERNAL_ID], digest)] = key
    found: dict[str, Scenario] = {}
    for environment_id, env_id in env_ids.items():
        listing: Callable[..., Page[Scenario]] = functools.partial(client.scenarios.list,
                                                                   environment_id=environment_id)
        for scenario in every_item(listing):
            made_of = hashes.get((env_id, scenario.external_id or "", scenario_hash_of(scenario)))
            if made_of is not None and (made_of not in found or scenario.created_at > found[made_of].created_at):
                found[made_of] = scenario
    return found


def reference_files(definition_dir: Path) -> dict[str, str]:
    """The texts of :data:`REFERENCE_FILES` under ``definition_dir`` (the caller's
    ``DEFINITION_DIR``: importers never import the sandbox image package). Raises OSError."""
    return {name: (definition_dir / path).read_text(encoding="utf-8") for name, path in REFERENCE_FILES.items()}


def reference_episode(client: Client, reference: Mapping[str, str], environment: ReleaseEnvironment,
                      scenario: ScenarioRecord, outputs: list[str], seed: int | None) -> dict[str, Any]:
    """EnvScaler's episode by the reference rules (``reference``: :func:`reference_files`),
    in a sandbox (``POST /v1/execute``): ``{"introduction", "tools", "observation":
    {"type", "content"}, "initial_state", "steps": [{"observation", "role", "terminated",
    "reward", "state_diff"}]}``.

    Raises:
        SandpitError: the API refused the job.
        RuntimeError: the sandbox did not finish the script (its status and last line of
            stderr), or its output is not the expected JSON.
    """
    record = environment.record
    job = {"source": record.code, "class_name": record.class_name, "seed": seed,
           "record": {"environment_introduction": record.introduction or "", "constraints_rules": record.rules,
                      "tools": environment.raw_tools if environment.raw_tools is not None else []},
           "scenario": {"task": scenario.task, "init_config": scenario.init_config,
                        "checklist_with_func": scenario.checklist_with_func},
           "requests": [{"text": text} for text in outputs]}
    return reference_run(client, reference, job)


def reference_run(client: Client, reference: Mapping[str, str], job: Mapping[str, Any]) -> dict[str, Any]:
    """One run of the reference rules in a sandbox (``POST /v1/execute``, the profile's time
    limit): ``job`` is ``{"source", "class_name", "seed", "record": {"environment_introduction",
    "constraints_rules", "tools"}, "scenario": {"task", "init_config", "checklist_with_func"},
    "requests": [Sandpit step bodies]}``; the answer as :func:`reference_episode` gives it.
    Raises as :func:`reference_episode`."""
    result = client.execute(_REFERENCE_SCRIPT, stdin=json.dumps(job), files=dict(reference))
    if result.status != "ok" or result.stdout_truncated:
        last = (result.stderr.strip().splitlines() or [""])[-1][:300]
        why = "its output was cut at the sandbox's cap" if result.stdout_truncated else f"status {result.status}"
        raise RuntimeError(f"the reference run failed ({why}): {last}")
    try:
        out = json.loads(result.stdout)
    except ValueError as exc:
        raise RuntimeError(f"the reference run printed no JSON: {exc}") from None
    if not isinstance(out, dict) or not isinstance(out.get("steps"), list):
        raise RuntimeError("the reference run printed JSON of another shape")
    return out


def gem_episode(client: Client, scenario_id: str, outputs: list[str], seed: int | None) -> dict[str, Any]:
    """The episode through the GEM env (``SandpitNonConvEnv``, the ``envscaler`` profile):
    ``{"introduction", "tools", "observation": {"type", "content"}, "steps": [{"observation",
    "role", "terminated", "reward"}]}``. Raises SandpitError."""
    from sandpit.client.gem_env import SandpitNonConvEnv

    env = SandpitNonConvEnv(scenario_id, client=client)
    try:
        observation, info = env.reset(seed=seed, scenario_id=scenario_id)
        steps = []
        for text in outputs:
            message, reward, terminated, truncated, _ = env.step(text)
            steps.append({"observation": message["content"], "role": message["type"],
                          "terminated": bool(terminated or truncated), "reward": reward})
            if terminated or truncated:
                break
    finally:
        env.close()
    return {"introduction": info["env_introduction"], "tools": info["tools"], "observation": observation,
            "steps": steps}


def _shorten(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def compare(gem: dict[str, Any], reference: dict[str, Any]) -> tuple[str | None, int]:
    """The first difference between the two runs (None when there is none) and how many
    values were equal before it."""
    pairs: list[tuple[str, Any, Any]] = [
        ("introduction", gem["introduction"], reference["introduction"]),
        ("tools", gem["tools"], reference["tools"]),
        ("first observation", gem["observation"], reference["observation"]),
    ]
    for number, (ours, theirs) in enumerate(zip(gem["steps"], reference["steps"], strict=False), start=1):
        for key in ("observation", "role", "terminated", "reward"):
            pairs.append((f"step {number} {key}", ours[key], theirs[key]))
    for count, (what, ours, theirs) in enumerate(pairs):
        if ours != theirs:
            return f"{what}: GEM {_shorten(ours)}, reference {_shorten(theirs)}", count
    if len(gem["steps"]) != len(reference["steps"]):
        return f"steps: GEM ran {len(gem['steps'])}, reference {len(reference['steps'])}", len(pairs)
    return None, len(pairs)


def _final_reward(steps: list[dict[str, Any]]) -> float | None:
    return float(steps[-1]["reward"]) if steps and steps[-1]["terminated"] else None


def run_episode(client: Client, release: Release, episode: RecordedEpisode, scenarios: dict[str, Scenario],
                reference: Mapping[str, str], seed: int | None = None) -> EpisodeParity:
    """Run one recorded episode both ways and compare (``scenarios``: :func:`find_scenarios`;
    ``reference``: :func:`reference_files`; ``seed`` overrides the recorded one). Never
    raises for the episode's own problems (they go to ``error``); raises SandpitError when
    the server is unreachable or refuses the API key."""
    seed = episode.seed if seed is None else seed
    parity = EpisodeParity(episode.task_id, note=episode.note, seed=seed)
    scenario = release.scenarios.get(episode.task_id)
    if scenario is None:
        parity.error = f"no scenario with this task_id in {SCENARIOS_FILE}"
        return parity
    environment, why = release.environment_of(scenario)
    if environment is None:
        parity.error = why
        return parity
    parity.environment = f"{environment.record.env_id} ({environment.record.class_name})"
    problems = scenario.problems + environment.record.problems
    if problems:
        parity.error = "the release's records cannot be used: " + "; ".join(problems)[:300]
        return parity
    imported = scenarios.get(episode.task_id)
    if imported is None:
        parity.error = ("not imported: no scenario of this task and environment "
                        "(run `sandpit import envscaler --envs ... --scenarios ...` first)")
        return parity
    parity.scenario_id = imported.id
    try:
        gem = gem_episode(client, imported.id, episode.outputs, seed)
    except SandpitError as exc:
        if _fatal(exc):
            raise
        parity.error = f"GEM env: {type(exc).__name__}: {exc}"
        return parity
    parity.steps = gem["steps"]
    parity.gem_steps, parity.gem_reward = len(gem["steps"]), _final_reward(gem["steps"])
    try:
        expected = reference_episode(client, reference, environment, scenario, episode.outputs, seed)
    except SandpitError as exc:
        if _fatal(exc):
            raise
        parity.error = f"reference: {type(exc).__name__}: {exc}"
        return parity
    except RuntimeError as exc:
        parity.error = f"reference: {exc}"
        return parity
    parity.reference_steps, parity.reference_reward = len(expected["steps"]), _final_reward(expected["steps"])
    parity.difference, parity.compared = compare(gem, expected)
    return parity


def run_release(client: Client, release: Release, reference: Mapping[str, str], *, seed: int | None = None,
                scenarios: dict[str, Scenario] | None = None,
                on_episode: Callable[[EpisodeParity], None] | None = None) -> list[EpisodeParity]:
    """Every recorded episode of ``release`` (:func:`run_episode`), in file order, on
    ``scenarios`` (default: :func:`find_scenarios`) with the reference's files
    (:func:`reference_files`); ``on_episode`` is told of each as it finishes. Raises
    SandpitError (unreachable server, refused key)."""
    if scenarios is None:
        scenarios = find_scenarios(client, release)
    results: list[EpisodeParity] = []
    for episode in release.episodes:
        results.append(run_episode(client, release, episode, scenarios, reference, seed))
        if on_episode is not None:
            on_episode(results[-1])
    return results


@dataclass
class Totals:
    """Sums over a run: episodes, equal ones, steps, mean rewards (over episodes that ended)."""

    episodes: int = 0
    equal: int = 0
    rewards_equal: int = 0
    gem_steps: int = 0
    reference_steps: int = 0
    gem_rewards: list[float] = field(default_factory=list)
    reference_rewards: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, results: list[EpisodeParity]) -> Totals:
        """Totals of ``results``."""
        totals = cls(episodes=len(results), equal=sum(r.equal for r in results),
                     rewards_equal=sum(r.rewards_equal for r in results),
                     gem_steps=sum(r.gem_steps for r in results),
                     reference_steps=sum(r.reference_steps for r in results))
        totals.gem_rewards = [r.gem_reward for r in results if r.gem_reward is not None]
        totals.reference_rewards = [r.reference_reward for r in results if r.reference_reward is not None]
        return totals

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``--json``)."""
        def mean(values: list[float]) -> float | None:
            return round(sum(values) / len(values), 4) if values else None
        return {"episodes": self.episodes, "equal": self.equal, "rewards_equal": self.rewards_equal,
                "gem_steps": self.gem_steps, "reference_steps": self.reference_steps,
                "gem_mean_reward": mean(self.gem_rewards), "reference_mean_reward": mean(self.reference_rewards)}
