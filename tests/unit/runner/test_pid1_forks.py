"""Which templates keep a session process forked ahead (``pid1_forks.Forker``): at most the
host's ``forks_ahead`` (a value the runner cannot use is taken as its default or its
bound), the templates forked from most recently, never the jobs template; a template that
falls out of the set has its waiting process killed. Over stand-ins of the runner's loop
and process table: the forks themselves are tests/integration/executor/test_forks_ahead.py's."""

from __future__ import annotations

import types
from typing import Any

import pytest
from sandpit.sandbox_images.runner import pid1_forks
from sandpit.sandbox_images.runner.limits import FORK_AHEAD_DEFAULT, FORK_AHEAD_MAX_PER_SANDBOX


class Loop:
    """What the Forker asks of the loop: deferred actions (recorded) and whether it is busy."""

    def __init__(self) -> None:
        self.deferred: list[Any] = []
        self.is_busy = False

    def later(self, action: Any) -> None:
        self.deferred.append(action)

    def busy(self) -> bool:
        return self.is_busy


class Children:
    def __init__(self) -> None:
        self.hooks: list[Any] = []

    def before_sweep(self, action: Any) -> None:
        self.hooks.append(action)

    def sessions_open(self) -> int:
        return 0


def forker(limits: dict[str, Any]) -> tuple[pid1_forks.Forker, dict[str, pid1_forks.Template], Loop]:
    by_key: dict[str, pid1_forks.Template] = {}
    loop = Loop()
    return pid1_forks.Forker(loop, Children(), limits, by_key, lambda t, r: None), by_key, loop  # type: ignore[arg-type]


def template(by_key: dict[str, pid1_forks.Template], key: str) -> pid1_forks.Template:
    child = types.SimpleNamespace(pid=len(by_key) + 10)
    made = pid1_forks.Template(key, child, 0.0)  # type: ignore[arg-type]
    made.ready, made.deadline = True, None
    by_key[key] = made
    return made


class Waiting:
    """A process forked ahead: only whether it was killed matters here."""

    def __init__(self, pid: int) -> None:
        self.pid, self.alive, self.killed = pid, True, False

    def kill(self) -> None:
        self.killed, self.alive = True, False


@pytest.mark.parametrize(("value", "most"), [
    (None, FORK_AHEAD_DEFAULT), (0, 0), (1, 1), (FORK_AHEAD_MAX_PER_SANDBOX, FORK_AHEAD_MAX_PER_SANDBOX),
    (FORK_AHEAD_MAX_PER_SANDBOX + 1, FORK_AHEAD_MAX_PER_SANDBOX), (10**9, FORK_AHEAD_MAX_PER_SANDBOX), (-3, 0),
    ("2", 2), ("two", FORK_AHEAD_DEFAULT), ([], FORK_AHEAD_DEFAULT), (None.__class__, FORK_AHEAD_DEFAULT),
])
def test_the_hosts_forks_ahead_is_taken_within_its_bounds(value: Any, most: int) -> None:
    limits = {"max_sessions": 8} if value is None else {"max_sessions": 8, "forks_ahead": value}
    assert forker(limits)[0].most == most


def test_the_templates_forked_from_most_recently_keep_one_and_the_others_lose_theirs() -> None:
    forks, by_key, loop = forker({"max_sessions": 8, "forks_ahead": 2})
    first, second, third = (template(by_key, f"{'0' * 64}:E{i}") for i in range(3))
    first.ahead = Waiting(101)  # type: ignore[assignment]
    forks.want(first)
    forks.want(second)
    assert list(forks.keys) == [first.key, second.key] and loop.deferred == [forks.fork_ahead] * 2
    forks.want(first)  # used again: the most recent
    forks.want(third)  # second is now the least recently forked from
    assert list(forks.keys) == [first.key, third.key]
    assert first.ahead is not None and not first.ahead.killed  # type: ignore[attr-defined]
    second.ahead = Waiting(102)  # type: ignore[assignment]
    waiting = second.ahead
    forks.want(second)  # back in: first (least recent) loses its process
    assert list(forks.keys) == [third.key, second.key]
    assert first.ahead is None and waiting is second.ahead


def test_the_jobs_template_and_a_zero_setting_never_fork_ahead() -> None:
    forks, by_key, loop = forker({"max_sessions": 8})
    forks.want(template(by_key, pid1_forks.JOBS_KEY))
    assert not forks.keys and not loop.deferred
    forks, by_key, loop = forker({"max_sessions": 8, "forks_ahead": 0})
    env = template(by_key, "0" * 64 + ":Env")
    env.ahead = Waiting(103)  # type: ignore[assignment]
    waiting = env.ahead
    forks.want(env)
    assert not forks.keys and not loop.deferred and env.ahead is None and waiting.killed  # type: ignore[attr-defined]


def test_forking_ahead_waits_while_the_runner_is_busy() -> None:
    forks, by_key, loop = forker({"max_sessions": 8})
    env = template(by_key, "0" * 64 + ":Env")
    forks.want(env)
    loop.deferred.clear()
    loop.is_busy = True
    forks.fork_ahead()  # a request in flight: nothing sent, asked for again later
    assert env.forking is None and loop.deferred == [forks.fork_ahead]
