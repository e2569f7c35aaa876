"""Backend selection as typed data: the environment's variables (the ones the README
documents) choose a config class by its ``type``; bad names and options are refused with a
validation error naming them; :func:`get_executor` builds whatever config it is given,
handing it the settings and the affinity, and no backend module is imported until then."""

from __future__ import annotations

import subprocess
import sys
from typing import Literal

import pytest
from memory_driver import MemoryDriver
from pydantic import BaseModel, ValidationError
from sandpit.executor import (
    EXECUTOR_CONFIG,
    Affinity,
    BackendSettings,
    Executor,
    ExecutorSettings,
    ImageSettings,
    LocalConfig,
    RayConfig,
    configured,
    get_executor,
)
from sandpit.executor.pool import SandboxPool
from sandpit.executor.ray import MemoryAffinity


def test_local_is_the_default() -> None:
    assert configured(BackendSettings()) == LocalConfig()


def test_the_documented_variables_choose_ray_and_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDPIT_EXECUTOR_BACKEND", "ray")
    monkeypatch.setenv("SANDPIT_RAY_ADDRESS", "10.0.0.5:6379")
    monkeypatch.setenv("SANDPIT_RAY_DIRECT_CALLS", "false")
    assert configured(BackendSettings()) == RayConfig(address="10.0.0.5:6379", direct_calls=False)


def test_another_backends_options_do_not_leak_into_the_chosen_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDPIT_RAY_ADDRESS", "10.0.0.5:6379")  # set, but local is chosen
    assert configured(BackendSettings()) == LocalConfig()


@pytest.mark.parametrize("backend", ["kubernetes", "", "RAY", "local; rm -rf /"])
def test_an_unknown_backend_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv("SANDPIT_EXECUTOR_BACKEND", backend)
    with pytest.raises(ValidationError, match="executor_backend"):
        BackendSettings()


@pytest.mark.parametrize("data", [
    {"type": "ray", "adress": "typo"},  # unknown option
    {"type": "local", "address": "x"},  # another backend's option
    {"type": "ray", "direct_calls": "sometimes"},
    {"address": "x"},  # no type
    {"type": "docker"},
    [],
])
def test_config_data_is_validated_strictly(data: object) -> None:
    with pytest.raises(ValidationError):
        EXECUTOR_CONFIG.validate_python(data)


def test_configs_are_plain_data() -> None:
    ray = RayConfig(address="head:6379")
    assert EXECUTOR_CONFIG.validate_python(ray.model_dump()) == ray
    assert EXECUTOR_CONFIG.validate_json('{"type": "local"}') == LocalConfig()


BUILT: list[tuple[object, ...]] = []
"""What ``RecordingConfig.build`` was handed, call by call."""


class RecordingConfig(BaseModel):
    """A config of a backend that does not exist: builds a pool over the in-memory driver
    and records what get_executor handed it."""

    type: Literal["recording"] = "recording"

    def build(self, settings: ExecutorSettings | None = None, *, image_settings: ImageSettings | None = None,
              affinity: Affinity | None = None) -> Executor:
        BUILT.append((settings, image_settings, affinity))
        return SandboxPool(MemoryDriver(), settings).start()


def test_get_executor_builds_any_config_with_what_the_caller_gives() -> None:
    settings, affinity = ExecutorSettings(pool_size=0), MemoryAffinity()
    executor = get_executor(RecordingConfig(), settings, affinity=affinity)
    try:
        assert isinstance(executor, Executor) and BUILT == [(settings, None, affinity)]
    finally:
        executor.close()


def test_the_package_face_imports_no_backend() -> None:
    code = ("import sys, sandpit.executor\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('docker', 'ray') "
            "or m.startswith(('sandpit.executor.docker', 'sandpit.executor.ray'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
