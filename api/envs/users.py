"""The simulated user of a conversational episode: EnvScaler's user agent over an
OpenAI-compatible chat endpoint.

The user model gets the task in its system prompt (:data:`USER_SYSTEM_PROMPT`) and the
agent's ``chat_with_user`` contents as user messages; its answers follow ``# Thought:``
/ ``# Reply:`` and only the reply is shown to the agent (:func:`parse_user_reply`).
:data:`STOP_TOKEN` in an answer ends the episode. :class:`UserSimulator` keeps the whole
chat (``messages``) so the caller can store it with the episode and a restart loses
nothing. Model calls go through :class:`sandpit.client.llm.ModelClient` (retries, the key
never logged); which endpoint and key an episode may use is
:mod:`sandpit.api.services.model_endpoints`'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sandpit.client.llm import ModelClient, ModelError, ModelSettings, Usage

STOP_TOKEN = "###STOP###"  # noqa: S105 - a marker, not a password
"""What the simulated user says when the task is done (EnvScaler's user agent)."""
USER_FIRST_PROMPT = "[Agent] Hi! How can I help you today?"
"""The agent's opening line shown to the simulated user (EnvScaler's user agent opens
the conversation this way)."""
USER_PARSE_ATTEMPTS = 3
"""Times the simulated user is asked again when its answer lacks the reply section."""
MAX_USER_MESSAGES = 400
"""Most messages kept in a conversational episode's user transcript."""


@dataclass(frozen=True)
class UserModel:
    """Where the simulated user's model is (no secret here: the key travels separately)."""

    model: str
    base_url: str
    temperature: float | None = None
    request_timeout_s: float = 60.0
    key_source: str = "none"
    """``request`` (given with the episode, stored encrypted), ``tenant`` (the tenant's
    stored key; only ever sent to the tenant's own endpoint) or ``none``."""


USER_SYSTEM_PROMPT = """You play a person who wants an AI assistant to get something done for you.

What you want done:
{task}

How to behave:
- Speak like a real user in a chat: short, natural messages. Never paste the whole goal at once; \
reveal what the assistant needs step by step, when it asks or when it is the natural next thing.
- Stay within the goal above. Do not invent requirements, names, numbers or other facts that \
are not in it, and keep names, identifiers and key words exactly as written there.
- If the assistant offers choices, accept only those that fit the goal; otherwise restate what \
you need.
- When everything in the goal has been done, answer with exactly {stop} and nothing else.

Answer in this format every time:
# Thought:
<your private reasoning; the assistant never sees it>
# Reply:
<the message the assistant sees>"""
_REPLY = re.compile(r"#\s*Thought:\s*(.*?)\s*#\s*Reply:\s*(.*)", re.DOTALL)


def parse_user_reply(text: str) -> str | None:
    """The visible part of the simulated user's answer: :data:`STOP_TOKEN` when it holds
    one, the text after ``# Reply:``, or None when the format is not followed."""
    if STOP_TOKEN in text:
        return STOP_TOKEN
    match = _REPLY.search(text)
    if match is None:
        return None
    reply = match.group(2).strip()
    return reply or None


class UserSimulator:
    """EnvScaler's user agent over an OpenAI-compatible endpoint (``openai`` client with
    retries, :class:`sandpit.client.llm.ModelClient`). ``messages`` is the whole chat as the user
    model sees it (system; ``user`` = the agent's words, ``assistant`` = the user's); the
    caller stores it with the episode so the conversation survives a restart.

    Raises :class:`sandpit.client.llm.ModelError` (endpoint unavailable after retries, or refused)."""

    def __init__(self, model: UserModel, api_key: str | None, messages: list[dict[str, Any]] | None = None) -> None:
        self.model = model
        self.api_key = api_key
        self.messages: list[dict[str, Any]] = list(messages or [])
        self.usage = Usage()

    def _client(self) -> ModelClient:
        return ModelClient(ModelSettings(base_url=self.model.base_url, model=self.model.model,
                                         temperature=self.model.temperature,
                                         request_timeout_s=self.model.request_timeout_s, retries=3,
                                         retry_initial_s=0.5, retry_max_s=10.0), self.api_key)

    def _turn(self) -> str:
        client = self._client()
        try:
            answer = ""
            for _ in range(USER_PARSE_ATTEMPTS):
                answer = client.chat(self.messages, [], self.usage).text
                reply = parse_user_reply(answer)
                if reply is not None:
                    self.messages.append({"role": "assistant", "content": answer})
                    return reply
            self.messages.append({"role": "assistant", "content": answer})
            return answer.strip()  # the format was never followed: the whole answer is the reply
        finally:
            client.close()

    def start(self, task: str) -> str:
        """The user's first message for ``task`` (EnvScaler ``get_init_reply``)."""
        self.messages = [{"role": "system", "content": USER_SYSTEM_PROMPT.format(task=task, stop=STOP_TOKEN)},
                         {"role": "user", "content": USER_FIRST_PROMPT}]
        return self._turn()

    def reply(self, agent_message: str) -> str:
        """The user's answer to the agent's ``chat_with_user`` content (EnvScaler ``user_step``)."""
        self.messages.append({"role": "user", "content": f"[Agent] {agent_message}"})
        if len(self.messages) > MAX_USER_MESSAGES:
            raise ModelError("model_error", f"the conversation is over {MAX_USER_MESSAGES} messages")
        return self._turn()
