"""Per-tenant quotas (:mod:`sandpit.api.services.quotas`): concurrent calls, the step
token bucket, live-env reservations, size caps (413 vs 429), the profile ceiling."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError
from sandpit.api.errors import PayloadTooLarge, QuotaExceeded
from sandpit.api.services.quotas import QuotaService, TenantContext
from sandpit.api.settings import ApiSettings, Quotas


def ctx(tenant: str = "team-a", **quotas: object) -> TenantContext:
    return TenantContext(tenant=tenant, actor="key_1", quotas=Quotas().merged(dict(quotas)))


def service(live: dict[str, int] | None = None) -> QuotaService:
    counts = live if live is not None else {}
    return QuotaService(lambda tenant: counts.get(tenant, 0), ApiSettings(max_code_bytes=4096))


def test_concurrent_calls_are_counted_per_tenant_and_released() -> None:
    quotas = service()
    a, b = ctx(max_concurrent_calls=2), ctx("team-b", max_concurrent_calls=1)
    with quotas.call(a), quotas.call(a), quotas.call(b):
        assert quotas.in_flight("team-a") == 2
        with pytest.raises(QuotaExceeded) as raised, quotas.call(a):
            pass
        assert raised.value.limit == "max_concurrent_calls" and raised.value.retry_after == 1
    assert quotas.in_flight("team-a") == 0
    with pytest.raises(QuotaExceeded), quotas.call(a, weight=3):
        pass
    assert quotas.in_flight("team-a") == 0


def test_the_step_bucket_empties_and_refills() -> None:
    quotas = service()
    caller = ctx(steps_per_minute=600, step_burst=3)  # 10 tokens per second
    for _ in range(3):
        quotas.take_step(caller)
    with pytest.raises(QuotaExceeded) as raised:
        quotas.take_step(caller)
    assert raised.value.limit == "steps_per_minute" and raised.value.retry_after >= 1
    time.sleep(0.15)
    quotas.take_step(caller)
    quotas.take_step(ctx("team-b", steps_per_minute=600, step_burst=3))  # buckets are per tenant


def test_burst_defaults_to_one_second_of_steps_at_least_ten() -> None:
    assert Quotas(steps_per_minute=60).burst() == 10
    assert Quotas(steps_per_minute=6000).burst() == 100
    assert Quotas(steps_per_minute=6000, step_burst=7).burst() == 7


def test_live_env_reservations_cannot_overshoot() -> None:
    live = {"team-a": 3}
    quotas = service(live)
    caller = ctx(max_live_envs=5)
    with quotas.reserve_envs(caller, 2):
        with pytest.raises(QuotaExceeded) as raised, quotas.reserve_envs(caller):
            pass
        assert raised.value.limit == "max_live_envs"
    with quotas.reserve_envs(caller, 2):
        live["team-a"] = 5  # the envs exist now: the rows count themselves
    with pytest.raises(QuotaExceeded), quotas.reserve_envs(caller):
        pass


def test_reservations_of_racing_creates_are_atomic() -> None:
    quotas = service()
    caller = ctx(max_live_envs=4)
    admitted: list[int] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        try:
            with quotas.reserve_envs(caller):
                admitted.append(1)
                time.sleep(0.05)
        except QuotaExceeded:
            pass

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(admitted) == 4


def test_sizes_over_the_server_cap_are_413_over_the_tenant_quota_429() -> None:
    quotas = service()
    caller = ctx(max_code_bytes=1000)
    quotas.check_size(caller, "max_code_bytes", 1000, "source_code")
    with pytest.raises(QuotaExceeded) as quota:
        quotas.check_size(caller, "max_code_bytes", 1001, "source_code")
    assert quota.value.field == "source_code" and quota.value.retry_after == 3600
    with pytest.raises(PayloadTooLarge) as hard:
        quotas.check_size(ctx(max_code_bytes=10**6), "max_code_bytes", 4097, "source_code")
    assert hard.value.field == "source_code"


def test_the_profile_ceiling_refuses_asked_values_and_lowers_defaults() -> None:
    caller = ctx(max_profile={"memory_mib": 128})
    defaults = {"memory_mib": 256, "cpus": 0.5, "call_timeout_s": 10.0}
    assert QuotaService.profile_overrides(caller, None, defaults) == {"memory_mib": 128}
    assert QuotaService.profile_overrides(caller, {"cpus": 0.25}, defaults) == {"cpus": 0.25, "memory_mib": 128}
    with pytest.raises(QuotaExceeded) as raised:
        QuotaService.profile_overrides(caller, {"memory_mib": 200}, defaults)
    assert raised.value.limit == "max_profile.memory_mib" and raised.value.field == "profile.memory_mib"
    assert QuotaService.profile_overrides(ctx(), None, defaults) is None


def test_overrides_merge_field_by_field_and_refuse_unknown_fields() -> None:
    merged = Quotas().merged({"max_profile": {"cpus": 0.25}, "max_live_envs": 3})
    assert merged.max_profile.cpus == 0.25 and merged.max_profile.memory_mib == 1024 and merged.max_live_envs == 3
    with pytest.raises(ValidationError):
        Quotas().merged({"max_lives": 3})
    with pytest.raises(ValidationError):
        Quotas().merged({"max_profile": {"memory_mib": 1}})


def test_usage_reports_open_envs_and_calls_in_flight() -> None:
    quotas = service({"team-a": 2})
    caller = ctx()
    with quotas.call(caller):
        usage = quotas.usage(caller)
    assert (usage.tenant, usage.key_id, usage.live_envs, usage.calls_in_flight) == ("team-a", "key_1", 2, 1)
    assert usage.quotas["max_live_envs"] == 1000
