"""The pool's per-sandbox session cap (:meth:`Admission.session_cap`), no Docker needed."""

from __future__ import annotations

from sandpit.executor.pool.admission import Admission
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.settings import ExecutorSettings


def admission(per: int) -> Admission:
    return Admission(ExecutorSettings(sessions_per_sandbox=per), lambda: 0)


def test_the_cap_is_sessions_per_sandbox_when_the_profile_has_room() -> None:
    assert admission(256).session_cap(ResourceProfile(pids=512)) == 256


def test_the_runners_descriptors_do_not_lower_the_cap() -> None:
    # the runner's nofile is sized for sessions_per_sandbox (ResourceProfile.runner_nofile),
    # so a small per-process nofile does not shrink a sandbox to a few dozen sessions
    assert admission(256).session_cap(ResourceProfile(pids=512, nofile=64)) == 256


def test_the_profiles_pids_lower_the_cap() -> None:
    assert admission(256).session_cap(ResourceProfile(pids=64)) == 48
    assert admission(256).session_cap(ResourceProfile(pids=16)) == 1  # at least one


def test_one_session_per_sandbox_is_always_one() -> None:
    assert admission(1).session_cap(ResourceProfile(pids=8)) == 1
