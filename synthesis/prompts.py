"""Versioned prompt templates (data files in ``synthesis/prompts/``).

A template is ``prompts/<name>.v<version>.md``: the text before a line ``----- user -----``
is the system message, the text after it the user message. Placeholders are
:class:`string.Template` names (``$task``, ``${class_name}``; a literal dollar is ``$$``),
so JSON and code in templates need no escaping. The first line of every system message is
``# sandpit-prompt <name> v<version>``: it names the step in logs, in the cache and for
scripted test servers. Changing a template means adding the next version file and bumping
:data:`VERSIONS` — cached answers of the old version are then never reused.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

SPLIT = "----- user -----"

VERSIONS: dict[str, int] = {
    "judge_stateful": 1,
    "infer_environment": 1,
    "state_space": 1,
    "class_definition": 1,
    "operations": 1,
    "method_code": 1,
    "test_configs": 1,
    "test_agent": 1,
    "judge_call": 1,
    "init_configs": 1,
    "scenario_task": 1,
    "checklist": 1,
    "check_function": 1,
    "retry": 1,
}
"""Template name -> the version the pipeline uses."""


HEADER = "# sandpit-prompt "
"""How every system message starts (then the name and the version)."""


def prompt_name(messages: Sequence[dict[str, Any]]) -> str:
    """The template name in the ``# sandpit-prompt <name>`` header of the first message,
    else ``"?"`` (model usage is counted per name)."""
    first = str(messages[0].get("content") or "") if messages else ""
    if first.startswith(HEADER):
        return first.split()[2]
    return "?"


class PromptError(LookupError):
    """A template is missing, has no ``----- user -----`` line, or a placeholder has no value."""


@dataclass(frozen=True)
class Prompt:
    """A loaded template: ``name``, ``version``, and the two unrendered halves."""

    name: str
    version: int
    system: str
    user: str

    def messages(self, **values: Any) -> list[dict[str, str]]:
        """``[{"role": "system"}, {"role": "user"}]`` with placeholders filled (``str(value)``).

        Raises:
            PromptError: a placeholder has no value.
        """
        try:
            system = string.Template(self.system).substitute(values)
            user = string.Template(self.user).substitute(values)
        except (KeyError, ValueError) as exc:
            raise PromptError(f"prompt {self.name} v{self.version}: no value for {exc}") from None
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]


@lru_cache
def load(name: str, version: int | None = None) -> Prompt:
    """Read template ``name`` (at :data:`VERSIONS`' version unless ``version`` is given).

    Raises:
        PromptError: unknown name, missing file, or no ``----- user -----`` separator.
    """
    if version is None:
        if name not in VERSIONS:
            raise PromptError(f"unknown prompt {name!r}")
        version = VERSIONS[name]
    path = resources.files("sandpit.synthesis") / "prompts" / f"{name}.v{version}.md"
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        raise PromptError(f"prompt file {name}.v{version}.md not found") from None
    if SPLIT not in text:
        raise PromptError(f"prompt {name}.v{version}.md has no '{SPLIT}' line")
    system, user = text.split(SPLIT, 1)
    header = f"# sandpit-prompt {name} v{version}"
    if not system.startswith(header):
        raise PromptError(f"prompt {name}.v{version}.md must start with {header!r}")
    return Prompt(name, version, system.strip() + "\n", user.strip() + "\n")


def render(name: str, **values: Any) -> list[dict[str, str]]:
    """``load(name).messages(**values)``."""
    return load(name).messages(**values)
