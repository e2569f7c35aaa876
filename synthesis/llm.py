"""Model access: the ``openai`` client with retries, an on-disk cache and usage totals.

* Any OpenAI-compatible server (``SynthSettings.base_url``; OpenAI, vLLM, ...).
* Retries (tenacity): 408/409/429/5xx answers, timeouts and connection errors, up to
  ``settings.retries`` attempts with exponential backoff from ``retry_backoff_s``. Other
  4xx answers are not retried. What is left raises :class:`LLMUnavailable`.
* Cache: every request is keyed by the SHA-256 of its canonical JSON (endpoint, model,
  messages, temperature, tools); the answer is stored as ``<cache>/<k[:2]>/<k>.json``
  (atomic rename). A rerun with the same requests never calls the model again, so runs are
  reproducible and resumable. The API key and base URL are not part of the key.
* At most ``max_concurrency`` requests are in flight at once (one semaphore per
  :class:`LLM`); the object is safe to share between threads.
* :class:`Usage` totals prompt/completion tokens of live calls, and counts cache hits.

Exception tree::

    LLMError
    └── LLMUnavailable    the endpoint failed after retries (or refused the request)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import tenacity

from .parsing import MalformedOutput
from .settings import SynthSettings

CACHE_FORMAT = 1


class LLMError(RuntimeError):
    """Base of the model-access errors."""


class LLMUnavailable(LLMError):
    """The endpoint did not give an answer after retries (transport failure, 5xx, 429),
    or refused the request (another 4xx). The item is not judged: a rerun resumes it."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call the model made: ``arguments`` is the raw JSON string it sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatReply:
    """One chat-completion answer: text content (may be empty), tool calls, token counts."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


@dataclass
class Usage:
    """Totals of one run: live requests and their tokens, cache hits, failures."""

    requests: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    failed: int = 0
    by_prompt: dict[str, int] = field(default_factory=dict)
    """Live requests per prompt name (the ``# sandpit-prompt <name>`` header)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able copy."""
        return {"requests": self.requests, "cached": self.cached, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "embedding_tokens": self.embedding_tokens,
                "failed": self.failed, "by_prompt": dict(sorted(self.by_prompt.items()))}


def request_key(request: dict[str, Any]) -> str:
    """SHA-256 hex of the request's canonical JSON (sorted keys, no whitespace)."""
    canonical = json.dumps({"format": CACHE_FORMAT, **request}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def prompt_name(messages: Sequence[dict[str, Any]]) -> str:
    """The ``# sandpit-prompt <name>`` of the first message, else ``"?"``."""
    first = str(messages[0].get("content") or "") if messages else ""
    if first.startswith("# sandpit-prompt "):
        return first.split()[2]
    return "?"


class ResponseCache:
    """Answers on disk, one JSON file per request key (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer, or None (absent or unreadable: then it is asked again)."""
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return entry.get("response") if isinstance(entry, dict) else None

    def put(self, key: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        """Store atomically (temp file + rename), so an interrupted write leaves nothing."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"request": request, "response": response}, handle, ensure_ascii=False)
        os.replace(tmp, path)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


class LLM:
    """Chat completions and embeddings for the pipeline (see the module docstring).

    Args:
        settings: endpoint, model, temperature, retries, concurrency.
        cache_dir: where answers are cached.
        client: an ``openai.OpenAI`` to use instead of building one (tests).
    """

    def __init__(self, settings: SynthSettings, cache_dir: Path, *, client: openai.OpenAI | None = None) -> None:
        self.settings = settings
        self.cache = ResponseCache(cache_dir)
        self.usage = Usage()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_concurrency)
        self._client = client or openai.OpenAI(
            base_url=settings.base_url, api_key=settings.api_key.get_secret_value() or "EMPTY",
            timeout=settings.request_timeout_s, max_retries=0)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _count(self, **fields: int) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(self.usage, name, getattr(self.usage, name) + value)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            stop=tenacity.stop_after_attempt(self.settings.retries),
            wait=tenacity.wait_exponential(multiplier=self.settings.retry_backoff_s, max=30),
            reraise=True)
        try:
            with self._slots:
                return retrying(fn, **kwargs)
        except openai.OpenAIError as exc:
            self._count(failed=1)
            status = getattr(exc, "status_code", None)
            where = f"HTTP {status}" if status is not None else type(exc).__name__
            raise LLMUnavailable(f"model endpoint: {where}: {str(exc)[:300]}") from None

    def chat(self, messages: Sequence[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> ChatReply:
        """One chat completion (cached). ``messages`` are OpenAI chat messages; ``tools``
        OpenAI function schemas (the model may answer with tool calls).

        Raises:
            LLMUnavailable: no answer after retries, or a 4xx refusal.
            MalformedOutput: the answer has no choices.
        """
        request: dict[str, Any] = {"endpoint": "chat", "model": self.settings.model, "messages": list(messages),
                                   "temperature": self.settings.temperature}
        if tools:
            request["tools"] = tools
        key = request_key(request)
        stored = self.cache.get(key)
        if stored is not None:
            self._count(cached=1)
            return ChatReply(content=stored.get("content") or "",
                             tool_calls=tuple(ToolCall(**c) for c in stored.get("tool_calls") or []),
                             prompt_tokens=stored.get("prompt_tokens", 0),
                             completion_tokens=stored.get("completion_tokens", 0), cached=True)
        kwargs: dict[str, Any] = {"model": self.settings.model, "messages": list(messages),
                                  "temperature": self.settings.temperature}
        if tools:
            kwargs["tools"] = tools
        response = self._call(self._client.chat.completions.create, **kwargs)
        if not response.choices:
            raise MalformedOutput("the model returned no choices")
        message = response.choices[0].message
        calls = [ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
                 for c in message.tool_calls or [] if getattr(c, "function", None) is not None]
        usage = response.usage
        reply = ChatReply(content=message.content or "", tool_calls=tuple(calls),
                          prompt_tokens=usage.prompt_tokens if usage else 0,
                          completion_tokens=usage.completion_tokens if usage else 0)
        self.cache.put(key, request, {"content": reply.content,
                                      "tool_calls": [c.__dict__ for c in reply.tool_calls],
                                      "prompt_tokens": reply.prompt_tokens,
                                      "completion_tokens": reply.completion_tokens})
        name = prompt_name(messages)
        with self._lock:
            self.usage.requests += 1
            self.usage.prompt_tokens += reply.prompt_tokens
            self.usage.completion_tokens += reply.completion_tokens
            self.usage.by_prompt[name] = self.usage.by_prompt.get(name, 0) + 1
        return reply

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embeddings of ``texts`` (``settings.embedding_model``; cached per batch).

        Raises:
            LLMUnavailable: no answer after retries.
        """
        request = {"endpoint": "embeddings", "model": self.settings.embedding_model, "input": list(texts)}
        key = request_key(request)
        stored = self.cache.get(key)
        if stored is not None:
            self._count(cached=1)
            return stored["vectors"]
        response = self._call(self._client.embeddings.create, model=self.settings.embedding_model,
                              input=list(texts))
        vectors = [list(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
        self.cache.put(key, request, {"vectors": vectors})
        self._count(requests=1, embedding_tokens=response.usage.total_tokens if response.usage else 0)
        return vectors
