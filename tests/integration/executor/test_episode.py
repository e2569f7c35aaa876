"""A whole EnvScaler episode on a real sandbox: instantiation semantics, ok/error calls,
state, snapshot and restore."""

from __future__ import annotations

import pytest
from sandpit.executor.errors import SessionClosed, SessionOpenError
from sandpit.executor.results import Snapshot

pytestmark = pytest.mark.docker

LIBRARY = '''
from typing import Dict, List


class Library:
    """Books can be borrowed while copies are left."""

    def __init__(self, init_config: dict):
        self.books: Dict[str, int] = dict(init_config.get("books", {}))
        self.loans: List[List[str]] = []
        self.tags = set()
        self._audit = []  # private, but state all the same (EnvScaler: vars() minus dunders)

    def borrow(self, member: str, title: str) -> str:
        if self.books.get(title, 0) <= 0:
            raise ValueError(f"no copies of {title!r} left")
        self.books[title] -= 1
        self.loans.append([member, title])
        self._audit.append(title)
        return f"{member} borrowed {title}"

    def tag(self, label: str) -> int:
        self.tags.add(label)
        return len(self.tags)

    def count(self) -> int:
        return sum(self.books.values())
'''

NO_ARG_INIT = '''
class Settings:
    def __init__(self):
        self.volume = 1
        self.muted = False

    def describe(self):
        return f"volume={self.volume} muted={self.muted} theme={self.theme}"
'''


def test_episode_calls_state_snapshot_restore(open_env) -> None:
    session = open_env(source=LIBRARY, class_name="Library", init_config={"books": {"Dune": 2, "Emma": 1}})
    assert session.state() == {"books": {"Dune": 2, "Emma": 1}, "loans": [], "tags": {"$set": []}, "_audit": []}

    first = session.call("borrow", {"member": "ann", "title": "Dune"})
    assert first.status == "ok", first
    assert first.observation == "ann borrowed Dune"
    assert first.delta.set == {"books": ["j", {"Dune": 1, "Emma": 1}], "loans": ["j", [["ann", "Dune"]]],
                               "_audit": ["j", ["Dune"]]}
    assert not first.recovered and first.tool_ms is not None

    failed = session.call("borrow", {"member": "bob", "title": "Hamlet"})
    assert failed.status == "error"
    assert failed.observation.startswith("Error: ValueError"), failed.observation
    assert failed.observation == "Error: ValueError: no copies of 'Hamlet' left"
    assert failed.traceback is not None and "ValueError" in failed.traceback
    assert "in borrow" in failed.traceback  # the environment's own frame is shown...
    assert "/opt/sandpit" not in failed.traceback  # ...the runner's are not
    assert len(failed.traceback) <= 4096 + 4
    assert failed.delta.set == {}

    assert session.call("tag", {"label": "classic"}).observation == "1"  # opaque (set) state
    assert session.call("count", {}).observation == "2"

    state = session.state()
    assert state == {"books": {"Dune": 1, "Emma": 1}, "loans": [["ann", "Dune"]], "tags": {"$set": ["classic"]},
                     "_audit": ["Dune"]}
    snapshot = Snapshot(attributes=session.read_state())
    assert isinstance(snapshot, Snapshot)
    assert snapshot.attributes["tags"][0] == "p"  # a set is pickled, opaque to the host
    assert snapshot.attributes["_audit"] == ["j", ["Dune"]]

    for member, title in (("cy", "Dune"), ("dee", "Emma")):
        assert session.call("borrow", {"member": member, "title": title}).status == "ok"
    session.call("tag", {"label": "new"})
    assert session.call("count", {}).observation == "0"
    assert session.state() != state

    session.restore(snapshot)
    assert session.state() == state
    assert Snapshot(attributes=session.read_state()) == snapshot
    # the restored instance behaves like the snapshot's: one Dune copy left, then none
    assert session.call("borrow", {"member": "eve", "title": "Dune"}).status == "ok"
    assert session.call("borrow", {"member": "fay", "title": "Dune"}).status == "error"

    session.close()
    with pytest.raises(SessionClosed):
        session.call("count", {})


def test_snapshot_restores_into_a_new_session(pool, fast_profile) -> None:
    session = pool.open_session(tenant="tests", source=LIBRARY, class_name="Library",
                                init_config={"books": {"Dune": 3}}, profile=fast_profile)
    try:
        session.call("borrow", {"member": "ann", "title": "Dune"})
        session.call("tag", {"label": "x"})
        snapshot = Snapshot(attributes=session.read_state())
        expected = session.state()
    finally:
        session.close()
    copy = pool.open_session(tenant="tests", source=LIBRARY, class_name="Library",
                             init_config={"books": {"Dune": 3}}, profile=fast_profile,
                             snapshot=snapshot.attributes)
    try:
        assert copy.state() == expected
        assert copy.call("count", {}).observation == "2"
    finally:
        copy.close()


def test_init_with_config_parameter_receives_the_whole_config(open_env) -> None:
    session = open_env(source=LIBRARY, class_name="Library", init_config={"books": {"X": 1}, "other": True})
    # EnvScaler init_env_instance: cls(init_config), then every key is set as an attribute too
    assert session.state() == {"books": {"X": 1}, "loans": [], "tags": {"$set": []}, "_audit": [], "other": True}


def test_init_without_parameters_sets_config_keys_as_attributes(open_env) -> None:
    session = open_env(source=NO_ARG_INIT, class_name="Settings",
                       init_config={"volume": 7, "theme": "dark"})
    # cls() then setattr per key: overrides __init__'s value and adds new attributes
    assert session.state() == {"volume": 7, "muted": False, "theme": "dark"}
    assert session.call("describe", {}).observation == "volume=7 muted=False theme=dark"


@pytest.mark.parametrize("source,class_name,status,observation", [
    (LIBRARY, "Missing", "error", "Error: LookupError: class 'Missing' is not defined by the environment code"),
    ("class Broken:\n    def __init__(self, cfg):\n        raise RuntimeError('no db')\n", "Broken", "error",
     "Error: RuntimeError: no db"),
    ("import nonexistent_module_xyz\n", "X", "error", "Error: ModuleNotFoundError"),
    ("class Slow:\n    def __init__(self, cfg):\n        while True: pass\n", "Slow", "timeout", "Error: tool call"),
])
def test_open_failures_are_reported_not_raised_as_crashes(pool, fast_profile, source, class_name, status,
                                                          observation) -> None:
    with pytest.raises(SessionOpenError) as info:
        pool.open_session(tenant="tests", source=source, class_name=class_name, profile=fast_profile)
    assert info.value.status == status
    assert info.value.observation.startswith(observation), info.value.observation
    assert pool.stats()["sessions"] == 0  # the slot was freed
