"""The runner's files: named by the process they run in, none shadowing the standard
library, one file list for the image, an entry point that follows the names, and the
rules of the package's imports: PID 1's and the children's modules never import each
other, PID 1's parts import one way, no cycle, and the host imports only the shared
modules of the runner (protocol, limits, wire and attached: the frames with attachments
the host writes and PID 1 reads)."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from sandpit.executor.docker import engine
from sandpit.sandbox_images import DEFINITION_DIR, NATIVE_FILES, RUNNER_FILES

RUNNER_DIR = Path(DEFINITION_DIR) / "runner"
SHARED = {"protocol", "limits", "wire", "attached"}
PACKAGE = "sandpit_runner"
"""The runner's package name in the image (``/opt/sandpit/sandpit_runner``)."""


def _stems() -> list[str]:
    return [name[:-3] for name in RUNNER_FILES if name != "__init__.py"]


def test_every_runner_module_says_where_it_runs() -> None:
    for stem in _stems():
        assert stem.startswith(("pid1_", "child_")) or stem in SHARED, stem
    assert {"pid1_runner", "child_session", "protocol"} <= set(_stems())


def test_no_runner_module_shadows_a_standard_library_module() -> None:
    # the package's modules import each other relatively, but a name shared with the
    # standard library is still one reader mistaking one for the other; the package's own
    # name is on sys.path while a process imports the runner
    shadowing = sorted((set(_stems()) | {PACKAGE}) & (set(sys.stdlib_module_names) | set(sys.builtin_module_names)))
    assert not shadowing, f"runner modules shadowing the standard library: {shadowing}"


def test_the_image_gets_the_folder_as_a_package_and_pid1_imports_it() -> None:
    assert RUNNER_FILES == tuple(sorted(p.name for p in RUNNER_DIR.glob("*.py")))
    assert "__init__.py" in RUNNER_FILES  # a regular package, not a namespace one
    dockerfile = (Path(DEFINITION_DIR) / "Dockerfile").read_text()
    assert f"COPY runner/ /opt/sandpit/{PACKAGE}/" in dockerfile  # the folder: one file list
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert cmd is not None
    assert json.loads(cmd.group(1))[1:] == engine.RUNNER_CMD[1:] == [
        "-s", "-S", "-B", "-c",
        f"import sys; sys.path[0] = '/opt/sandpit'; from {PACKAGE} import pid1_runner; pid1_runner.main()"]


def test_imports_between_runner_modules_name_existing_files() -> None:
    stems = set(_stems()) | {name[:-2] for name in NATIVE_FILES}  # C modules the image build compiles
    for name in RUNNER_FILES:
        tree = ast.parse((RUNNER_DIR / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module in stems):
                imported = [node.module] if node.module else [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names if alias.name in stems
                            or alias.name.startswith(("pid1_", "child_"))]
            else:
                continue
            for module in imported:
                assert module in stems, f"{name} imports {module}, which is not a runner file"


def test_spawned_processes_boot_the_child_spare_module() -> None:
    tree = ast.parse((RUNNER_DIR / "pid1_children.py").read_text())
    boot = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "SESSION_BOOT")
    assert "import child_spare; child_spare.main()" in ast.unparse(boot)


CAP_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _is_cap(name: str) -> bool:
    return bool(CAP_NAME.match(name)) and (name.startswith("MAX_") or "_MAX_" in name or "_CAP_" in name
                                           or name.endswith(("_BYTES", "_CHARS", "_S")))


def _numeric(node: ast.expr) -> bool:
    return all(isinstance(n, ast.Constant | ast.BinOp | ast.operator | ast.UnaryOp | ast.unaryop)
               and (not isinstance(n, ast.Constant) or isinstance(n.value, int | float)) for n in ast.walk(node))


def test_every_cap_is_defined_once_in_limits() -> None:
    # the host's side of the runner too; not executor/docker/owners.py, whose caps bound the lease
    # files pools on one engine share: it never meets the runner
    host = sorted(p for p in (Path(DEFINITION_DIR).parent / "executor").rglob("*.py") if p.name != "owners.py")
    for path in [RUNNER_DIR / name for name in RUNNER_FILES if name != "limits.py"] + host:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                assert not (_is_cap(name) and _numeric(node.value)), \
                    f"{path.name}: cap {name} belongs in sandbox_images/runner/limits.py"


def _runner_imports(name: str) -> set[str]:
    """The runner modules ``name`` imports, in any form and anywhere in the file (module
    level, inside functions, under ``TYPE_CHECKING``): ``from . import x``, ``from .x
    import y``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((RUNNER_DIR / name).read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
    return found & set(_stems())


PID1_ORDER = [{"pid1_cleanup"}, {"pid1_loop", "pid1_deadlines", "pid1_configs"}, {"pid1_host"}, {"pid1_children"}, {"pid1_forks"}, {"pid1_templates"},
              {"pid1_replies", "pid1_job_requests", "pid1_session_requests", "pid1_verdicts", "pid1_groups"},
              {"pid1_sessions", "pid1_jobs"},
              {"pid1_runner"}]
"""PID 1's parts, each importing only parts of the tiers before its own (sessions and jobs
are peers: neither imports the other)."""
HOST_DIRS = ("executor", "api", "cli", "client", "importers", "synthesis")
HOST_MAY_IMPORT = SHARED


def test_pid1_and_child_modules_never_import_each_other() -> None:
    for stem in _stems():
        imported = _runner_imports(f"{stem}.py")
        if stem.startswith("pid1_"):
            assert not {m for m in imported if m.startswith("child_")}, (stem, imported)
        elif stem.startswith("child_"):
            assert not {m for m in imported if m.startswith("pid1_")}, (stem, imported)
        else:  # shared by both sides and the host: only each other
            assert imported <= SHARED, (stem, imported)


def test_pid1_imports_run_one_way() -> None:
    tier = {stem: level for level, stems in enumerate(PID1_ORDER) for stem in stems}
    assert set(tier) == {stem for stem in _stems() if stem.startswith("pid1_")}, "every pid1_ module has a tier"
    for stem, level in tier.items():
        for imported in _runner_imports(f"{stem}.py") & set(tier):
            assert tier[imported] < level, f"{stem} imports {imported}, which is not before it"


def test_no_import_cycle_among_runner_modules() -> None:
    graph = {stem: _runner_imports(f"{stem}.py") for stem in _stems()}
    done: set[str] = set()

    def visit(stem: str, path: list[str]) -> None:
        assert stem not in path, f"import cycle: {' -> '.join([*path[path.index(stem):], stem])}"
        if stem in done:
            return
        for imported in sorted(graph[stem]):
            visit(imported, [*path, stem])
        done.add(stem)

    for stem in sorted(graph):
        visit(stem, [])


def test_the_host_imports_only_protocol_limits_and_wire_of_the_runner() -> None:
    root = Path(DEFINITION_DIR).parent
    runner = "sandpit.sandbox_images.runner"
    checked = 0
    for path in sorted(p for folder in HOST_DIRS for p in (root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == runner:
                    modules = {alias.name for alias in node.names}
                elif node.module.startswith(runner + "."):
                    modules = {node.module[len(runner) + 1:].split(".")[0]}
                elif node.module == "sandpit.sandbox_images":
                    modules = {alias.name for alias in node.names} & {"runner"}
                else:
                    continue
            elif isinstance(node, ast.Import):
                modules = {alias.name[len(runner) + 1:].split(".")[0] or "runner" for alias in node.names
                           if alias.name == runner or alias.name.startswith(runner + ".")}
            else:
                continue
            checked += 1
            assert modules <= HOST_MAY_IMPORT, f"{path.relative_to(root)} imports {modules} of the runner"
    assert checked > 10  # the scan sees the host's imports of the runner


def test_every_runner_module_is_under_600_lines() -> None:
    for name in RUNNER_FILES:
        lines = (RUNNER_DIR / name).read_text().count("\n")
        assert lines < 600, f"{name} has {lines} lines"


def test_new_runner_modules_ship_in_the_image() -> None:
    assert {"pid1_cleanup.py", "child_confine.py"} <= set(RUNNER_FILES)
