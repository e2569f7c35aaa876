"""Importers of third-party environment suites: `bfcl` (the Berkeley Function Calling
Leaderboard's multi-turn set) and `envscaler` (EnvScaler's released metadata files).

Importers are API clients like any other: they import `sandpit.client` (plus the standard
library, pydantic and ijson), never `sandpit.api` or `sandpit.executor`, and every piece of
imported code runs only in sandboxes, through the API
(tests/unit/importers/test_import_rules.py checks the imports).
"""
