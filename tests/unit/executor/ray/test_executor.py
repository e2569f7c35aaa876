"""How a Ray replica merges the recorded drains with what it learnt itself (undrains
forgotten, an undrained host no longer counted lost), and the in-process affinity. No Ray
needed: the backend imports Ray on first use, and none of this uses it."""

from __future__ import annotations

from sandpit.executor.ray import MemoryAffinity, RayExecutor


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
    affinity = _FlakyAffinity()
    executor = RayExecutor(affinity=affinity)
    affinity.start_drain("h-recorded")
    executor.learnt_draining("h-recorded")
    executor.learnt_draining("h-undrained")  # answered HostDraining, but no record (undrained since)
    assert executor._read_drains() == {"h-recorded": "draining"}
    affinity.during_read.append(lambda: executor.learnt_draining("h-new"))  # learnt while reading: kept
    assert executor._read_drains() == {"h-recorded": "draining", "h-new": "draining"}
    affinity.during_read.clear()
    affinity.fail = True  # the database is down: the last known drains stay
    executor._drains = {"h-recorded": "draining"}
    assert executor._read_drains() == {"h-recorded": "draining"}


def test_an_undrained_host_leaves_the_lost_hosts_so_it_can_be_recreated() -> None:
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
