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
