"""Profile values in requests are bounded by the executor's own models (issue 12: a
``memory_mib`` of 16..31 passed the API and made the executor raise, answered 500)."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, ValidationError
from sandpit.api.schemas.envs import ProfileRequest
from sandpit.api.schemas.profile_limits import executor_bounds
from sandpit.api.schemas.validation import ExecuteRequest
from sandpit.api.settings import ProfileCeiling
from sandpit.executor.profiles import ProfileOverrides, ResourceProfile

# (request model, its field, the executor's field)
FIELDS = [
    (ProfileRequest, "memory_mib", "memory_mib"),
    (ProfileRequest, "cpus", "cpus"),
    (ProfileRequest, "call_timeout_s", "call_timeout_s"),
    (ExecuteRequest, "memory_mb", "memory_mib"),
    (ExecuteRequest, "timeout_s", "call_timeout_s"),
    (ProfileCeiling, "memory_mib", "memory_mib"),
    (ProfileCeiling, "cpus", "cpus"),
    (ProfileCeiling, "call_timeout_s", "call_timeout_s"),
]


def _request(model: type[BaseModel], field: str, value: float) -> BaseModel:
    extra = {"code": "print(1)"} if model is ExecuteRequest else {}
    return model.model_validate({**extra, field: value})


def _executor_accepts(field: str, value: float) -> None:
    """Raises pydantic's ValidationError when the executor's models refuse ``value``."""
    ProfileOverrides.model_validate({field: value})
    ResourceProfile.model_validate({field: value})


def _edges(bounds: dict[str, float], integer: bool) -> tuple[list[float], list[float]]:
    """(values just inside, values just outside) of ``bounds``."""
    def below(value: float) -> float:
        return value - 1 if integer else math.nextafter(value, -math.inf)

    def above(value: float) -> float:
        return value + 1 if integer else math.nextafter(value, math.inf)

    pairs = {"ge": lambda v: (v, below(v)), "gt": lambda v: (above(v), v),
             "le": lambda v: (v, above(v)), "lt": lambda v: (below(v), v)}
    edges = [pairs[key](value) for key, value in bounds.items()]
    return [inside for inside, _ in edges], [outside for _, outside in edges]


@pytest.mark.parametrize("model, field, executor_field", FIELDS)
def test_request_bounds_are_the_executors(model: type[BaseModel], field: str, executor_field: str) -> None:
    bounds = executor_bounds(executor_field)
    assert {"ge", "gt"} & set(bounds) and {"le", "lt"} & set(bounds), bounds
    integer = executor_field == "memory_mib"
    inside, outside = _edges(bounds, integer)
    for value in inside:
        _request(model, field, value)
        _executor_accepts(executor_field, value)
    for value in outside:
        with pytest.raises(ValidationError):
            _request(model, field, value)


@pytest.mark.parametrize("value", range(0, 32))
def test_memory_below_the_executor_floor_is_refused(value: int) -> None:
    """The values issue 12 found (16..31) and every other one under the floor."""
    for model, field in ((ProfileRequest, "memory_mib"), (ExecuteRequest, "memory_mb")):
        with pytest.raises(ValidationError) as caught:
            _request(model, field, value)
        assert caught.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize("field", ["memory_mib", "cpus", "call_timeout_s"])
def test_the_tenants_ceiling_states_the_executors_bounds(field: str) -> None:
    """``ProfileCeiling`` (in the settings, which load no executor module) writes its
    bounds out: they are exactly the executor's, keyword for keyword."""
    bounds = {key: getattr(item, key) for item in ProfileCeiling.model_fields[field].metadata
              for key in ("ge", "gt", "le", "lt") if getattr(item, key, None) is not None}
    assert bounds == executor_bounds(field)


def test_bounds_follow_the_executor_models() -> None:
    """Derived, not copied: the ceiling is ResourceProfile's, the floor ProfileOverrides'."""
    assert executor_bounds("memory_mib") == {"ge": ProfileOverrides.model_json_schema()["properties"]["memory_mib"][
        "anyOf"][0]["minimum"], "le": ResourceProfile.model_fields["memory_mib"].metadata[1].le}
    with pytest.raises(KeyError):
        executor_bounds("nofile")  # not a caller-lowerable field
