"""Sandpit: sandboxed execution of LLM-synthesized tool environments.

The distribution installs everything under this one import name: ``sandpit.executor``
(Docker sandboxes), ``sandpit.api`` (HTTP service), ``sandpit.client`` (Python client,
model client, RL adapters), ``sandpit.importers`` (BFCL, EnvScaler), ``sandpit.synthesis``,
``sandpit.sandbox_images`` (image definition and in-sandbox runner) and ``sandpit.cli``.
Its default dependencies are the client's (``sandpit.client`` and the ``sandpit`` command);
the server's are the ``server`` extra (``pyproject.toml``, :mod:`sandpit.cli_extras`).
"""

__version__ = "0.1.0"
