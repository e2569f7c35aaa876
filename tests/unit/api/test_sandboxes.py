"""The executor adapter (:mod:`sandpit.api.sandboxes`) over the fake: every run of
untrusted code holds a scheduler slot, and executor errors become API errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_fakes import SOURCE, fake_executor
from sandpit.api.errors import InvalidRequest, NoCapacity, QuotaExceeded, ServiceUnavailable
from sandpit.api.sandboxes import (
    CHECK_SOURCE_MAX_BYTES,
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
from sandpit.executor.errors import ArgumentError, CapacityError, DockerUnavailable, ProfileError, SandboxLost
from sandpit.executor.fake import FakeExecutor
from sandpit.executor.interface import HostInfo
from threads import held_elsewhere


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
    session.restore(session.read_state())
    session.state()  # read from the sandbox's own snapshot: no code runs
    sandboxes.describe(tenant="t", source=SOURCE, class_name="Counter")
    sandboxes.run_checks(tenant="t", checks=[{"check_item": "i", "check_func": "c"}], initial_state={},
                         final_state={})
    sandboxes.execute(tenant="t", code="x", stdin=None, files=None, timeout_s=None, profile=sandboxes.profile())
    assert scheduler.taken == ["t"] * 6


def test_a_tenant_over_its_running_calls_waits_then_gets_429(fake: FakeExecutor, tmp_path: Path) -> None:
    sandboxes = adapter(fake, tmp_path, limit=1)
    with held_elsewhere(lambda: sandboxes.slot("t"), release_after_s=5):
        with pytest.raises(QuotaExceeded) as raised:
            sandboxes.describe(tenant="t", source=SOURCE, class_name="Counter")
        assert raised.value.limit == "max_running_calls"
        assert sandboxes.describe(tenant="other", source=SOURCE, class_name="Counter")  # tenants are apart


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


class ClusterFake(FakeExecutor):
    """The fake plus the two multi-host capabilities (Cluster, KeyedSessions), scripted:
    ``hosts`` answers ``infos``; ``fail_with`` makes every cluster call raise it."""

    def __init__(self) -> None:
        super().__init__()
        self.infos: list[HostInfo] = [{"host": "h1", "stats": {"sessions": 2}}]
        self.fail_with: Exception | None = None
        self.drained: list[str] = []
        self.discarded: list[str] = []

    def _cluster_call(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with

    def refresh(self, force: bool = False) -> list[str]:
        self._cluster_call()
        return [info["host"] for info in self.infos]

    def hosts(self) -> list[HostInfo]:
        self._cluster_call()
        return list(self.infos)

    def drain(self, host: str, wait_s: float | None = None) -> bool:
        self._cluster_call()
        self.drained.append(host)
        return False

    def undrain(self, host: str) -> bool:
        self._cluster_call()
        return True

    def node_alive(self, host: str) -> bool:
        self._cluster_call()
        return host == "h1"

    def discard(self, session_id: str) -> bool:
        self.discarded.append(session_id)
        raise SandboxLost("the host went away", "h1")  # best effort: the adapter swallows it


def test_capabilities_are_found_by_their_protocols(fake: FakeExecutor, tmp_path: Path) -> None:
    plain = adapter(fake, tmp_path)
    assert not plain.keyed and plain.cluster is None and not plain.multi_host
    assert plain.hosts() == [] and plain.live_hosts() == set() and "hosts" not in plain.stats()
    with pytest.raises(SandboxUnavailable, match="one sandbox host"):
        plain.drain("local")
    multi = adapter(ClusterFake(), tmp_path)
    assert multi.keyed and multi.cluster is multi.executor and multi.multi_host
    assert multi.live_hosts(force=True) == {"h1"} and multi.node_alive("h1") and not multi.node_alive("h2")
    assert multi.stats()["hosts"] == [{"host": "h1", "stats": {"sessions": 2}}]


def test_only_keyed_executors_get_the_env_id_and_a_discard(fake: FakeExecutor, tmp_path: Path) -> None:
    fake.register("Counter", {"bump": lambda state, by=1: by}, init=lambda config: {"count": 0})
    session = adapter(fake, tmp_path).open_session(tenant="t", source=SOURCE, class_name="Counter", env_id="env_1")
    assert session.id != "env_1"  # the local pool's ids stay its own
    adapter(fake, tmp_path).discard("env_1")  # not keyed: nothing to end, nothing raised
    cluster = ClusterFake()
    cluster.register("Counter", {"bump": lambda state, by=1: by}, init=lambda config: {"count": 0})
    keyed = adapter(cluster, tmp_path)
    assert keyed.open_session(tenant="t", source=SOURCE, class_name="Counter", env_id="env_1").id == "env_1"
    keyed.discard("env_1")  # its failure is logged, never raised
    assert cluster.discarded == ["env_1"]


@pytest.mark.parametrize(("error", "translated"), [
    (SandboxLost("host gone", "h1"), SandboxUnavailable),
    (DockerUnavailable("no host answers"), SandboxUnavailable),
    (CapacityError("full", retry_after_s=2.0), SandboxCapacity),
])
def test_cluster_errors_are_translated_like_every_other_executor_error(
        tmp_path: Path, error: Exception, translated: type[Exception]) -> None:
    cluster = ClusterFake()
    sandboxes = adapter(cluster, tmp_path)
    cluster.fail_with = error
    for operation in (sandboxes.hosts, lambda: sandboxes.drain("h1"), lambda: sandboxes.undrain("h1"),
                      lambda: sandboxes.node_alive("h1"), lambda: sandboxes.live_hosts(force=True)):
        with pytest.raises(translated):
            operation()


@pytest.mark.parametrize("checks", [
    [{"check_item": "i", "check_func": "x" * (CHECK_SOURCE_MAX_BYTES + 1)}],  # over the cap
    [{"check_item": "i"}] * 3,  # no check_func
    "def check_func(s): return True",  # not a list
    [{"check_item": "i", "check_func": "\ud800"}],  # a lone surrogate
])
def test_bad_arguments_pass_through_untranslated_for_the_caller_to_name(
        fake: FakeExecutor, tmp_path: Path, checks: object) -> None:
    sandboxes = adapter(fake, tmp_path)
    with pytest.raises(ArgumentError) as refused:
        sandboxes.run_checks(tenant="t", checks=checks, initial_state={}, final_state={})  # type: ignore[arg-type]
    assert isinstance(refused.value, ValueError) and not isinstance(refused.value, SandboxError)
    assert "check" in str(refused.value)


def test_a_session_lost_with_its_sandbox_is_told_from_one_closed_otherwise() -> None:
    from sandpit.api.sandboxes import SessionLostError, translate
    from sandpit.executor.errors import SessionClosed, SessionLost

    lost = translate(SessionLost("its sandbox was lost"), retry_after=1)
    closed = translate(SessionClosed("another replica attached"), retry_after=1)
    assert isinstance(lost, SessionLostError) and isinstance(lost, SessionClosedError)
    assert isinstance(closed, SessionClosedError) and not isinstance(closed, SessionLostError)


class ReportingExecutor(FakeExecutor):
    """A fake whose stats are given (what another backend might report)."""

    def __init__(self, stats: dict[str, object]) -> None:
        super().__init__()
        self.reported = stats

    def stats(self) -> dict[str, object]:
        return dict(self.reported)


@pytest.mark.parametrize(("stats", "expected"), [
    ({"memory_projected_mib": 900.0, "memory_budget_mib": 1000.0, "sandboxes": 8, "max_sandboxes": 64}, 0.9),
    ({"memory_projected_mib": 100.0, "memory_budget_mib": 1000.0, "sandboxes": 48, "max_sandboxes": 64}, 0.75),
    ({"sandboxes": 8, "max_sandboxes": 64}, 0.125),
    ({"sandboxes": 8}, 1.0),  # no capacity reported: as if full
    ({}, 1.0),
    ({"memory_projected_mib": 5.0, "memory_budget_mib": 0, "sandboxes": 0, "max_sandboxes": 0}, 1.0),  # no capacity
    ({"memory_projected_mib": "lots", "memory_budget_mib": None, "sandboxes": 1, "max_sandboxes": 4}, 0.25),
])
def test_fullness_is_the_fuller_of_memory_and_sandboxes(tmp_path: Path, stats: dict[str, object],
                                                        expected: float) -> None:
    sandboxes = Sandboxes(ReportingExecutor(stats), ApiSettings(data_dir=tmp_path))
    assert sandboxes.fullness() == pytest.approx(expected)
