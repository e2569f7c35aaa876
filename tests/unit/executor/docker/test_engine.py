"""The hardened container specification and the leftover-owner logic (no Docker needed)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from sandpit.executor.docker import engine
from sandpit.executor.profiles import MiB, ResourceProfile
from sandpit.executor.settings import ExecutorSettings


def make_spec(settings: ExecutorSettings | None = None, profile: ResourceProfile | None = None) -> dict:
    settings = settings or ExecutorSettings()
    profile = profile or ResourceProfile()
    return engine.container_spec(
        settings=settings, profile=profile, image="sandpit-sandbox:test", tenant="acme", sandbox_id="abc123",
        pool_id="pool1", uid=23456, socket_dir="/run/sandpit/abc123",
        limits_json=json.dumps(profile.runner_limits(settings.sessions_per_sandbox, True)))


def test_no_network_readonly_root_no_privileges() -> None:
    spec = make_spec()
    assert spec["network_mode"] == "none"
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert "cap_add" not in spec
    assert spec.get("privileged") is not True
    assert spec["security_opt"] == ["no-new-privileges:true"]  # and no seccomp/apparmor override
    assert spec["ipc_mode"] == "private"
    assert "pid_mode" not in spec and "userns_mode" not in spec
    assert "runtime" not in spec  # runc: Docker's default


def test_runs_as_the_given_non_root_uid_and_sandbox_group() -> None:
    spec = make_spec()
    assert spec["user"] == "23456:10001"


def test_tmpfs_mounts_are_capped_and_noexec() -> None:
    spec = make_spec(profile=ResourceProfile(tmpfs_mib=16))
    assert set(spec["tmpfs"]) == {"/tmp", "/work"}
    for options in spec["tmpfs"].values():
        opts = options.split(",")
        assert {"noexec", "nosuid", "nodev", "size=16m"} <= set(opts)
    assert "mode=1733" in spec["tmpfs"]["/work"].split(",")  # work root: not listable


def test_memory_cpu_and_process_limits() -> None:
    profile = ResourceProfile(memory_mib=128, cpus=0.25, pids=32, nofile=100, fsize_mib=8)
    spec = make_spec(ExecutorSettings(sessions_per_sandbox=2), profile)
    assert spec["mem_limit"] == spec["memswap_limit"] == (128 + 2 * 32) * MiB  # no swap
    assert spec["cpu_quota"] / spec["cpu_period"] == pytest.approx(0.25)
    assert spec["pids_limit"] == 32
    ulimits = {u.name: (u.soft, u.hard) for u in spec["ulimits"]}
    assert ulimits == {"nofile": (100, 100), "nproc": (32, 32), "fsize": (8 * MiB, 8 * MiB), "core": (0, 0)}


def test_the_runners_nofile_holds_every_session_of_a_shared_sandbox() -> None:
    # 256 sessions need 4 descriptors each in PID 1: the container's nofile (the runner's)
    # is raised for them, while the processes that run untrusted code keep the profile's
    profile = ResourceProfile(nofile=256)
    spec = make_spec(ExecutorSettings(sessions_per_sandbox=256), profile)
    ulimits = {u.name: (u.soft, u.hard) for u in spec["ulimits"]}
    assert ulimits["nofile"] == (64 + 4 * 256, 64 + 4 * 256)
    runner = json.loads(spec["environment"]["SANDPIT_LIMITS"])
    assert runner["session_nofile"] == 256


def test_the_runners_nofile_is_never_below_the_profiles() -> None:
    profile = ResourceProfile(nofile=4096)
    for per in (1, 2, 256):
        ulimits = {u.name: u.soft for u in make_spec(ExecutorSettings(sessions_per_sandbox=per), profile)["ulimits"]}
        assert ulimits["nofile"] == 4096


def test_only_the_socket_directory_is_mounted_read_only() -> None:
    spec = make_spec()
    assert spec["volumes"] == {"/run/sandpit/abc123": {"bind": "/run/sandpit", "mode": "ro"}}
    assert "mounts" not in spec and "devices" not in spec


def test_labels_and_environment() -> None:
    spec = make_spec()
    labels = spec["labels"]
    assert labels[engine.LABEL] == "1"
    assert labels[engine.LABEL_TENANT] == "acme"
    assert labels[engine.LABEL_SANDBOX] == "abc123"
    assert labels[engine.LABEL_POOL] == "pool1"
    assert labels[engine.LABEL_OWNER] == engine.owner_id()
    # the token is a file at a fixed path in the socket directory: neither it nor its path
    # is in the environment (gVisor shows /proc/1/environ to every process of the runner's uid)
    assert set(spec["environment"]) == {"SANDPIT_LIMITS"}
    assert not any("/run/sandpit" in value or "token" in value.lower() for value in spec["environment"].values())
    assert json.loads(spec["environment"]["SANDPIT_LIMITS"])["call_timeout_s"] == 10.0
    assert spec["command"] == engine.RUNNER_CMD
    assert spec["stop_signal"] == "SIGKILL"
    assert spec["log_config"]["config"]["max-size"] == "1m"


def test_gvisor_runtime_is_passed_through() -> None:
    assert make_spec(ExecutorSettings(runtime="runsc"))["runtime"] == "runsc"


def test_gvisor_gets_pids_headroom_for_its_own_threads_but_nproc_stays() -> None:
    spec = make_spec(ExecutorSettings(runtime="runsc", runsc_pids_headroom=100, runsc_pids_per_process=8))
    nproc = next(u for u in spec["ulimits"] if u.name == "nproc")
    assert spec["pids_limit"] == ResourceProfile().pids * 8 + 100
    assert nproc.soft == nproc.hard == ResourceProfile().pids
    assert make_spec(ExecutorSettings(runsc_pids_headroom=100))["pids_limit"] == ResourceProfile().pids


def test_owner_id_and_liveness() -> None:
    me = engine.owner_id()
    host, pid, started = me.split(":")
    assert host == socket.gethostname() and int(pid) == os.getpid() and started.isdigit()
    assert engine.owner_alive(me)
    assert not engine.owner_alive("")
    assert not engine.owner_alive(f"{host}:{pid}:{int(started) + 1}")  # pid reused by another process
    assert engine.owner_alive("some-other-host:1:1")  # other hosts' sandboxes are never ours to reap
    assert not engine.owner_alive(f"{host}:notapid:1")


def test_owner_of_an_exited_process_is_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        owner = engine.owner_id(proc.pid)
        assert engine.owner_alive(owner)
    finally:
        proc.kill()
        proc.wait()
    assert not engine.owner_alive(owner)


@pytest.mark.parametrize(("fraction", "cpus", "expected"), [(1.0, 0.25, 2500), (0.5, 0.5, 2500), (0.0, 1.0, 0),
                                                           (1.0, 0.01, 1000)])
def test_cpu_burst_is_a_fraction_of_the_quota(fraction: float, cpus: float, expected: int) -> None:
    from sandpit.executor.docker.engine import cpu_burst_us

    settings = ExecutorSettings(cpu_burst_fraction=fraction)
    profile = ResourceProfile(cpus=cpus)
    assert cpu_burst_us(settings, profile) == expected
    assert cpu_burst_us(settings, profile) <= make_spec(settings, profile)["cpu_quota"]  # the kernel's cap


@pytest.mark.parametrize("fraction", [-0.1, 1.01, float("nan")])
def test_a_burst_beyond_the_quota_or_negative_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError):
        ExecutorSettings(cpu_burst_fraction=fraction)


def test_setting_a_burst_without_a_cgroup_file_is_false() -> None:
    from sandpit.executor.docker.engine import set_cpu_burst

    assert set_cpu_burst("f" * 64, 1000) is False  # no such container



def test_host_memory_total_is_read_once_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    with open("/proc/meminfo") as handle:
        line = next(line for line in handle if line.startswith("MemTotal:"))
    expected = int(line.split()[1]) * 1024
    monkeypatch.setattr(engine, "_memory_total", 0)
    assert engine.host_memory_total() == expected
    opened: list[str] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    assert engine.host_memory_total() == expected
    assert opened == []  # kept: the admission asks on every placement


def test_an_unreadable_host_memory_total_is_0_and_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_memory_total", 0)
    real_open = open

    def failing(path: str, *args: object, **kwargs: object) -> object:
        if path == "/proc/meminfo":
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", failing)
    assert engine.host_memory_total() == 0
    monkeypatch.setattr("builtins.open", real_open)
    assert engine.host_memory_total() > 0
