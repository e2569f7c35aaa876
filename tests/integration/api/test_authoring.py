"""Authoring mistakes caught at registration and release-sized scenarios, through the real
app over HTTP on real sandboxes.

* a sample ``init_config`` key whose value replaces an attribute the constructor set to a
  value of another type (EnvScaler sets every key over what ``__init__`` made) is an
  ``init-config-replaces-attribute`` warning in the environment's policy report;
* a check without ``check_func`` (or that does not parse) is refused when a scenario is
  created or checks are given to ``evaluate`` (422 naming the check);
* checklists as long as EnvScaler's release (1,000 and 1,100 checks) are evaluated in
  sandbox batches with the reward one batch would give; over the caps they are refused;
* ``__import__('time')`` is a warning of the default policy, ``__import__('os')`` and a
  computed name stay errors.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.docker
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

ORDERS_SOURCE = '''
class Shop:
    """Orders by id (the constructor converts the released list), a user, a counter."""

    def __init__(self, init_config):
        orders = init_config.get("orders", [])
        self.orders = orders if isinstance(orders, dict) else {o["id"]: o for o in orders}
        self.user = init_config.get("user", "anon")
        self.count = 0
        self.placeholder = None

    def get_order(self, order_id: str) -> dict:
        """One order by id."""
        return self.orders.get(order_id)
'''


def _ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


def _register(api: httpx.Client, source: str, class_name: str, config: dict[str, Any] | None,
              **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"source_code": source, "class_name": class_name, **extra}
    if config is not None:
        body["sample_init_config"] = config
    return api.post("/v1/environments", json=body)


def _retyped(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["rule"] == "init-config-replaces-attribute"]


# -- init_config replacing a constructed attribute ----------------------------------------------
def test_a_config_key_that_replaces_a_constructed_attribute_with_another_type_is_a_warning(
        api: httpx.Client) -> None:
    config = {"orders": [{"id": "o1"}], "user": "ada", "count": 2.5, "placeholder": {"x": 1}, "extra": [1]}
    environment = _ok(_register(api, ORDERS_SOURCE, "Shop", config), 201)
    report = environment["policy_report"]
    found = _retyped(report)
    assert len(found) == 1, found  # user: str over str, count: float over int, placeholder: over None, extra: new
    assert found[0]["severity"] == "warning" and report["passed"] is True
    assert found[0]["line"] == 7 and found[0]["col"] == 8  # self.orders = ... in __init__
    message = found[0]["message"]
    assert "'orders'" in message and "a dict" in message and "a list" in message, message
    assert report["warnings"] >= 1

    # the mistake is real: EnvScaler's rule gives the tool the list, and the call fails
    env = _ok(api.post("/v1/envs", json={"environment_id": environment["id"], "init_config": config}), 201)
    step = _ok(api.post(f"/v1/envs/{env['id']}/step", json={"name": "get_order", "arguments": {"order_id": "o1"}}))
    assert "'list' object has no attribute 'get'" in step["observation"], step


@pytest.mark.parametrize("config", [
    {"orders": {"o1": {"id": "o1"}}},  # the constructed form: a dict over a dict
    {"user": "ada", "count": 3},  # same types
    {"new_key": [1, 2], "another": {"a": 1}},  # attributes the constructor did not set
    {},
])
def test_same_type_replacements_and_new_keys_are_not_reported(api: httpx.Client, config: dict[str, Any]) -> None:
    environment = _ok(_register(api, ORDERS_SOURCE, "Shop", config), 201)
    assert _retyped(environment["policy_report"]) == []


def test_retyped_attributes_are_found_when_the_constructor_takes_no_config(api: httpx.Client) -> None:
    source = ("class Bare:\n    def __init__(self):\n        self.items, self.name = [], 'x'\n"
              "    def size(self) -> int:\n        return len(self.items)\n")
    environment = _ok(_register(api, source, "Bare", {"items": {"a": 1}, "name": "y"}), 201)
    found = _retyped(environment["policy_report"])
    assert [(f["line"], "list" in f["message"] and "dict" in f["message"]) for f in found] == [(3, True)]


def test_registering_the_same_config_again_reports_it_again(api: httpx.Client) -> None:
    """The second and third opens of one config in a sandbox may come from its config
    template: the template keeps what its construction found."""
    config = {"orders": [{"id": "o1"}]}
    reports = [_ok(_register(api, ORDERS_SOURCE, "Shop", config), 201)["policy_report"] for _ in range(4)]
    assert all(len(_retyped(r)) == 1 for r in reports), reports


def test_hostile_constructors_and_keys_do_not_break_registration(api: httpx.Client) -> None:
    source = '''
class Meta(type):
    @property
    def __name__(cls):
        raise RuntimeError("no name")


class Odd(metaclass=Meta):
    pass


class Hostile:
    def __init__(self, init_config):
        self.odd = Odd()
        for i in range(100):
            setattr(self, f"k{i}", i)

    def ping(self) -> str:
        """Pong."""
        return "pong"
'''
    config: dict[str, Any] = {"odd": 1, **{f"k{i}": [i] for i in range(100)}, "x" * 5000: 1}
    environment = _ok(_register(api, source, "Hostile", config), 201)
    found = _retyped(environment["policy_report"])
    assert len(found) == 32  # at most INIT_RETYPED_MAX keys are reported
    assert "self.odd, which __init__ set to a Odd, with a int" in found[0]["message"] or any(
        "'odd'" in f["message"] and "Odd" in f["message"] for f in found)
    assert all(len(f["message"]) <= 300 for f in found)


# -- checks that define no check_func, or do not parse ---------------------------------------------
@pytest.mark.parametrize("source, expect", [
    ("x = 1\n", "no check_func defined"),
    ("   \n", "no check_func defined"),
    ("def check(final_state):\n    return True\n", "no check_func defined"),
    ("def helper():\n    check_func = 1\n", "no check_func defined"),
    ("def check_func(final_state:\n    return True\n", "syntax-error"),
    ("def check_func(final_state):\nreturn True\n", "syntax-error"),
])
def test_a_scenario_whose_check_defines_no_check_func_or_does_not_parse_is_refused(
        api: httpx.Client, counter_env_id: str, source: str, expect: str) -> None:
    good = {"check_item": "ok", "check_func": "def check_func(final_state):\n    return True\n"}
    response = api.post("/v1/scenarios", json={
        "environment_id": counter_env_id, "task": "t", "checklist_with_func": [good, good, {
            "check_item": "bad", "check_func": source}]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "checklist_with_func.2.check_func" and expect in error["message"], error

    # /v1/validate says the same of it
    result = _ok(api.post("/v1/validate", json={"kind": "check_function", "source_code": source,
                                                "cases": [{"initial_state": {}, "final_state": {}}]}))
    assert result["verdict"] == "invalid"
    assert any(expect in reason or (expect == "syntax-error" and "syntax-error" in reason)
               for reason in result["reasons"]), result["reasons"]


def test_an_empty_check_func_is_refused_naming_it(api: httpx.Client, counter_env_id: str) -> None:
    response = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t",
                                               "checklist_with_func": [{"check_item": "e", "check_func": ""}]})
    assert response.status_code == 422 and response.json()["error"]["field"] == "checklist_with_func.0.check_func"


@pytest.mark.parametrize("source", ["def check_func(final_state:\n", "y = 2\n"])
def test_inline_checks_given_to_evaluate_are_held_to_the_same_rule(api: httpx.Client, counter_env_id: str,
                                                                   source: str) -> None:
    env = _ok(api.post("/v1/envs", json={"environment_id": counter_env_id}), 201)
    good = {"check_item": "ok", "check_func": "def check_func(final_state):\n    return True\n"}
    response = api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": [good, {"check_item": "b",
                                                                                  "check_func": source}]})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "checks.1.check_func"
    ok = _ok(api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": [good, {
        "check_item": "lambda", "check_func": "check_func = lambda final_state: True\n"}]}))
    assert ok["reward"] == 1.0


# -- release-sized checklists ------------------------------------------------------------------------
def _verdict_checks(passing: int, failing: int) -> list[dict[str, str]]:
    """``passing`` checks that return True, then ``failing`` that return False, each its own
    source (they read the state, so none is a constant)."""
    checks = []
    for i in range(passing + failing):
        want = "== 0" if i < passing else "!= 0"
        checks.append({"check_item": f"check {i}",
                       "check_func": f"def check_func(final_state):\n    # {i}\n    return final_state['count'] {want}\n"})
    return checks


@pytest.mark.parametrize("passing, failing, reward", [(700, 300, 0.7), (1099, 1, 0.9991), (0, 1100, 0.0)])
def test_a_release_sized_checklist_is_evaluated_in_batches_with_the_exact_reward(
        api: httpx.Client, counter_env_id: str, passing: int, failing: int, reward: float) -> None:
    checks = _verdict_checks(passing, failing)
    scenario = _ok(api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "long",
                                                   "init_config": {"count": 0}, "checklist_with_func": checks}), 201)
    assert len(scenario["checklist_with_func"]) == passing + failing
    env = _ok(api.post("/v1/envs", json={"scenario_id": scenario["id"]}), 201)
    started = time.perf_counter()
    evaluation = _ok(api.post(f"/v1/envs/{env['id']}/evaluate"))
    elapsed = time.perf_counter() - started
    assert evaluation["total"] == passing + failing and evaluation["passed"] == passing
    assert evaluation["reward"] == reward
    results = evaluation["results"]
    assert [r["check_item"] for r in results] == [c["check_item"] for c in checks]  # in order, across batches
    assert [r["passed"] for r in results] == [True] * passing + [False] * failing
    assert all(r["status"] == "ok" for r in results)
    print(f"{passing + failing} checks: {elapsed:.2f} s")


def test_checklists_over_the_caps_are_refused_naming_the_field(api: httpx.Client, counter_env_id: str) -> None:
    tiny = {"check_item": "t", "check_func": "check_func = lambda s: True"}
    over = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t",
                                           "checklist_with_func": [tiny] * 5000})
    assert over.status_code == 422 and over.json()["error"]["field"] == "checklist_with_func", over.text
    listed = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t", "checklist": ["c"] * 5000})
    assert listed.status_code == 422 and listed.json()["error"]["field"] == "checklist"
    env = _ok(api.post("/v1/envs", json={"environment_id": counter_env_id}), 201)
    inline = api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": [tiny] * 5000})
    assert inline.status_code == 422 and inline.json()["error"]["field"] == "checks"

    head = "def check_func(s):\n    return True\n#"
    long_source = head + "x" * (64 * 1024 + 1 - len(head))
    assert len(long_source) == 64 * 1024 + 1
    one = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t",
                                          "checklist_with_func": [{"check_item": "l", "check_func": long_source}]})
    assert one.status_code == 422 and one.json()["error"]["field"] == "checklist_with_func.0.check_func"
    wide = "def check_func(s):\n    return True\n#" + "é" * 40_000  # under 64 Ki characters, over 64 KiB
    bytes_over = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t",
                                                 "checklist_with_func": [tiny, {"check_item": "w", "check_func": wide}]})
    assert bytes_over.status_code == 422 and bytes_over.json()["error"]["field"] == "checklist_with_func.1.check_func"
    inline_wide = api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": [tiny, {"check_item": "w",
                                                                                    "check_func": wide}]})
    assert inline_wide.status_code == 422 and inline_wide.json()["error"]["field"] == "checks.1.check_func"

    # 40 checks of 60 KiB: each fits, together they are over max_code_bytes (2 MiB)
    big = {"check_item": "b", "check_func": "def check_func(s):\n    return True\n#" + "x" * (60 * 1024)}
    total = api.post("/v1/scenarios", json={"environment_id": counter_env_id, "task": "t",
                                            "checklist_with_func": [big] * 40})
    assert total.status_code == 413 and total.json()["error"]["field"] == "checklist_with_func", total.text
    inline_total = api.post(f"/v1/envs/{env['id']}/evaluate", json={"checks": [big] * 40})
    assert inline_total.status_code == 413 and inline_total.json()["error"]["field"] == "checks", inline_total.text


# -- __import__ of an allowed module -------------------------------------------------------------
def _clock(started: str, now: str, prelude: str = "") -> str:
    return (f"{prelude}class Clock:\n    def __init__(self, init_config):\n        self.started = {started}\n\n"
            f"    def now(self) -> float:\n        \"\"\"Seconds since the epoch.\"\"\"\n        return {now}\n")


def test_import_of_an_allowed_module_registers_with_a_warning(api: httpx.Client) -> None:
    source = _clock('__import__("time").time()', '__import__("time").time()')
    environment = _ok(_register(api, source, "Clock", None), 201)
    report = environment["policy_report"]
    assert report["passed"] is True
    calls = [f for f in report["findings"] if f["rule"] == "import-call"]
    assert [(f["line"], f["severity"]) for f in calls] == [(3, "warning"), (7, "warning")], report
    env = _ok(api.post("/v1/envs", json={"environment_id": environment["id"]}), 201)
    step = _ok(api.post(f"/v1/envs/{env['id']}/step", json={"name": "now", "arguments": {}}))
    assert float(step["observation"]) > 1.7e9
    strict = _register(api, source, "Clock", None, policy="strict")
    assert strict.status_code == 422 and "import-call" in strict.json()["error"]["message"]


@pytest.mark.parametrize("source", [
    _clock("0", '__import__("os").getpid()'),
    _clock("0", "__import__(NAME).time()", prelude='NAME = "time"\n'),
    _clock("0", '__import__("time", globals(), None, [], 1)'),
    _clock("0", "LOAD('time').time()", prelude="LOAD = __import__\n"),
], ids=["os", "computed-name", "relative-level", "bare-reference"])
def test_import_of_a_forbidden_or_computed_module_is_still_refused(api: httpx.Client, source: str) -> None:
    response = _register(api, source, "Clock", None)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == "source_code" and "dynamic-import" in error["message"], error
    audited = _ok(_register(api, source, "Clock", None, policy="audit"), 201)  # audit reports, never refuses
    assert any(f["rule"] == "dynamic-import" for f in audited["policy_report"]["findings"])
