"""The Ray backend's plain-data contract (no Ray needed: the module imports Ray lazily):
executor errors cross the hop as data and come back as the same classes with their fields;
anything unknown becomes a plain ExecutorError naming the original type. Also how a
replica merges the recorded drains with what it learnt itself (undrains forgotten, an
undrained host no longer counted lost)."""

from __future__ import annotations

import pytest
from sandpit.executor.errors import (
    CapacityError,
    DockerUnavailable,
    ExecutorError,
    ProfileError,
    SandboxLost,
    SessionClosed,
    SessionOpenError,
    ToolSchemaError,
)
from sandpit.executor.ray_backend import MemoryAffinity, _error_data, _guard, _raise


@pytest.mark.parametrize("error", [
    CapacityError("full", retry_after_s=3.5),
    SandboxLost("gone", "sbx_1", status="oom"),
    SessionOpenError("timeout", "Error: TimeoutError: init", "tb"),
    ToolSchemaError("rejected", "Error: too many tools"),
    ProfileError("above max"),
    SessionClosed("closed"),
    DockerUnavailable("down"),
    ValueError("bad arguments"),
])
def test_errors_come_back_as_the_same_class_with_their_fields(error: Exception) -> None:
    with pytest.raises(type(error)) as caught:
        _raise(_error_data(error))
    assert type(caught.value) is type(error) and str(caught.value) == str(error)
    for attr in ("retry_after_s", "sandbox_id", "status", "observation", "traceback"):
        if hasattr(error, attr):
            assert getattr(caught.value, attr) == getattr(error, attr)


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit", "os.system", "__import__('os')", ""])
def test_unknown_or_hostile_types_are_a_plain_executor_error(kind: str) -> None:
    with pytest.raises(ExecutorError) as caught:
        _raise({"type": kind, "message": "m"})
    assert type(caught.value) is ExecutorError and kind in str(caught.value)


def test_guard_wraps_executor_errors_and_lets_bugs_through() -> None:
    assert _guard(lambda: 3) == {"ok": 3}
    assert _guard(lambda: (_ for _ in ()).throw(SessionClosed("x")))["error"]["type"] == "SessionClosed"
    with pytest.raises(ZeroDivisionError):
        _guard(lambda: 1 / 0)


def test_memory_affinity_records_the_last_host() -> None:
    affinity = MemoryAffinity()
    affinity.put("env_1", "sandpit-host-a")
    affinity.put("env_1", "sandpit-host-b")
    assert affinity.get("env_1") == "sandpit-host-b" and affinity.get("env_2") is None


class _FlakyAffinity(MemoryAffinity):
    """A MemoryAffinity whose ``drains()`` can fail, or run a hook while it is read."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False
        self.during_read: list[object] = []

    def drains(self) -> dict[str, str]:
        if self.fail:
            raise OSError("database down")
        for hook in self.during_read:
            hook()  # type: ignore[operator]
        return super().drains()


def test_drains_learnt_from_hosts_are_forgotten_once_the_affinity_no_longer_records_them() -> None:
    from sandpit.executor.ray_backend import RayExecutor

    affinity = _FlakyAffinity()
    executor = RayExecutor(affinity=affinity)
    affinity.start_drain("h-recorded")
    executor._learnt_draining("h-recorded")
    executor._learnt_draining("h-undrained")  # answered HostDraining, but no record (undrained since)
    assert executor._read_drains() == {"h-recorded": "draining"}
    affinity.during_read.append(lambda: executor._learnt_draining("h-new"))  # learnt while reading: kept
    assert executor._read_drains() == {"h-recorded": "draining", "h-new": "draining"}
    affinity.during_read.clear()
    affinity.fail = True  # the database is down: the last known drains stay
    executor._drains = {"h-recorded": "draining"}
    assert executor._read_drains() == {"h-recorded": "draining"}


def test_an_undrained_host_leaves_the_lost_hosts_so_it_can_be_recreated() -> None:
    from sandpit.executor.ray_backend import RayExecutor

    affinity = MemoryAffinity()
    executor = RayExecutor(affinity=affinity)
    affinity.start_drain("h1")
    assert affinity.finish_drain("h1", 0) and not affinity.finish_drain("h-never", 0)
    executor._drains = executor._read_drains()
    assert executor._drains == {"h1": "drained"}
    executor._lost("h1")  # this process asked the drained host's actor after its drain killed it
    executor._lost("h2")  # a node that died (never drained)
    assert executor._read_drains() == {"h1": "drained"} and executor._dead == {"h1", "h2"}
    affinity.undrain("h1")
    assert executor._read_drains() == {}
    assert executor._dead == {"h2"}  # h1 is re-created by the next refresh; h2 stays lost
