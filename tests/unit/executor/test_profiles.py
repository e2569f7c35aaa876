"""Resource profiles: named, lowered by callers, bounded by the operator's ceiling."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sandpit.executor.errors import ProfileError
from sandpit.executor.profiles import MiB, ProfileOverrides, ResourceProfile, resolve_profile
from sandpit.executor.settings import ExecutorSettings

CEILING = ExecutorSettings().max_profile


def profiles(**named: ResourceProfile) -> dict[str, ResourceProfile]:
    return {"default": ResourceProfile(), **named}


def test_default_profile_matches_documented_limits() -> None:
    profile = resolve_profile(profiles(), CEILING, "default")
    assert (profile.memory_mib, profile.cpus, profile.pids, profile.tmpfs_mib, profile.call_timeout_s) == (
        256, 0.5, 64, 64, 10.0)


def test_unknown_profile_name() -> None:
    with pytest.raises(ProfileError, match="unknown resource profile 'gpu'"):
        resolve_profile(profiles(), CEILING, "gpu")


def test_overrides_lower_and_rename() -> None:
    lowered = resolve_profile(profiles(), CEILING, "default",
                              ProfileOverrides(call_timeout_s=2, memory_mib=64))
    assert lowered.call_timeout_s == 2 and lowered.memory_mib == 64
    assert lowered.pids == 64  # untouched fields keep the named profile's value
    # a lowered profile is a distinct warm-pool key
    assert lowered.name == "default[call_timeout_s=2.0,memory_mib=64]"


def test_empty_overrides_return_the_named_profile() -> None:
    named = profiles()
    assert resolve_profile(named, CEILING, "default", ProfileOverrides()) is named["default"]


@pytest.mark.parametrize("field,value", [("memory_mib", 257), ("cpus", 0.75), ("pids", 65),
                                         ("tmpfs_mib", 65), ("call_timeout_s", 10.5),
                                         ("output_cap_bytes", 64 * 1024 + 1)])
def test_overrides_may_not_raise_a_limit(field: str, value: float) -> None:
    with pytest.raises(ProfileError, match=f"{field}=.*callers may only lower limits"):
        resolve_profile(profiles(), CEILING, "default", ProfileOverrides(**{field: value}))


def test_overrides_cannot_touch_operator_only_fields() -> None:
    with pytest.raises(ValidationError):
        ProfileOverrides(nofile=16)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ProfileOverrides(memory_mib=8)  # below the hard floor


def test_named_profile_above_ceiling_is_refused_at_resolve_time() -> None:
    big = ResourceProfile(name="big", memory_mib=4096)
    ceiling = ResourceProfile(name="max", memory_mib=1024)
    with pytest.raises(ProfileError, match="memory_mib=4096 exceeds the operator maximum 1024"):
        resolve_profile(profiles(big=big), ceiling, "big")


def test_settings_refuse_profiles_above_the_ceiling() -> None:
    with pytest.raises(ValidationError, match="exceeds the operator maximum"):
        ExecutorSettings(profiles={"default": ResourceProfile(pids=4096)})
    with pytest.raises(ValidationError, match="default_profile 'fast' is not in profiles"):
        ExecutorSettings(default_profile="fast")


def test_settings_rename_profiles_to_their_key() -> None:
    settings = ExecutorSettings(profiles={"default": ResourceProfile(), "small": ResourceProfile(memory_mib=64)})
    assert settings.profiles["small"].name == "small"


def test_profile_fields_are_bounded_and_frozen() -> None:
    with pytest.raises(ValidationError):
        ResourceProfile(memory_mib=16)
    with pytest.raises(ValidationError):
        ResourceProfile(cpus=0)
    with pytest.raises(ValidationError):
        ResourceProfile(bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ResourceProfile().memory_mib = 1024  # type: ignore[misc]


def test_sandbox_memory_and_runner_limits() -> None:
    profile = ResourceProfile(memory_mib=128, call_timeout_s=3, output_cap_bytes=4096)
    assert profile.sandbox_memory_bytes(1) == (128 + 32) * MiB
    assert profile.sandbox_memory_bytes(4) == (128 + 4 * 32) * MiB
    limits = profile.runner_limits(4, spare_child=False)
    assert limits["call_timeout_s"] == 3
    assert limits["session_memory_bytes"] == 128 * MiB
    assert limits["output_cap_bytes"] == 4096
    assert limits["max_sessions"] == 4
    assert limits["spare_child"] is False
    # the session process's own memory limit stays below the container's
    assert limits["session_memory_bytes"] < profile.sandbox_memory_bytes(1)


def test_session_memory_is_rlimit_as_under_gvisor_only() -> None:
    from sandpit.executor.profiles import ResourceProfile

    profile = ResourceProfile(memory_mib=100)
    assert profile.runner_limits(1, True)["memory_rlimit"] == "data"
    assert profile.runner_limits(1, True, 0.05, "runsc")["memory_rlimit"] == "as"
    assert profile.runner_limits(1, True, 0.05, "runsc")["session_memory_bytes"] == 100 * 1024 * 1024


def test_sweeps_count_tasks_in_the_pids_cgroup_under_runc_only() -> None:
    from sandpit.executor.profiles import ResourceProfile

    profile = ResourceProfile()
    assert profile.runner_limits(4, True)["cgroup_task_count"] is True
    assert profile.runner_limits(4, True, 0.05, "runsc")["cgroup_task_count"] is False


def test_forks_ahead_reach_the_runner_limits_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandpit.executor.profiles import ResourceProfile
    from sandpit.executor.settings import ExecutorSettings
    from sandpit.sandbox_images.runner.limits import FORK_AHEAD_DEFAULT, FORK_AHEAD_MAX_PER_SANDBOX

    profile = ResourceProfile()
    assert profile.runner_limits(4, True)["forks_ahead"] == FORK_AHEAD_DEFAULT == ExecutorSettings().session_forks_ahead
    assert profile.runner_limits(4, True, forks_ahead=0)["forks_ahead"] == 0
    for value in ("0", "1", str(FORK_AHEAD_MAX_PER_SANDBOX)):
        monkeypatch.setenv("SANDPIT_EXECUTOR_SESSION_FORKS_AHEAD", value)
        assert ExecutorSettings().session_forks_ahead == int(value)
    for value in ("-1", str(FORK_AHEAD_MAX_PER_SANDBOX + 1), "1.5", "two", ""):
        monkeypatch.setenv("SANDPIT_EXECUTOR_SESSION_FORKS_AHEAD", value)
        with pytest.raises(ValueError, match="session_forks_ahead"):
            ExecutorSettings()
