"""Docstring parsing of tool schemas (``child_docstrings``): a summary and documented
parameters, edge cases, and adversarial docstrings in linear time. The styles themselves
are exercised through whole classes in ``test_child_schemas.py``."""

from __future__ import annotations

import time

import pytest
from sandpit.sandbox_images.runner import child_docstrings, limits


def test_parse_docstring_edge_cases() -> None:
    assert child_docstrings.parse_docstring(None) == ("", {})
    assert child_docstrings.parse_docstring("   ") == ("", {})
    summary, params = child_docstrings.parse_docstring("Only :param-like text in the middle: not a field.")
    assert summary == "Only :param-like text in the middle: not a field." and params == {}
    summary, params = child_docstrings.parse_docstring("Sum.\n\nArgs:\n    x (int): X.\n\nTrailing text at the section level.")
    assert summary == "Sum." and params["x"].description == "X."
    _, params = child_docstrings.parse_docstring("S.\n\nArgs:\n    url: see http://example.org\n    http://not.an/item\n")
    assert list(params) == ["url"] and params["url"].description == "see http://example.org"


@pytest.mark.parametrize("doc", [
    ":param " + "a b " * 20000 + ":", ":param x" + " " * 100_000 + "y:", "S.\n\nArgs:\n    a" + " " * 200_000 + "(",
    "S.\n\nArgs:\n    a (" + "(" * 100_000 + ":", "S.\n\nArgs:\n    a (" + "b(c)" * 50_000 + "d",
    "Parameters\n----------\n" + "a" * 100_000 + " " * 100_000 + "!", "Args" + " " * 200_000 + "x",
    "S.\n\nArgs:\n    a: start\n" + "        a\n" * 120_000, "x\n" * 5_000_000,
])
def test_adversarial_docstrings_parse_in_linear_time(doc: str) -> None:
    started = time.perf_counter()
    summary, params = child_docstrings.parse_docstring(doc)
    assert time.perf_counter() - started < 1.0
    assert len(summary) <= limits.MAX_DESCRIPTION_CHARS
    assert all(len(p.description) <= limits.MAX_DESCRIPTION_CHARS for p in params.values())
