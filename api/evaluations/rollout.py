"""The rollout agent loop (EnvScaler style) against an OpenAI-compatible model endpoint.

One episode: the system prompt is built from the environment's name and description
(the EnvScaler importer puts the environment introduction and its ``Rules:`` there), the
user message is the scenario's task, and the environment's tools are offered as
function-calling tools. Each tool call the model makes is executed as a step by a
caller-supplied ``execute`` function and its observation goes back as the tool message.
The loop ends when the model answers without tool calls, when ``max_steps`` tool calls
were attempted (rejected ones count, so a model repeating a bad call still stops), or
when ``should_stop()`` says so.

Model calls go through the one OpenAI-compatible client of Sandpit
(:mod:`sandpit.client.llm`: retries with backoff, ``Retry-After``, token usage, the API key
never logged); its :class:`~sandpit.client.llm.ModelError` statuses are the episode's
error statuses: ``model_unavailable`` (still transient after the retries) and
``model_error`` (refused, not retried).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandpit.client.llm import CHAT_COUNTERS, ModelClient, ModelError, ModelSettings, Usage

__all__ = ["CHAT_COUNTERS", "Execute", "ModelClient", "ModelError", "ModelSettings", "RolloutResult", "StepRecord",
           "Usage", "initial_messages", "run_episode", "system_prompt"]

SYSTEM_TEMPLATE = """You are an agent operating in the environment "{name}".

{description}

Use the provided tools to complete the user's task. Call one or more tools when you need \
information or need to change the environment's state; each tool's result is returned to \
you. When the task is complete (or cannot be completed), reply with a final message and \
no tool calls."""


@dataclass
class StepRecord:
    """One attempted tool call of an episode (a trajectory entry): ``action`` is
    ``{"name", "arguments"}`` (``arguments`` is the raw string when it was not a JSON
    object), ``status`` a step status (``ok``, ``error``, ``timeout``, ``oom``,
    ``crashed``, ``rejected``), ``duration_ms`` the sandbox time in milliseconds."""

    step: int
    action: dict[str, Any]
    observation: str
    status: str
    duration_ms: float = 0.0
    failure: str = "none"
    """The step's failure (the step result's; ``agent`` for a call refused before it ran)."""

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "observation": self.observation,
                "status": self.status, "duration_ms": self.duration_ms, "failure": self.failure}


@dataclass
class RolloutResult:
    """What :func:`run_episode` produced: the full chat ``transcript`` (system, user,
    assistant with tool calls, tool), the ``trajectory`` of attempted tool calls,
    ``usage``, and why it ended: ``stop_reason`` in ``model_stopped``, ``max_steps``,
    ``stopped`` (``should_stop``)."""

    transcript: list[dict[str, Any]]
    trajectory: list[StepRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = "model_stopped"


Execute = Callable[[int, str, Any], StepRecord]
"""``execute(step_number, tool_name, arguments) -> StepRecord``: run one tool call in the
env; ``arguments`` is what the model sent (a JSON string, usually). A malformed call (not
a tool, arguments that do not parse to an object) is the callee's to record as
``rejected``, not raised. Transient failures are the callee's to retry; a fatal one
raises and ends the episode."""


def system_prompt(name: str | None, description: str | None) -> str:
    """The EnvScaler-style system prompt: environment name, its introduction and rules
    (``description``), and how to use the tools."""
    return SYSTEM_TEMPLATE.format(name=name or "environment",
                                  description=(description or "").strip() or "(no description)")


def initial_messages(name: str | None, description: str | None, task: str) -> list[dict[str, Any]]:
    """``[system, user]``: the system prompt and the scenario's task as the user message."""
    return [{"role": "system", "content": system_prompt(name, description)}, {"role": "user", "content": task}]


def run_episode(model: ModelClient, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                execute: Execute, *, max_steps: int,
                should_stop: Callable[[], bool] = lambda: False) -> RolloutResult:
    """The agent loop (see the module docstring). ``messages`` are the initial
    ``[system, user]`` messages (extended in place into the transcript).

    Every tool call goes to ``execute`` as the model sent it (arguments unparsed), which
    records a malformed one as a ``rejected`` step whose observation goes back to the
    model as the tool result. Tool calls the model makes after ``max_steps`` was reached
    get a tool message saying they were not executed.

    Raises ModelError (the transcript so far is on ``exc.result``) and whatever
    ``execute`` raises."""
    result = RolloutResult(transcript=messages)
    while True:
        if should_stop():
            result.stop_reason = "stopped"
            return result
        try:
            reply = model.chat(messages, tools, result.usage, should_stop).message()
        except ModelError as exc:
            exc.result = result
            raise
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            result.stop_reason = "model_stopped"
            return result
        for call in calls:
            function = call["function"]
            if len(result.trajectory) >= max_steps or should_stop():
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": "Error: not executed: the episode's step limit was reached"})
                continue
            number = len(result.trajectory) + 1
            record = execute(number, function["name"], function["arguments"])
            result.trajectory.append(record)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": record.observation})
        if len(result.trajectory) >= max_steps:
            result.stop_reason = "max_steps"
            return result
