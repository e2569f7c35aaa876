"""When a failed template is built again (``pid1_templates.Templates``): a failure a loaded
machine causes (late, died, a fork that failed) is retried after a growing backoff, at most
TEMPLATE_REBUILDS times per recycle; a verdict (``unsuitable``) or a protocol violation never
is. Over stand-ins of the runner's loop and process table: only which templates get started
is observed here (the processes themselves are tests/integration/executor/test_templates.py's)."""

from __future__ import annotations

import types
from typing import Any

import pytest
from sandpit.sandbox_images.runner import pid1_templates
from sandpit.sandbox_images.runner.limits import TEMPLATE_REBUILD_BACKOFF_S, TEMPLATE_REBUILDS

KEY = "0" * 64 + ":Env"
SPEC = {"source": "class Env:\n    pass\n", "class_name": "Env"}


class Clock:
    """``time.monotonic`` of pid1_templates, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Children:
    """What Templates asks of the process table: spares to take (counted)."""

    def __init__(self) -> None:
        self.taken: list[Any] = []

    def follow(self, *args: Any, **kwargs: Any) -> None:
        pass

    def before_sweep(self, action: Any) -> None:
        pass

    def take(self) -> Any:
        child = types.SimpleNamespace(pid=100 + len(self.taken), sock=object(), out_r=-1, err_r=-1, frames=None,
                                      sent=[], kill=lambda: None)
        child.send = child.sent.append
        self.taken.append(child)
        return child


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> tuple[pid1_templates.Templates, Children, Clock]:
    clock = Clock()
    monkeypatch.setattr(pid1_templates.time, "monotonic", clock)
    loop = types.SimpleNamespace(add_deadlines=lambda f: None, watch=lambda *a: None, unwatch=lambda *a: None)
    children = Children()
    templates = pid1_templates.Templates(loop, children, {"call_timeout_s": 1.0, "templates": True,  # type: ignore[arg-type]
                                                          "max_sessions": 8})
    return templates, children, clock


def test_a_template_that_failed_late_is_built_again_after_a_growing_backoff_a_bounded_number_of_times(setup) -> None:
    templates, children, clock = setup
    templates.want(KEY, SPEC)
    assert len(children.taken) == 1
    waits = []
    for attempt in range(TEMPLATE_REBUILDS):
        templates.fail(templates.by_key[KEY], "fork failed: TimeoutError")
        templates.want(KEY, SPEC)
        assert len(children.taken) == attempt + 1, "rebuilt before its backoff"
        wait = TEMPLATE_REBUILD_BACKOFF_S * 4 ** attempt
        clock.now += wait - 0.01
        templates.want(KEY, SPEC)
        assert len(children.taken) == attempt + 1, "rebuilt before its backoff"
        clock.now += 0.02
        templates.want(KEY, SPEC)
        assert len(children.taken) == attempt + 2, f"not rebuilt after {wait} s"
        waits.append(wait)
    assert waits == [5.0, 20.0, 80.0]
    templates.fail(templates.by_key[KEY], "did not load in time")  # one failure too many
    clock.now += 10_000
    templates.want(KEY, SPEC)
    assert len(children.taken) == TEMPLATE_REBUILDS + 1 and templates.still_failed(KEY)


@pytest.mark.parametrize("reason", ["unsuitable: imports os", "broke the protocol"])
def test_a_verdict_or_a_protocol_violation_is_never_retried(setup, reason: str) -> None:
    templates, children, clock = setup
    templates.want(KEY, SPEC)
    templates.fail(templates.by_key[KEY], reason, final=True)
    clock.now += 10_000
    templates.want(KEY, SPEC)
    assert len(children.taken) == 1 and templates.failed[KEY] == reason


def test_a_recycle_gives_every_key_its_rebuilds_back(setup) -> None:
    templates, children, clock = setup
    templates.want(KEY, SPEC)
    for _ in range(TEMPLATE_REBUILDS + 1):
        templates.fail(templates.by_key[KEY], "exited")
        clock.now += 10_000
        templates.want(KEY, SPEC)
    assert templates.still_failed(KEY)
    templates.clear()
    templates.want(KEY, SPEC)
    assert KEY in templates.by_key and not templates.rebuilds
