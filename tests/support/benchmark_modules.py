"""The benchmark scripts as modules for their unit tests: ``benchmarks/`` is not a package,
so a test loads a script by its path (:func:`load`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
"""The repository's ``benchmarks/`` directory."""


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` executed as a new module named ``name`` (each call a new
    one). Raises FileNotFoundError when there is no such script, and what the script's
    import raises."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has a loader
        raise ImportError(f"cannot load benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
