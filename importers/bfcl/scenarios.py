"""BFCL episodes as Sandpit scenarios, so BFCL can be scored by replay and rollout
evaluations (``/v1/evaluations``).

BFCL multi-turn scores a model by its *state*: after the model's calls, every involved
class instance must equal the instance the ground-truth calls produce, attribute by
attribute, its private (``_``) attributes left out (BFCL's state checker). Here the ground
truth is replayed through the API (:func:`~.replay.replay_episode`), the resulting
stored state is read back (its JSON view, ``$`` tags for objects and sets), and each
state attribute becomes one checklist item whose check function brings the real value it
gets (check functions see real objects) to the same plain form (:func:`plain`: objects
become ``{"__type__": name, <public attributes>}``, sets sorted lists, tuples lists, dates
ISO text) and compares its SHA-256 with the ground truth's. Private attributes such as
``_last_modified`` timestamps differ from run to run and are not compared, as in BFCL.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from sandpit.client import Client, SandpitError, every_item

from .replay import replay_episode
from .suite import BfclEpisode, BfclSuite

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


PLAIN_SOURCE = """
import base64, datetime, decimal, enum, fractions, hashlib, json, math, uuid


def _key(value):
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _plain(v, seen=()):
    if v is None or type(v) is bool:
        return v
    if isinstance(v, enum.Enum):
        return {"__enum__": v.name}
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else ("nan" if v != v else "inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, (decimal.Decimal, uuid.UUID)):
        return str(v)
    if isinstance(v, fractions.Fraction):
        return f"{v.numerator}/{v.denominator}"
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, complex):
        return [v.real, v.imag]
    if id(v) in seen:
        return "<cycle>"
    seen = seen + (id(v),)
    if isinstance(v, dict):
        keys = list(v)
        if all(type(k) is str for k in keys) and not (len(keys) == 1 and keys[0].startswith("$")):
            return {k: _plain(x, seen) for k, x in v.items()}
        return {_key(_plain(k, seen)): _plain(x, seen) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x, seen) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_plain(x, seen) for x in v), key=_key)
    attrs = getattr(v, "__dict__", None)
    if isinstance(attrs, dict):
        out = {"__type__": type(v).__name__}
        out.update((k, _plain(x, seen)) for k, x in attrs.items() if isinstance(k, str) and not k.startswith("_"))
        return out
    text = repr(v)
    return {"__repr__": text if len(text) <= 4096 else text[:4096] + "..."}


def _digest(value):
    return hashlib.sha256(_key(_plain(value)).encode("utf-8", "surrogatepass")).hexdigest()
"""
"""The plain form of a real value, as a check function computes it (our own code, run
only inside sandboxes as part of each check's source)."""


def is_tag(value: object) -> bool:
    """True when ``value`` (a state rendering) is a ``$`` tag: a one-key dict whose key
    starts with ``$`` (the rendering's rule, ``sandbox_images/runner/child_render.py``, restated
    here: an importer reads the API's JSON and imports nothing of the server's)."""
    if type(value) is not dict or len(value) != 1:
        return False
    key = next(iter(value))
    return isinstance(key, str) and key.startswith("$")


class NotComparable(ValueError):
    """A ground-truth state that was cut (a ``$truncated`` tag): no exact check can be made."""


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def plain(view: Any) -> Any:
    """The plain form (:data:`PLAIN_SOURCE`'s ``_plain``) of a state rendering: the same
    value the check computes from the real object. Raises NotComparable on ``$truncated``."""
    if isinstance(view, list):
        return [plain(x) for x in view]
    if not isinstance(view, dict):
        return view
    if not is_tag(view):
        return {k: plain(x) for k, x in view.items()}
    tag, body = next(iter(view.items()))
    if tag in ("$set", "$frozenset"):
        return sorted((plain(x) for x in body), key=_key)
    if tag == "$tuple":
        return [plain(x) for x in body]
    if tag == "$object":
        out = {"__type__": str(body.get("type", "")).rsplit(".", 1)[-1]}
        out.update((k, plain(x)) for k, x in body.get("attrs", {}).items() if not k.startswith("_"))
        return out
    if tag == "$dict":
        return {_key(plain(k)): plain(x) for k, x in body}
    if tag == "$enum":
        return {"__enum__": body.get("name")}
    if tag == "$repr":
        return {"__repr__": body.get("repr")}
    if tag == "$cycle":
        return "<cycle>"
    if tag == "$truncated":
        raise NotComparable("the ground-truth state was cut (too large or too deep) and cannot be compared")
    if tag == "$complex":
        return [plain(x) for x in body]
    return body  # dates, times, timedelta, Decimal, Fraction, UUID, bytes, non-finite floats: their text


def checklist(state: dict[str, Any]) -> list[dict[str, str]]:
    """One ``{check_item, check_func}`` per state attribute (EnvScaler checklist shape) that
    BFCL compares (public ones): the attribute's plain form must hash like the ground
    truth's. Raises NotComparable."""
    items = []
    for name in sorted(state):
        if name.startswith("_"):
            continue
        digest = hashlib.sha256(_key(plain(state[name])).encode("utf-8", "surrogatepass")).hexdigest()
        func = (f"{PLAIN_SOURCE}\n\ndef check_func(final_state):\n"
                f"    return {name!r} in final_state and _digest(final_state[{name!r}]) == {digest!r}\n")
        items.append({"check_item": f"{name} matches BFCL's ground-truth final state", "check_func": func})
    return items


def ground_truth_state(client: Client, episode: BfclEpisode, environment_id: str) -> dict[str, Any]:
    """Replay the ground truth in a fresh env and return its final state's JSON view.
    Raises SandpitError when the replay fails."""
    replay = replay_episode(client, episode, environment_id, keep=True)
    if replay.error is not None or replay.env_id is None:
        raise SandpitError(replay.error or "replay failed")
    handle = client.envs.get(replay.env_id)
    try:
        return handle.state()
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
        except (SandpitError, NotComparable) as exc:
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
