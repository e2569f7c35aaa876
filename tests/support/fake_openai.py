"""A scripted OpenAI-compatible server for tests (never a real model, loopback only).

``ScriptedLLM(rules).start()`` serves ``POST /v1/chat/completions`` and
``POST /v1/embeddings`` on ``127.0.0.1:<free port>`` from a uvicorn thread; point the
real ``openai`` client at ``llm.base_url``. Each chat request is answered by the first
:class:`Rule` that matches it (by message content and turn); a rule may first answer
with scripted HTTP errors (``errors=[429, 500]``, once each) to exercise retries. A
request no rule matches gets 400 ``no scripted response`` (the client does not retry
it), so a test sees a missing script at once. ``llm.requests`` logs every request body.

Embeddings are deterministic: hashed word counts in 64 dimensions, L2-normalised, so
near-identical texts get cosine similarity near 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


class ToolCallScript(BaseModel):
    """A tool call the scripted assistant makes; ``arguments`` may be a dict (sent as
    JSON) or a raw string (sent as is, e.g. to script malformed JSON)."""

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Rule(BaseModel):
    """One scripted answer and when it applies.

    * ``contains``: every string must occur somewhere in the request's messages (any role).
    * ``last_contains``: every string must occur in the last message.
    * ``turn``: number of assistant messages already in the request (0 = first answer).
    * ``model``: the request's model must equal this.
    """

    contains: list[str] = Field(default_factory=list)
    last_contains: list[str] = Field(default_factory=list)
    turn: int | None = None
    model: str | None = None
    content: str | None = None
    tool_calls: list[ToolCallScript] = Field(default_factory=list)
    errors: list[int] = Field(default_factory=list)
    """HTTP statuses answered (one per matching request, in order) before the answer."""
    delay_s: float = 0.0
    """Sleep before answering (to hold a rollout mid-episode)."""


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    parts = [str(content or "")]
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        parts.append(f"{function.get('name', '')} {function.get('arguments', '')}")
    return "\n".join(parts)


def _embed(text: str, dims: int = 64) -> list[float]:
    vector = [0.0] * dims
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        vector[int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % dims] += 1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


class ScriptedLLM:
    """The server; ``rules`` are tried in order for every chat request."""

    def __init__(self, rules: list[Rule] | None = None) -> None:
        self.rules: list[Rule] = list(rules or [])
        self.requests: list[dict[str, Any]] = []
        self._errors_left: dict[int, list[int]] = {}
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = self._build()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        """Logged chat-completion request bodies."""
        return [r for r in self.requests if "messages" in r]

    def match(self, body: dict[str, Any]) -> tuple[int, Rule] | None:
        messages = body.get("messages") or []
        every = "\n".join(_text(m) for m in messages)
        last = _text(messages[-1]) if messages else ""
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        for index, rule in enumerate(self.rules):
            if rule.model is not None and body.get("model") != rule.model:
                continue
            if rule.turn is not None and rule.turn != turn:
                continue
            if all(s in every for s in rule.contains) and all(s in last for s in rule.last_contains):
                return index, rule
        return None

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.requests.append(body)
                found = self.match(body)
                if found is None:
                    return JSONResponse({"error": {"message": "no scripted response matches", "type": "invalid_request_error"}},
                                        status_code=400)
                index, rule = found
                left = self._errors_left.setdefault(index, list(rule.errors))
                status = left.pop(0) if left else None
            if rule.delay_s:
                time.sleep(rule.delay_s)  # runs in the event loop thread on purpose: one request at a time
            if status is not None:
                return JSONResponse({"error": {"message": f"scripted {status}", "type": "server_error"}},
                                    status_code=status, headers={"retry-after-ms": "10"})
            message: dict[str, Any] = {"role": "assistant", "content": rule.content}
            if rule.tool_calls:
                message["tool_calls"] = [
                    {"id": f"call_{len(self.requests)}_{n}", "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                                  else json.dumps(c.arguments)}}
                    for n, c in enumerate(rule.tool_calls)]
            prompt_tokens = sum(len(_text(m)) for m in body.get("messages") or []) // 4 + 1
            completion_tokens = len(_text(message)) // 4 + 1
            return JSONResponse({
                "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if rule.tool_calls else "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}})

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.requests.append(body)
            inputs = body.get("input")
            texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
            return JSONResponse({"object": "list", "model": body.get("model", "scripted-embed"),
                                 "data": [{"object": "embedding", "index": i, "embedding": _embed(str(t))}
                                          for i, t in enumerate(texts)],
                                 "usage": {"prompt_tokens": sum(len(str(t)) // 4 + 1 for t in texts),
                                           "total_tokens": sum(len(str(t)) // 4 + 1 for t in texts)}})

        return app

    def start(self) -> ScriptedLLM:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="scripted-llm")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted LLM server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
