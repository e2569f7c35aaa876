"""The seccomp profile of runsc sandboxes (``executor/docker/seccomp.py``) and where it goes in the
container specification; ``tests/integration/executor/test_gvisor_confine.py`` measures it
in gVisor."""

from __future__ import annotations

import json

from sandpit.executor.docker import engine, seccomp
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.settings import ExecutorSettings


def _spec(runtime: str) -> dict:
    settings = ExecutorSettings(runtime=runtime)
    return engine.container_spec(settings=settings, profile=ResourceProfile(), image="sandpit-sandbox:test",
                                 tenant="acme", sandbox_id="abc123", pool_id="pool1", uid=23456,
                                 socket_dir="/run/sandpit/abc123", limits_json="{}")


def test_runc_keeps_docker_s_default_profile() -> None:
    assert _spec("runc")["security_opt"] == ["no-new-privileges:true"]


def test_runsc_gets_the_profile_as_json() -> None:
    options = _spec("runsc")["security_opt"]
    assert options[0] == "no-new-privileges:true" and len(options) == 2
    assert options[1].startswith("seccomp=")
    assert json.loads(options[1].removeprefix("seccomp=")) == seccomp.runsc_profile()


def test_the_profile_allows_by_default_and_refuses_namespaces_with_eperm() -> None:
    profile = seccomp.runsc_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    rules = profile["syscalls"]
    assert all(rule["action"] == "SCMP_ACT_ERRNO" and rule["errnoRet"] == 1 for rule in rules)
    named = [name for rule in rules if "args" not in rule for name in rule["names"]]
    assert {"unshare", "setns", "mount", "keyctl", "bpf", "perf_event_open"} <= set(named)
    assert len(named) == len(set(named))
    # what Docker's profile, converted by runsc 2022-12, broke: never refused here
    assert not {"clone3", "pselect6", "select", "openat2", "futex_waitv", "personality"} & set(named)
    clone = [rule for rule in rules if rule["names"] == ["clone"]]
    assert sorted(rule["args"][0]["value"] for rule in clone) == sorted(seccomp.CLONE_NEW_FLAGS.values())
    for rule in clone:
        [arg] = rule["args"]
        assert arg["index"] == 0 and arg["op"] == "SCMP_CMP_MASKED_EQ" and arg["valueTwo"] == arg["value"]


def test_the_clone_rules_cover_each_namespace_and_leave_fork_and_threads() -> None:
    mask = 0
    for value in seccomp.CLONE_NEW_FLAGS.values():
        mask |= value
    assert mask == 0x7E020000  # NS | CGROUP | UTS | IPC | USER | PID | NET
    fork, thread = 0x01200011, 0x003D0F00  # glibc's fork; pthread_create's CLONE_VM | CLONE_THREAD | ...
    assert not (fork & mask) and not (thread & mask)
