"""Sandbox image definition: ``Dockerfile``, ``base.json`` (debootstrap recipe) and the
stdlib-only ``runner/`` package copied into the image. Built by
:mod:`sandpit.executor.images`; nothing here imports Docker."""

from pathlib import Path

DEFINITION_DIR = Path(__file__).resolve().parent
RUNNER_FILES = tuple(sorted(p.name for p in (DEFINITION_DIR / "runner").glob("*.py") if p.name != "__init__.py"))
"""The runner's modules: every ``.py`` file of ``runner/`` (the image gets the folder; this
is the one list, used for the image's content hash and its build context)."""
