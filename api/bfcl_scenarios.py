"""BFCL episodes as Sandpit scenarios, so BFCL can be scored by replay and rollout
evaluations (``/v1/evaluations``).

BFCL multi-turn scores a model by its *state*: after the model's calls, every involved
class instance must equal the instance the ground-truth calls produce. Here the ground
truth is replayed through the API (:func:`~.bfcl_replay.replay_episode`), the resulting
stored state is read back, and each state attribute becomes one checklist item with a
check function ``final_state[attr] == <ground truth value>``.

Limit: BFCL's class instances are not JSON, so Sandpit stores them as opaque pickles and
check functions see ``{"$opaque": "pickle", "bytes": n}``; their check compares that
placeholder, i.e. the pickled size. That catches most divergent trajectories (a missing
or different state-changing call changes the instance) but not a change that keeps the
pickle the same size. JSON attributes are compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from .bfcl import BfclEpisode, BfclSuite
from .bfcl_replay import replay_episode
from .client import Client, SandpitError, every_item

MAX_TASK_CHARS = 20_000


@dataclass
class BfclScenario:
    """The scenario made for one episode, or why none was."""

    episode: BfclEpisode
    scenario_id: str | None = None
    error: str | None = None


def task_text(episode: BfclEpisode) -> str:
    """The episode's user turns as one task (``Turn k: ...`` lines)."""
    lines = []
    for number, turn in enumerate(episode.questions, 1):
        said = " ".join(str(m.get("content", "")) for m in turn if m.get("role") == "user")
        if said:
            lines.append(f"Turn {number}: {said}")
    return "\n".join(lines)[:MAX_TASK_CHARS]


def checklist(state: dict[str, Any]) -> list[dict[str, str]]:
    """One ``{check_item, check_func}`` per state attribute (EnvScaler checklist shape):
    the attribute must equal its ground-truth value (``repr`` of JSON is a Python literal)."""
    items = []
    for name in sorted(state):
        value = state[name]
        opaque = isinstance(value, dict) and "$opaque" in value
        item = f"{name} matches BFCL's ground-truth final state" + (" (pickled size)" if opaque else "")
        func = (f"def check_func(final_state):\n    expected = {value!r}\n"
                f"    return final_state.get({name!r}) == expected\n")
        items.append({"check_item": item, "check_func": func})
    return items


def ground_truth_state(client: Client, episode: BfclEpisode, environment_id: str) -> dict[str, Any]:
    """Replay the ground truth in a fresh env and return the *stored* final state (what
    check functions see). Raises SandpitError when the replay fails."""
    replay = replay_episode(client, episode, environment_id, keep=True)
    if replay.error is not None or replay.env_id is None:
        raise SandpitError(replay.error or "replay failed")
    handle = client.envs.get(replay.env_id)
    try:
        fork = handle.fork(count=1)[0]  # a fork has no session yet: its state is read from storage
        try:
            return fork.state()
        finally:
            fork.delete()
    finally:
        handle.delete()


def make_scenarios(client: Client, suite: BfclSuite, environment_ids: dict[str, str], *, concurrency: int = 4,
                   limit: int | None = None,
                   on_episode: Callable[[BfclScenario], None] | None = None) -> list[BfclScenario]:
    """A scenario per episode (``external_id`` = BFCL's id), reusing ones that exist.
    API errors are reported per episode, never raised."""
    existing = {s.external_id: s.id for s in every_item(client.scenarios.list) if s.external_id}
    episodes = list(suite.episodes[:limit] if limit else suite.episodes)

    def one(episode: BfclEpisode) -> BfclScenario:
        if episode.id in existing:
            return BfclScenario(episode, existing[episode.id])
        environment_id = environment_ids[episode.environment_name]
        try:
            state = ground_truth_state(client, episode, environment_id)
            created = client.scenarios.create({
                "environment_id": environment_id, "task": task_text(episode) or episode.id,
                "init_config": episode.init_config, "checklist": [c["check_item"] for c in checklist(state)],
                "checklist_with_func": checklist(state), "external_id": episode.id})
            return BfclScenario(episode, created.id)
        except SandpitError as exc:
            return BfclScenario(episode, error=f"{type(exc).__name__}: {exc}")

    results = []
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as workers:
        for future in as_completed([workers.submit(one, episode) for episode in episodes]):
            result = future.result()
            results.append(result)
            if on_episode is not None:
                on_episode(result)
    return sorted(results, key=lambda r: episodes.index(r.episode))


def replay_items(scenarios: list[BfclScenario], drop_last_call: bool = False) -> list[dict[str, Any]]:
    """The ``replay`` evaluation input: ``{scenario_id, tool_calls}`` per scenario, the
    tool calls being the episode's ground truth (all turns in order). ``drop_last_call``
    removes each episode's last call (a deliberately wrong trajectory, for checking that
    the checks notice)."""
    items = []
    for made in scenarios:
        if made.scenario_id is None:
            continue
        calls = [{"name": c.name, "arguments": c.arguments} for turn in made.episode.turns for c in turn]
        if drop_last_call and calls:
            calls = calls[:-1]
        items.append({"scenario_id": made.scenario_id, "tool_calls": calls})
    return items
