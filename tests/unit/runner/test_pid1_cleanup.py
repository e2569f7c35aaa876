"""Pure helpers of PID 1's containment (``pid1_cleanup``): removing trees, proving a
directory empty, sweeps that select nothing outside a sandbox's pid namespace."""

from __future__ import annotations

import os

from sandpit.sandbox_images.runner import pid1_cleanup


def test_remove_handles_unreadable_and_deep_trees(tmp_path) -> None:
    root = tmp_path / "leftover"
    deep = root
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    locked = root / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "g").write_text("y")
    os.chmod(locked / "inner", 0)
    os.chmod(locked, 0)
    os.symlink("/etc/passwd", root / "link")
    pid1_cleanup.remove(str(root))
    assert not root.exists()
    assert os.path.exists("/etc/passwd")  # a symlink is removed, never followed
    pid1_cleanup.remove(str(root))  # missing: no error


def test_scrub_and_baseline_prove_a_directory_empty(tmp_path) -> None:
    (tmp_path / "a").write_text("x")
    (tmp_path / "b" / "c").mkdir(parents=True)
    assert pid1_cleanup.scrub(str(tmp_path)) == []
    assert os.listdir(tmp_path) == []
    assert pid1_cleanup.scrub(str(tmp_path / "missing")) == []


def test_sweep_outside_a_pid_namespace_selects_nothing_it_is_not_told_to() -> None:
    seen = []
    assert pid1_cleanup.sweep(lambda pid, sid: seen.append(pid) or False)
    assert os.getpid() not in seen and seen  # it scanned, selected nothing, killed nothing
    assert pid1_cleanup.kill_all() is True  # not PID 1: refuses to kill(-1) on a host
