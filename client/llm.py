"""The one OpenAI-compatible model client of Sandpit: chat completions and embeddings
through the ``openai`` SDK, with tenacity retries, token usage and an optional on-disk
cache. Synthesis (``sandpit synth``), rollout evaluations and the simulated user of
conversational episodes all call models through it.

Usage::

    from sandpit.client.llm import ModelClient, ModelSettings

    settings = ModelSettings(base_url="http://127.0.0.1:8000/v1", model="qwen3-8b", retries=4)
    with ModelClient(settings, api_key) as model:
        reply = model.chat(messages, tools)      # ChatReply: content, tool_calls, tokens
        messages.append(reply.message())         # the assistant message, OpenAI format
        vectors = model.embed(["a text"], model="text-embedding-3-small")
        model.usage.as_dict()

Retries (tenacity): an answer with HTTP 408, 409, 429 or 5xx, a timeout or a connection
failure is *transient* (:func:`is_transient`; the ``openai`` SDK's own rule) and is tried
again, ``retries`` times after the first attempt, sleeping ``retry_initial_s * 2**(n-1)``
seconds (or the server's ``Retry-After`` / ``retry-after-ms`` when longer), at most
``retry_max_s``; ``should_stop()`` (when given) ends the retries early. Any other refusal
(400, 401, 404, ...) is not retried. The ``openai`` client is built with ``max_retries=0``:
its own retries use the same rule but fixed backoff constants (0.5 s doubling to 8 s) and
cannot be ended by the caller, while a cancelled rollout evaluation must stop waiting at
once (``should_stop``) and an operator sets the backoff (``retry_initial_s``,
``retry_max_s``); so tenacity owns retries. The client is built with an explicit API key
(``"EMPTY"`` when there is none, so an ``OPENAI_API_KEY`` of this process is never sent to
a caller-chosen endpoint). The key is never logged, never part of an error message and
never part of a cache key.

Exception tree (every failure of the endpoint raises one; ``status`` is the evaluation
error status)::

    ModelError              status, message
    ├── ModelUnavailable    status "model_unavailable": still transient after the retries
    └── ModelRefused        status "model_error": a refusal that is not retried, or an
                            answer without choices

Cache (``cache_dir``; off by default): each request is keyed by the SHA-256 of its
canonical JSON (:func:`request_key`: endpoint, model, messages, temperature, tools,
max_tokens when set; embeddings: model and input) and its answer stored as
``<cache_dir>/<k[:2]>/<k>.json`` (temp file + rename). A repeated request never reaches
the endpoint again, so a rerun is reproducible and resumable.

Usage: every live request, cache hit, retry and failure is counted in a :class:`Usage`
(``client.usage``, or the ``usage`` given to the call), under a lock: one client may be
shared by threads. ``max_concurrency`` bounds the requests in flight per client.

Install: ``openai`` comes with the ``llm`` extra (``pip install 'sandpit[llm]'``) and the
``server`` extra; without it, importing this module raises ``ModuleNotFoundError`` saying so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

import httpx
import tenacity

if TYPE_CHECKING:
    import openai

if importlib.util.find_spec("openai") is None:  # the default install is the HTTP client alone
    raise ModuleNotFoundError("sandpit.client.llm needs the openai SDK: pip install 'sandpit[llm]'", name="openai")


def _openai() -> Any:
    """The ``openai`` module, imported on first use: it takes about a second to import, and
    the processes that import this module (``sandpit serve``, every CLI command) mostly
    never call a model. Its presence is checked when this module is imported."""
    import openai

    return openai

__all__ = [
    "CACHE_FORMAT",
    "CHAT_COUNTERS",
    "ChatReply",
    "ModelClient",
    "ModelError",
    "ModelRefused",
    "ModelSettings",
    "ModelUnavailable",
    "ResponseCache",
    "ToolCall",
    "Usage",
    "is_transient",
    "request_key",
]

CACHE_FORMAT = 1
"""Part of every cache key; bumping it invalidates every cached answer."""
CHAT_COUNTERS = ("prompt_tokens", "completion_tokens", "requests", "retries")
"""The counters of chat requests (what a rollout evaluation stores per episode)."""
TRANSIENT_STATUSES = frozenset({408, 409, 429})
"""HTTP statuses retried besides every 5xx."""
_MAX_DETAIL_CHARS = 300

ErrorStatus = Literal["model_unavailable", "model_error"]


# --------------------------------------------------------------------------- errors


class ModelError(Exception):
    """The model endpoint failed for good.

    Attributes:
        status: ``model_unavailable`` (still transient after the retries) or
            ``model_error`` (refused, not retried; or an unusable answer).
        message: the HTTP status and the server's message (capped at 300 characters),
            never the API key.
        result: not set by this module: a slot for the caller's partial result (the
            rollout loop puts the episode so far there before re-raising).
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.result: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt without __init__: subclasses take other arguments, and errors cross
        # process boundaries (multiprocessing / Ray workers)
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


def _rebuild_error(cls: type[ModelError], args: tuple[Any, ...], state: dict[str, Any]) -> ModelError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ModelUnavailable(ModelError):
    """No answer after the retries: 408, 409, 429, 5xx, timeouts, connection failures
    (``status == "model_unavailable"``). Nothing is wrong with the request: try later."""

    def __init__(self, message: str) -> None:
        super().__init__("model_unavailable", message)


class ModelRefused(ModelError):
    """The endpoint refused the request (400, 401, 404, ...: not retried) or answered
    without choices (``status == "model_error"``)."""

    def __init__(self, message: str) -> None:
        super().__init__("model_error", message)


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: connection failures and timeouts, and answers
    with HTTP 408, 409, 429 or 5xx."""
    sdk = sys.modules.get("openai")
    if sdk is None:  # not imported yet: no exception of it exists
        return False
    if isinstance(exc, sdk.APIConnectionError):  # APITimeoutError is one
        return True
    if isinstance(exc, sdk.APIStatusError):
        return exc.status_code in TRANSIENT_STATUSES or exc.status_code >= 500
    return False


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    text = getattr(exc, "message", None) or str(exc)
    where = f"HTTP {status}" if status is not None else type(exc).__name__
    return f"{where}: {str(text)[:_MAX_DETAIL_CHARS]}"


def _retry_after(exc: BaseException | None) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, else ``retry-after`` in
    seconds), or None."""
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


# --------------------------------------------------------------------------- settings, results


@dataclass(frozen=True)
class ModelSettings:
    """How to reach and query one model (no secret: the API key is passed separately).

    Attributes:
        base_url: OpenAI-compatible endpoint including ``/v1`` (OpenAI, vLLM, ...).
        model: chat model name.
        temperature: sampling temperature; None leaves it to the server.
        max_tokens: completion token cap; None leaves it to the server.
        request_timeout_s: seconds per HTTP request (one attempt).
        retries: extra attempts after the first on transient failures (0: none).
        retry_initial_s: first backoff, seconds; doubles each retry.
        retry_max_s: cap of one backoff (and of an honoured ``Retry-After``), seconds.
        embedding_model: the model :meth:`ModelClient.embed` uses unless given one.
    """

    base_url: str
    model: str
    temperature: float | None = None
    max_tokens: int | None = None
    request_timeout_s: float = 60.0
    retries: int = 4
    retry_initial_s: float = 1.0
    retry_max_s: float = 30.0
    embedding_model: str | None = None

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, not {self.retries}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, not {self.request_timeout_s}")


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made; ``arguments`` is the raw JSON string it sent
    (judging it is the caller's business: it may not parse)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatReply:
    """One chat-completion answer.

    Attributes:
        content: the text as the model sent it (None when it sent none, e.g. only tool calls).
        tool_calls: function calls, in order.
        prompt_tokens, completion_tokens: what the endpoint's ``usage`` reported (0 if nothing).
        cached: True when the answer came from the on-disk cache.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False

    @property
    def text(self) -> str:
        """``content``, or ``""`` when there is none."""
        return self.content or ""

    def message(self) -> dict[str, Any]:
        """The assistant message for the next request (``role``, ``content``, and
        ``tool_calls`` in OpenAI format when there are any)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return out


@dataclass
class Usage:
    """Counts of a client, an episode or a run (add them up with :meth:`add`).

    Attributes:
        requests: live requests answered (chat and embeddings; cache hits excluded).
        prompt_tokens, completion_tokens: chat tokens the endpoint reported.
        embedding_tokens: embedding tokens the endpoint reported.
        cached: answers served from the on-disk cache.
        retries: failed attempts that were retried.
        failed: requests that raised :class:`ModelError`.
        by_prompt: live chat requests per ``label`` (only labelled calls are counted).
    """

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    cached: int = 0
    retries: int = 0
    failed: int = 0
    by_prompt: dict[str, int] = field(default_factory=dict)

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to these."""
        for item in fields(self):
            if item.name != "by_prompt":
                setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))
        for label, count in other.by_prompt.items():
            self.by_prompt[label] = self.by_prompt.get(label, 0) + count

    def as_dict(self, keys: Iterable[str] | None = None) -> dict[str, Any]:
        """JSON-able copy: every counter and ``by_prompt`` (sorted), or only the integer
        counters named in ``keys`` (e.g. :data:`CHAT_COUNTERS`)."""
        if keys is not None:
            return {name: int(getattr(self, name)) for name in keys}
        out: dict[str, Any] = {item.name: getattr(self, item.name) for item in fields(self) if item.name != "by_prompt"}
        out["by_prompt"] = dict(sorted(self.by_prompt.items()))
        return out


# --------------------------------------------------------------------------- cache


def request_key(request: dict[str, Any]) -> str:
    """SHA-256 hex of the request's canonical JSON (sorted keys, no whitespace) and
    :data:`CACHE_FORMAT`."""
    canonical = json.dumps({"format": CACHE_FORMAT, **request}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    """Answers on disk, one JSON file ``<directory>/<key[:2]>/<key>.json`` per request key."""

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
        response = entry.get("response") if isinstance(entry, dict) else None
        return response if isinstance(response, dict) else None

    def put(self, key: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        """Store atomically (temp file + rename): an interrupted write leaves nothing."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"request": request, "response": response}, handle, ensure_ascii=False)
        os.replace(tmp, path)


def _reply_from_cache(stored: dict[str, Any]) -> ChatReply:
    return ChatReply(content=stored.get("content"),
                     tool_calls=tuple(ToolCall(id=str(c.get("id") or ""), name=str(c.get("name") or ""),
                                               arguments=str(c.get("arguments") or ""))
                                      for c in stored.get("tool_calls") or [] if isinstance(c, dict)),
                     prompt_tokens=int(stored.get("prompt_tokens") or 0),
                     completion_tokens=int(stored.get("completion_tokens") or 0), cached=True)


# --------------------------------------------------------------------------- client


class ModelClient:
    """Chat completions and embeddings against one OpenAI-compatible endpoint.

    Args:
        settings: endpoint, model and retry policy.
        api_key: the endpoint's key (None or empty: ``"EMPTY"``); kept only inside the
            ``openai`` client.
        cache_dir: cache answers there (see the module docstring); None: no cache.
        max_concurrency: requests in flight at once through this client; None: no bound.
        http_client: the ``httpx.Client`` the ``openai`` client uses (tests, proxies).
        client: an ``openai.OpenAI`` to use as is instead of building one (tests).

    The client is thread-safe; close it (or use it as a context manager) to release its
    connections.
    """

    def __init__(self, settings: ModelSettings, api_key: str | None = None, *, cache_dir: Path | None = None,
                 max_concurrency: int | None = None, http_client: httpx.Client | None = None,
                 client: openai.OpenAI | None = None) -> None:
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {max_concurrency}")
        self.settings = settings
        self.usage = Usage()
        self.cache = ResponseCache(cache_dir) if cache_dir is not None else None
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_concurrency) if max_concurrency else None
        self._client = client or _openai().OpenAI(base_url=settings.base_url, api_key=api_key or "EMPTY",
                                               timeout=settings.request_timeout_s, max_retries=0,
                                               http_client=http_client)

    def close(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------
    def chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
             usage: Usage | None = None, should_stop: Callable[[], bool] | None = None, *,
             label: str | None = None) -> ChatReply:
        """One chat completion.

        Args:
            messages: OpenAI chat messages.
            tools: OpenAI function schemas the model may call (none: no ``tools`` sent).
            usage: where the counts go (default :attr:`usage`).
            should_stop: polled between attempts; True ends the retries (the last failure
                is raised as :class:`ModelUnavailable`).
            label: counts this request in ``usage.by_prompt[label]`` when it is live.

        Returns:
            The :class:`ChatReply` (from the cache when there is one and it has the answer).

        Raises:
            ModelUnavailable: still transient after ``settings.retries`` retries.
            ModelRefused: a refusal (not retried), or an answer without choices.
        """
        target = usage if usage is not None else self.usage
        settings = self.settings
        request: dict[str, Any] = {"endpoint": "chat", "model": settings.model, "messages": list(messages),
                                   "temperature": settings.temperature}
        if tools:
            request["tools"] = list(tools)
        if settings.max_tokens is not None:
            request["max_tokens"] = settings.max_tokens
        key = request_key(request) if self.cache is not None else ""
        if self.cache is not None:
            stored = self.cache.get(key)
            if stored is not None:
                self._count(target, cached=1)
                return _reply_from_cache(stored)
        kwargs: dict[str, Any] = {"model": settings.model, "messages": list(messages)}
        if tools:
            kwargs["tools"] = list(tools)
        if settings.temperature is not None:
            kwargs["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            kwargs["max_tokens"] = settings.max_tokens
        response = self._call(self._client.chat.completions.create, kwargs, target, should_stop)
        prompt_tokens = (response.usage.prompt_tokens or 0) if response.usage is not None else 0
        completion_tokens = (response.usage.completion_tokens or 0) if response.usage is not None else 0
        with self._lock:
            target.requests += 1
            target.prompt_tokens += prompt_tokens
            target.completion_tokens += completion_tokens
            if label is not None:
                target.by_prompt[label] = target.by_prompt.get(label, 0) + 1
            number = target.requests
        if not response.choices:
            self._count(target, failed=1)
            raise ModelRefused("model answer has no choices")
        message = response.choices[0].message
        calls = []
        for index, call in enumerate(message.tool_calls or []):
            function = getattr(call, "function", None)
            if function is None:  # a custom (non-function) tool call: not ours to run
                continue
            calls.append(ToolCall(id=call.id or f"call_{number}_{index}", name=function.name or "",
                                  arguments=function.arguments or ""))
        reply = ChatReply(content=message.content, tool_calls=tuple(calls), prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens)
        if self.cache is not None:
            self.cache.put(key, request, {"content": reply.content,
                                          "tool_calls": [c.__dict__ for c in reply.tool_calls],
                                          "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens})
        return reply

    def embed(self, texts: Sequence[str], *, model: str | None = None, usage: Usage | None = None) -> list[list[float]]:
        """Embeddings of ``texts``, in order (one request; cached per batch).

        Args:
            model: the embedding model (default ``settings.embedding_model``).
            usage: where the counts go (default :attr:`usage`).

        Raises:
            ValueError: no model given and ``settings.embedding_model`` is None.
            ModelUnavailable, ModelRefused: as :meth:`chat`.
        """
        name = model or self.settings.embedding_model
        if not name:
            raise ValueError("no embedding model: pass model= or set ModelSettings.embedding_model")
        target = usage if usage is not None else self.usage
        request = {"endpoint": "embeddings", "model": name, "input": list(texts)}
        key = request_key(request) if self.cache is not None else ""
        if self.cache is not None:
            stored = self.cache.get(key)
            if stored is not None and isinstance(stored.get("vectors"), list):
                self._count(target, cached=1)
                return [[float(x) for x in vector] for vector in stored["vectors"]]
        response = self._call(self._client.embeddings.create, {"model": name, "input": list(texts)}, target, None)
        vectors = [[float(x) for x in item.embedding] for item in sorted(response.data, key=lambda d: d.index)]
        if self.cache is not None:
            self.cache.put(key, request, {"vectors": vectors})
        self._count(target, requests=1, embedding_tokens=response.usage.total_tokens if response.usage else 0)
        return vectors

    # -- helpers -------------------------------------------------------------------------
    def _count(self, usage: Usage, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(usage, name, getattr(usage, name) + value)

    def _wait(self, state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = self.settings.retry_initial_s * 2 ** (state.attempt_number - 1)
        return float(min(max(backoff, _retry_after(exc) or 0.0), self.settings.retry_max_s))

    def _call(self, fn: Callable[..., Any], kwargs: dict[str, Any], usage: Usage,
              should_stop: Callable[[], bool] | None) -> Any:
        attempts = self.settings.retries + 1

        def stop(state: tenacity.RetryCallState) -> bool:
            return state.attempt_number >= attempts or (should_stop is not None and should_stop())

        def before_sleep(_state: tenacity.RetryCallState) -> None:
            self._count(usage, retries=1)

        retrying = tenacity.Retrying(retry=tenacity.retry_if_exception(is_transient), stop=stop, wait=self._wait,
                                     before_sleep=before_sleep, reraise=True)
        try:
            if self._slots is None:
                return retrying(fn, **kwargs)
            with self._slots:
                return retrying(fn, **kwargs)
        except _openai().OpenAIError as exc:
            self._count(usage, failed=1)
            if is_transient(exc):
                raise ModelUnavailable(f"model endpoint unavailable after {self.settings.retries} retries: "
                                       f"{_describe(exc)}") from None
            raise ModelRefused(f"model endpoint refused the request: {_describe(exc)}") from None
