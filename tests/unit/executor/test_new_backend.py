"""The seam a new backend plugs into, proved with one that exists only here: sandboxes as
"pods", added the way a Kubernetes backend would be (``docs/kubernetes.md``): one driver
class (``PodDriver``, a :class:`SandboxDriver` whose pods are in-memory runner doubles
from ``tests/support/memory_driver.py``) and one config class with a ``type`` of its own
(``PodsConfig``). Nothing in ``api/`` or ``executor/pool/`` is edited for it, and this module
imports only the executor's face and the pool's public names: the real pool places, steps
and recycles sessions through the driver, and the API's adapter serves it like any backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest
from memory_driver import MemorySandbox, bump
from pydantic import BaseModel, ConfigDict
from sandpit.api.sandboxes import Sandboxes
from sandpit.api.settings import ApiSettings
from sandpit.executor import (
    Affinity,
    Cluster,
    Executor,
    ExecutorSettings,
    ImageSettings,
    KeyedSessions,
    ResourceProfile,
    get_executor,
)
from sandpit.executor.pool import SandboxDriver, SandboxHandle, SandboxPool
from sandpit.executor.recovering import RecoveringSession


class PodDriver:
    """Starts one "pod" per sandbox in ``namespace`` (a :class:`SandboxDriver`). A real one
    would create a Pod through the API server, wait for it to be Ready and dial its runner;
    here a pod is a :class:`MemorySandbox`, and the driver records what it was asked."""

    maintenance_s = 5.0

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.pods: list[MemorySandbox] = []
        self.pool_id = ""
        self.closed = False

    def open(self, pool_id: str) -> None:
        self.pool_id = pool_id  # a real driver: the lease object pods get ownerReferences to

    def start(self, tenant: str, profile: ResourceProfile, uid: int) -> SandboxHandle:
        pod = MemorySandbox(f"{self.namespace}/sandbox-{len(self.pods)}", tenant, {"bump": bump},
                            memory_limit=profile.memory_mib * 1024 * 1024)
        self.pods.append(pod)
        return pod

    def ping(self) -> None:
        return None

    def memory_total(self) -> int:
        return 0  # unknown: admission counts sessions only

    def maintain(self) -> Callable[[], None] | None:
        return None

    def stats(self) -> dict[str, int]:
        return {"pods": len(self.pods)}

    def close(self) -> None:
        self.closed = True


DRIVERS: list[PodDriver] = []
"""The drivers PodsConfig built, so a test can look at the pods."""


class PodsConfig(BaseModel):
    """The new backend's config: a ``type`` of its own and a ``build`` (imports would be
    lazy in ``executor/config.py``; this one is already in the test)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["pods"] = "pods"
    namespace: str = "sandpit"

    def build(self, settings: ExecutorSettings | None = None, *, image_settings: ImageSettings | None = None,
              affinity: Affinity | None = None) -> Executor:
        driver = PodDriver(self.namespace)
        DRIVERS.append(driver)
        return SandboxPool(driver, settings).start()


@pytest.fixture
def executor() -> Iterator[Executor]:
    DRIVERS.clear()
    built = get_executor(PodsConfig(namespace="tenant-pods"), ExecutorSettings(pool_size=0, watchdog_grace_s=0.0))
    try:
        yield built
    finally:
        built.close()


def test_the_new_driver_satisfies_the_protocol_and_its_executor_is_a_plain_one(executor: Executor) -> None:
    driver: SandboxDriver = DRIVERS[0]  # structural: mypy checks the signatures
    assert isinstance(driver, SandboxDriver) and isinstance(executor, Executor)
    assert not isinstance(executor, Cluster) and not isinstance(executor, KeyedSessions)  # one pool, no drains


def test_the_pool_places_steps_and_recycles_sessions_on_pods(executor: Executor) -> None:
    [driver] = DRIVERS
    session = executor.open_session(tenant="t1", source="<never run>", class_name="Counter", init_config={"count": 1})
    assert session.call("bump", {"by": 2}).observation == "3"
    assert session.state() == {"count": 3}
    session.close()
    [pod] = driver.pods
    assert pod.id == "tenant-pods/sandbox-0" and ("recycle", {}) in pod.requests
    again = executor.open_session(tenant="t1", source="<never run>", class_name="Counter")
    assert again.call("bump").observation == "1" and len(driver.pods) == 1  # the recycled pod served it
    stranger = executor.open_session(tenant="t2", source="<never run>", class_name="Counter")
    assert stranger.call("bump").status == "ok" and [p.tenant for p in driver.pods] == ["t1", "t2"]
    assert executor.stats()["pods"] == 2  # the driver's counters come with the pool's


def test_a_lost_pod_closes_the_session_and_a_recovering_one_reopens(executor: Executor) -> None:
    [driver] = DRIVERS
    session = executor.open_session(tenant="t1", source="<never run>", class_name="Counter")
    session.call("bump", {"by": 5})
    driver.pods[0].kill()
    assert session.call("bump").status == "crashed" and session.closed
    kept = RecoveringSession(executor, tenant="t1", source="<never run>", class_name="Counter")
    kept.call("bump", {"by": 5})
    driver.pods[-1].kill()
    assert kept.call("bump").status == "crashed"
    recovered = kept.call("bump")
    assert recovered.recovered and recovered.observation == "6" and len(driver.pods) == 3


def test_the_api_adapter_serves_the_new_backend_unchanged(executor: Executor, tmp_path: Path) -> None:
    sandboxes = Sandboxes(executor, ApiSettings(data_dir=tmp_path))
    session = sandboxes.open_session(tenant="t1", source="<never run>", class_name="Counter", env_id="env_1")
    assert session.call("bump", {"by": 4}).observation == "4"
    assert session.id != "env_1"  # not KeyedSessions: the pool's own ids
    assert sandboxes.hosts() == [] and sandboxes.stats()["pods"] == 1
    session.close()


def test_closing_the_executor_closes_the_driver(executor: Executor) -> None:
    [driver] = DRIVERS
    executor.open_session(tenant="t1", source="<never run>", class_name="Counter")
    executor.close()
    assert driver.closed and all(pod.destroyed for pod in driver.pods)
