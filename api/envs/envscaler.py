"""The ``envscaler`` episode profile: EnvScaler's RL environment, byte for byte.

EnvScaler's RL environments (``rl/roll/pipeline/agentic/env/envscaler_env``:
``EnvScalerBaseEnv`` with ``EnvScalerNonConvRLEnv`` / ``EnvScalerConvRLEnv``, and
``utils/parse_util.py``) decide what an agent sees and when an episode ends. This module
restates those rules for a server whose tools run in sandboxes; :mod:`.steps` applies them
to every step of an episode whose profile is ``envscaler`` (the ``sandpit`` profile is
Sandpit's own: :mod:`.actions`, :mod:`.rulebook`). What the profile fixes:

* the introduction (:func:`introduction_text`): ``# Environment Information`` /
  ``## Brief Introduction:`` / ``## Environment Rules / Constraints:`` with EnvScaler's
  spacing, two trailing spaces after each colon included;
* a step's action (:func:`parse_action`): raw text goes through EnvScaler's response
  parse; output it cannot structure (an unclosed ``<think>`` or ``<tool_call>``, tool-call
  JSON that does not parse or lacks ``name``/``arguments``) is
  :data:`STRUCT_PARSE_FAILED`; a structure that gives no action (nothing to say and no
  call, ``arguments`` text that is not JSON) is :data:`ACTION_PARSE_FAILED`; plain text is
  ``chat_with_user(content=text)``; ``arguments`` given as a JSON string are decoded;
* validity (:func:`validity_problem` on the host, ``hasattr`` in the sandbox): a falsy
  name, a name the instance has no attribute for (``hasattr`` decides, so ``_private``
  attributes and non-callable state attributes are actions too), arguments that are not
  an object, or ``chat_with_user`` without ``content`` give :data:`INVALID_ACTION`; the
  episode goes on;
* a tool that raises ends the episode with reward 0.0 and the observation ``Error:
  <Exception>\\n`` + the traceback (``traceback.format_exc()``), of the environment's own
  frames, which are named ``<string>`` as EnvScaler's ``exec`` names them (the sandbox
  formats it: ``child_session.envscaler_traceback``); calling a state attribute that is
  not callable raises ``TypeError`` and ends it the same way;
* ``chat_with_user`` ends a non-conversational episode (``Task finished``, the reward
  from the checks), whatever its ``content``; in a conversational one it goes to the
  simulated user (``[Agent] <content>``, any JSON value formatted as Python's ``str``);
* observation kinds: ``tool`` for a tool's result, ``user`` for everything else;
* the reward: the sum of the checks' results over their number, rounded to 4 places
  (:func:`~sandpit.api.envs.rewards.episode_reward`, the same formula).

Where EnvScaler's own ``step()`` raises instead of answering (a tool name that is not a
string, ``chat_with_user`` content that ``in`` cannot search in a non-conversational
episode), the profile answers :data:`INVALID_ACTION` / ends the episode as above; the
profile table in docs/envscaler.md lists these with every other difference from the ``sandpit``
profile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..schemas.envs import StepRequest
from .actions import INVALID_ACTION, PARSE_FAILED, THINK, THINK_OPEN, TOOL_CALL
from .rulebook import CHAT_ACTION, TASK_FINISHED

__all__ = ["ACTION_PARSE_FAILED", "CHAT_ACTION", "INVALID_ACTION", "STRUCT_PARSE_FAILED", "TASK_FINISHED",
           "EnvScalerAction", "Structured", "chat_content", "introduction_text", "parse_action", "parse_response",
           "validity_problem"]

STRUCT_PARSE_FAILED = "Error: Failed to parse response to struct response"
"""EnvScaler's observation when raw output cannot be structured (``parse_response``)."""
ACTION_PARSE_FAILED = PARSE_FAILED
"""EnvScaler's observation when a structured response gives no action (``parse_action``)."""



def introduction_text(introduction: str | None, rules: list[str] | None) -> str:
    """EnvScaler's ``construct_env_introduction``: the brief introduction (empty when
    there is none) and one ``- <rule>`` line per rule, in its exact layout."""
    rule_lines = "".join(f"- {rule}\n" for rule in rules or [])
    return (f"# Environment Information\n\n## Brief Introduction:  \n{introduction or ''}\n\n"
            f"## Environment Rules / Constraints:  \n{rule_lines}")


@dataclass(frozen=True)
class Structured:
    """EnvScaler's structured response: the first ``tool_call`` (``{"name", "arguments"}``
    as written) or None, and ``content`` (the text around it and the ``<think>`` block,
    which nothing reads further)."""

    tool_call: dict[str, Any] | None
    content: str


def parse_response(text: str) -> tuple[Structured | None, str | None]:
    """EnvScaler ``parse_response`` on raw model output: ``(structured, None)``, or
    ``(None, why)`` when the output cannot be structured (:data:`STRUCT_PARSE_FAILED`)."""
    text = text.strip()
    think = THINK.search(text)
    why = None
    if think is None and THINK_OPEN.search(text):
        why = "unclosed <think> block"
    calls = list(TOOL_CALL.finditer(text))
    first = calls[0] if calls else None
    if first is None and "<tool_call>" in text and "</tool_call>" not in text:
        why = why or "unclosed <tool_call> tag"
    if think is not None and first is not None:
        content = text[think.end():first.start()].strip()
    elif think is not None:
        content = text[think.end():].strip()
    elif first is not None:
        content = text[:first.start()].strip()
    else:
        content = text
    tool_call = None
    if first is not None:
        try:
            body = json.loads(first.group(1))
        except (ValueError, RecursionError) as exc:
            return None, why or f"the <tool_call> is not valid JSON: {str(exc)[:200]}"
        missing = [key for key in ("name", "arguments") if not isinstance(body, dict) or key not in body]
        if missing:
            return None, why or f"the <tool_call> lacks {', '.join(missing)}"
        tool_call = body
    if why is not None:
        return None, why
    return Structured(tool_call, content), None


@dataclass(frozen=True)
class EnvScalerAction:
    """An action as EnvScaler's ``step()`` has it after parsing: ``name`` and
    ``arguments`` as written (any JSON values), or ``problem`` (the observation to record:
    :data:`STRUCT_PARSE_FAILED` or :data:`ACTION_PARSE_FAILED`) with ``error`` saying why."""

    name: Any = None
    arguments: Any = None
    problem: str | None = None
    error: str | None = None


def _decoded(arguments: Any) -> tuple[Any, str | None]:
    """EnvScaler ``parse_action``'s ``json.loads`` of string arguments."""
    if not isinstance(arguments, str):
        return arguments, None
    try:
        return json.loads(arguments), None
    except (ValueError, RecursionError) as exc:
        return None, f"the arguments are not valid JSON: {str(exc)[:200]}"


def parse_action(request: StepRequest) -> EnvScalerAction:
    """The action of a step request under EnvScaler's rules (module docstring):

    * ``text``: ``parse_response``, then ``parse_action`` of the structure: a tool call
      wins over text; text alone is ``chat_with_user(content=text)``; neither is
      :data:`ACTION_PARSE_FAILED`;
    * ``function`` (an OpenAI tool call: a structured response with that one call);
    * ``name`` + ``arguments``: an action already parsed (arguments given as a JSON string
      are decoded, as ``parse_action`` does).

    Never raises."""
    if request.text is not None:
        structured, why = parse_response(request.text)
        if structured is None:
            return EnvScalerAction(problem=STRUCT_PARSE_FAILED, error=why)
        if structured.tool_call is not None:
            arguments, why = _decoded(structured.tool_call["arguments"])
            if why is not None:
                return EnvScalerAction(problem=ACTION_PARSE_FAILED, error=why)
            return EnvScalerAction(structured.tool_call["name"], arguments)
        if structured.content:
            return EnvScalerAction(CHAT_ACTION, {"content": structured.content})
        return EnvScalerAction(problem=ACTION_PARSE_FAILED, error="the reply holds neither text nor a tool call")
    name: str | None
    if request.function is not None:
        name, arguments = request.function.name, request.function.arguments
    else:
        name, arguments = request.name, request.arguments if request.arguments is not None else {}
    arguments, why = _decoded(arguments)
    if why is not None:
        return EnvScalerAction(problem=ACTION_PARSE_FAILED, error=why)
    return EnvScalerAction(name, arguments)


def validity_problem(action: EnvScalerAction) -> str | None:
    """What the host can tell of EnvScaler ``check_vaild_action`` without the instance:
    a reason the action is invalid, or None (then, unless it is ``chat_with_user``, the
    sandbox asks ``hasattr``)."""
    name, arguments = action.name, action.arguments
    if not name:
        return "the action has no name"
    if not isinstance(name, str):
        return f"the action's name is a {type(name).__name__}, not a string"
    if not isinstance(arguments, dict):
        return f"arguments must be an object, got {type(arguments).__name__}"
    if name == CHAT_ACTION and "content" not in arguments:
        return "chat_with_user needs the argument 'content'"
    return None


def chat_content(arguments: dict[str, Any]) -> str:
    """The ``content`` of ``chat_with_user`` as EnvScaler formats it into a message
    (``f"{content}"``: Python's ``str`` of whatever JSON value it is)."""
    return f"{arguments['content']}"
