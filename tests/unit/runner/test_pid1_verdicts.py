"""How PID 1 tells the host a session's instance was made (``pid1_verdicts``): every
template failure reason the runner writes maps to its class, forged or unknown ones to a
class of the same bounded set, and :func:`verdict` tests the reasons in their documented
order against the templates' bookkeeping."""

from __future__ import annotations

import types
from typing import Any

import pytest
from sandpit.executor.results import CONSTRUCTION_REASONS
from sandpit.sandbox_images.runner import pid1_verdicts
from sandpit.sandbox_images.runner.limits import CONSTRUCTION_DETAIL_MAX_CHARS
from sandpit.sandbox_images.runner.pid1_templates import config_template_key
from sandpit.sandbox_images.runner.pid1_verdicts import REASONS, classify, verdict

KEY = "a" * 64 + ":Env"
HASH = "b" * 64
CKEY = config_template_key(KEY, HASH)


@pytest.mark.parametrize(("failure", "config", "expected"), [
    ("unsuitable: imports os", False, "source_unsuitable"),
    ("unsuitable: imports from pathlib", False, "source_unsuitable"),
    ("unsuitable: names open", False, "source_unsuitable"),
    ("unsuitable: names .__import__", False, "source_unsuitable"),
    ("unsuitable: rebinds module globals from a function", False, "source_unsuitable"),
    ("unsuitable: decorator register runs at import", False, "source_unsuitable"),
    ("unsuitable: calls now at import", False, "source_unsuitable"),
    ("unsuitable: a metaclass runs at import", False, "source_unsuitable"),
    ("unsuitable: a class hook runs at import", False, "source_unsuitable"),
    ("unsuitable: source does not parse: SyntaxError", False, "source_unsuitable"),
    ("unsuitable: source too large to check", False, "source_unsuitable"),
    ("unsuitable: import failed: ZeroDivisionError", False, "import_effects"),
    ("unsuitable: 3 threads after import", False, "import_effects"),
    ("unsuitable: descriptors [5] open after import", False, "import_effects"),
    ("unsuitable: two constructions differ", True, "nondeterministic"),
    ("unsuitable: construction changed module-level state", True, "module_state"),
    ("unsuitable: module state cannot be fingerprinted", True, "module_state"),
    ("unsuitable: construction failed: KeyError", True, "construction_failed"),
    ("unsuitable: the second construction did not report (it died, ran out of memory or time)", True, "no_verdict"),
    ("unsuitable: construction left a child process (12)", True, "leaves_process"),
    ("unsuitable: 2 threads after import", True, "leaves_process"),
    ("did not load in time", True, "template_failed"),
    ("exited", False, "template_failed"),
    ("fork failed: TimeoutError", True, "template_failed"),
    ("a forked session failed (crashed)", True, "template_failed"),
    ("unsuitable: malformed request", True, "template_failed"),
])
def test_every_failure_the_runner_writes_has_its_class(failure: str, config: bool, expected: str) -> None:
    assert classify(failure, config) == expected


@pytest.mark.parametrize("forged", ["", "unsuitable: ", "unsuitable: imports os", "\x00" * 500, "reason=\"}{",
                                    "unsuitable: two constructions differ" + "x" * 10_000])
def test_a_forged_reason_of_a_config_template_still_lands_in_the_bounded_set(forged: str) -> None:
    """A config template's report is written by a process that ran environment code."""
    assert classify(forged, config=True) in REASONS
    assert len(pid1_verdicts.constructed("building", forged).get("detail", "")) <= CONSTRUCTION_DETAIL_MAX_CHARS


def test_the_runners_reasons_are_the_hosts_but_other() -> None:
    assert set(CONSTRUCTION_REASONS) == {*REASONS, "other"}


def _templates(enabled: bool = True, **fields: Any) -> Any:
    state = {"failed": {}, "no_room": set(), "by_key": {}, "config_opens": {}, **fields}
    return types.SimpleNamespace(enabled=lambda: enabled, **state)


@pytest.mark.parametrize(("templates", "config_hash", "spec", "fresh", "expected"), [
    (_templates(), HASH, {}, False, "restored"),
    (_templates(enabled=False), HASH, {}, True, "templates_off"),
    (_templates(), HASH, {"seed": 3}, True, "seeded"),
    (_templates(), None, {}, True, "no_config"),
    (_templates(failed={KEY: "unsuitable: imports os", CKEY: "unsuitable: two constructions differ"}),
     HASH, {}, True, "source_unsuitable"),
    (_templates(failed={CKEY: "unsuitable: two constructions differ"}), HASH, {}, True, "nondeterministic"),
    (_templates(no_room={CKEY}, config_opens={CKEY: 1.0}), HASH, {}, True, "no_room"),
    (_templates(by_key={CKEY: object()}), HASH, {}, True, "building"),
    (_templates(config_opens={CKEY: 1.0}), HASH, {}, True, "building"),
    (_templates(config_opens={config_template_key(KEY, "c" * 64): 1.0}), HASH, {}, True, "first_open"),
])
def test_verdict_tests_the_reasons_in_order(templates: Any, config_hash: str | None, spec: dict[str, Any],
                                            fresh: bool, expected: str) -> None:
    found = verdict(templates, KEY, config_hash, spec, fresh)
    assert found["path"] == "constructed" and found["reason"] == expected
    if expected in ("source_unsuitable", "nondeterministic"):
        assert found["detail"].startswith("unsuitable: ")
