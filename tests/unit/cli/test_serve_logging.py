"""``sandpit serve``'s logging settings: the ``sandpit`` loggers follow ``--log-level``,
the access log goes to stdout through its own formatter (no server needed; a real server
writes the lines in ``tests/integration/api/test_access_log.py``)."""

from __future__ import annotations

import logging

import pytest
from sandpit.api.http.access_log import AccessFormatter
from sandpit.cli import serve_log_config


@pytest.mark.parametrize(("level", "number"), [("info", logging.INFO), ("WARNING", logging.WARNING),
                                               ("debug", logging.DEBUG), ("trace", 5), ("critical", logging.CRITICAL)])
def test_sandpit_loggers_follow_the_level(level: str, number: int) -> None:
    config = serve_log_config(level)
    assert config["loggers"]["sandpit"] == {"handlers": ["default"], "level": number, "propagate": False}
    assert config["loggers"]["sandpit.access"] == {"handlers": ["sandpit_access"], "level": number,
                                                   "propagate": False}
    assert config["handlers"]["sandpit_access"]["stream"] == "ext://sys.stdout"
    assert config["loggers"]["uvicorn"]["handlers"] == ["default"], "uvicorn's own settings stay"


def test_unknown_levels_are_refused() -> None:
    for level in ("verbose", "", "20", "info\n"):
        with pytest.raises(KeyError):
            serve_log_config(level)


def test_the_access_formatter_renders_the_time_to_the_millisecond() -> None:
    record = logging.LogRecord("sandpit.access", logging.INFO, __file__, 1, "%s %s", ("GET", "/healthz"), None)
    assert AccessFormatter().format(record) == logging.Formatter("%(asctime)s %(message)s").format(record)
    later = logging.LogRecord("sandpit.access", logging.INFO, __file__, 1, "x", (), None)
    later.created += 3600.5
    later.msecs = 500.0
    formatter = AccessFormatter()
    assert formatter.format(record) != formatter.format(later)
    assert formatter.format(later) == logging.Formatter("%(asctime)s %(message)s").format(later)


# -- the start-up summary -------------------------------------------------------------------
def test_the_summary_names_everything_and_masks_the_password(tmp_path) -> None:
    from sandpit.api.settings import ApiSettings
    from sandpit.cli import serve_summary
    from sandpit.executor.settings import ExecutorSettings

    api = ApiSettings(data_dir=tmp_path, database_url="postgresql+psycopg://sandpit:hunter2@db.internal:5432/sp",
                      call_slots=6)
    lines = dict(serve_summary(api, ExecutorSettings(runtime="runsc", pool_size=3, max_sandboxes=40), "local",
                               "sandpit-sandbox:abc", "::1", 8601))
    assert lines == {"data dir": str(tmp_path), "database": "postgresql+psycopg://sandpit:***@db.internal:5432/sp",
                     "backend": "local", "image": "sandpit-sandbox:abc", "runtime": "runsc",
                     "warm pool": "3 per tenant and profile (max 40 sandboxes)", "call slots": "6",
                     "url": "http://[::1]:8601"}
    sqlite = dict(serve_summary(ApiSettings(data_dir=tmp_path), ExecutorSettings(), "local", "i", "10.0.0.7", 80))
    assert sqlite["database"] == f"sqlite:///{tmp_path / 'sandpit.db'}" and sqlite["url"] == "http://10.0.0.7:80"


@pytest.mark.parametrize("url", ["not a url at all", "postgresql://u:p@host:notaport/db"])
def test_an_unparsable_url_is_never_printed(url: str) -> None:
    from sandpit.cli import masked_url

    assert masked_url(url) == "<unparsable URL>"


def test_serve_prints_the_summary_before_refusing_an_unmigrated_database(tmp_path) -> None:
    from sandpit.api.settings import get_api_settings
    from sandpit.cli import app
    from typer.testing import CliRunner

    database = tmp_path / "[bold]fresh[/bold].db"
    env = {"SANDPIT_DATA_DIR": str(tmp_path), "SANDPIT_DATABASE_URL": f"sqlite:///{database}",
           "SANDPIT_PORT": "8777", "SANDPIT_EXECUTOR_RUNTIME": "runc", "COLUMNS": "300"}
    get_api_settings.cache_clear()
    try:
        result = CliRunner(env=env).invoke(app, ["serve"])
    finally:
        get_api_settings.cache_clear()
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == f"data dir   {tmp_path}"
    assert lines[1] == f"database   sqlite:///{database}"  # markup in the path stays as written
    assert [line.split()[0] for line in lines[:8]] == ["data", "database", "backend", "image", "runtime", "warm",
                                                        "call", "url"]
    assert lines[7] == "url        http://127.0.0.1:8777"
    assert lines[8].startswith("error: ") and "upgrade" in lines[8]
