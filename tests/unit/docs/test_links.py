"""No file of the repository links outside it: a clone has only its own files, so a link to a
directory beside the checkout (the steering notes' ``shared`` folder, say) or to an
absolute local path is broken for every reader but its author.

What counts as such a link:

* in a Markdown file, a link or image whose target is not a URL or an anchor and is
  absolute (``/...``, ``file:``), leaves the repository, or names no existing file;
* in any text file (code, comments, scripts, configuration), :data:`SHARED`, a relative path
  to a document (``.md``, ``.rst``, ``.html``, ``.pdf``, ``.ipynb``) that climbs out of the
  repository from the file's own directory, an absolute path to such a document, or the
  checkout's own absolute path.

The files are those git knows of (tracked, or new and not ignored), so build outputs and
virtualenvs are left out. The offending paths this module tests with are written in pieces,
so that it passes its own check.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_docs import link_targets

ROOT = Path(__file__).resolve().parents[3]
SHARED = "../" + "shared"
"""The folder beside a working checkout that a clone does not have."""
DOCUMENT = r"[\w.-]+\.(?:md|rst|html|pdf|ipynb)\b"
CLIMBING = re.compile(r"(?<![\w.])((?:\.\./)+(?:[\w.-]+/)*" + DOCUMENT + ")")
ABSOLUTE_DOCUMENT = re.compile(r"(?<![\w.:/~}-])(/(?:[\w.-]+/)+" + DOCUMENT + ")")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
FILE_URL = re.compile(r"(?:\]\(|<)\s*file:", re.IGNORECASE)
"""A Markdown link or autolink to a ``file:`` URL."""


def _inside(root: Path, path: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def markdown_problems(root: Path, file: Path, text: str) -> list[str]:
    """Links of the Markdown ``file`` that point outside ``root`` or at nothing."""
    problems = [f"{file.relative_to(root)}:{number}: links a local file URL"
                for number, line in enumerate(text.splitlines(), start=1) if FILE_URL.search(line)]
    for target, line in link_targets(text):  # the parser itself drops file: links
        where = f"{file.relative_to(root)}:{line}: link {target!r}"
        if SCHEME.match(target) or target.startswith("#") or not target:
            continue
        path_part = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if path_part.startswith("/"):
            problems.append(f"{where} is an absolute path")
        elif not _inside(root, file.parent / path_part):
            problems.append(f"{where} leaves the repository")
        elif not (file.parent / path_part).exists():
            problems.append(f"{where} names no file of the repository")
    return problems


def text_problems(root: Path, file: Path, text: str) -> list[str]:
    """Mentions, in any text ``file``, of documents outside ``root``."""
    problems = []
    checkout = str(root.resolve())
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{file.relative_to(root)}:{number}"
        if SHARED in line:
            problems.append(f"{where}: names {SHARED}, which a clone does not have")
        if checkout in line:
            problems.append(f"{where}: names the checkout's absolute path {checkout}")
        for match in CLIMBING.finditer(line):
            if not _inside(root, file.parent / match[1]):
                problems.append(f"{where}: {match[1]!r} leaves the repository")
        for match in ABSOLUTE_DOCUMENT.finditer(line):
            problems.append(f"{where}: {match[1]!r} is an absolute local path")
    return problems


def outside_links(root: Path, files: Iterable[Path]) -> list[str]:
    """Every problem of :func:`markdown_problems` and :func:`text_problems` in ``files``
    (binary files are skipped)."""
    problems: list[str] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if file.suffix == ".md":
            problems += markdown_problems(root, file, text)
        problems += text_problems(root, file, text)
    return problems


def repository_files(root: Path) -> list[Path]:
    """Files git knows of under ``root``: tracked, or untracked and not ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode()
    return [root / name for name in listed.split("\0") if name and (root / name).is_file()]


def test_no_file_of_the_repository_links_outside_it() -> None:
    files = repository_files(ROOT)
    assert any(file.name == "README.md" for file in files) and len(files) > 100
    assert outside_links(ROOT, files) == []


ABSOLUTE_NOTES = "/" + "work/shared/notes.md"
HOME_NOTES = "/" + "home/someone/notes.md"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A small repository whose files hold every kind of outside link, and fine ones."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "docs" / "page.md").write_text("# Page\n\nBack to the [README](../README.md).\n")
    (root / "README.md").write_text(
        "# Project\n\n"
        f"See [the card]({SHARED}/ARCHITECTURE.md) and [notes]({ABSOLUTE_NOTES}).\n\n"
        "[passwd](file:///etc/passwd) and [a page that is not there](docs/missing.md).\n\n"
        "| page | link |\n|---|---|\n| design | [outside](../../design.md#top) |\n\n"
        "Fine: [page](docs/page.md#page), [site](https://example.org/a/b.md), [top](#project), "
        "[mail](mailto:team@example.org), [code](pkg/mod.py).\n")
    (root / "pkg" / "mod.py").write_text(
        f'"""The design card is {SHARED}/ARCHITECTURE.md; see also {HOME_NOTES}."""\n'
        "# the same page, climbing out: ../../guide.rst\n"
        'HOSTILE_PATHS = ["../escape.txt", "../../etc/passwd", "h/../../etc:1:2"]  # inputs, not links\n'
        'URL = "https://example.org/docs/index.html"\n'
        "# inside the repository: ../README.md\n")
    (root / "pkg" / "data.bin").write_bytes(b"\xff\xfe" + SHARED.encode() + b"\x00")
    return root


def test_every_kind_of_outside_link_is_reported(repository: Path) -> None:
    files = sorted(path for path in repository.rglob("*") if path.is_file())
    expected = [f"README.md:3: link '{SHARED}/ARCHITECTURE.md' leaves the repository",
                f"README.md:3: link '{ABSOLUTE_NOTES}' is an absolute path",
                "README.md:5: links a local file URL",
                "README.md:5: link 'docs/missing.md' names no file of the repository",
                "README.md:9: link '../../design.md#top' leaves the repository",
                f"README.md:3: names {SHARED}, which a clone does not have",
                f"README.md:3: '{SHARED}/ARCHITECTURE.md' leaves the repository",
                f"README.md:3: '{ABSOLUTE_NOTES}' is an absolute local path",
                "README.md:9: '../../design.md' leaves the repository",
                f"pkg/mod.py:1: names {SHARED}, which a clone does not have",
                f"pkg/mod.py:1: '{HOME_NOTES}' is an absolute local path",
                "pkg/mod.py:2: '../../guide.rst' leaves the repository"]
    found = outside_links(repository, files)
    assert sorted(found) == sorted(expected), "\n".join(sorted(found))


def test_the_checkout_path_itself_is_reported(repository: Path) -> None:
    script = repository / "pkg" / "run.sh"
    script.write_text(f"cd {repository.resolve()}/pkg && python mod.py\n")
    assert outside_links(repository, [script]) == [
        f"pkg/run.sh:1: names the checkout's absolute path {repository.resolve()}"]
