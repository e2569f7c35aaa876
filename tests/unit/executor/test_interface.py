"""The executor seam: :class:`SandboxPool` and :class:`Session` are an
:class:`Executor` and an :class:`ExecutorSession`, checked twice: structurally by mypy
(``scripts/lint`` type-checks this file; the annotated assignments below fail it if a
method is missing or its signature drifts) and at runtime with ``isinstance``. No Docker:
the pool is never started, its client is a stand-in."""

from __future__ import annotations

import docker.errors
import pytest
import requests.exceptions
from sandpit.executor.errors import DockerUnavailable, ExecutorError
from sandpit.executor.interface import Executor, ExecutorSession
from sandpit.executor.pool.placement import SessionSpec
from sandpit.executor.pool.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.settings import ExecutorSettings


class Engine:
    """Stands in for a ``docker.DockerClient``: only ``ping``, answering or failing."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.pings = 0

    def ping(self) -> bool:
        self.pings += 1
        if self.error is not None:
            raise self.error
        return True


def test_the_pool_is_an_executor_and_its_sessions_executor_sessions() -> None:
    pool: Executor = SandboxPool(ExecutorSettings())
    session: ExecutorSession = Session(placement=SandboxPool(ExecutorSettings()), spec=SessionSpec(
        session_id="s1", tenant="t", profile=ResourceProfile(), source="", class_name="A", init_config={}))
    assert isinstance(pool, Executor)
    assert isinstance(session, ExecutorSession)
    assert (session.id, session.tenant, session.closed) == ("s1", "t", False)


def test_ping_asks_the_engine() -> None:
    engine = Engine()
    SandboxPool(ExecutorSettings(), client=engine).ping()  # type: ignore[arg-type]
    assert engine.pings == 1


@pytest.mark.parametrize("error", [requests.exceptions.ConnectionError("refused"),
                                   docker.errors.APIError("500 Server Error")])
def test_ping_raises_docker_unavailable_when_the_engine_does_not_answer(error: Exception) -> None:
    pool = SandboxPool(ExecutorSettings(), client=Engine(error))  # type: ignore[arg-type]
    with pytest.raises(DockerUnavailable, match="pinging the Docker Engine"):
        pool.ping()


def test_ping_before_start_is_an_executor_error() -> None:
    with pytest.raises(ExecutorError, match="not started"):
        SandboxPool(ExecutorSettings()).ping()
