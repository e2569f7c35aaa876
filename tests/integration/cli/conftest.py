"""Fixtures of the CLI's integration tests."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="module")
def runner(server: Any) -> CliRunner:
    """A CliRunner whose environment points the client at the module's server (``server``)
    with its tenant's key, in a terminal 200 columns wide."""
    return CliRunner(env={"SANDPIT_URL": server.url, "SANDPIT_API_KEY": server.api_key, "COLUMNS": "200"})
