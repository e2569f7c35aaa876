"""Fixtures for tests on the real Docker Engine and sandbox image (nothing mocked).

* Docker or the image missing: the tests skip, unless ``SANDPIT_REQUIRE_DOCKER`` is set
  (CI, ``scripts/test``), where they fail instead.
* ``pool``: one session-scoped :class:`SandboxPool` (one session per sandbox, one warm
  sandbox) shared by most tests; ``fast_profile`` is the small profile they use (2 s per
  call), so every test runs in the same warm-pool key.
* ``open_env``: opens sessions and closes every one of them when the test ends.
* a test marked ``serial`` outside ``tests/integration/scale`` is a collection error
  (``scripts/test`` runs that folder alone for them).
* ``leak_check``: after every pool has closed, no ``sandpit=1`` container made by this
  process (or by a dead one) may remain.
* ``server``, ``make_server``, ``make_module_server``: real ``sandpit serve`` processes
  (``api_server.ApiServer`` in tests/support) for the API's tests and its clients' (the
  Python client, importers, CLI, synthesis); ``server`` is one per module, or one for the
  whole session (``shared_server``) in modules that set ``SHARED_SERVER = True`` because
  nothing they assert depends on a fresh server (a server start costs seconds); ``api``
  an httpx client of tenant ``default``, ``counter_env_id`` / ``counter_source`` the
  Counter test environment.
"""

from __future__ import annotations

import gc
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import httpx
import pytest
import requests.exceptions
from api_server import COUNTER_SOURCE, ApiServer
from sandpit.executor.docker import docker_pool, engine
from sandpit.executor.docker.images import resolve_image
from sandpit.executor.docker.sandbox import Sandbox
from sandpit.executor.errors import ImageError
from sandpit.executor.pool import SandboxPool
from sandpit.executor.pool.session import Session
from sandpit.executor.profiles import ProfileOverrides, ResourceProfile
from sandpit.executor.results import CallResult
from sandpit.executor.settings import ExecutorSettings, get_image_settings

TENANT = "tests"
CALL_TIMEOUT_S = 2.0
FAST = ProfileOverrides(call_timeout_s=CALL_TIMEOUT_S, memory_mib=128, tmpfs_mib=8, output_cap_bytes=8192)

PROBE_SOURCE = '''
import os


class Probe:
    """Test environment: ``run`` executes a snippet as this tool's body (``result`` is
    the return value); the other tools are ordinary EnvScaler tools."""

    def __init__(self, init_config):
        self.counter = init_config.get("counter", 0)
        self.log = []

    def bump(self, by=1):
        self.counter += by
        self.log.append(by)
        return self.counter

    def run(self, code):
        scope = {"self": self, "os": os}
        exec(code, scope)
        return scope.get("result")
'''
"""Environment used by the limit and hostile-code tests (its code is untrusted code too:
it only ever runs inside sandboxes)."""


PROCESS_LIST = """
import json
procs = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2:].split()[0]
        procs.append([int(entry), state, stat[stat.find("(") + 1:stat.rfind(")")]])
result = json.dumps(sorted(procs))
"""
"""Snippet for ``run``: JSON ``[[pid, state, comm], ...]`` of every process in the sandbox."""


def _require(reason: str) -> None:
    if os.environ.get("SANDPIT_REQUIRE_DOCKER"):
        pytest.fail(f"SANDPIT_REQUIRE_DOCKER is set but {reason}", pytrace=False)
    pytest.skip(reason)


SERIAL_HOME = Path(__file__).parent / "scale"
"""Where tests marked ``serial`` live: ``scripts/test`` runs them alone from there only."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test marked ``serial`` outside :data:`SERIAL_HOME`: the parallel run of
    ``scripts/test`` deselects it and the serial run, which collects only that folder,
    would never see it.

    Raises:
        pytest.UsageError: naming each such test.
    """
    misplaced = [item.nodeid for item in items
                 if item.get_closest_marker("serial") is not None and not item.path.is_relative_to(SERIAL_HOME)]
    if misplaced:
        raise pytest.UsageError(f"tests marked serial must live under {SERIAL_HOME} (scripts/test runs only "
                                f"that folder alone): {', '.join(misplaced)}")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A Docker SDK client; skips (or fails, under SANDPIT_REQUIRE_DOCKER) if the engine
    is unreachable."""
    problem = None
    with warnings.catch_warnings():
        # the SDK leaks the socket of a failed connection: collect it while that is ignored
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=30)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            problem = str(exc)
        gc.collect()
    if problem is not None:
        _require(f"Docker Engine unreachable ({problem}); run scripts/ensure-docker")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    """The content-hash tag of the sandbox image built from this checkout."""
    try:
        return resolve_image(docker_client, None, get_image_settings())
    except ImageError as exc:
        _require(f"{exc} (the tag follows sandbox_images/runner/*.py: rebuild after editing them)")
        raise AssertionError("unreachable") from exc


def _leaked(client: docker.DockerClient) -> list[str]:
    """Sandbox containers this process (or a dead Sandpit process) left behind. Live
    sandboxes of other processes sharing the engine are not ours to judge."""
    me = engine.owner_id()
    leaked = []
    # ignore_removed: a container another process removes between the list and its inspect
    for container in client.containers.list(all=True, filters={"label": "sandpit=1"}, ignore_removed=True):
        owner = container.labels.get(engine.LABEL_OWNER, "")
        if owner == me or not engine.owner_alive(owner):
            leaked.append(f"{container.name} ({container.status}, labels={container.labels})")
    return leaked


@pytest.fixture(scope="session", autouse=True)
def leak_check(docker_client: docker.DockerClient, sandbox_image: str) -> Iterator[None]:
    """Session-scoped finalizer: set up before and torn down after every pool fixture
    (they also depend on it explicitly, which fixes that order)."""
    yield
    deadline = time.monotonic() + 10  # removals by background threads may still be in flight
    while (leaked := _leaked(docker_client)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leaked, f"sandbox containers left after every pool closed: {leaked}"


@pytest.fixture(scope="session")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Parent of the pools' protocol-socket directories (short paths: AF_UNIX limit)."""
    return tmp_path_factory.mktemp("run")


def make_settings(run_root: Path, name: str, **changes: Any) -> ExecutorSettings:
    fields: dict[str, Any] = {"pool_size": 1, "sessions_per_sandbox": 1, "run_dir": run_root / name, "idle_timeout_s": 20.0,
                              "startup_timeout_s": 30.0, "watchdog_grace_s": 5.0, "reap_on_start": True}
    fields.update(changes)
    return ExecutorSettings(**fields)


@pytest.fixture(scope="session")
def pool_settings(run_root: Path) -> Callable[..., ExecutorSettings]:
    """``pool_settings(name, **changes)``: test settings with their own socket directory."""
    return lambda name, **changes: make_settings(run_root, name, **changes)


@pytest.fixture(scope="session")
def pool(leak_check: None, run_root: Path) -> Iterator[SandboxPool]:
    """The shared pool: one session per sandbox, one warm sandbox."""
    with docker_pool(make_settings(run_root, "main")) as shared:
        yield shared


@pytest.fixture(scope="session")
def fast_profile(pool: SandboxPool) -> ResourceProfile:
    profile = pool.profile(overrides=FAST)
    assert profile.call_timeout_s == CALL_TIMEOUT_S
    return profile


@pytest.fixture
def opened() -> Iterator[list[Session]]:
    """A list the test appends the sessions it opens to; each is closed at teardown
    (before any module-scoped pool they came from)."""
    sessions: list[Session] = []
    yield sessions
    for session in sessions:
        session.close()


def template_state(sandbox: Any) -> dict[str, Any]:
    """The runner's template bookkeeping of ``sandbox`` (the ``templates`` field of its
    ``ping`` reply: ready, loading, configs_loading, ...)."""
    assert isinstance(sandbox, Sandbox)
    return dict(sandbox.request("ping")["templates"])


def deferred_actions(sandbox: Any) -> int:
    """How many of the runner's deferred actions (a spare's, a template's or a fork
    ahead's start) wait for a quiet moment in ``sandbox`` (the ``deferred`` field of its
    ``ping`` reply); each ``ping`` is itself an event that the quiet waits out."""
    assert isinstance(sandbox, Sandbox)
    return int(sandbox.request("ping")["deferred"])


OpenEnv = Callable[..., Session]


@pytest.fixture
def open_env(pool: SandboxPool, fast_profile: ResourceProfile) -> Iterator[OpenEnv]:
    """``open_env(source=PROBE_SOURCE, class_name="Probe", init_config=None, on=pool,
    profile=<the fast profile of that pool>)`` -> an open Session, closed (and its slot
    freed) at teardown."""
    opened: list[tuple[SandboxPool, Session]] = []

    def _open(source: str = PROBE_SOURCE, class_name: str = "Probe", init_config: dict | None = None,
              on: SandboxPool | None = None, profile: ResourceProfile | None = None) -> Session:
        target = on or pool
        session = target.open_session(tenant=TENANT, source=source, class_name=class_name,
                                      init_config=init_config, profile=profile or target.profile(overrides=FAST))
        opened.append((target, session))
        return session

    yield _open
    for _, session in opened:
        session.close()
    for target, session in opened:
        assert session.closed
        assert all(session.id not in sandbox.sessions for sandbox in list(target.sets.all.values()))


FORK_BOMB = """
def processes():
    return sum(1 for entry in os.listdir('/proc') if entry.isdigit())

self.counter = -1
peak = 0
while True:
    try:
        os.fork()  # parent and child both go on forking
    except OSError:
        count = processes()
        if count > peak:
            peak = count
            try:
                with open('peak-%d' % os.getpid(), 'w') as handle:
                    handle.write(str(peak))
            except OSError:
                pass
"""
"""Snippet: forks until EAGAIN, recording the peak process count seen in files ``peak-<pid>``."""


class Probe:
    """Helpers around :data:`PROBE_SOURCE` (``run`` executes a snippet as a tool body)."""

    source = PROBE_SOURCE
    FORK_BOMB = FORK_BOMB

    @staticmethod
    def run(session: Session, code: str) -> CallResult:
        return session.call("run", {"code": code})

    def ok(self, session: Session, code: str) -> str:
        """Run ``code``, assert the call succeeded, return the observation."""
        result = self.run(session, code)
        assert result.status == "ok", (result.status, result.observation, result.traceback, result.stderr)
        return result.observation

    def processes(self, session: Session) -> list[list]:
        """``[[pid, state, comm], ...]`` of every process in the session's sandbox."""
        return json.loads(self.ok(session, PROCESS_LIST))

    def settled_processes(self, session: Session, quiet_s: float = 0.5, timeout_s: float = 15.0) -> list[list]:
        """:meth:`processes` once the set of pids stayed the same over ``quiet_s`` seconds:
        the runner starts a spare or a template once its loop has been quiet for
        ``limits.QUIET_S`` after the reply of an open, or within ``limits.DEFER_MAX_S``
        while calls are in flight, so right after an open the list may still grow by one."""
        deadline = time.monotonic() + timeout_s
        seen = self.processes(session)
        while True:
            time.sleep(quiet_s)
            now = self.processes(session)
            if {p[0] for p in now} == {p[0] for p in seen} or time.monotonic() > deadline:
                return now
            seen = now


@pytest.fixture
def probe() -> Probe:
    return Probe()


# -- API servers (sandpit serve subprocesses) -------------------------------------------------
@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory, leak_check, sandbox_image) -> Iterator[ApiServer]:
    """One API server (default settings) for every module that sets ``SHARED_SERVER = True``."""
    instance = ApiServer(tmp_path_factory.mktemp("api-shared")).start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, leak_check,
           sandbox_image) -> Iterator[ApiServer]:
    """The API server of a test module: a server of its own, or the session's
    ``shared_server`` when the module sets ``SHARED_SERVER = True``. A module shares only
    if its tests hold whatever other modules leave on the server: tenant ``default``'s
    environments, scenarios and envs, other tenants (each module names its own), live
    sandboxes, audit records and metrics."""
    if getattr(request.module, "SHARED_SERVER", False):
        yield request.getfixturevalue("shared_server")
        return
    instance = ApiServer(tmp_path_factory.mktemp("api")).start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def api(server: ApiServer) -> Iterator[httpx.Client]:
    """httpx client of tenant ``default`` on the module's server."""
    with server.client() as client:
        yield client


@pytest.fixture(scope="module")
def counter_env_id(server: ApiServer) -> str:
    """A registered Counter environment on the module's server."""
    with server.client() as client:
        response = client.post("/v1/environments", json={"name": "counter", "source_code": COUNTER_SOURCE,
                                                         "class_name": "Counter"})
        assert response.status_code == 201, response.text
        return response.json()["id"]


@pytest.fixture(scope="session")
def counter_source() -> str:
    """Source of the Counter test environment (untrusted code: it only runs in sandboxes)."""
    return COUNTER_SOURCE


@pytest.fixture
def make_server(tmp_path: Path, leak_check, sandbox_image) -> Iterator:
    """``make_server(**env)`` -> a started :class:`ApiServer` of this test (stopped after)."""
    started: list[ApiServer] = []

    def make(**env: str) -> ApiServer:
        instance = ApiServer(tmp_path / f"server{len(started)}", **env)
        started.append(instance)
        return instance.start()

    yield make
    for instance in started:
        instance.stop()


@pytest.fixture(scope="module")
def make_module_server(tmp_path_factory: pytest.TempPathFactory, leak_check, sandbox_image) -> Iterator:
    """Like ``make_server``, but the servers live for the whole test module."""
    started: list[ApiServer] = []

    def make(**env: str) -> ApiServer:
        instance = ApiServer(tmp_path_factory.mktemp("api"), **env)
        started.append(instance)
        return instance.start()

    yield make
    for instance in started:
        instance.stop()
