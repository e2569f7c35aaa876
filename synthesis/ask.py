"""Ask the model for a structured answer, retrying malformed ones with feedback.

A malformed answer (no code block, not JSON, a syntax error, the wrong class name...) is
answered with the ``retry`` prompt naming what was wrong, and the model tries again, up to
``attempts`` answers in all. Because each retry's request contains the previous answer and
the feedback, every request is distinct, so the on-disk cache replays the same sequence on
a rerun.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sandpit.client.llm import ModelClient

from .parsing import MalformedOutput
from .prompts import prompt_name, render
from .records import Rejected

T = TypeVar("T")


def ask(llm: ModelClient, messages: Sequence[dict[str, Any]], parse: Callable[[str], T], *, attempts: int,
        what: str) -> T:
    """``parse(answer)`` of the first well-formed answer to ``messages``.

    Args:
        parse: turns the answer text into the result; raises :class:`MalformedOutput`
            (its message is the feedback) when it cannot.
        attempts: answers asked for at most (>= 1).
        what: names the step in the rejection (``"class definition"``).

    Raises:
        Rejected: reason ``malformed output`` after ``attempts`` malformed answers.
        ModelError: the endpoint failed (not the model's fault: resumable).
    """
    history = list(messages)
    errors: list[str] = []
    for _ in range(max(1, attempts)):
        reply = llm.chat(history, label=prompt_name(history))
        try:
            return parse(reply.text)
        except MalformedOutput as exc:
            errors.append(str(exc))
            feedback = render("retry", error=str(exc))[1]
            history += [{"role": "assistant", "content": reply.text}, feedback]
    raise Rejected("malformed output", f"{what}: {len(errors)} malformed answer(s); last: {errors[-1]}")
