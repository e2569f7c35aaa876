"""The executor seam: :class:`SandboxPool` and :class:`Session` are an :class:`Executor`
and an :class:`ExecutorSession`, checked twice: structurally by mypy (``scripts/lint``
type-checks this file; the annotated assignments below fail it if a method is missing or
its signature drifts) and at runtime with ``isinstance``. No Docker: the pool runs over
the in-memory driver of ``tests/support/memory_driver.py``."""

from __future__ import annotations

from memory_driver import MemoryDriver
from sandpit.executor.fake import FakeExecutor
from sandpit.executor.interface import Cluster, Executor, ExecutorSession, KeyedSessions
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.placement import SessionSpec
from sandpit.executor.pool.session import Session
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.ray import RayExecutor
from sandpit.executor.settings import ExecutorSettings


def test_the_pool_is_an_executor_and_its_sessions_executor_sessions() -> None:
    pool: Executor = SandboxPool(MemoryDriver(), ExecutorSettings())
    session: ExecutorSession = Session(placement=SandboxPool(MemoryDriver()), spec=SessionSpec(
        session_id="s1", tenant="t", profile=ResourceProfile(), source="", class_name="A", init_config={}))
    assert isinstance(pool, Executor)
    assert isinstance(session, ExecutorSession)
    assert (session.id, session.tenant, session.closed) == ("s1", "t", False)


def test_ping_asks_the_driver() -> None:
    driver = MemoryDriver()
    SandboxPool(driver, ExecutorSettings()).ping()
    assert driver.opened is False  # a ping opens nothing


def test_the_ray_backend_has_both_capabilities_and_the_others_neither() -> None:
    ray = RayExecutor()  # not started: no Ray needed to check its shape
    cluster: Cluster = ray  # structural: mypy checks the signatures
    keyed: KeyedSessions = ray
    executor: Executor = ray
    assert isinstance(cluster, Cluster) and isinstance(keyed, KeyedSessions) and isinstance(executor, Executor)
    for single in (SandboxPool(MemoryDriver()), FakeExecutor()):
        assert not isinstance(single, Cluster) and not isinstance(single, KeyedSessions)
