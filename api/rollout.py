"""The rollout agent loop (EnvScaler style) against an OpenAI-compatible model endpoint.

One episode: the system prompt is built from the environment's name and description
(the EnvScaler importer puts the environment introduction and its ``Rules:`` there), the
user message is the scenario's task, and the environment's tools are offered as
function-calling tools. Each tool call the model makes is executed as a step by a
caller-supplied ``execute`` function and its observation goes back as the tool message.
The loop ends when the model answers without tool calls, when ``max_steps`` tool calls
were attempted (rejected ones count, so a model repeating a bad call still stops), or
when ``should_stop()`` says so.

Model errors (:class:`ModelError`, ``status``):

* ``model_unavailable`` — 429, 5xx, connection failures and timeouts, after the retries
  (tenacity, exponential backoff from ``retry_initial_s``, or the server's
  ``Retry-After`` when it sends one, capped at ``retry_max_s``);
* ``model_error`` — any other refusal (400, 401, 404, ...) or an answer with no choices:
  not retried.

The ``openai`` client is built with ``max_retries=0`` (tenacity owns retries) and an
explicit API key (``"EMPTY"`` when none is configured, so a server-side
``OPENAI_API_KEY`` is never sent to a caller-chosen endpoint). The key is never logged
and never part of an error message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import tenacity

TRANSIENT = (openai.RateLimitError, openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError)
"""Errors retried with backoff (``APITimeoutError`` is an ``APIConnectionError``; listed for clarity)."""

SYSTEM_TEMPLATE = """You are an agent operating in the environment "{name}".

{description}

Use the provided tools to complete the user's task. Call one or more tools when you need \
information or need to change the environment's state; each tool's result is returned to \
you. When the task is complete (or cannot be completed), reply with a final message and \
no tool calls."""


class ModelError(Exception):
    """The model endpoint failed for good. ``status`` is ``model_unavailable`` (retries
    exhausted) or ``model_error`` (refused, not retried); ``message`` has the HTTP status
    and the server's message (capped), never the API key."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.result: RolloutResult | None = None
        """The episode so far (transcript, trajectory, usage), set by :func:`run_episode`."""


@dataclass(frozen=True)
class ModelSettings:
    """How to reach and query the model (no secrets; the key is passed separately).

    ``request_timeout_s``: seconds per HTTP request. ``retries``: extra attempts after
    the first on transient errors. ``retry_initial_s``/``retry_max_s``: backoff base and
    cap, seconds."""

    base_url: str
    model: str
    temperature: float | None = None
    max_tokens: int | None = None
    request_timeout_s: float = 60.0
    retries: int = 4
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0


@dataclass
class Usage:
    """Token totals of an episode (or a job): what the endpoint's ``usage`` reported."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    """Successful chat-completion requests."""
    retries: int = 0
    """Failed attempts that were retried."""

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "requests": self.requests, "retries": self.retries}


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

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "action": self.action, "observation": self.observation,
                "status": self.status, "duration_ms": self.duration_ms}


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


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            return float(headers["retry-after-ms"]) / 1000.0
        if headers.get("retry-after") is not None:
            return float(headers["retry-after"])
    except ValueError:
        return None
    return None


class ModelClient:
    """Chat completions with retries for one job's model settings.

    Args:
        settings: endpoint, model and retry policy.
        api_key: the model API key (None: ``"EMPTY"``); kept only inside the ``openai`` client.
        http_client: an ``httpx.Client`` to use (tests); default the ``openai`` one.
    """

    def __init__(self, settings: ModelSettings, api_key: str | None, *,
                 http_client: httpx.Client | None = None) -> None:
        self.settings = settings
        self._client = openai.OpenAI(base_url=settings.base_url, api_key=api_key or "EMPTY",
                                     timeout=settings.request_timeout_s, max_retries=0, http_client=http_client)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = self.settings.retry_initial_s * 2 ** (state.attempt_number - 1)
        hinted = _retry_after(exc) if exc is not None else None
        return min(max(backoff, hinted or 0.0), self.settings.retry_max_s)

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], usage: Usage,
             should_stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """One chat completion; returns the assistant message as a dict (``role``,
        ``content``, and ``tool_calls`` when there are any). Adds token counts and
        retries to ``usage``.

        Raises ModelError (``model_unavailable`` after ``retries`` retries of 429, 5xx,
        timeouts and connection errors; ``model_error`` for any other refusal or an
        answer without choices)."""
        kwargs: dict[str, Any] = {"model": self.settings.model, "messages": messages}
        if tools:
            kwargs["tools"] = tools
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            kwargs["max_tokens"] = self.settings.max_tokens

        def before_sleep(_state: tenacity.RetryCallState) -> None:
            usage.retries += 1

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            stop=tenacity.stop_after_attempt(self.settings.retries + 1) | tenacity.stop_when_event_set(_Flag(should_stop)),
            wait=self._wait, before_sleep=before_sleep, reraise=True)
        try:
            response = retrying(self._client.chat.completions.create, **kwargs)
        except TRANSIENT as exc:
            raise ModelError("model_unavailable", f"model endpoint unavailable after {self.settings.retries} "
                                                  f"retries: {_describe(exc)}") from None
        except openai.OpenAIError as exc:
            raise ModelError("model_error", f"model endpoint refused the request: {_describe(exc)}") from None
        usage.requests += 1
        if response.usage is not None:
            usage.prompt_tokens += response.usage.prompt_tokens or 0
            usage.completion_tokens += response.usage.completion_tokens or 0
        if not response.choices:
            raise ModelError("model_error", "model answer has no choices")
        message = response.choices[0].message
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        calls = []
        for number, call in enumerate(message.tool_calls or []):
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: not ours to run
                continue
            calls.append({"id": call.id or f"call_{usage.requests}_{number}", "type": "function",
                          "function": {"name": function.name or "", "arguments": function.arguments or ""}})
        if calls:
            out["tool_calls"] = calls
        return out


class _Flag:
    """Adapts a ``should_stop()`` callable to tenacity's event interface."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self._check = check

    def is_set(self) -> bool:
        return self._check()


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    text = getattr(exc, "message", None) or str(exc)
    where = f"HTTP {status}" if status is not None else type(exc).__name__
    return f"{where}: {str(text)[:300]}"


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
            reply = model.chat(messages, tools, result.usage, should_stop)
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
