"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor, a
page missing from the nav or a snippet that does not resolve fails the test suite (and so
CI, which runs ``scripts/test``). It runs here rather than as a separate step of
``scripts/test`` so that it fails wherever the tests run, beside the other documentation
checks of this directory; the build takes a few seconds and needs only the ``docs`` extra
(part of ``dev``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD_TIMEOUT_S = 120.0


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project`` (its ``mkdocs.yml``) into ``site``, run from
    ``project`` (the snippets extension resolves ``README.md`` from there)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)


def copy_project(target: Path) -> Path:
    """What the site is built from (``mkdocs.yml``, ``docs/``, ``README.md``), copied to ``target``."""
    target.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", target)
    shutil.copy(ROOT / "README.md", target)
    shutil.copytree(ROOT / "docs", target / "docs")
    return target


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {page.stem for page in (ROOT / "docs").glob("*.md")} - {"index"}
    built = {path.parent.name for path in (tmp_path / "site").glob("*/index.html")}
    assert (tmp_path / "site" / "index.html").is_file() and pages <= built, sorted(pages - built)
    quickstart = (tmp_path / "site" / "quickstart" / "index.html").read_text()
    assert "team-a" in quickstart, "the README's quickstart is not included in the site"


def test_broken_links_anchors_and_pages_outside_the_nav_fail_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    page = project / "docs" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md) and "
                    "[a missing section](api.md#no-such-section).\n")
    (project / "docs" / "orphan.md").write_text("# Orphan\n\nNo nav entry names this page.\n")
    done = build(project, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    for culprit in ("no-such-page.md", "no-such-section", "orphan.md"):
        assert culprit in output, (culprit, output)


def test_a_quickstart_section_that_is_gone_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    readme = project / "README.md"
    readme.write_text(readme.read_text().replace("[start:quickstart]", "[start:elsewhere]"))
    done = build(project, tmp_path / "site")
    assert done.returncode != 0 and "'quickstart' could not be located" in done.stderr, done.stdout + done.stderr
