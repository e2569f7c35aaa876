"""The JSON codec of the processes that run untrusted code, bound before any of it runs.

Stdlib only. A session process (``child_session.py``), a template (``child_template.py``)
and a check batch (``child_checks.py``) speak to PID 1 in JSON frames *after* the
environment's module, or a check function, has run in the same interpreter. Such code may
change the modules every process shares (``json.dumps = ...``, ``json.encoder.
encode_basestring = ...``, ``sys.modules["json"] = ...``) for its own reasons: an
environment that wraps ``json`` its own way is legitimate. The frames must not change with
it. So this module takes its references once, when it is imported (before the runner hands
the process any code), and calls only them afterwards:

* :func:`dumps`: CPython's C encoder (``_json.make_encoder``) with the escape function
  and separators fixed here; non-finite floats, non-str/int/float/bool/None keys and any
  other type are refused (``ValueError``/``TypeError``, as ``json.dumps(allow_nan=False)``
  raises). The output is byte for byte what ``json.dumps(value, separators=(",", ":"),
  ensure_ascii=..., allow_nan=False)`` gives.
* :func:`loads`: CPython's C scanner, made here from a decoder that refuses ``NaN`` and
  ``Infinity``; leading and trailing JSON whitespace is allowed, anything else after the
  value is a ``ValueError``.

Patching the module objects themselves (rewriting a function's ``__code__``, or this
module's globals) is not defended against: code that does that inside a session process
can only break its own session's frames, which PID 1 checks and answers by killing the
process (``crashed``). What a verdict rests on never shares a process with such code
unless a scenario opts in (``child_restore.py``).
"""

from __future__ import annotations

import builtins
import json.decoder as _decoder
import json.encoder as _encoder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any  # annotations only: never evaluated in the sandbox (see below)

_make_encoder: Any = getattr(_encoder, "c_make_encoder", None)
_escape: Any = getattr(_encoder, "c_encode_basestring", None)
_escape_ascii: Any = getattr(_encoder, "c_encode_basestring_ascii", None)
_WHITESPACE = " \t\n\r"


__builtins__ = dict(vars(builtins))  # type: ignore[assignment]
# ^ this module's own copy of the builtins, taken before any untrusted code runs: code
# that patches `builtins` later in this process does not act on its functions


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


if _make_encoder is None or _escape is None or _escape_ascii is None:  # pragma: no cover - no _json
    _fallback_plain = _encoder.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    _fallback_ascii = _encoder.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode

    def dumps(value: object, ascii: bool = False, sort_keys: bool = False, spaced: bool = False) -> str:
        """JSON text of ``value`` (see the module docstring)."""
        if sort_keys or spaced:
            return _encoder.JSONEncoder(separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=ascii,
                                        allow_nan=False, sort_keys=sort_keys).encode(value)
        return _fallback_ascii(value) if ascii else _fallback_plain(value)
else:
    def dumps(value: object, ascii: bool = False, sort_keys: bool = False, spaced: bool = False) -> str:
        """Compact JSON text of ``value``: ``separators=(",", ":")`` (``(", ", ": ")``, the
        ``json`` module's default, with ``spaced``), no NaN or infinity (``ValueError``),
        only JSON types and str/int/float/bool/None keys (``TypeError``), circular
        structures refused (``ValueError``). ``ascii`` escapes every non-ASCII character;
        ``sort_keys`` orders object members."""
        if type(value) is str:  # the encoder's one-shot path for a bare string
            text: str = _escape_ascii(value) if ascii else _escape(value)
            return text
        encode = _make_encoder({}, _refuse, _escape_ascii if ascii else _escape, None, ": " if spaced else ":",
                               ", " if spaced else ",", sort_keys, False, False)
        return "".join(encode(value, 0))


_scan_once = getattr(_decoder.JSONDecoder(parse_constant=_refuse_constant), "scan_once")  # noqa: B009


def loads(text: str) -> Any:
    """The JSON value of ``text`` (a ``str``). Raises ``ValueError`` when it is not exactly
    one JSON value (``NaN``/``Infinity`` refused); ``RecursionError`` for nesting deeper
    than the interpreter's recursion limit."""
    if type(text) is not str:
        raise TypeError(f"JSON text must be str, not {type(text).__name__}")
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan_once(text, start)
    except StopIteration as exc:
        raise ValueError(f"not JSON at character {exc.value}") from None
    if end != len(text) and text[end:].strip(_WHITESPACE):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value
