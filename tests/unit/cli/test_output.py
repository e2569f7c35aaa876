"""Messages from outside the CLI are printed as written, never read as rich markup
(:mod:`sandpit.output`): through the real commands (typer's CliRunner, nothing running)
whose errors carry text the user or a server chose."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from rich.console import Console
from sandpit.cli import app
from sandpit.output import error, note, out
from typer.testing import CliRunner

HOSTILE = ["tenant id must match [a-z0-9][a-z0-9_-]{0,63}", "[bold]loud[/bold] and [red]red", "closing [/] tag",
           "[/nothing] [link=http://x]click[/link]", "emoji :warning: stays"]


@pytest.mark.parametrize("message", HOSTILE)
def test_error_prints_the_message_as_written(message: str) -> None:
    console = Console(record=True, width=20, color_system=None)
    with pytest.raises(typer.Exit) as raised:
        error(console, message + "\nsecond line", code=3)
    assert raised.value.exit_code == 3
    assert console.export_text() == f"error: {message} second line\n"  # one line, never wrapped at 20 columns


def test_note_keeps_styles_apart_from_the_text() -> None:
    console = Console(record=True, width=200, color_system="truecolor", force_terminal=True)
    note(console, ("[bold]x[/bold]", "red"), " plain [i]")
    assert console.export_text(clear=False) == "[bold]x[/bold] plain [i]\n"
    assert "\x1b[31m" in console.export_text(styles=True)  # the style given apart is applied


@pytest.mark.parametrize("name", ["[bold]run[/bold]", "odd [/] dir", "tenant id must match {0,63}"])
def test_command_errors_keep_brackets(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / name
    result = CliRunner().invoke(app, ["synth", "report", "--run-dir", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"error: {run_dir} is not a run directory\n"
    missing = tmp_path / f"{name}.jsonl"
    replay = CliRunner().invoke(app, ["eval", "replay", str(missing), "--url", "http://127.0.0.1:9"])
    assert replay.exit_code == 2 and replay.stderr.startswith(f"error: cannot read {missing}: ")


def test_an_unreachable_server_with_brackets_in_its_url_is_one_plain_line() -> None:
    url = "http://127.0.0.1:9/[bold]x[/]"
    result = CliRunner().invoke(app, ["tenants", "list", "--url", url], env={"SANDPIT_OPERATOR_KEY": "k" * 40})
    assert result.exit_code == 1 and result.stderr.startswith(f"error: cannot reach {url}")
    assert result.stderr.count("\n") == 1


def test_standard_output_follows_the_width_of_the_moment_it_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    # rich reads COLUMNS when a console is made: one made at import kept that width
    monkeypatch.setenv("COLUMNS", "80")
    from sandpit import api_cli, eval_cli  # the command groups' modules, imported at this width

    assert api_cli.out is out and eval_cli.out is out  # no console of their own, made at import
    monkeypatch.setenv("COLUMNS", "200")
    assert out().width == 200
    monkeypatch.setenv("COLUMNS", "40")
    assert out().width == 40
