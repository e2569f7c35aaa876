"""Reward integrity on the real engine: the code being judged cannot write a verdict.

An environment's module installs, when it is loaded, every hook a Python process offers
(profile and trace functions, audit hooks, patched ``json``/``pickle``/``builtins``, a
thread that walks every frame and rewrites result dicts, a pickle whose ``__reduce__``
runs code when it is loaded). Its state holds objects of its own classes, so the state is
pickled. Honest checks that are False must stay False:

* by default (no ``source`` sent: stand-ins) under runc and under gVisor: none of that
  code runs where checks run;
* with ``source`` (the ``check_objects: environment`` opt-in) the import-time hooks that
  the batch can take back are taken back before any check runs; what the environment's
  classes decide through their own methods (``__eq__``) is theirs, as documented.

Plain-data states (the same module, nothing pickled) never load the module at all.
Everything here runs in sandboxes; the host only reads results.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hostile_environments import ATTACKS, HONEST, HOSTILE
from sandpit.executor.docker import docker_pool
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.jobs import encode_json_state
from sandpit.executor.profiles import ProfileOverrides

pytestmark = pytest.mark.docker

TENANT = "tests"

PLAIN = '''
class Plain:
    def __init__(self, init_config=None):
        self.count = 0

    def bump(self):
        self.count += 1
        return self.count
'''



@pytest.fixture(scope="module", params=["runc", "runsc"])
def judged_pool(request, leak_check, pool_settings, docker_client) -> Iterator[SandboxPool]:
    """A pool per runtime (gVisor only when Docker has it registered)."""
    if request.param == "runsc" and "runsc" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("runsc runtime not registered with Docker")
    with docker_pool(pool_settings(f"verdict-{request.param}", runtime=request.param, pool_size=0)) as pool:
        yield pool


def _states(pool: SandboxPool, source: str, class_name: str) -> tuple[dict, dict]:
    """A real session's encoded initial state and its state after one ``bump``."""
    session = pool.open_session(tenant=TENANT, source=source, class_name=class_name,
                                profile=pool.profile(overrides=ProfileOverrides(call_timeout_s=5.0)))
    try:
        initial = session.read_state()
        assert session.call("bump", {}).status == "ok"
        final = session.read_state()
    finally:
        session.close()
    return initial, final


def _verdicts(pool: SandboxPool, initial: dict, final: dict, checks: list[str], source: str | None = None) -> list:
    results = pool.run_checks(tenant=TENANT, checks=[{"check_item": f"c{i}", "check_func": c}
                                                     for i, c in enumerate(checks)],
                              initial_state=initial, final_state=final, source=source, per_check_timeout_s=5.0)
    return [(r.status, r.passed) for r in results]


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_environments_module_cannot_set_a_verdict_by_default(judged_pool, attack) -> None:
    source = HOSTILE.format(attack=attack)
    initial, final = _states(judged_pool, source, "Hostile")
    assert final["box"][0] == "p" and final["hook"][0] == "p"  # objects of its own classes: pickled
    assert _verdicts(judged_pool, initial, final, HONEST) == [("ok", False), ("ok", False), ("ok", True)]


def test_stand_ins_carry_the_objects_fields_but_not_their_methods(judged_pool) -> None:
    initial, final = _states(judged_pool, HOSTILE.format(attack="all"), "Hostile")
    verdicts = _verdicts(judged_pool, initial, final, [
        "def check_func(final_state):\n    return final_state['box'].value == 1 and type(final_state['box']).__name__ == 'Box'\n",
        "def check_func(final_state):\n    return final_state['box'] == initial_state['box']\n",  # Box.__eq__ is not run
        "def check_func(final_state):\n    return final_state['box'] != final_state['count']\n",
    ])
    assert verdicts == [("ok", True), ("ok", False), ("ok", True)]


def test_plain_states_never_load_the_environment(judged_pool) -> None:
    initial, final = _states(judged_pool, PLAIN, "Plain")
    assert all(entry[0] == "j" for entry in final.values())
    source = HOSTILE.format(attack="all")  # sent, as the opt-in would: nothing in the states needs it
    assert _verdicts(judged_pool, initial, final, HONEST, source=source) == [("ok", False), ("ok", False), ("ok", True)]
    plain = _verdicts(judged_pool, encode_json_state({"count": 0}), encode_json_state({"count": 1}), HONEST)
    assert plain == [("ok", False), ("ok", False), ("ok", True)]


@pytest.mark.parametrize("attack", ["profile", "trace", "json", "builtins", "pickle", "modules"])
def test_the_opt_in_takes_back_import_time_hooks_but_the_classes_decide_for_their_objects(judged_pool, attack) -> None:
    """``check_objects: environment``: the module is loaded to unpickle its classes. The
    hooks and patches it installs at import that the batch can take back do not act on the
    checks; what its classes' own methods answer is theirs (``Box.__eq__`` says True)."""
    source = HOSTILE.format(attack=attack)
    initial, final = _states(judged_pool, source, "Hostile")
    checks = HONEST + ["def check_func(final_state):\n    return final_state['box'] == initial_state['box']\n"]
    assert _verdicts(judged_pool, initial, final, checks, source=source) == [
        ("ok", False), ("ok", False), ("ok", True), ("ok", True)]


def test_a_check_that_walks_frames_changes_only_its_own_verdict(judged_pool) -> None:
    walker = '''
import sys

def check_func(final_state):
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if type(value) is dict and "passed" in value:
                value.update(passed=True, status="ok")
        frame = frame.f_back
    sys.setprofile(lambda f, e, a: a.update(passed=True, status="ok")
                   if e == "return" and type(a) is dict and "passed" in a else None)
    return False
'''
    initial, final = encode_json_state({"count": 0}), encode_json_state({"count": 1})
    verdicts = _verdicts(judged_pool, initial, final, [walker] + HONEST + [walker])
    # the walker may forge its own result (its author's business); nothing else moves
    assert verdicts[1:4] == [("ok", False), ("ok", False), ("ok", True)]
