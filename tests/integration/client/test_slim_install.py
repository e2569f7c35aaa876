"""``pip install sandpit`` (no extras) is the client alone, and it runs an episode.

A fresh virtualenv gets the project's wheel, built from this checkout, without extras. The
test asserts that none of the server's packages is importable there, runs one episode (a
scenario of the Counter environment: create, reset, steps given as an OpenAI tool call, a
tool name and raw text, the reward) with that venv's Python against the real test server,
and runs the ``sandpit`` command there: the client-side commands work, the server's and
the other extras' answer in one line naming the extra.

The venv with the dependencies is cached under ``build/slim-client/<hash>`` (the hash of
``pyproject.toml`` and the Python version; one at a time), so only its first creation
reaches PyPI (or pip's cache); every run builds the wheel again offline
(``--no-build-isolation`` with the venv's own setuptools) and reinstalls it with
``--no-deps``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from api_server import ApiServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]
SHARED_SERVER = True  # the session's server (conftest's ``server``): nothing here needs a fresh one

ROOT = Path(__file__).resolve().parents[3]
SERVER_PACKAGES = ("docker", "fastapi", "sqlalchemy", "alembic", "RestrictedPython", "uvicorn", "cryptography",
                   "starlette", "openai", "pydantic_settings", "gymnasium")
"""Import names a client-only install must not have: the server's, the model client's (the
`llm` extra) and the gymnasium adapters' (`rl`)."""
BUILD_REQUIREMENTS = ("setuptools>=68", "wheel")  # pyproject.toml [build-system] requires

EPISODE = '''
import json, sys
import sandpit
from sandpit.client import Client

CHECKS = [{"check_item": "count is 3",
           "check_func": "def check_func(final_state):\\n    return final_state['count'] == 3\\n"}]
with Client() as client:  # SANDPIT_URL, SANDPIT_API_KEY
    scenario = client.scenarios.create({"environment_id": sys.argv[1], "init_config": {"count": 0},
                                        "task": "Make the counter 3.", "checklist_with_func": CHECKS})
    with client.envs.create(scenario_id=scenario.id, episode={"max_steps": 5}) as env:
        first = env.reset()
        steps = [env.step({"id": "call_1", "type": "function",
                           "function": {"name": "bump", "arguments": '{"by": 2}'}}),
                 env.step("bump", by=1),
                 env.step(text="Done: the counter is 3.")]
print(json.dumps({"module": sandpit.__file__, "task": first.observation,
                  "steps": [[s.status, s.observation, s.reward, s.terminated] for s in steps]}))
'''
"""One episode with the client alone; argv[1] is the environment id."""

NOT_IMPORTABLE = '''
import importlib.util, json, sys
missing = {}
try:
    import sandpit.client.llm
except ModuleNotFoundError as exc:
    missing["llm"] = str(exc)
print(json.dumps({"importable": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None],
                  "client": importlib.util.find_spec("sandpit.client") is not None, **missing}))
'''

MISSING_EXTRA = re.compile(r"error: `sandpit (?P<command>[a-z]+)` needs the '(?P<extra>[a-z]+)' extra "
                           r"\((?P<module>\w+) is not installed\): pip install 'sandpit\[(?P=extra)\]'")


def _run(args: list[str | Path], env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


def _checked(args: list[str | Path], env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = _run(args, env, timeout)
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _source_copy(target: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, nothing ignored): no stale
    ``build/`` or ``*.egg-info`` leaks into the wheel."""
    listed = _checked(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _wheel(python: Path, work: Path) -> Path:
    """Build the project's wheel with ``python``'s setuptools, offline."""
    source = _source_copy(work / "src")
    _checked([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", work / "dist", source])
    (wheel,) = (work / "dist").glob("sandpit-*.whl")
    return wheel


@pytest.fixture(scope="module")
def slim_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python of a venv with ``pip install <this checkout's wheel>`` (no extras)."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + sys.version.encode()).hexdigest()[:16]
    venv = ROOT / "build" / "slim-client" / key
    python = venv / "bin" / "python"
    work = tmp_path_factory.mktemp("slim")
    if not (venv / "ready").exists():
        for stale in venv.parent.glob("*"):  # venvs of other pyproject.toml versions, or a half-made one
            shutil.rmtree(stale, ignore_errors=True)
        _checked([sys.executable, "-m", "venv", venv])
        _checked([python, "-m", "pip", "install", "-q", *BUILD_REQUIREMENTS])
        _checked([python, "-m", "pip", "install", "-q", _wheel(python, work)])
        (venv / "ready").write_text(key)
    else:
        _checked([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", _wheel(python, work)])
    return python


def _client_env(server: ApiServer, data_dir: Path) -> dict[str, str]:
    """A clean environment for the venv's processes: no PYTHONPATH or VIRTUAL_ENV of the tests."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data_dir), "LANG": "C.UTF-8",
            "SANDPIT_URL": server.url, "SANDPIT_API_KEY": server.api_key, "SANDPIT_DATA_DIR": str(data_dir),
            "COLUMNS": "200"}


def test_client_alone_runs_an_episode(slim_python: Path, server: ApiServer, counter_env_id: str,
                                      tmp_path: Path) -> None:
    env = _client_env(server, tmp_path)
    _checked([slim_python, "-m", "pip", "check"], env=env)  # the default install's requirements are whole
    report = json.loads(_checked([slim_python, "-c", NOT_IMPORTABLE, *SERVER_PACKAGES], env=env).stdout)
    assert report["importable"] == [] and report["client"]
    assert "pip install 'sandpit[llm]'" in report["llm"]

    episode = json.loads(_checked([slim_python, "-c", EPISODE, counter_env_id], env=env, timeout=120).stdout)
    assert Path(episode["module"]).is_relative_to(slim_python.parents[1])  # the venv's sandpit, not this checkout
    assert episode["task"] == "Make the counter 3."
    assert episode["steps"] == [["ok", "2", 0.0, False], ["ok", "3", 0.0, False],
                                ["ok", "Task finished", 1.0, True]]


def test_sandpit_command_on_the_client_alone(slim_python: Path, server: ApiServer, counter_env_id: str,
                                             tmp_path: Path) -> None:
    sandpit = slim_python.parent / "sandpit"
    env = _client_env(server, tmp_path)
    usage = _checked([sandpit, "--help"], env=env).stdout
    assert "serve" in usage and re.search(r"synth +Needs the 'server' extra \(\w+ is not installed\)\.", usage)
    listed = _checked([sandpit, "environments", "list"], env=env).stdout
    assert counter_env_id in listed

    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"scenario_id": "scn_none", "tool_calls": []}) + "\n")
    expected = {
        ("serve",): "server", ("db", "upgrade"): "server", ("image", "build"): "server",
        ("image", "tag"): "server", ("demo",): "server", ("sandboxes", "--reap"): "server",
        ("synth", "run", "--run-dir", str(tmp_path / "run"), "--register"): "server",
        ("synth", "--help"): "server", ("import", "bfcl"): "importers", ("bfcl", "fetch"): "importers",
        ("rl", "demo", str(replay)): {"rl", "gem"},
    }
    for args, extra in expected.items():
        done = _run([sandpit, *args], env=env, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        match = MISSING_EXTRA.fullmatch(lines[0])
        assert match is not None and match["command"] == args[0], (args, lines[0])
        assert match["extra"] in ({extra} if isinstance(extra, str) else extra), (args, lines[0])
