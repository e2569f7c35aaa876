"""The runner's files: named by the process they run in, none shadowing the standard
library, one file list for the image, and an entry point that follows the names."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from sandpit.executor import engine
from sandpit.sandbox_images import DEFINITION_DIR, RUNNER_FILES

RUNNER_DIR = Path(DEFINITION_DIR) / "runner"
SHARED = {"protocol", "limits"}


def _stems() -> list[str]:
    return [name[:-3] for name in RUNNER_FILES]


def test_every_runner_module_says_where_it_runs() -> None:
    for stem in _stems():
        assert stem.startswith(("pid1_", "child_")) or stem in SHARED, stem
    assert {"pid1_runner", "child_session", "protocol"} <= set(_stems())


def test_no_runner_module_shadows_a_standard_library_module() -> None:
    # in the sandbox the runner's directory is sys.path[0]: a runner module named like a
    # stdlib module would replace it for the runner and for every session process
    shadowing = sorted(set(_stems()) & (set(sys.stdlib_module_names) | set(sys.builtin_module_names)))
    assert not shadowing, f"runner modules shadowing the standard library: {shadowing}"


def test_the_image_gets_the_folder_and_starts_pid1_runner() -> None:
    assert RUNNER_FILES == tuple(sorted(p.name for p in RUNNER_DIR.glob("*.py") if p.name != "__init__.py"))
    dockerfile = (Path(DEFINITION_DIR) / "Dockerfile").read_text()
    assert "COPY runner/ /opt/sandpit/runner/" in dockerfile  # the folder: one file list
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    assert json.loads(cmd.group(1))[1:] == engine.RUNNER_CMD[1:] == [
        "-s", "-S", "-B", "/opt/sandpit/runner/pid1_runner.py"]


def test_imports_between_runner_modules_name_existing_files() -> None:
    stems = set(_stems())
    for name in RUNNER_FILES:
        tree = ast.parse((RUNNER_DIR / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names if alias.name in stems
                            or alias.name.startswith(("pid1_", "child_"))]
            else:
                continue
            for module in imported:
                assert module in stems, f"{name} imports {module}, which is not a runner file"


def test_session_processes_boot_the_child_session_module() -> None:
    tree = ast.parse((RUNNER_DIR / "pid1_runner.py").read_text())
    boot = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "SESSION_BOOT")
    assert "import child_session; child_session.main()" in ast.unparse(boot)
