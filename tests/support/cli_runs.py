"""Running the ``sandpit`` CLI in-process for the CLI's integration tests."""

from __future__ import annotations

from click.testing import Result
from sandpit.cli import app
from typer.testing import CliRunner


def run(runner: CliRunner, *args: str, code: int = 0) -> Result:
    """``sandpit <args>`` through ``runner``; asserts its exit code is ``code`` (the output
    and the exception in the message when it is not)."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, f"{args}: exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result
