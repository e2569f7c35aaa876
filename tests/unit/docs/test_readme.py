"""The README is the front door: short, opening with the two set-up commands, a quickstart that
can be run as written (``tests/integration/docs/test_quickstart.py`` runs it; here only its
shape is checked, without Docker), and a link to every page of the documentation site."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_docs import (
    DOCUMENTED_PORT,
    HEREDOC_END,
    QuickstartError,
    code_blocks,
    link_targets,
    quickstart_script,
)

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
MAX_LINES = 300
SETUP_COMMANDS = (
    "bash scripts/demo   # install everything (Docker Engine, gVisor, venv, sandbox image), run the main job\n"
    "bash scripts/test   # install everything, then run the whole test suite (what CI runs)\n")
NOT_LINKED_FROM_README = {"index.md", "quickstart.md"}
"""The site's home and the page that includes the README's own quickstart."""


def test_the_readme_stays_short() -> None:
    assert len(README.splitlines()) <= MAX_LINES


def test_it_opens_with_the_two_setup_commands() -> None:
    first = code_blocks(README)[0]
    assert (first.language, first.code) == ("sh", SETUP_COMMANDS)


def test_it_links_every_page_of_the_site() -> None:
    linked = {target.split("#")[0] for target, _ in link_targets(README)}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md") if page.name not in NOT_LINKED_FROM_README}
    assert pages - linked == set()


def test_the_quickstart_is_one_script_from_server_to_rl_loop() -> None:
    script = quickstart_script(README, 12345)
    assert script.startswith("set -euo pipefail\n") and DOCUMENTED_PORT not in script
    steps = ["sandpit db upgrade", "sandpit serve --port 12345", "sandpit tenants create",
             "sandpit environments create counter.py", "sandpit envs create", "sandpit envs step",
             "sandpit envs state", "cat > train.py", "python train.py", "kill %1"]
    positions = [script.index(step) for step in steps]
    assert positions == sorted(positions)
    assert script.index("cat > counter.py") < script.index("sandpit environments create counter.py")


QUICKSTART = "# Tool\n\n## Quickstart\n\n{blocks}\n## Next\n\n```sh\necho after\n```\n"


@pytest.mark.parametrize(("blocks", "message"), [
    ("No code at all.\n", "no code blocks"),
    ("```sh\nsandpit serve --port 8600 &\n```\n\n```console\n$ sandpit envs list\n```\n", "'console' block"),
    ("```sh\nsandpit serve --port 8600 &\n```\n\n```\nplain text\n```\n", "'plain' block"),
    ("```python\nprint('no file name')\n```\n\n```sh\nsandpit serve --port 8600\n```\n", "must start with '# <file>.py'"),
    ("```python\n# a.py\nprint('" + HEREDOC_END + "')\n```\n\n```sh\nsandpit serve --port 8600\n```\n",
     f"holds {HEREDOC_END}"),
    ("```sh\nsandpit serve\n```\n", "never names port 8600"),
])
def test_a_quickstart_that_cannot_run_as_written_is_refused(blocks: str, message: str) -> None:
    with pytest.raises(QuickstartError, match=message.replace("(", r"\(").replace("[", r"\[")):
        quickstart_script(QUICKSTART.format(blocks=blocks), 12345)


def test_only_the_quickstart_section_is_taken() -> None:
    readme = QUICKSTART.format(blocks="```python\n# a.py\nx = 8600\n```\n\n```sh\npython a.py\n```\n")
    assert quickstart_script(readme, 12345) == (
        f"set -euo pipefail\ncat > a.py <<'{HEREDOC_END}'\n# a.py\nx = 12345\n{HEREDOC_END}\npython a.py\n\n")
    assert quickstart_script("# Tool\n\n## Quickstart (5 minutes)\n\n```sh\nsandpit serve --port 8600\n```\n",
                             1) == "set -euo pipefail\nsandpit serve --port 1\n\n"
