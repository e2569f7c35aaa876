"""Sandbox image definition: ``Dockerfile``, ``base.json`` (debootstrap recipe) and the
stdlib-only ``runner/`` package copied into the image. Built by
:mod:`sandpit.executor.images`; nothing here imports Docker."""

from pathlib import Path

DEFINITION_DIR = Path(__file__).resolve().parent
RUNNER_FILES = ("protocol.py", "runner.py", "session.py", "schemas.py", "jobs.py", "oneshot.py", "cleanup.py",
                "confine.py")
