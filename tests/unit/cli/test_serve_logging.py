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
