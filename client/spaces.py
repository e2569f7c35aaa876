"""The spaces and actions of Sandpit's gymnasium adapters (:mod:`sandpit.client.rl`).

Observations are text of any Unicode characters, and actions are raw model text or a
structured tool call. gymnasium's `Text` space only admits the characters of its charset,
and a charset of every code point would cost a table of a million entries, so both spaces
are `Text` subclasses whose `contains()` admits any string within the length bounds
(`UnicodeText`; `ToolCallSpace` admits tool-call dicts and objects too) while `sample()`
draws short strings of printable ASCII. `action_body` turns any action into a step
request body, never raising: what cannot be sent becomes a stand-in call the server
records as a `rejected` step.
"""

from __future__ import annotations

import json
import string
from typing import Any

import numpy as np
from gymnasium import spaces

from .calls import NOT_A_TOOL_CALL, stand_in_body, tool_call_body

__all__ = ["MAX_ACTION_CHARS", "MAX_OBSERVATION_CHARS", "NOT_A_TOOL_CALL", "ToolCallSpace", "UnicodeText",
           "action_body", "stand_in_body"]

MAX_OBSERVATION_CHARS = 1 << 24
"""Upper length bound of observations (16 Mi characters; the server's are far shorter)."""
MAX_ACTION_CHARS = 4 * 1024 * 1024
"""Upper length bound of text actions: the server's request limit (its default byte limit
per action, 256 KiB, is lower; longer actions become stand-in rejected steps)."""
SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "

# --------------------------------------------------------------------------- spaces


class UnicodeText(spaces.Text):
    """Text of any Unicode characters, `min_length`..`max_length` of them.

    `contains(x)`: `x` is a `str` within the length bounds (any characters, unlike
    `gymnasium.spaces.Text`). `sample()`: a string of `sample_charset` characters, at most
    `sample_max_length` long unless a length is given in `mask`/`probability` (masks index
    `sample_charset`, as `Text`'s do its charset).
    """

    def __init__(self, max_length: int, *, min_length: int = 0, sample_charset: str = SAMPLE_CHARSET,
                 sample_max_length: int = 64, seed: int | np.random.Generator | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=sample_charset, seed=seed)
        if sample_max_length < 0:
            raise ValueError(f"sample_max_length must be >= 0, not {sample_max_length}")
        self.sample_max_length = sample_max_length

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            upper = min(self.max_length, max(self.min_length, self.sample_max_length))
            length = int(self.np_random.integers(self.min_length, upper + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __eq__(self, other: object, /) -> bool:
        return (type(other) is type(self) and super().__eq__(other)
                and self.sample_max_length == other.sample_max_length)

    def __hash__(self) -> int:
        return hash((type(self), self.min_length, self.max_length, self.characters, self.sample_max_length))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.min_length}, {self.max_length}, any characters)"


class ToolCallSpace(UnicodeText):
    """Actions: raw model text (a `str`, any characters) or a structured tool call
    (`{"name", "arguments"}`, an OpenAI tool call dict or SDK object, `{"text": ...}`;
    see `sandpit.client.tool_call_body`). `sample()` gives text, as a model would."""

    def contains(self, x: Any) -> bool:
        if isinstance(x, str):
            return super().contains(x)
        try:
            tool_call_body(x)
        except TypeError:
            return False
        return True


# --------------------------------------------------------------------------- actions


def action_body(action: object) -> tuple[dict[str, Any], str | None]:
    """The step request body for `action`, and why it is a stand-in (None when it is not).

    A tool call (dict, OpenAI tool call, SDK object) or text is sent as it is: the server
    judges it. Anything else (None, a number, a dict without a name...), text over
    `MAX_ACTION_CHARS` (which the server's request schema refuses outright) and an action
    that cannot be sent as UTF-8 JSON (arguments JSON cannot encode, NaN, a lone surrogate
    in the text) become a stand-in call named `NOT_A_TOOL_CALL`, which the server records
    as a `rejected` step. Never raises.
    """
    try:
        _, body = tool_call_body(action)
    except TypeError as exc:
        return stand_in_body(action, f"the action is not a tool call or text: {exc}")
    text = body.get("text")
    if isinstance(text, str) and len(text) > MAX_ACTION_CHARS:
        return stand_in_body(action, f"the action is over the server's size limit: {len(text)} characters, "
                                     f"at most {MAX_ACTION_CHARS}")
    try:  # as the transport encodes a body (httpx: ensure_ascii=False, then UTF-8)
        json.dumps(body, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return stand_in_body(action, f"the action cannot be sent as JSON: {exc}")
    return body, None
