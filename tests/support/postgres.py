"""A real PostgreSQL server for tests: ``scripts/ensure-postgres`` starts (or finds) the
test cluster on loopback; each caller gets databases of its own, created from a migrated
template (``CREATE DATABASE ... TEMPLATE``: a file copy inside the server, ~0.1 s) and
dropped afterwards.

:func:`server_url` skips the test (with the reason) only when PostgreSQL is not installed
or this process is not root; under ``SANDPIT_REQUIRE_DOCKER=1`` (what ``scripts/test`` and
CI set) it fails instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from glob import glob
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = "sandpit_template"


def _unusable(reason: str) -> str:
    if os.environ.get("SANDPIT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"PostgreSQL is required here (SANDPIT_REQUIRE_DOCKER=1) but {reason}", pytrace=False)
    pytest.skip(reason)


@functools.cache
def _start() -> str:
    result = subprocess.run([str(REPO / "scripts" / "ensure-postgres")], capture_output=True, text=True,
                            timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"scripts/ensure-postgres failed: {result.stderr.strip()[-500:]}")
    return result.stdout.strip().splitlines()[-1]


def server_url() -> str:
    """The admin URL (database ``postgres``) of the running test server. Skips (fails
    under SANDPIT_REQUIRE_DOCKER=1) when PostgreSQL is not installed or not root."""
    if not glob("/usr/lib/postgresql/*/bin/initdb"):
        _unusable("PostgreSQL is not installed (Debian package 'postgresql'; run scripts/setup)")
    if os.geteuid() != 0:
        _unusable("starting the test PostgreSQL server needs root (scripts/ensure-postgres)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unusable("psycopg is not installed (pip install -e '.[dev]')")
    try:
        return _start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name``."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _admin(sql: str) -> None:
    engine = create_engine(server_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


@functools.cache
def template_url() -> str:
    """A database at the newest migration (made once per process; re-made when a
    previous run left one behind, so a changed migration is always applied)."""
    from sandpit.api.db.engine import upgrade

    name = f"{TEMPLATE}_{os.getpid()}"
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _admin(f'CREATE DATABASE "{name}"')
    url = with_database(server_url(), name)
    upgrade(url)
    return url


@contextmanager
def fresh_database(migrated: bool = True) -> Iterator[str]:
    """A new, empty database (at the newest migration when ``migrated``) for the block;
    dropped afterwards. Yields its URL."""
    name = f"sandpit_test_{secrets.token_hex(6)}"
    source = make_url(template_url()).database if migrated else "template0"
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    try:
        yield with_database(server_url(), name)
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_template() -> None:
    """Drop this process's template database (end of the session)."""
    if template_url.cache_info().currsize:
        name = make_url(template_url()).database
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def have_postgres() -> bool:
    """True when the PostgreSQL binaries are installed (no server is started)."""
    return bool(glob("/usr/lib/postgresql/*/bin/initdb")) and shutil.which("runuser") is not None
