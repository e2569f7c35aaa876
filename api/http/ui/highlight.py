"""Environment source code as highlighted HTML (Pygments): the code is untrusted text, and
Pygments' HTML formatter escapes every token; the result carries CSS classes only (the
colours are in ``static/viewer.css``), so no inline style reaches the page."""

from __future__ import annotations

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

MAX_SOURCE_CHARS = 1_000_000
"""Longest source highlighted; past it the rest is cut (the API has the whole text)."""


def python_html(source: str) -> Markup:
    """``source`` (Python) as an escaped, highlighted ``<div class="code"><pre>`` with line
    numbers in a table; at most :data:`MAX_SOURCE_CHARS` characters."""
    formatter = HtmlFormatter(cssclass="code", linenos="table", nowrap=False, noclasses=False)
    # Pygments' HtmlFormatter escapes every token of the source
    return Markup(highlight(source[:MAX_SOURCE_CHARS], PythonLexer(), formatter))  # noqa: S704
