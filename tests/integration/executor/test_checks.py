"""Check functions (EnvScaler rule-based reward) on the real engine: ``SandboxPool.run_checks``.

Every check source below is untrusted code: it only ever runs inside sandboxes, each
check in a fresh process of its own (forked from a process that restored the states;
never an environment's process), or, when the sandbox proves it read-only and the states
are plain data, in that process itself. Checks that fail in every
possible way each get their own status, the checks after them still run, nothing one
check does reaches another's verdict, and the sandbox keeps serving. States are restored
as real Python objects (sets, dates, instances of the environment's classes).
"""

from __future__ import annotations

import json
import re
import time

import pytest
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.jobs import encode_json_state
from sandpit.executor.profiles import ResourceProfile
from sandpit.executor.results import CheckResult
from sandpit.sandbox_images.runner import limits
from sandpit.sandbox_images.runner.child_readonly import why_not_read_only

pytestmark = pytest.mark.docker

TENANT = "tests"
INITIAL = {"orders": {"O1": {"status": "pending", "items": ["P1"]}}, "balance": 100, "log": []}
FINAL = {"orders": {"O1": {"status": "shipped", "items": ["P1"]}}, "balance": 80, "log": ["ship O1"]}


def check(body: str, prelude: str = "") -> str:
    """A ``check_func`` source whose body is ``body`` (indented here)."""
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{prelude}\n" * bool(prelude) + f"def check_func(final_state):\n{lines}\n"


OK = check("return final_state['orders']['O1']['status'] == 'shipped'")
FALSE = check("return final_state['balance'] == 100")


def run(pool: SandboxPool, profile: ResourceProfile, sources: list[str], timeout_s: float | None = None,
        initial: dict | None = None, final: dict | None = None, encoded: bool = False,
        source: str | None = None) -> list[CheckResult]:
    """Run ``sources`` as checks on plain JSON states (or already ``encoded`` ones)."""
    checks = [{"check_item": f"check {i}", "check_func": source} for i, source in enumerate(sources)]
    initial = INITIAL if initial is None else initial
    final = FINAL if final is None else final
    if not encoded:
        initial, final = encode_json_state(initial), encode_json_state(final)
    results = pool.run_checks(tenant=TENANT, checks=checks, initial_state=initial, final_state=final,
                              profile=profile, per_check_timeout_s=timeout_s, source=source)
    assert [r.check_item for r in results] == [c["check_item"] for c in checks]
    return results


def test_pass_fail_and_errors_follow_calculate_reward(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        OK, FALSE,
        check("return final_state['missing']"),
        check("return 1"), check("return 'yes'"), check("return None"), check("pass"),
        check("return [True]"),
        check("class B(int):\n    pass\nreturn B(1)"),
    ])
    summary = [(r.status, r.passed, r.result, r.error) for r in results]
    assert summary[0] == ("ok", True, "True", None)
    assert summary[1] == ("ok", False, "False", None)  # a clean False is not an error
    assert summary[2][:3] == ("error", False, None)
    assert summary[2][3] == "Error: KeyError: 'missing'"
    assert results[2].traceback is not None and "line 2, in check_func" in results[2].traceback
    assert "return final_state['missing']" in results[2].traceback  # with its source line
    assert summary[3] == ("error", False, "1", "returned int 1, not a bool")
    assert summary[4] == ("error", False, "'yes'", "returned str 'yes', not a bool")
    assert summary[5] == ("error", False, "None", "returned None, not a bool")
    assert summary[6] == ("error", False, "None", "returned None, not a bool")
    assert summary[7] == ("error", False, "[True]", "returned list [True], not a bool")
    assert summary[8][:2] == ("error", False) and "not a bool" in summary[8][3]
    assert all(r.duration_ms >= 0 for r in results)
    assert sum(r.passed for r in results) == 1


def test_initial_state_is_a_global_of_the_check_module(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        check("return initial_state['balance'] - final_state['balance'] == 20"),
        check("return helper()", prelude="def helper():\n    return initial_state['orders']['O1']['status'] == 'pending'"),
        check("return final_state == initial_state"),
    ])
    assert [(r.status, r.passed) for r in results] == [("ok", True), ("ok", True), ("ok", False)]


def test_a_check_mutating_its_states_affects_no_other_check(pool, fast_profile) -> None:
    mutate = check(
        "initial_state['balance'] = -1\n"
        "initial_state['orders'].clear()\n"
        "final_state['log'].append('forged')\n"
        "final_state['orders']['O1']['status'] = 'lost'\n"
        "globals()['initial_state'] = {}\n"
        "return True")
    intact = check("return initial_state == INITIAL and final_state == FINAL",
                   prelude=f"INITIAL = {INITIAL!r}\nFINAL = {FINAL!r}")
    results = run(pool, fast_profile, [intact, mutate, intact, mutate, intact])
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 5, results


def test_syntax_errors_and_missing_check_func_are_rejected(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        "def check_func(final_state)\n    return True\n",
        "x = 1\n",
        "check_func = 5\n",
        "def other(final_state):\n    return True\n",
        "def check_func(final_state):\n    return True\n\x00",
        "import nonexistent_module_xyz\ndef check_func(final_state):\n    return True\n",
        OK,
    ])
    assert results[0].status == "rejected" and results[0].error == "syntax error: expected ':' (line 1)"
    assert (results[1].status, results[1].error) == ("rejected", "no check_func defined")
    assert (results[2].status, results[2].error) == ("rejected", "check_func is a int, not a function")
    assert (results[3].status, results[3].error) == ("rejected", "no check_func defined")
    assert results[4].status == "rejected" and results[4].error.startswith("syntax error")
    assert results[5].status == "error"  # the module raised while defining check_func
    assert results[5].error == "Error: ModuleNotFoundError: No module named 'nonexistent_module_xyz'"
    assert (results[6].status, results[6].passed) == ("ok", True)
    assert not any(r.passed for r in results[:6])


def test_a_check_that_loops_forever_times_out_and_the_others_still_run(pool, fast_profile) -> None:
    restarts = pool.check_restarts
    started = time.monotonic()
    results = run(pool, fast_profile, [
        OK, check("while True:\n    pass"), OK, check("import time\ntime.sleep(60)"), FALSE, OK,
    ], timeout_s=0.5)
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok", "timeout", "ok", "timeout", "ok", "ok"], results
    assert [r.passed for r in results] == [True, False, True, False, False, True]
    assert results[1].error == "timed out after 0.5 s" and results[1].result is None
    assert 450 <= results[1].duration_ms < 2000
    assert elapsed < 2 * 0.5 + 3.0, elapsed
    assert pool.check_restarts - restarts == 2


@pytest.mark.parametrize("death", [
    "import os\nos._exit(3)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "import ctypes\nctypes.string_at(0)",
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nreturn True",  # kills the process it came from
])
def test_a_check_that_kills_its_process_crashes_alone(pool, fast_profile, death) -> None:
    results = run(pool, fast_profile, [OK, check(death), OK, FALSE])
    assert [r.status for r in results] == ["ok", "crashed", "ok", "ok"], results
    assert results[1].error is not None and results[1].error.startswith("the check process"), results[1]
    assert [r.passed for r in results] == [True, False, True, False]


def test_a_check_never_holds_the_runner_channel(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        check("import os\nos.close(3)\nreturn True"),
        check("import os\nos.write(3, b'\\x00\\x00\\x00\\x02{}')\nreturn True"),
        OK])
    assert [r.status for r in results] == ["error", "error", "ok"], results
    assert all("Bad file descriptor" in r.error for r in results[:2])


def test_memory_errors_are_oom_and_the_others_still_run(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        check("blob = bytearray(10**10)\nreturn True"), OK,
        check("try:\n    bytearray(10**10)\nexcept MemoryError:\n    return True"),  # caught: its own business
        OK,
    ])
    assert [(r.status, r.passed) for r in results] == [("oom", False), ("ok", True), ("ok", True), ("ok", True)]
    assert "MemoryError" in results[0].error


def test_each_checks_output_is_captured_and_capped(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        check("print('first says hi')\nimport sys\nprint('oops', file=sys.stderr)\nreturn True"),
        check("print('x' * 100000)\nreturn True"),
        check("return True"),
    ])
    assert results[0].stdout == "first says hi\n" and results[0].stderr == "oops\n"
    cap = limits.CHECK_OUTPUT_CAP_BYTES
    assert results[1].stdout.startswith("x" * cap) and results[1].stdout.endswith("bytes dropped]")
    assert len(results[1].stdout) < cap + 64
    assert (results[2].stdout, results[2].stderr) == ("", "")


def test_checks_never_share_an_interpreter_with_environment_code(pool, fast_profile, open_env, probe) -> None:
    session = open_env(init_config={"counter": 1})
    # a process is its pid within its pid namespace: checks may run in another sandbox,
    # whose pids count from 1 as the env's do
    process = "'%d in %d' % (os.getpid(), os.stat('/proc/self/ns/pid').st_ino)"
    env_process = probe.ok(session, f"result = {process}")
    assert re.fullmatch(r"\d+ in \d+", env_process), env_process
    results = run(pool, fast_profile, [
        check("import sys\nreturn 'dynamic_env' not in sys.modules and '__main__' in sys.modules"),
        check(f"import os\nreturn {process} != {env_process!r}"),
        check("import os\nreturn os.getcwd().startswith('/work/') and os.listdir('.') == []"),
    ])
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 3, results
    assert session.call("bump", {"by": 1}).observation == "2"


HOSTILE = [
    check("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),  # fork bomb
    check("import os, signal\nfor sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):\n"
          "    os.kill(1, sig)\nreturn True"),
    check("import os\nos.write(3, b'\\x00\\x00\\x00\\x05hello')\nreturn True"),  # garbage on the channel
    check("import os\nos.write(3, b'\\xff\\xff\\xff\\xff')\nreturn True"),  # oversize frame header
    check("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)"),  # infinite output
    check("import os\nif os.fork() == 0:\n    import time\n    time.sleep(600)\nreturn True"),  # a stray
    check("import os\nos.setsid() if os.fork() == 0 else None\nreturn True"),  # a forked twin runs on
    check("open('/opt/sandpit/sandpit_runner/pid1_runner.py', 'w').write('pwned')\nreturn True"),
]


def test_hostile_checks_never_break_the_sandbox(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [OK] + HOSTILE + [OK], timeout_s=1.0)
    statuses = [r.status for r in results]
    assert statuses[0] == "ok" and statuses[-1] == "ok", results
    assert statuses[1] == "timeout"  # the fork bomb
    assert statuses[2] == "ok" and results[2].passed  # signals to the runner are ignored
    assert statuses[3] == "error" and statuses[4] == "error"  # no runner channel in a check's process
    assert statuses[5] == "timeout" and results[5].stdout.endswith("bytes dropped]")
    assert statuses[6] == "ok" and statuses[7] == "ok"
    assert statuses[8] == "error" and results[8].error.startswith("Error: OSError"), results[8]
    assert results[-1].passed
    again = run(pool, fast_profile, [OK, FALSE])  # the same pool and sandbox go on serving
    assert [(r.status, r.passed) for r in again] == [("ok", True), ("ok", False)]
    listing = run(pool, fast_profile, [check(
        "import json, os\nlive = []\nfor entry in os.listdir('/proc'):\n"
        "    if entry.isdigit():\n"
        "        stat = open(f'/proc/{entry}/stat').read()\n"
        "        if stat[stat.rfind(')') + 2] != 'Z':\n"
        "            live.append(int(entry))\n"
        "print(json.dumps(live))\nreturn True")])
    pids = json.loads(listing[0].stdout)
    # the runner, the checks' zygote, this check's process, the spare, the jobs template: no stray
    assert len(pids) <= 5, pids


def test_argument_caps_raise_value_error(pool, fast_profile) -> None:
    item = {"check_item": "x", "check_func": OK}
    cases = [
        ([item] * (limits.MAX_CHECKS + 1), INITIAL, FINAL, None, "at most 256 checks"),
        ([{"check_item": "x", "check_func": "#" * (limits.MAX_CHECK_SOURCE_BYTES + 1)}], INITIAL, FINAL, None,
         "65536"),
        ([{"check_item": "x"}], INITIAL, FINAL, None, "check_func must be a string"),
        ([{"check_item": 1, "check_func": OK}], INITIAL, FINAL, None, "check_item"),
        ([{"check_item": "x", "check_func": OK, "extra": 1}], INITIAL, FINAL, None, "keys"),
        ("not a list", INITIAL, FINAL, None, "must be a list"),
        ([item], [1], FINAL, None, "initial_state must be an object"),
        ([item], INITIAL, {"x": ["j", float("nan")]}, None, "final_state is not JSON-encodable"),
        ([item], INITIAL, {"x": ["j", object()]}, None, "final_state is not JSON-encodable"),
        ([item], INITIAL, {"x": float("nan")}, None, "not an encoded value"),
        ([item], INITIAL, FINAL, fast_profile.call_timeout_s + 1, "above the profile"),
        ([item], INITIAL, FINAL, 0, "positive"),
        ([{"check_item": "x", "check_func": "\ud800"}], INITIAL, FINAL, None, "not valid text"),
    ]
    for checks, initial, final, timeout_s, message in cases:
        if isinstance(initial, dict) and initial is INITIAL:
            initial = encode_json_state(initial)
        if isinstance(final, dict) and final is FINAL:
            final = encode_json_state(final)
        with pytest.raises(ValueError, match=message):
            pool.run_checks(tenant=TENANT, checks=checks, initial_state=initial, final_state=final,
                            profile=fast_profile, per_check_timeout_s=timeout_s)
    with pytest.raises(ValueError, match="source"):
        pool.run_checks(tenant=TENANT, checks=[item], initial_state={}, final_state={}, source=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tenant"):
        pool.run_checks(tenant="", checks=[item], initial_state={}, final_state={})
    assert pool.run_checks(tenant=TENANT, checks=[], initial_state={}, final_state={}) == []


def test_throughput_of_trivial_checks(pool, fast_profile) -> None:
    """Measured, printed, not asserted (target: >= 300 checks/s on 2 cores, 0.5 CPU)."""
    checks = [{"check_item": f"balance {i}", "check_func": check(f"return final_state['balance'] < {i + 81}")}
              for i in range(limits.MAX_CHECKS)]
    rates = []
    for _ in range(5):
        started = time.perf_counter()
        results = pool.run_checks(tenant=TENANT, checks=checks, initial_state=encode_json_state(INITIAL),
                                  final_state=encode_json_state(FINAL), profile=fast_profile)
        rates.append(len(checks) / (time.perf_counter() - started))
        assert all(r.passed for r in results)
    rates.sort()
    print(f"\ncheck throughput ({len(checks)} trivial checks per call, {fast_profile.cpus} CPU sandbox): "
          f"median {rates[len(rates) // 2]:.0f} checks/s, best {rates[-1]:.0f}, worst {rates[0]:.0f}")


# --------------------------------------------------------------------- real objects, isolation
ENV_SOURCE = """
import dataclasses
from datetime import date


@dataclasses.dataclass
class Order:
    id: str
    due: date
    tags: set

    def overdue(self, today):
        return self.due < today


class Shop:
    def __init__(self, init_config):
        self.orders = {}
"""


def _pickled(session_state: dict) -> dict:
    """A state encoded by a real session (what the API stores), without the renderings."""
    return {name: entry[:2] if entry[0] == "p" else entry for name, entry in session_state.items()}


def test_checks_see_real_sets_dates_and_environment_objects(pool, fast_profile, open_env) -> None:
    session = pool.open_session(tenant=TENANT, source=ENV_SOURCE + """
    def add(self, tag):
        self.orders["O1"] = Order("O1", date(2024, 5, 1), {tag, "new"})
        self.tags = frozenset({3, 1})
        self.when = (date(2024, 1, 2), b"raw")
        return "added"
""", class_name="Shop", profile=fast_profile)
    try:
        initial = session.read_state()
        assert session.call("add", {"tag": "vip"}).status == "ok"
        final = session.read_state()
        source = session.source
    finally:
        session.close()
    assert final["orders"][0] == "p" and final["orders"][2]["O1"]["$object"]["type"] == "Order"
    results = run(pool, fast_profile, [
        check("return isinstance(final_state['orders']['O1'].tags, set) and 'vip' in final_state['orders']['O1'].tags"),
        check("from datetime import date\nreturn final_state['orders']['O1'].overdue(date(2025, 1, 1))"),
        check("return type(final_state['orders']['O1']).__name__ == 'Order' and 3 in final_state['tags']"),
        check("from datetime import date\nreturn final_state['when'] == (date(2024, 1, 2), b'raw')"),
        check("return initial_state['orders'] == {} and 'tags' not in initial_state"),
    ], initial=_pickled(initial), final=_pickled(final), encoded=True, source=source)
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 5, results


def _state_with_an_order(pool: SandboxPool, profile: ResourceProfile) -> tuple[dict, str]:
    """A real session's encoded state holding an ``Order`` instance (a pickle), and the
    environment's source."""
    session = pool.open_session(tenant=TENANT, source=ENV_SOURCE + """
    def add(self):
        self.orders["O1"] = Order("O1", date(2024, 5, 1), set())
""", class_name="Shop", profile=profile)
    try:
        session.call("add", {})
        return _pickled(session.read_state()), session.source
    finally:
        session.close()


def test_environment_objects_without_the_source_are_stand_ins(pool, fast_profile) -> None:
    """The default (no ``source``): an ``Order`` is rebuilt as a stand-in with its fields;
    its methods do not exist (nothing of the environment runs where the verdict is made)."""
    final, _ = _state_with_an_order(pool, fast_profile)
    results = run(pool, fast_profile, [
        check("o = final_state['orders']['O1']\nreturn type(o).__name__ == 'Order' and o.id == 'O1'"),
        check("from datetime import date\nreturn final_state['orders']['O1'].due == date(2024, 5, 1)"),
        check("return final_state['orders']['O1'].tags == set()"),
        check("return final_state['orders']['O1'].overdue is None"),
    ], initial={}, final=final, encoded=True)
    assert [(r.status, r.passed) for r in results[:3]] == [("ok", True)] * 3, results
    assert results[3].status == "error" and "stands in" in results[3].error, results[3]


def test_hand_written_states_may_use_the_renderings_tags(pool, fast_profile) -> None:
    final = {"tags": {"$set": [1, 2]}, "day": {"$date": "2024-05-01"}, "pair": {"$tuple": [1, "a"]},
             "plain": {"$set": [1], "other": 2}, "obj": {"$object": {"type": "P", "attrs": {"x": 1}}}}
    results = run(pool, fast_profile, [
        check("return final_state['tags'] == {1, 2}"),
        check("import datetime\nreturn final_state['day'] == datetime.date(2024, 5, 1)"),
        check("return final_state['pair'] == (1, 'a')"),
        check("return final_state['plain'] == {'$set': [1], 'other': 2}"),
        check("return final_state['obj'].x == 1"),
    ], initial={}, final=final)
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 5, results


FLIP_OTHERS = check("""
import sys, builtins, gc
def tracer(frame, event, arg):
    if event == 'return' and frame.f_code.co_name == 'check_func' and arg is False:
        frame.f_back.f_locals['value'] = True
    return tracer
sys.settrace(tracer)
sys.setprofile(tracer)
builtins.bool = lambda *a: True
builtins.isinstance = lambda *a: True
import json
json.dumps = lambda *a, **k: '{"status": "ok", "passed": true, "duration_ms": 0}'
return True""")


def test_nothing_a_check_does_reaches_another_checks_verdict(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [FALSE, FLIP_OTHERS, FALSE, FLIP_OTHERS, FALSE, OK])
    assert [(r.status, r.passed) for r in results] == [
        ("ok", False), ("ok", True), ("ok", False), ("ok", True), ("ok", False), ("ok", True)], results


def test_each_check_runs_in_a_fresh_process(pool, fast_profile) -> None:
    marker = check("import os, sys\nprint(os.getpid())\nsys.modules['marker'] = 1\n"
                   "import builtins\nbuiltins.SEEN = getattr(builtins, 'SEEN', 0) + 1\nreturn builtins.SEEN == 1")
    results = run(pool, fast_profile, [marker] * 4)
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 4, results
    pids = {r.stdout for r in results}
    assert len(pids) == 4, pids


# ------------------------------------------------- read-only checks share the batch's process
PID = check("import os\nprint(os.getpid())\nreturn True")  # not read-only: forked
READ_ONLY = check("return final_state['balance'] == 80 and len(initial_state['orders']) == 1")


def _pids_taken(results: list[CheckResult]) -> int:
    """Process ids allocated between the first and the last check (both print their pid;
    pids in a sandbox's own pid namespace are handed out in order)."""
    assert results[0].passed and results[-1].passed, results
    return int(results[-1].stdout) - int(results[0].stdout)


def test_read_only_checks_run_in_the_batch_process_and_the_others_fork(pool, fast_profile) -> None:
    shared = run(pool, fast_profile, [PID] + [READ_ONLY] * 8 + [PID])
    assert all(r.passed for r in shared), shared
    forked = run(pool, fast_profile, [PID] + ["import os\n" + READ_ONLY] * 8 + [PID])  # same check + import
    assert all(r.passed for r in forked), forked
    assert _pids_taken(forked) >= 9  # a process per check
    assert _pids_taken(shared) <= 3  # only the last check's (and perhaps a spare's)


def test_read_only_checks_on_unpickled_objects_still_fork(pool, fast_profile) -> None:
    final, source = _state_with_an_order(pool, fast_profile)
    assert final["orders"][0] == "p"  # an Order's __eq__ could be the environment's code
    results = run(pool, fast_profile, [PID] + [check("return len(final_state['orders']) == 1")] * 8 + [PID],
                  initial={}, final=final, encoded=True, source=source)
    assert all(r.passed for r in results), results
    assert _pids_taken(results) >= 9


def test_read_only_checks_change_only_objects_they_made(pool, fast_profile) -> None:
    intact = check("return initial_state == INITIAL and final_state == FINAL",
                   prelude=f"INITIAL = {INITIAL!r}\nFINAL = {FINAL!r}")
    on_copies = check("mine = dict(final_state)\nmine['balance'] = 0\nmine.pop('log')\n"
                      "orders = final_state['orders'].copy()\norders.clear()\n"
                      "log = list(final_state['log'])\nlog += ['forged']\nlog.append('more')\n"
                      "return mine['balance'] == 0 and orders == {} and len(log) == 3")
    assert why_not_read_only(intact) is None and why_not_read_only(on_copies) is None
    results = run(pool, fast_profile, [intact, on_copies, intact, on_copies, intact])
    assert [(r.status, r.passed) for r in results] == [("ok", True)] * 5, results


def test_read_only_checks_keep_their_own_output_errors_and_memory_errors(pool, fast_profile) -> None:
    results = run(pool, fast_profile, [
        check("print('first')\nreturn True"),
        check("print('second', final_state['balance'])\nreturn final_state['missing']"),
        check("return len('x' * 10**14) > 0"),  # MemoryError at once: nothing was allocated
        check("return True"),
    ])
    assert [(r.status, r.passed, r.stdout) for r in results] == [
        ("ok", True, "first\n"), ("error", False, "second 80\n"), ("oom", False, ""), ("ok", True, "")], results
    assert results[1].error == "Error: KeyError: 'missing'" and "line 3, in check_func" in results[1].traceback
    assert "MemoryError" in results[2].error


def test_read_only_checks_leave_nothing_for_the_next_check(pool, fast_profile) -> None:
    # besides its own objects, an in-place check can touch the decimal context's flags,
    # the module table (a codec lookup imports) and linecache (its traceback): all put back
    leaves = check("try:\n    final_state['price'] / 0\nexcept ZeroDivisionError:\n    pass\n"
                   "name = str(b'xn--bcher-kva', 'idna')\n"
                   "return final_state['price'] / 3 > 0 and len(name) == 6 and final_state['missing']")
    sees = check("import decimal, linecache, sys\n"
                 "print(sorted(f.__name__ for f, on in decimal.getcontext().flags.items() if on))\n"
                 "print(repr(linecache.getline('<check_func>', 2)))\n"
                 "return 'encodings.idna' not in sys.modules and 'stringprep' not in sys.modules")
    assert why_not_read_only(leaves) is None and why_not_read_only(sees) is not None
    results = run(pool, fast_profile, [sees, leaves, sees], initial={}, final={"price": {"$decimal": "1.10"}})
    assert (results[1].status, results[1].error) == ("error", "Error: KeyError: 'missing'"), results[1]
    assert "return final_state['price'] / 3 > 0" in results[1].traceback  # its lines were there for it
    for seen in (results[0], results[2]):
        assert (seen.status, seen.passed, seen.stdout) == ("ok", True, "[]\n''\n"), seen
