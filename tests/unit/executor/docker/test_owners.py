"""Who owns a sandbox and whether that owner is alive (``executor/docker/owners.py``): the
verdicts the reaper acts on, the lease files, hostile labels and lease files. Real
processes and a real directory; no Docker needed."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandpit.executor.docker import owners
from sandpit.executor.docker.owners import Here, LeaseView, OwnerLease, judge

OTHER_BOOT = "0a0b0c0d-0e0f-4000-8000-00000000000e"


@pytest.fixture
def me() -> tuple[str, str]:
    """(owner label, owner-namespace label) of this process."""
    return owners.owner_id(), owners.owner_ns()


@pytest.fixture
def dead() -> tuple[str, str]:
    """Labels of a process of this namespace that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        labels = owners.owner_id(proc.pid), owners.owner_ns(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return labels


def foreign_here() -> Here:
    """A checker in another pid namespace of this boot (what a server in another
    container sees)."""
    here = Here.now()
    return Here(here.hostname, here.boot, str(int(here.namespace) + 1))


def lease_at(directory: Path, owner: str, ns: str, pool: str, age_s: float, timeout_s: float = 10.0) -> Path:
    """A lease as a pool writes it, last renewed ``age_s`` seconds ago."""
    lease = OwnerLease(directory, owner, ns, pool, timeout_s)
    mtime = lease.acquire()
    assert mtime is not None
    os.utime(lease.path, (mtime - age_s, mtime - age_s))
    return lease.path


def view(directory: Path) -> LeaseView:
    return LeaseView(directory, time.time())


def test_labels_of_this_process() -> None:
    owner, ns = owners.owner_id(), owners.owner_ns()
    host, pid, started = owners.parse_owner(owner) or ("", 0, "")
    assert (host, pid) == (socket.gethostname(), os.getpid()) and started.isdigit()
    boot, namespace = owners.parse_ns(ns) or ("", "")
    assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert os.readlink("/proc/self/ns/pid") == f"pid:[{namespace}]"


def test_a_live_process_of_this_namespace_is_alive(me: tuple[str, str], tmp_path: Path) -> None:
    assert judge(*me, "p1", running=True, leases=None).state == "alive"
    assert judge(*me, "p1", running=True, leases=view(tmp_path)).state == "alive"  # no lease: the process says
    lease_at(tmp_path, *me, "p1", age_s=1)
    assert judge(*me, "p1", running=True, leases=view(tmp_path)) == owners.Verdict("alive", "owner lease is fresh")


def test_a_gone_process_of_this_namespace_is_dead_even_with_a_fresh_lease(dead: tuple[str, str],
                                                                           tmp_path: Path) -> None:
    assert judge(*dead, "p1", running=True, leases=None) == owners.Verdict("dead", "owner process is gone")
    lease_at(tmp_path, *dead, "p1", age_s=0)
    assert judge(*dead, "p1", running=True, leases=view(tmp_path)).state == "dead"
    owner, ns = dead
    host, pid, started = owner.split(":")
    assert judge(f"{host}:{os.getpid()}:{started}", owners.owner_ns(), "p1", running=True,
                 leases=None).state == "dead", "a reused pid (start time differs) is not the owner"


def test_an_expired_lease_makes_a_live_process_dead(me: tuple[str, str], tmp_path: Path) -> None:
    lease_at(tmp_path, *me, "p1", age_s=11, timeout_s=10)
    assert judge(*me, "p1", running=True, leases=view(tmp_path)) == owners.Verdict("dead", "owner lease expired")
    assert judge(*me, "p2", running=True, leases=view(tmp_path)).state == "alive", "leases are per pool"


def test_another_namespace_is_judged_by_its_lease_only(me: tuple[str, str], dead: tuple[str, str],
                                                       tmp_path: Path) -> None:
    elsewhere = foreign_here()
    for labels in (me, dead):  # its pids mean nothing here, alive or not
        assert judge(*labels, "p1", running=True, leases=view(tmp_path), here=elsewhere).state == "unknown"
        assert judge(*labels, "p1", running=True, leases=None, here=elsewhere).state == "unknown"
    lease_at(tmp_path, *dead, "p1", age_s=2, timeout_s=10)
    assert judge(*dead, "p1", running=True, leases=view(tmp_path), here=elsewhere).state == "alive"
    lease_at(tmp_path, *dead, "p1", age_s=12, timeout_s=10)
    assert judge(*dead, "p1", running=True, leases=view(tmp_path), here=elsewhere).state == "dead"
    # the timeout is the owner's (written in its lease), not the checker's
    lease_at(tmp_path, *dead, "p1", age_s=12, timeout_s=600)
    assert judge(*dead, "p1", running=True, leases=view(tmp_path), here=elsewhere).state == "alive"


def test_labels_of_earlier_versions_are_judged_by_hostname(dead: tuple[str, str]) -> None:
    owner = dead[0]
    assert judge(owner, "", "p1", running=True, leases=None).state == "dead"
    assert judge("some-other-host:1:1", "", "p1", running=True, leases=None).state == "unknown"
    assert judge(owners.owner_id(), "", "p1", running=True, leases=None).state == "alive"


def test_an_earlier_boot_of_this_host_is_dead_once_its_container_stopped() -> None:
    host = socket.gethostname()
    ns = f"{OTHER_BOOT}/4026531836"
    assert judge(f"{host}:123:456", ns, "p", running=False, leases=None) == owners.Verdict(
        "dead", "owner ran on this host under an earlier boot")
    assert judge(f"{host}:123:456", ns, "p", running=True, leases=None).state == "unknown"
    assert judge("another-host:123:456", ns, "p", running=False, leases=None).state == "unknown"


@pytest.mark.parametrize("owner", ["", "garbage", "a:b", "host:1:2:3", "host:1:2:3:4:5", ":1:2", "host::2",
                                   "host:1:", "host:١٢٣:1", "host:-1:2", "host:1:2\n", "ho st:1:2",
                                   "host:99999999999:1", "h/../../etc:1:2", "x" * 5000 + ":1:2"])
def test_owner_labels_sandpit_did_not_write_are_unowned(owner: str, tmp_path: Path) -> None:
    assert judge(owner, owners.owner_ns(), "p1", running=True, leases=view(tmp_path)).state == "unowned"


@pytest.mark.parametrize("ns", ["garbage", "/", "../../etc/passwd", f"{OTHER_BOOT}/", f"/{4026531836}",
                                f"{OTHER_BOOT.upper()}/1", f"{OTHER_BOOT}/1/2", f"{OTHER_BOOT}/١"])
def test_namespace_labels_sandpit_did_not_write_are_unowned(ns: str, dead: tuple[str, str]) -> None:
    assert judge(dead[0], ns, "p1", running=False, leases=None).state == "unowned"


def test_lease_files_sandpit_did_not_write_do_not_count(dead: tuple[str, str], tmp_path: Path) -> None:
    elsewhere = foreign_here()
    owner, ns = dead
    path = tmp_path / owners.lease_name(owner, ns, "p1")

    def verdict() -> str:
        return judge(owner, ns, "p1", running=True, leases=view(tmp_path), here=elsewhere).state

    old = time.time() - 3600
    for content in (b"", b"not json", b"[1]", b'"x"', b'{"timeout_s": -1}', b'{"timeout_s": 0}',
                    b'{"timeout_s": true}', b'{"timeout_s": "10"}', b'{"timeout_s": NaN}', b'{"timeout_s": 1e308}',
                    b'{"timeout_s": Infinity}', b'{"other": 1}', b"[" * 100000, b'{"timeout_s": 1}' + b" " * 5000):
        path.write_bytes(content)
        os.utime(path, (old, old))
        assert verdict() == "unknown", content[:40]
    path.unlink()
    path.mkdir()
    assert verdict() == "unknown"
    path.rmdir()
    real = lease_at(tmp_path / "elsewhere", owner, ns, "p1", age_s=3000)
    path.symlink_to(real)  # a stale lease reached through a link is not this one's
    assert verdict() == "unknown"
    path.unlink()
    os.mkfifo(path)
    assert verdict() == "unknown"


def test_lease_renewal_release_and_expiry(me: tuple[str, str], tmp_path: Path) -> None:
    directory = tmp_path / "made" / "on" / "demand"
    lease = OwnerLease(directory, *me, "p1", timeout_s=8.0)
    assert lease.renew_period_s == 2.0
    first = lease.acquire()
    assert first is not None and lease.path.parent == directory
    assert json.loads(lease.path.read_text()) == {"owner": me[0], "owner_ns": me[1], "pool": "p1", "timeout_s": 8.0}
    os.utime(lease.path, (first - 100, first - 100))
    renewed = lease.renew()
    assert renewed is not None and renewed >= first
    lease.path.unlink()
    assert lease.renew() is not None and lease.path.exists(), "a removed lease is written again"
    os.utime(lease.path, (first - 100, first - 100))
    lease.renew_if_due()  # renewed just now: not due, the file keeps its old time
    assert lease.path.stat().st_mtime < first
    lease._renewed -= 2.0
    lease.renew_if_due()
    assert lease.path.stat().st_mtime >= first
    lease.expire()
    assert view(directory).state(*me, "p1") == "expired"
    lease.release()
    assert not lease.path.exists() and view(directory).state(*me, "p1") == "missing"
    lease.release()  # twice: no error


def test_a_lease_that_cannot_be_written_warns_once(me: tuple[str, str], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    lease = OwnerLease(blocker / "leases", *me, "p1", timeout_s=4.0)
    with caplog.at_level(logging.WARNING, logger="sandpit.executor.docker.owners"):
        assert lease.acquire() is None
        assert lease.renew() is None
    assert len([r for r in caplog.records if "cannot write the owner lease" in r.getMessage()]) == 1


@pytest.fixture
def garbage_dir(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Path]]]:
    directory = tmp_path / "leases"
    now = time.time()
    paths = {"fresh": lease_at(directory, "h:1:1", "", "fresh", age_s=1, timeout_s=10),
             "expired": lease_at(directory, "h:1:1", "", "expired", age_s=50, timeout_s=10),
             "long expired": lease_at(directory, "h:1:1", "", "long", age_s=101, timeout_s=10),
             "long expired, named": lease_at(directory, "h:1:1", "", "named", age_s=101, timeout_s=10),
             "released": lease_at(directory, "h:1:1", "", "released", age_s=now, timeout_s=10)}
    for name, age in (("old tmp", 3700), ("new tmp", 10)):
        path = directory / f".{'a' * 40}.lease.{age}.tmp"
        path.write_text("{")
        os.utime(path, (now - age, now - age))
        paths[name] = path
    paths["other file"] = directory / "notes.txt"
    paths["other file"].write_text("kept")
    os.utime(paths["other file"], (0, 0))
    yield directory, paths


def test_garbage_collection_keeps_every_lease_that_may_still_matter(garbage_dir: tuple[Path, dict[str, Path]]) -> None:
    directory, paths = garbage_dir
    leases = view(directory)
    assert leases.state("h:1:1", "", "named") == "expired"  # a container names it
    assert leases.collect_garbage() == 3
    gone = {name for name, path in paths.items() if not path.exists()}
    assert gone == {"long expired", "released", "old tmp"}


def test_lease_names_are_hashes_of_the_labels() -> None:
    name = owners.lease_name("../../x:1:2", "/etc", "..")
    assert name.endswith(".lease") and "/" not in name and len(name) == 46
    assert owners.lease_name("a", "b", "c") != owners.lease_name("a", "b", "d")
    assert owners.lease_name("a\nb", "", "c") != owners.lease_name("a", "b", "\nc")


def test_settings_of_sweeps_and_leases() -> None:
    from pydantic import ValidationError
    from sandpit.executor.settings import ExecutorSettings

    settings = ExecutorSettings(run_dir=Path("/srv/run/sandpit"))
    assert settings.reap_interval_s == 30.0 and settings.owner_lease_timeout_s == 60.0
    assert settings.resolved_lease_dir() == Path("/srv/run/sandpit.leases")
    shared = ExecutorSettings(run_dir=Path("/srv/run/sandpit"), owner_lease_dir=Path("/shared/leases"))
    assert shared.resolved_lease_dir() == Path("/shared/leases")
    assert ExecutorSettings(reap_interval_s=0).reap_interval_s == 0  # no sweeps
    for bad in ({"reap_interval_s": -1}, {"owner_lease_timeout_s": 0}, {"owner_lease_timeout_s": 0.1},
                {"reap_interval_s": float("nan")}):
        with pytest.raises(ValidationError):
            ExecutorSettings(**bad)
