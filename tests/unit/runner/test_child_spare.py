"""The spare's start (``child_spare``): the compiler warmed up before any request, with
nothing of the warm-up source executed."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

from sandpit.sandbox_images.runner import child_spare


def in_a_fresh_interpreter(script: str) -> str:
    """What ``script`` prints, run by a new interpreter of this one (it must succeed)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


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
    assert in_a_fresh_interpreter(script) == "ok"


def test_the_spare_warms_its_compiler_after_its_limits_and_before_serving() -> None:
    body = ast.parse(inspect.getsource(child_spare.main)).body[0]
    assert isinstance(body, ast.FunctionDef)
    found = sorted((node.lineno, node.col_offset, ast.unparse(node.func)) for node in ast.walk(body)
                   if isinstance(node, ast.Call))
    calls = [name for _, _, name in found]
    assert calls.index("harden") < calls.index("warm_compiler") < calls.index("child_session.serve")


def test_a_rehearsal_runs_an_open_and_leaves_nothing_behind() -> None:
    # a fresh interpreter: the rehearsal's module leaves sys.modules, its objects are collected,
    # and it opens no descriptor and starts no thread
    script = ("import gc, os, sys, threading; from sandpit.sandbox_images.runner import child_spare; "
              "before, fds = set(sys.modules), set(os.listdir('/proc/self/fd')); "
              "child_spare.rehearse({}); "
              "new = set(sys.modules) - before; assert not new, new; "
              "assert not [o for o in gc.get_objects() if type(o).__name__ == 'Rehearsal' "
              "or (isinstance(o, type) and o.__name__ == 'Rehearsal')], 'left objects'; "
              "assert set(os.listdir('/proc/self/fd')) == fds; assert threading.active_count() == 1; "
              "print('ok')")
    assert in_a_fresh_interpreter(script) == "ok"


def test_the_rehearsal_does_every_step_of_an_open_and_a_call(monkeypatch) -> None:
    from sandpit.sandbox_images.runner import child_instance, child_session

    seen: list[str] = []
    for module, name in ((child_instance, "load_class"), (child_instance, "instantiate"),
                         (child_session.Session, "delta_json")):
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    child_spare.rehearse({})
    assert seen == ["load_class", "instantiate", "delta_json", "delta_json"]


def test_a_rehearsal_that_fails_still_cleans_up(monkeypatch) -> None:
    from sandpit.sandbox_images.runner import child_instance

    def broken(cls, init_config, retyped=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(child_instance, "instantiate", broken)
    child_spare.rehearse({})  # never raises
    assert child_instance.MODULE_NAME not in sys.modules
    assert not any(name in sys.modules for name in child_instance.LEGACY_MODULE_NAMES)


def test_only_a_process_holding_nothing_rehearses(monkeypatch) -> None:
    from sandpit.sandbox_images.runner import child_session

    calls: list[object] = []
    monkeypatch.setattr(child_spare, "rehearse", calls.append)
    session = child_session.Session(-1, {"x": 1})
    child_spare.become({"op": "rehearse", "id": ""}, session)
    session.preloaded = type("Preloaded", (), {})
    child_spare.become({"op": "rehearse", "id": ""}, session)
    assert calls == [{"x": 1}]
