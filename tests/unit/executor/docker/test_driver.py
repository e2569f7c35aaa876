"""The Docker driver without an engine: ``ping`` through a stand-in client (answering or
failing as the SDK does), before ``open``, and the maintenance it asks of the pool. The
containers themselves are ``tests/integration/executor``'s."""

from __future__ import annotations

import docker.errors
import pytest
import requests.exceptions
from sandpit.executor.docker import DockerDriver, docker_pool
from sandpit.executor.errors import DockerUnavailable, ExecutorError
from sandpit.executor.pool import SandboxDriver
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


def test_the_docker_driver_is_a_sandbox_driver() -> None:
    driver: SandboxDriver = DockerDriver(ExecutorSettings())  # structural: mypy checks the signatures
    assert isinstance(driver, SandboxDriver)
    assert isinstance(docker_pool(ExecutorSettings()).driver, DockerDriver)


def test_ping_asks_the_engine() -> None:
    engine = Engine()
    docker_pool(ExecutorSettings(), client=engine).ping()  # type: ignore[arg-type]
    assert engine.pings == 1


@pytest.mark.parametrize("error", [requests.exceptions.ConnectionError("refused"),
                                   docker.errors.APIError("500 Server Error")])
def test_ping_raises_docker_unavailable_when_the_engine_does_not_answer(error: Exception) -> None:
    pool = docker_pool(ExecutorSettings(), client=Engine(error))  # type: ignore[arg-type]
    with pytest.raises(DockerUnavailable, match="pinging the Docker Engine"):
        pool.ping()


def test_ping_before_open_is_an_executor_error() -> None:
    with pytest.raises(ExecutorError, match="not started"):
        DockerDriver(ExecutorSettings()).ping()


def test_maintenance_hands_out_no_sweep_when_sweeps_are_off_or_not_due() -> None:
    off = DockerDriver(ExecutorSettings(reap_interval_s=0))
    assert off.maintain() is None and off.maintenance_s == 60.0
    due_later = DockerDriver(ExecutorSettings(reap_interval_s=30))
    assert due_later.maintenance_s == 30.0
    assert due_later.maintain() is not None  # never opened: the first sweep is due at once
    assert due_later.maintain() is None  # one pending at a time


def test_close_before_open_touches_nothing() -> None:
    driver = DockerDriver(ExecutorSettings())
    driver.close()
    assert driver.stats() == {"reaped": 0, "sweeps": 0}
