"""Sandbox image definition: ``Dockerfile``, ``base.json`` (debootstrap recipe), the
stdlib-only ``runner/`` package copied into the image and ``native/``, C sources the image
build compiles for the image's interpreter. Built by
:mod:`sandpit.executor.images`; nothing here imports Docker."""

from pathlib import Path

DEFINITION_DIR = Path(__file__).resolve().parent
RUNNER_FILES = tuple(sorted(p.name for p in (DEFINITION_DIR / "runner").glob("*.py")))
"""The runner package's files: every ``.py`` file of ``runner/``, its ``__init__.py`` too
(the image installs the folder as a regular package; this is the one list, used for the
image's content hash and its build context)."""
NATIVE_FILES = tuple(sorted(p.name for p in (DEFINITION_DIR / "native").glob("*.c")))
"""C sources of ``native/`` (compiled in the image build's builder stage)."""
