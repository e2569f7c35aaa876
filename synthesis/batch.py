"""Run one stage's items concurrently and sort the outcomes into a :class:`StageOutput`.

An item ends as one of:

* finished: the function returned a record (``items``), or several; a returned
  :class:`Rejection` is a rejected sub-item (e.g. one scenario of an environment);
* rejected: it raised :class:`Rejected` (``rejected``, final);
* unfinished: the model endpoint or the Sandpit API was unavailable (``errors``; the stage
  is ``partial`` and a rerun resumes it). Any other exception is a bug in the pipeline and
  propagates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pydantic import BaseModel
from sandpit.client import InvalidResponse, RateLimited, SandpitConnectionError, ServerError, Unavailable
from sandpit.client.llm import ModelError

from .records import ItemError, Rejected, Rejection, StageOutput

T = TypeVar("T")

TRANSIENT_API_ERRORS = (SandpitConnectionError, Unavailable, RateLimited, ServerError, InvalidResponse)
"""Sandpit client errors that are not the generated code's fault (the item is resumable)."""


def run_items(items: Sequence[T], key: Callable[[T], str], fn: Callable[[T], BaseModel | Sequence[BaseModel]], *,
              concurrency: int, on_item: Callable[[], None] | None = None) -> StageOutput:
    """Apply ``fn`` to every item with at most ``concurrency`` in parallel; outcomes in
    input order. ``fn`` may return one record or several. ``on_item`` is called after each."""
    outcomes: list[tuple[str, object]] = []

    def one(item: T) -> tuple[str, object]:
        try:
            return "ok", fn(item)
        except Rejected as exc:
            return "rejected", Rejection(key=key(item), reason=exc.reason, detail=exc.detail[:2000])
        except ModelError as exc:
            return "error", ItemError(key=key(item), error=str(exc)[:2000])
        except TRANSIENT_API_ERRORS as exc:
            return "error", ItemError(key=key(item), error=f"sandpit api: {exc}"[:2000])
        finally:
            if on_item is not None:
                on_item()

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="synth") as workers:
        outcomes = list(workers.map(one, items))
    output = StageOutput()
    for kind, value in outcomes:
        if kind == "ok":
            for record in [value] if isinstance(value, BaseModel) else value if isinstance(value, list | tuple) else []:
                if isinstance(record, Rejection):
                    output.rejected.append(record)
                elif isinstance(record, BaseModel):
                    output.items.append(record.model_dump(mode="json"))
        elif isinstance(value, Rejection):
            output.rejected.append(value)
        elif isinstance(value, ItemError):
            output.errors.append(value)
    return output
