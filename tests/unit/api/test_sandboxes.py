"""The executor adapter (:mod:`sandpit.api.sandboxes`) over the fake: every run of
untrusted code holds a scheduler slot, and executor errors become API errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_fakes import SOURCE, fake_executor
from sandpit.api.errors import InvalidRequest, NoCapacity, QuotaExceeded, ServiceUnavailable
from sandpit.api.sandboxes import (
    CodeFailed,
    SandboxCapacity,
    SandboxError,
    Sandboxes,
    SandboxRefused,
    SandboxUnavailable,
    SessionClosedError,
)
from sandpit.api.scheduler import FairScheduler
from sandpit.api.settings import ApiSettings
from sandpit.executor.errors import CapacityError, DockerUnavailable, ProfileError, SandboxLost
from sandpit.executor.fake import FakeExecutor


class RecordingScheduler(FairScheduler):
    """A fair scheduler that records which tenant took a slot."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self.taken: list[str] = []

    @contextmanager
    def slot(self, tenant: str, limit: int, timeout_s: float) -> Iterator[float]:
        with super().slot(tenant, limit, timeout_s) as waited:
            self.taken.append(tenant)
            yield waited


@pytest.fixture
def fake() -> Iterator[FakeExecutor]:
    with fake_executor() as executor:
        yield executor


def adapter(fake: FakeExecutor, tmp_path: Path, scheduler: FairScheduler | None = None,
            limit: int = 4) -> Sandboxes:
    settings = ApiSettings(data_dir=tmp_path, call_queue_timeout_s=0.2)
    return Sandboxes(fake, settings, running_limit=lambda _tenant: limit, scheduler=scheduler)


def test_every_run_of_untrusted_code_takes_a_slot(fake: FakeExecutor, tmp_path: Path) -> None:
    scheduler = RecordingScheduler(4)
    sandboxes = adapter(fake, tmp_path, scheduler)
    fake.script_check("c", True)
    fake.script_exec("x", "")
    session = sandboxes.open_session(tenant="t", source=SOURCE, class_name="Counter")
    session.call("bump", {"by": 1})
    session.restore(session.encoded_state())
    session.state()  # a rendering of the last snapshot: no code runs
    sandboxes.describe(tenant="t", source=SOURCE, class_name="Counter")
    sandboxes.run_checks(tenant="t", checks=[{"check_item": "i", "check_func": "c"}], initial_state={},
                         final_state={})
    sandboxes.execute(tenant="t", code="x", stdin=None, files=None, timeout_s=None, profile=sandboxes.profile())
    assert scheduler.taken == ["t"] * 6


def test_a_tenant_over_its_running_calls_waits_then_gets_429(fake: FakeExecutor, tmp_path: Path) -> None:
    sandboxes = adapter(fake, tmp_path, limit=1)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with sandboxes.slot("t"):
            holding.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(5)
        with pytest.raises(QuotaExceeded) as raised:
            sandboxes.describe(tenant="t", source=SOURCE, class_name="Counter")
        assert raised.value.limit == "max_running_calls"
        assert sandboxes.describe(tenant="other", source=SOURCE, class_name="Counter")  # tenants are apart
    finally:
        release.set()
        thread.join()


@pytest.mark.parametrize("error, expected, base", [
    (CapacityError("full"), SandboxCapacity, NoCapacity),
    (ProfileError("too big"), SandboxRefused, InvalidRequest),
    (DockerUnavailable("down"), SandboxUnavailable, ServiceUnavailable),
    (SandboxLost("gone", "sbx_1"), SandboxUnavailable, ServiceUnavailable),
])
def test_executor_errors_become_api_errors(fake: FakeExecutor, tmp_path: Path, error: Exception,
                                           expected: type[Exception], base: type[Exception]) -> None:
    sandboxes = adapter(fake, tmp_path)
    fake.fail("open_session", error)
    with pytest.raises(expected) as raised:
        sandboxes.open_session(tenant="t", source=SOURCE, class_name="Counter")
    assert isinstance(raised.value, base) and isinstance(raised.value, SandboxError)


def test_code_that_fails_and_closed_sessions(fake: FakeExecutor, tmp_path: Path) -> None:
    sandboxes = adapter(fake, tmp_path)
    with pytest.raises(CodeFailed) as failed:
        sandboxes.open_session(tenant="t", source=SOURCE, class_name="Counter", init_config={"explode": True})
    assert failed.value.status == "error" and "init refused" in failed.value.observation
    session = sandboxes.open_session(tenant="t", source=SOURCE, class_name="Counter")
    session.close()
    assert session.closed
    with pytest.raises(SessionClosedError):
        session.call("bump", {})


def test_profiles_are_lowered_never_raised(fake: FakeExecutor, tmp_path: Path) -> None:
    sandboxes = adapter(fake, tmp_path)
    assert sandboxes.profile({"memory_mib": 64}).memory_mib == 64
    assert sandboxes.default_limits() == {"memory_mib": 256, "cpus": 0.5, "call_timeout_s": 10.0}
    with pytest.raises(SandboxRefused) as raised:
        sandboxes.profile({"memory_mib": 60000})
    assert raised.value.field == "profile"
