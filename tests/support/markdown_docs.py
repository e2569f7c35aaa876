"""The repository's Markdown read as data, for the documentation tests: the fenced code blocks
of a section, the link targets of a document, and the README's quickstart turned into the one
shell script a newcomer's pasting amounts to.

Markdown is parsed with markdown-it-py (CommonMark plus tables), so a fence inside a list or
a link inside a table cell is found where a reader sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from markdown_it import MarkdownIt
from markdown_it.token import Token

QUICKSTART_HEADING = "Quickstart"
"""The README's level-2 heading (its first word) whose code blocks make the quickstart."""
DOCUMENTED_PORT = "8600"
"""The port the quickstart serves on (``sandpit serve``'s default); a test replaces it with a
free one so that it can run beside other servers."""
HEREDOC_END = "SANDPIT_QUICKSTART_FILE_END"
"""Delimiter of the here-documents that write the quickstart's Python files."""
FILE_LINE = re.compile(r"# ([A-Za-z0-9_.-]+\.py)\n")
"""First line of a quickstart Python block: the file a newcomer saves it as."""


class QuickstartError(ValueError):
    """The README's quickstart cannot be run as written (the message says where and why)."""


@dataclass(frozen=True)
class Block:
    """A fenced code block: its info string's first word, its text, its first line (1-based)."""

    language: str
    code: str
    line: int


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def _block(token: Token) -> Block:
    language = token.info.split()[0] if token.info.strip() else ""
    return Block(language, token.content, (token.map or [0])[0] + 1)


def code_blocks(text: str) -> list[Block]:
    """Every fenced code block of ``text``, in order."""
    return [_block(token) for token in _parser().parse(text) if token.type == "fence"]


def section_blocks(text: str, heading: str) -> list[Block]:
    """Fenced code blocks under the first level-2 heading of ``text`` whose title starts with
    ``heading``, up to the next level-1 or level-2 heading; [] when there is no such heading."""
    tokens = _parser().parse(text)
    blocks: list[Block] = []
    inside = found = False
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag in ("h1", "h2"):
            if found and inside:
                break
            inside = token.tag == "h2" and tokens[i + 1].content.startswith(heading)
            found = found or inside
        elif inside and token.type == "fence":
            blocks.append(_block(token))
    return blocks


def link_targets(text: str) -> list[tuple[str, int]]:
    """``(target, line)`` of every link and image in ``text`` (inline and reference links,
    tables included); the line is that of the paragraph or cell holding it (1-based)."""
    found: list[tuple[str, int]] = []
    for token in _parser().parse(text):
        if token.type != "inline" or not token.children:
            continue
        line = (token.map or [0])[0] + 1
        for child in token.children:
            if child.type == "link_open":
                found.append((str(child.attrGet("href") or ""), line))
            elif child.type == "image":
                found.append((str(child.attrGet("src") or ""), line))
    return found


def quickstart_script(readme: str, port: int) -> str:
    """The README's quickstart as one bash script, in the order of its blocks: ``sh`` blocks
    as they are, each ``python`` block written to the file its first line names
    (``# train.py``), and :data:`DOCUMENTED_PORT` replaced by ``port``. The script stops at
    the first failing command (``set -euo pipefail``).

    Raises:
        QuickstartError: no quickstart section or no code in it; a block that is neither
            ``sh`` nor ``python``; a Python block without its file name or holding
            :data:`HEREDOC_END`; no mention of :data:`DOCUMENTED_PORT`.
    """
    blocks = section_blocks(readme, QUICKSTART_HEADING)
    if not blocks:
        raise QuickstartError(f"no code blocks under a '## {QUICKSTART_HEADING}' heading")
    parts = ["set -euo pipefail"]
    for block in blocks:
        if block.language == "sh":
            parts.append(block.code)
        elif block.language == "python":
            named = FILE_LINE.match(block.code)
            if named is None:
                raise QuickstartError(f"line {block.line}: a python block must start with '# <file>.py', "
                                      "the file the reader saves it as")
            if HEREDOC_END in block.code:
                raise QuickstartError(f"line {block.line}: the block holds {HEREDOC_END}")
            parts.append(f"cat > {named[1]} <<'{HEREDOC_END}'\n{block.code}{HEREDOC_END}")
        else:
            raise QuickstartError(f"line {block.line}: a {block.language or 'plain'!r} block; the quickstart "
                                  "holds only sh and python blocks")
    script = "\n".join(parts) + "\n"
    if DOCUMENTED_PORT not in script:
        raise QuickstartError(f"the quickstart never names port {DOCUMENTED_PORT}")
    return script.replace(DOCUMENTED_PORT, str(port))
