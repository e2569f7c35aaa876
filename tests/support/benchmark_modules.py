"""The benchmark scripts as modules for their unit tests: ``benchmarks/`` is not a package,
so a test loads a script by its path (:func:`load`)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

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


def report_rows(report: ModuleType, results: Path, name: str, saved: dict[str, Any],
                make_rows: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    """The rows one of ``report.py``'s row functions (``make_rows``, e.g.
    ``report._batch_rows``) makes from ``saved`` written as ``<results>/<name>.json``, with
    the loaded ``report`` module reading its results from ``results`` for the call."""
    (results / f"{name}.json").write_text(json.dumps(saved))
    before, report.RESULTS = report.RESULTS, results  # type: ignore[attr-defined]
    try:
        rows: list[dict[str, Any]] = []
        make_rows(rows)
        return rows
    finally:
        report.RESULTS = before  # type: ignore[attr-defined]
