"""The ``bfcl-eval`` wheel: fetching it (``pip download``, sha256-pinned, cached) and
reading its members as text, bounded. Nothing in the wheel is installed, imported or
executed; BFCL's backend config (the class -> module mapping) is read with ``ast``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import BfclImportError

__all__ = [
    "ANSWER_MEMBER",
    "BACKEND_CONFIG_MEMBER",
    "BFCL_VERSION",
    "CACHE_ENV",
    "DATASET_MEMBER",
    "MAX_MEMBER_BYTES",
    "WHEEL_FILENAME",
    "WHEEL_SHA256",
    "cached_wheel",
    "default_cache_dir",
    "fetch_wheel",
]

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release this importer reads (its dataset is ``BFCL_v4``)."""
WHEEL_FILENAME = f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a"
"""Digest of the PyPI wheel; a cached or downloaded file that differs is refused."""
CACHE_ENV = "SANDPIT_BFCL_CACHE"
"""Environment variable overriding the wheel cache directory (default ``~/.cache/sandpit/bfcl``)."""

DATASET_MEMBER = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
ANSWER_MEMBER = "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json"
BACKEND_CONFIG_MEMBER = "bfcl_eval/constants/executable_backend_config.py"
MAX_MEMBER_BYTES = 16 * 1024 * 1024
"""Largest wheel member read (the biggest, ``long_context.py``, is about 190 KB)."""
FETCH_TIMEOUT_S = 300.0


# -- fetching ------------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """``$SANDPIT_BFCL_CACHE`` if set, else ``~/.cache/sandpit/bfcl``."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "sandpit" / "bfcl"


def cached_wheel(cache_dir: Path | None = None) -> Path | None:
    """The cached wheel's path, or None when it is not there (never downloads).

    Raises:
        BfclImportError: a file is there but does not have :data:`WHEEL_SHA256`.
    """
    target = (cache_dir if cache_dir is not None else default_cache_dir()) / WHEEL_FILENAME
    if not target.is_file():
        return None
    _check_digest(target)
    return target


def fetch_wheel(cache_dir: Path | None = None) -> Path:
    """Return the path of the cached ``bfcl-eval`` wheel, downloading it when missing.

    Downloads with ``<this python> -m pip download --no-deps --only-binary=:all:
    bfcl-eval==<BFCL_VERSION>`` (a wheel only: building an sdist would run its code on
    this host) into a temporary directory under the cache, checks the digest, then moves
    it into place.

    Args:
        cache_dir: where the wheel lives; default :func:`default_cache_dir`.

    Returns:
        ``<cache_dir>/bfcl_eval-<version>-py3-none-any.whl``.

    Raises:
        BfclImportError: pip failed (no network, no such release), produced no wheel,
            or the cached or downloaded file does not have :data:`WHEEL_SHA256`.
    """
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / WHEEL_FILENAME
    if cached_wheel(cache) is not None:
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    except OSError as exc:
        raise BfclImportError(f"cannot create the BFCL cache directory {cache}: {exc}") from exc
    try:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", f"bfcl-eval=={BFCL_VERSION}", "-d", str(staging)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BfclImportError(f"could not run pip to download bfcl-eval=={BFCL_VERSION}: {exc}") from exc
        downloaded = staging / WHEEL_FILENAME
        if done.returncode != 0 or not downloaded.is_file():
            detail = (done.stderr or done.stdout).strip()[-2000:]
            raise BfclImportError(
                f"could not download bfcl-eval=={BFCL_VERSION} into {cache} (pip exit {done.returncode}): "
                f"{detail or 'no wheel produced'}; run scripts/setup where PyPI is reachable, or put "
                f"{WHEEL_FILENAME} there (or in ${CACHE_ENV})")
        _check_digest(downloaded)
        os.replace(downloaded, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _check_digest(path: Path) -> None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise BfclImportError(f"cannot read {path}: {exc}") from exc
    if digest.hexdigest() != WHEEL_SHA256:
        raise BfclImportError(f"{path} has sha256 {digest.hexdigest()}, expected {WHEEL_SHA256} "
                              f"(bfcl-eval=={BFCL_VERSION} from PyPI); delete it and fetch again")


class WheelReader:
    """Bounded, cached text reads of wheel members."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive = archive
        self.cache: dict[str, str] = {}

    def text(self, member: str) -> str:
        """The member as UTF-8 text. Raises BfclImportError (missing, too large, not UTF-8)."""
        if member not in self.cache:
            try:
                info = self.archive.getinfo(member)
            except KeyError as exc:
                raise BfclImportError(f"the wheel has no {member}") from exc
            if info.file_size > MAX_MEMBER_BYTES:
                raise BfclImportError(f"{member} is {info.file_size} bytes, over the {MAX_MEMBER_BYTES}-byte limit")
            data = self.archive.read(info)[: MAX_MEMBER_BYTES + 1]
            if len(data) > MAX_MEMBER_BYTES:
                raise BfclImportError(f"{member} inflates past the {MAX_MEMBER_BYTES}-byte limit")
            try:
                self.cache[member] = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BfclImportError(f"{member} is not UTF-8: {exc}") from exc
        return self.cache[member]

    def module_source(self, dotted: str) -> str:
        """The source of BFCL module ``dotted`` (``a.b.c`` -> ``a/b/c.py``)."""
        return self.text(dotted.replace(".", "/") + ".py")


def json_lines(text: str, member: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines member (each with a string ``id``; blank lines
    skipped). Raises BfclImportError naming the line."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise BfclImportError(f"{member} line {number} is not JSON: {exc}") from exc
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise BfclImportError(f"{member} line {number} is not an object with a string id")
        rows.append(row)
    return rows


# -- BFCL's class -> module mapping, read with ast ---------------------------------------------
def backend_config(source: str) -> tuple[dict[str, str], frozenset[str]]:
    """``CLASS_FILE_PATH_MAPPING`` and ``STATELESS_CLASSES`` from BFCL's
    ``executable_backend_config.py``, evaluated as string constants and f-strings over
    earlier string assignments (no code run)."""
    try:
        tree = ast.parse(source, filename=BACKEND_CONFIG_MEMBER)
    except (SyntaxError, ValueError) as exc:
        raise BfclImportError(f"{BACKEND_CONFIG_MEMBER} does not parse: {exc}") from exc
    strings: dict[str, str] = {}
    mapping: dict[str, str] | None = None
    stateless: frozenset[str] | None = None
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if name == "CLASS_FILE_PATH_MAPPING" and isinstance(value, ast.Dict):
            mapping = {}
            for key, item in zip(value.keys, value.values, strict=True):
                class_name, module = _static_str(key, strings), _static_str(item, strings)
                if class_name is None or module is None:
                    raise BfclImportError(f"{BACKEND_CONFIG_MEMBER}: CLASS_FILE_PATH_MAPPING is not a static mapping")
                mapping[class_name] = module
        elif name == "STATELESS_CLASSES" and isinstance(value, ast.List):
            items = [_static_str(item, strings) for item in value.elts]
            if any(item is None for item in items):
                raise BfclImportError(f"{BACKEND_CONFIG_MEMBER}: STATELESS_CLASSES is not a list of names")
            stateless = frozenset(item for item in items if item is not None)
        else:
            text = _static_str(value, strings)
            if text is not None:
                strings[name] = text
    if mapping is None or stateless is None:
        raise BfclImportError(f"{BACKEND_CONFIG_MEMBER} lacks CLASS_FILE_PATH_MAPPING or STATELESS_CLASSES")
    return mapping, stateless


def _static_str(node: ast.expr | None, strings: Mapping[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif (isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None
                  and isinstance(part.value, ast.Name) and part.value.id in strings):
                parts.append(strings[part.value.id])
            else:
                return None
        return "".join(parts)
    return None
