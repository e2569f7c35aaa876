"""Bounds of the resource-profile values a request may carry, taken from the executor.

The executor takes a caller's lowering of a profile as
:class:`~sandpit.executor.profiles.ProfileOverrides` (its lower bounds) and the result
is a :class:`~sandpit.executor.profiles.ResourceProfile` (its upper bounds). Request
models (``ProfileRequest``, ``ExecuteRequest``) declare their fields with
:func:`profile_value`, so their bounds are the intersection of both and a value that
passes request validation can never make the executor raise a validation error (the
tenants' ``ProfileCeiling`` in :mod:`sandpit.api.settings` states the same bounds as
numbers, and a test holds them equal). What the executor may still refuse depends on the
operator's configuration, not on a constant: a value above the configured profile is a
``ProfileError`` (422 naming the field) and one above the tenant's ``max_profile`` a 429.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field
from sandpit.executor.profiles import ProfileOverrides, ResourceProfile


def _numeric_schema(model: type[BaseModel], name: str) -> dict[str, Any]:
    """The JSON schema of field ``name`` of ``model`` without its ``None`` branch."""
    prop: dict[str, Any] = model.model_json_schema()["properties"][name]
    variants: list[dict[str, Any]] = prop.get("anyOf", [prop])
    for variant in variants:
        if variant.get("type") in ("integer", "number"):
            return variant
    raise TypeError(f"{model.__name__}.{name} is not a number")


def executor_bounds(name: str) -> dict[str, float]:
    """``Field`` keyword arguments (``ge``/``gt``/``le``/``lt``) of profile field ``name``:
    the tightest of :class:`ProfileOverrides` and :class:`ResourceProfile`'s bounds.
    Raises KeyError for a name that is not a field of both."""
    lower: tuple[float, bool] = (-math.inf, False)  # (value, exclusive)
    upper: tuple[float, bool] = (math.inf, False)
    for model in (ProfileOverrides, ResourceProfile):
        schema = _numeric_schema(model, name)
        for key, exclusive in (("minimum", False), ("exclusiveMinimum", True)):
            if key in schema and (schema[key], exclusive) > lower:
                lower = (schema[key], exclusive)
        for key, exclusive in (("maximum", False), ("exclusiveMaximum", True)):
            if key in schema and (schema[key], not exclusive) < (upper[0], not upper[1]):
                upper = (schema[key], exclusive)
    bounds: dict[str, float] = {}
    if lower[0] > -math.inf:
        bounds["gt" if lower[1] else "ge"] = lower[0]
    if upper[0] < math.inf:
        bounds["lt" if upper[1] else "le"] = upper[0]
    return bounds


def profile_value(name: str, description: str | None = None) -> Any:
    """A pydantic ``Field`` for a request's value of profile field ``name`` (bounds from
    :func:`executor_bounds`); use as ``Annotated[int | None, profile_value("memory_mib")]``."""
    bounds = executor_bounds(name)
    return Field(description=description, gt=bounds.get("gt"), ge=bounds.get("ge"), lt=bounds.get("lt"),
                 le=bounds.get("le"))
