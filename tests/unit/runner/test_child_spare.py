"""The spare's start (``child_spare``): the compiler warmed up before any request, with
nothing of the warm-up source executed."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

from sandpit.sandbox_images.runner import child_spare


def test_the_warm_up_source_has_the_constructs_of_an_environment_class() -> None:
    tree = ast.parse(child_spare.WARM_UP_SOURCE)
    kinds = {type(node).__name__ for node in ast.walk(tree)}
    assert {"ClassDef", "FunctionDef", "AnnAssign", "Import", "DictComp", "JoinedStr", "Raise"} <= kinds
    assert any(isinstance(node, ast.FunctionDef) and node.decorator_list for node in ast.walk(tree))


def test_warming_the_compiler_executes_nothing() -> None:
    # a fresh interpreter: the names the source would bind, and the modules it imports, stay absent
    script = ("import sys; from sandpit.sandbox_images.runner import child_spare; "
              "before = set(sys.modules); child_spare.warm_compiler(); "
              "new = set(sys.modules) - before; "
              "assert not new, new; "
              "assert not any('WarmUp' in vars(m) for m in list(sys.modules.values()) if m is not None), 'executed'; "
              "print('ok')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_spare_warms_its_compiler_after_its_limits_and_before_serving() -> None:
    body = ast.parse(inspect.getsource(child_spare.main)).body[0]
    assert isinstance(body, ast.FunctionDef)
    found = sorted((node.lineno, node.col_offset, ast.unparse(node.func)) for node in ast.walk(body)
                   if isinstance(node, ast.Call))
    calls = [name for _, _, name in found]
    assert calls.index("harden") < calls.index("warm_compiler") < calls.index("child_session.serve")
