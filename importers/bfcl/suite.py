"""The BFCL multi-turn base set (``multi_turn_base``) as Sandpit environments and
episodes: :func:`load_suite` reads the dataset, its ground truth and the tool classes from
the wheel and builds one composite environment per combination of classes
(:mod:`.codegen`) and one :class:`BfclEpisode` per dataset entry (calls parsed by
:mod:`.calls`)."""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calls import JsonValue, ToolCall, parse_call
from .codegen import CONFIG_KEY, BfclEnvironment, ModuleIndex, build, environment_name
from .errors import BfclImportError
from .wheel import (
    ANSWER_MEMBER,
    BACKEND_CONFIG_MEMBER,
    BFCL_VERSION,
    DATASET_MEMBER,
    WheelReader,
    backend_config,
    json_lines,
)

__all__ = ["BfclEpisode", "BfclSuite", "load_suite"]


@dataclass(frozen=True, slots=True)
class BfclEpisode:
    """One dataset entry with its ground truth.

    Attributes:
        id: BFCL's id, e.g. ``"multi_turn_base_0"``.
        environment_name: the :class:`BfclEnvironment` it runs in.
        init_config: ``{"_bfcl": {class name: that class's scenario}}`` for every
            involved class (``{}`` where the dataset gives none); ``BfclEnv(init_config)``.
        turns: per user turn, the ground-truth calls in order (a turn may be empty).
        questions: per user turn, BFCL's messages (``{"role": ..., "content": ...}``).
        excluded_functions: BFCL's ``excluded_function`` list (tools withheld from the
            model in that entry; BFCL's own code does not use it in this release).
    """

    id: str
    environment_name: str
    init_config: dict[str, JsonValue]
    turns: tuple[tuple[ToolCall, ...], ...]
    questions: tuple[tuple[dict[str, JsonValue], ...], ...]
    excluded_functions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BfclSuite:
    """Everything :func:`load_suite` extracts from one wheel.

    Attributes:
        version: the ``bfcl-eval`` release (:data:`BFCL_VERSION`).
        environments: environment name -> environment, sorted by name.
        episodes: in dataset order.
    """

    version: str
    environments: dict[str, BfclEnvironment]
    episodes: tuple[BfclEpisode, ...]


# -- loading ---------------------------------------------------------------------------------
def load_suite(wheel: Path) -> BfclSuite:
    """Read the multi-turn base dataset, its ground truth and the tool classes from the
    wheel (as a zip; nothing in it is imported or executed) and build the suite.

    Args:
        wheel: path of the ``bfcl-eval`` wheel (see :func:`.wheel.fetch_wheel`).

    Returns:
        A :class:`BfclSuite`: one environment per distinct ``involved_classes``
        combination, one episode per dataset entry (200 in this release).

    Raises:
        BfclImportError: the wheel is not a readable zip or lacks a member; a dataset line
            is not the expected JSON; an entry has no ground truth (or the turn counts
            differ); a class is unknown to BFCL's class -> module mapping, or its source
            uses something the composite cannot reproduce (see :func:`.codegen.build_environment`);
            any ground-truth call fails :func:`.calls.parse_call`.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            reader = WheelReader(archive)
            entries = json_lines(reader.text(DATASET_MEMBER), DATASET_MEMBER)
            answers = json_lines(reader.text(ANSWER_MEMBER), ANSWER_MEMBER)
            class_modules, stateless = backend_config(reader.text(BACKEND_CONFIG_MEMBER))
            truth = _ground_truth_by_id(answers)
            combos = sorted({_involved(entry) for entry in entries})
            index = ModuleIndex(reader.module_source)
            environments: dict[str, BfclEnvironment] = {}
            for classes in combos:
                env = build(classes, class_modules, stateless, index)
                environments[env.name] = env
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, OSError) as exc:
        raise BfclImportError(f"{wheel} is not a readable wheel: {exc}") from exc
    episodes = tuple(_episode(entry, truth, environments) for entry in entries)
    return BfclSuite(version=BFCL_VERSION, environments=environments, episodes=episodes)


def _involved(entry: dict[str, Any]) -> tuple[str, ...]:
    classes = entry.get("involved_classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise BfclImportError(f"episode {entry['id']}: involved_classes is not a non-empty list of names")
    return tuple(sorted(set(classes)))


def _ground_truth_by_id(answers: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    truth: dict[str, list[list[str]]] = {}
    for row in answers:
        turns = row.get("ground_truth")
        if not isinstance(turns, list) or not all(
                isinstance(turn, list) and all(isinstance(call, str) for call in turn) for turn in turns):
            raise BfclImportError(f"episode {row['id']}: ground_truth is not a list of lists of call strings")
        truth[row["id"]] = turns
    return truth


def _episode(entry: dict[str, Any], truth: dict[str, list[list[str]]],
             environments: dict[str, BfclEnvironment]) -> BfclEpisode:
    episode_id = entry["id"]
    classes = _involved(entry)
    env = environments[environment_name(classes)]
    if episode_id not in truth:
        raise BfclImportError(f"episode {episode_id} has no ground truth")
    questions = entry.get("question")
    if not isinstance(questions, list) or not all(isinstance(turn, list) for turn in questions):
        raise BfclImportError(f"episode {episode_id}: question is not a list of turns")
    if len(questions) != len(truth[episode_id]):
        raise BfclImportError(f"episode {episode_id}: {len(questions)} user turns but "
                              f"{len(truth[episode_id])} ground-truth turns")
    initial = entry.get("initial_config") or {}
    if not isinstance(initial, dict) or not all(isinstance(initial.get(c, {}), dict) for c in classes):
        raise BfclImportError(f"episode {episode_id}: initial_config is not an object of objects")
    excluded = entry.get("excluded_function") or []
    if not isinstance(excluded, list) or not all(isinstance(name, str) for name in excluded):
        raise BfclImportError(f"episode {episode_id}: excluded_function is not a list of names")
    turns = tuple(tuple(parse_call(call, env.signatures, episode_id=episode_id) for call in turn)
                  for turn in truth[episode_id])
    return BfclEpisode(
        id=episode_id, environment_name=env.name,
        init_config={CONFIG_KEY: {name: initial.get(name, {}) for name in classes}},
        turns=turns, questions=tuple(tuple(turn) for turn in questions),
        excluded_functions=tuple(excluded))
