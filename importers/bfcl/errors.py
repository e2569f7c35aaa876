"""The one error of the BFCL importer."""

from __future__ import annotations

__all__ = ["BfclImportError"]


class BfclImportError(Exception):
    """The BFCL wheel could not be fetched or read, or its content is not what this
    importer supports. The message names the file, episode id and/or call string."""
