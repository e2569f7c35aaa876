"""Printing text that comes from outside the CLI (API error messages, server data, file
names, sandbox output, model answers) so that rich never reads it as console markup: a
message such as ``tenant id must match [a-z0-9][a-z0-9_-]{0,63}`` or one holding
``[bold]`` is printed as written, never styled, cut or refused by rich's markup parser.

Every command group prints errors with :func:`error` and notes with :func:`note`; styles
are given apart from the text (``note(console, ("done", "green"), " ", name)``), never
inside an f-string."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

Part = str | tuple[str, str]
"""A piece of a line: plain text, or ``(text, style)``."""


def out() -> Console:
    """The console of standard output, made for each use: rich reads ``COLUMNS`` when a
    console is made, so one made at import would keep the width of that moment instead
    of the terminal's when the command prints."""
    return Console()


def line(*parts: Part) -> Text:
    """The pieces as one :class:`~rich.text.Text`; the text of each is taken literally."""
    return Text.assemble(*parts)


def note(console: Console, *parts: Part) -> None:
    """One line of ``parts`` on ``console``: no markup, no highlighting, never wrapped
    into several lines by rich (the terminal may still wrap it)."""
    console.print(line(*parts), soft_wrap=True, highlight=False)


def error(console: Console, message: object, code: int = 1, label: str = "error") -> NoReturn:
    """``error: message`` as one line on ``console`` (the message's own line breaks
    become spaces), then exit with ``code``. Raises typer.Exit."""
    note(console, (f"{label}: ", "red"), " ".join(str(message).splitlines()))
    raise typer.Exit(code)


def id_column(table: Table, header: str, ids: Iterable[str]) -> None:
    """Add an id column as wide as the longest of ``ids``: ids are never cut or wrapped,
    however narrow the terminal (other columns give way)."""
    table.add_column(header, no_wrap=True, min_width=max([len(header), *map(len, ids)]))


def show(console: Console, table: Table) -> None:
    """Print ``table`` whole: when the terminal is too narrow for its id columns
    (:func:`id_column`: ``no_wrap`` with a ``min_width``) beside a few characters of each
    other column, the table is laid out at the width they need and its lines are not
    cropped (the terminal wraps them), so no id is ever cut; otherwise it is laid out at
    the terminal's width as usual (other columns wrap)."""
    _, right, _, left = table.padding
    needed = sum((column.min_width or 0) if column.no_wrap else 4 for column in table.columns)
    needed += len(table.columns) * (left + right) + (len(table.columns) + 1 if table.box else 0)
    if needed > console.width:
        table.width = needed
    console.print(table, crop=False)
