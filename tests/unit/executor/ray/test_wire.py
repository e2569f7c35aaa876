"""The Ray backend's plain-data contract for errors (no Ray needed): executor errors cross
the hop as data and come back as the same classes with their fields; anything unknown
becomes a plain ExecutorError naming the original type."""

from __future__ import annotations

import pytest
from sandpit.executor.errors import (
    ArgumentError,
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    ProfileError,
    SandboxLost,
    SessionClosed,
    SessionLost,
    SessionOpenError,
    ToolSchemaError,
)
from sandpit.executor.ray.wire import error_data, guard, raise_error


@pytest.mark.parametrize("error", [
    CapacityError("full", retry_after_s=3.5),
    SandboxLost("gone", "sbx_1", status="oom"),
    SessionOpenError("timeout", "Error: TimeoutError: init", "tb"),
    ToolSchemaError("rejected", "Error: too many tools"),
    ProfileError("above max"),
    SessionClosed("closed"),
    SessionLost("its sandbox was lost"),
    DockerUnavailable("down"),
    ArgumentError("checks[0].check_func has 70000 bytes"),
])
def test_errors_come_back_as_the_same_class_with_their_fields(error: Exception) -> None:
    with pytest.raises(type(error)) as caught:
        raise_error(error_data(error))
    assert type(caught.value) is type(error) and str(caught.value) == str(error)
    for attr in ("retry_after_s", "sandbox_id", "status", "observation", "traceback"):
        if hasattr(error, attr):
            assert getattr(caught.value, attr) == getattr(error, attr)


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit", "os.system", "__import__('os')", ""])
def test_unknown_or_hostile_types_are_a_plain_executor_error(kind: str) -> None:
    with pytest.raises(ExecutorError) as caught:
        raise_error({"type": kind, "message": "m"})
    assert type(caught.value) is ExecutorError and kind in str(caught.value)


def test_guard_wraps_executor_errors_and_lets_bugs_through() -> None:
    assert guard(lambda: 3) == {"ok": 3}
    assert guard(lambda: (_ for _ in ()).throw(SessionClosed("x")))["error"]["type"] == "SessionClosed"
    with pytest.raises(ZeroDivisionError):
        guard(lambda: 1 / 0)


def test_a_plain_value_error_comes_back_as_an_argument_error() -> None:
    """What a host's pydantic validation or a stray ValueError raises is a bad argument."""
    data = guard(lambda: int("not a number"))["error"]
    assert data["type"] == "ArgumentError"
    with pytest.raises(ArgumentError, match="invalid literal") as caught:
        raise_error(data)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ArgumentError):
        raise_error({"type": "ValueError", "message": "from an older host"})
