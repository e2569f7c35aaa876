"""The README's quickstart, run as a newcomer runs it: its blocks pasted in order into one
bash shell in a fresh directory whose ``.venv`` is this test run's virtualenv, against the
real ``sandpit serve`` the quickstart itself starts (real SQLite file, real Docker Engine).

Only two things differ from a newcomer's machine: the port (:data:`DOCUMENTED_PORT` becomes a
free one, so the test runs beside other servers) and ``TMPDIR`` (the quickstart's
``mktemp -d`` data directory lands in the test's temporary directory). ``SANDPIT_*``
variables of the test run are not passed on: the quickstart sets what it needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from api_server import free_port
from markdown_docs import quickstart_script

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
SCRIPT_TIMEOUT_S = 420.0
"""The whole quickstart: server start, a pool's first sandboxes, registrations, two episodes."""
STOP_GRACE_S = 60.0
"""What a server left running by a failed script gets to remove its sandboxes after SIGTERM."""


def _stop_group(pgid: int) -> None:
    """End whatever the script left in its process group (the server, when the script failed
    before its last block stopped it): SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _server_logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in tmp_path.glob("*/server.log"))


def run_quickstart(readme: str, tmp_path: Path) -> tuple[int, str, str, int]:
    """Run the quickstart of ``readme`` as the module docstring says; returns its exit
    status, stdout, stderr (with the server's log) and process group. Whatever the script
    left running in that group is stopped before this returns."""
    script = quickstart_script(readme, free_port())
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (checkout / "quickstart.sh").write_text(script)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SANDPIT_")}
    env["TMPDIR"] = str(tmp_path)
    process = subprocess.Popen(["bash", "quickstart.sh"], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _stop_group(process.pid)
        out, err = process.communicate()
        pytest.fail(f"the quickstart did not finish within {SCRIPT_TIMEOUT_S} s\n{out}\n{err}\n{_server_logs(tmp_path)}")
    finally:
        _stop_group(process.pid)
    return process.returncode, out, f"{err}\n{_server_logs(tmp_path)}", process.pid


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_readme_quickstart_runs_as_written(tmp_path: Path, sandbox_image: str) -> None:
    code, out, err, _ = run_quickstart((ROOT / "README.md").read_text(), tmp_path)
    report = f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert code == 0, report
    assert '"count": 3' in out, report  # sandpit envs state, after bump by=2 from count 1
    assert "ok 5 {'count': 5, 'records': {}}" in out, report  # the client's step and state
    assert out.count("reward 1.0 after 3 steps") == 2, report  # both RL episodes scored by the checks


def test_a_quickstart_that_breaks_midway_fails_and_leaves_no_server(tmp_path: Path, sandbox_image: str) -> None:
    readme = (ROOT / "README.md").read_text()
    broken = readme.replace("sandpit environments create counter.py", "sandpit environments create missing.py")
    assert broken != readme
    code, out, err, group = run_quickstart(broken, tmp_path)
    # exit 2 is typer's for a missing file: the server had started and answered before it
    assert code == 2 and "missing.py" in err and "reward" not in out, f"exit {code}\n{out}\n{err}"
    assert _group_gone(group)  # the server the script left running was stopped (its sandboxes: leak_check)
