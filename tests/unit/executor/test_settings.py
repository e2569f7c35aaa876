"""Executor settings read the environment when they are made, never when the module is
imported (tests and the CLI override them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandpit.executor.settings import ImageSettings


def test_the_image_cache_follows_the_environment_when_the_settings_are_made(monkeypatch: pytest.MonkeyPatch,
                                                                             tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "one"))
    assert ImageSettings().cache_dir == tmp_path / "one" / "sandpit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "two"))  # after import: still read
    assert ImageSettings().cache_dir == tmp_path / "two" / "sandpit"
    monkeypatch.setenv("SANDPIT_IMAGE_CACHE_DIR", str(tmp_path / "chosen"))
    assert ImageSettings().cache_dir == tmp_path / "chosen"


def test_sessions_share_a_sandbox_by_default_under_runc_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandpit.executor.settings import SHARED_SESSIONS_DEFAULT, ExecutorSettings

    monkeypatch.delenv("SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX", raising=False)
    monkeypatch.delenv("SANDPIT_EXECUTOR_RUNTIME", raising=False)
    assert ExecutorSettings().sessions_per_sandbox == SHARED_SESSIONS_DEFAULT > 1
    assert ExecutorSettings(runtime="runsc").sessions_per_sandbox == 1
    assert ExecutorSettings(sessions_per_sandbox=1).sessions_per_sandbox == 1  # set: kept
    assert ExecutorSettings(runtime="runsc", sessions_per_sandbox=4).sessions_per_sandbox == 4
    monkeypatch.setenv("SANDPIT_EXECUTOR_RUNTIME", "runsc")
    monkeypatch.setenv("SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX", "3")
    assert ExecutorSettings().sessions_per_sandbox == 3  # from the environment: kept, whatever the runtime
    monkeypatch.setenv("SANDPIT_EXECUTOR_SESSIONS_PER_SANDBOX", "0")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        ExecutorSettings()
