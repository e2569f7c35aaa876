"""The JSON rules shared by the HTTP edge and the store: strict parsing, nesting depth,
lone surrogates, long numbers, and the sizes the caps measure.

Python's ``json`` accepts ``NaN``/``Infinity`` and recurses once per nesting level, so a
hostile body could smuggle non-JSON numbers into stored state or hit the recursion limit.
It also accepts ``"\\ud800"``: a lone UTF-16 surrogate, which JSON's grammar allows but
which is not Unicode (I-JSON, RFC 7493, refuses it) and cannot be encoded as UTF-8, so
the database, the sandbox protocol or the response encoder would fail on it later.
:func:`strict_loads` refuses constants and bounds nesting (iteratively, before parsing);
:func:`lone_surrogate_at` names the first string holding a lone surrogate. orjson parses
what it parses exactly; :func:`has_long_number` sends integers beyond 64 bits to Python's
parser (:func:`strict_loads` for bodies, :func:`stored_loads` for what the store wrote). :func:`text_size` and :func:`json_size` measure what the size caps
(``max_code_bytes``, ``max_init_config_bytes``, ``max_arguments_bytes``) count.

Imported: :mod:`.errors` (an :class:`~.errors.InvalidRequest` names what is wrong) and the
runner's :func:`~sandpit.sandbox_images.runner.wire.depth_exceeds`, the one nesting-depth
scan the host and the sandbox share.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from sandpit.sandbox_images.runner.wire import depth_exceeds

from .errors import InvalidRequest

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A ``\\uD800``..``\\uDFFF`` escape: a body without one cannot decode to a surrogate."""
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x2E for b in range(256))
_LONG_RUN = b"0" * 19


def has_long_number(data: bytes) -> bool:
    """True when ``data`` holds 19 digits in a row: a number orjson would not parse as
    Python's json does (integers beyond 64 bits become floats there); such bodies take
    Python's parser. Every digit mapped to ``0`` by one ``translate``, then one substring
    search, both in C (3 MB: a few ms; the regular expression ``\\d{19}`` took ~40 ms
    on a body full of numbers, retrying at every digit)."""
    return _LONG_RUN in data.translate(_DIGITS)


def _refuse_constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not valid JSON (numbers must be finite)")


def stored_loads(data: bytes) -> Any:
    """The value of JSON bytes the store wrote (state blobs, canonical configs), exactly
    as Python's ``json`` reads them: orjson's parse (about three times faster on a large
    state), or ``json``'s (which reads lone surrogates written ``surrogatepass``) where
    orjson does not read them exactly: a run of 19 digits (:func:`has_long_number`: integers beyond
    64 bits, which orjson makes floats), or bytes orjson refuses (infinities, surrogates).
    Raises ValueError (``json.JSONDecodeError``, ``UnicodeDecodeError``) on bytes that
    are not JSON."""
    if not has_long_number(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)  # bytes: decoded with surrogatepass, as the store's json.dumps wrote them


def strict_loads(body: bytes, max_depth: int) -> Any:
    """Parse ``body`` as strict JSON. Raises :class:`InvalidRequest` on NaN/Infinity,
    malformed JSON or nesting deeper than ``max_depth``."""
    if depth_exceeds(body, max_depth):
        raise InvalidRequest(f"JSON nested deeper than {max_depth} levels")
    if not has_long_number(body):
        try:  # orjson refuses NaN/Infinity, lone surrogates and bad UTF-8: json below says which
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


def lone_surrogate_at(body: bytes, parsed: Any) -> str | None:
    """The dotted path (``init_config.key``; ``""`` for the top level) of the first
    string or key of ``parsed`` holding a lone surrogate, or None. Paired surrogates
    (``\\ud83d\\ude00``) decode to one character and pass. Only walks ``parsed`` when
    ``body`` has a surrogate escape at all."""
    if not _SURROGATE_ESCAPE.search(body):
        return None
    stack: list[tuple[str, Any]] = [("", parsed)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodable(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                where = f"{path}.{key}" if path else str(key)
                if not _encodable(key):
                    return path or "(key)"
                stack.append((where, item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{index}" if path else str(index), item) for index, item in enumerate(value))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_size(text: str) -> int:
    """UTF-8 size of ``text`` in bytes (lone surrogates count as 3 bytes, never fail)."""
    return len(text.encode("utf-8", "surrogatepass"))


def json_size(value: Any) -> int:
    """Compact JSON size of ``value`` in bytes (``json.dumps`` with ``separators=(",",
    ":")`` and ``ensure_ascii=False``, lone surrogates counted as 3 bytes)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
