"""What every schema family shares: step statuses, timestamps, base URLs, the strict
request base and its integer rule."""

from __future__ import annotations

import re
import types
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

Status = Literal["ok", "error", "timeout", "oom", "crashed", "rejected"]
Failure = Literal["none", "agent", "environment", "infrastructure", "verifier"]
"""Who an outcome is to blame on (the failure taxonomy: :mod:`sandpit.api.envs.failures`,
docs/failures.md)."""
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
ArgumentChecking = Literal["off", "warn", "strict"]
PolicyName = Literal["strict", "standard", "audit"]


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(_aware)]
"""A point in time, always with its zone in JSON (ISO 8601, ``...+00:00``): SQLite hands
timestamps back without one; they are UTC."""


_HOST = r"[A-Za-z0-9._~%!$&'()*+,;=-]+"
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = ("(" + "|".join([
    f"({_H16}:){{7}}{_H16}", f"({_H16}:){{1,7}}:", f"({_H16}:){{1,6}}:{_H16}",
    *(f"({_H16}:){{1,{5 - n}}}(:{_H16}){{1,{n + 2}}}" for n in range(4)),
    f"{_H16}:(:{_H16}){{1,6}}", f":((:{_H16}){{1,7}}|:)"]) + ")")
BASE_URL_PATTERN = (rf"^[Hh][Tt][Tt][Pp][Ss]?://({_HOST}|\[{_IPV6}\])(:[0-9]{{1,5}})?"
                    r"(/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?$")
"""An ``http(s)://host[:port][/path]`` URL (RFC 3986 characters): a registered name or
an IPv6 literal in brackets, no credentials (``@``), query, fragment, spaces or control
characters. Every URL of this form passes :func:`~.evaluations.check_base_url`
(``urlsplit``'s reading; ``tests/unit/api/test_openapi_agrees.py``)."""

def list_pattern(names: Iterable[str]) -> str:
    """The pattern of a comma-separated list of ``names`` (``?include=state,state_diff``):
    any of them, in any order, repeated or not; empty items are ignored (so ``""`` too)."""
    name = "(" + "|".join(sorted(map(re.escape, names), key=lambda n: (-len(n), n))) + ")"
    return f"^{name}?(,{name}?)*$"


BaseURL = Annotated[str, Field(max_length=2000, pattern=BASE_URL_PATTERN)]
"""An OpenAI-compatible endpoint a request names (:data:`BASE_URL_PATTERN`)."""


@cache
def int_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` declared ``int`` (or ``int | None``, bounds aside)."""

    def is_int(annotation: Any) -> bool:
        if annotation is int:
            return True
        origin = get_origin(annotation)
        if origin is Annotated:
            return is_int(get_args(annotation)[0])
        if origin is Union or origin is types.UnionType:
            return any(is_int(arg) for arg in get_args(annotation))
        return False

    return frozenset(name for name, field in model.model_fields.items() if is_int(field.annotation))


def integral_numbers(model: type[BaseModel], data: Any) -> Any:
    """``data`` (a request object for ``model``) with every float of a whole value
    (``1.0``, ``2e3``) in an ``int`` field of ``model`` given as that int.

    JSON has one number type and JSON Schema's ``integer`` is any number without a
    fraction, so ``1.0`` is an integer to every client and validator of the OpenAPI
    document; strict pydantic ints refuse it (a 422 for a request the document allows).
    Strings and booleans stay refused, and so do ``1.5``, NaN and infinities."""
    if not isinstance(data, dict):
        return data
    names = int_fields(model)
    if not any(type(data.get(name)) is float for name in names):
        return data
    return {key: int(value) if key in names and type(value) is float and value.is_integer() else value
            for key, value in data.items()}


class _Request(BaseModel):
    # strict: a request is what the OpenAPI document says (no false -> 0, no "yes" -> True)
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: Any) -> Any:
        return integral_numbers(cls, data)
