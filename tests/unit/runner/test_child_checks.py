"""Pure helpers of a check batch's zygote (``child_checks``): syntax error texts, and the
clean-up after a read-only check ran in the zygote, on this file's own two fixed check
sources (run here like the zygote runs them). Untrusted checks only ever run in sandboxes."""

from __future__ import annotations

import base64
import json
import marshal

from hypothesis import given, settings
from hypothesis import strategies as st
from sandpit.sandbox_images.runner import child_checks, child_restore, pid1_job_requests


def test_syntax_error_texts() -> None:
    try:
        compile("def f(:\n", "<check_func>", "exec")
    except SyntaxError as exc:
        assert child_checks.syntax_error_text(exc).startswith("syntax error: ") and "(line 1)" in child_checks.syntax_error_text(exc)
    assert child_checks.syntax_error_text(ValueError("source code string cannot contain null bytes")) == \
        "syntax error: source code string cannot contain null bytes"


def test_a_check_in_place_leaves_no_decimal_flags_nor_source_lines() -> None:
    import decimal
    import linecache

    source = ("def check_func(final_state):\n    try:\n        final_state['price'] / 0\n"
              "    except ZeroDivisionError:\n        pass\n    return final_state['price'] / 3 > final_state['x']\n")
    decimal.getcontext().clear_flags()
    out = child_checks._check_in_place(source, {}, {"price": decimal.Decimal("1.10")})
    assert (out["status"], out["error"]) == ("error", "Error: KeyError: 'x'")
    assert "return final_state['price'] / 3" in out["traceback"]  # its lines were there for its traceback
    assert not any(decimal.getcontext().flags.values())  # DivisionByZero, Inexact, Rounded were raised
    assert child_checks.CHECK_FILENAME not in linecache.cache


def test_modules_imported_by_a_check_are_forgotten() -> None:
    import sys

    before = set(sys.modules)
    out = child_checks._check_in_place("def check_func(s):\n    return str(b'xn--bcher-kva', 'idna') == 'b\\u00fccher'\n",
                                        {}, {})
    assert (out["status"], out["passed"]) == ("ok", True)
    child_checks._forget_new_modules(before)
    assert set(sys.modules) == before


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet="$a\\\"é{[", max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="$ab\\\"", max_size=4), inner,
                                                                max_size=3)
    | st.builds(lambda tag, items: {tag: items}, st.sampled_from(["$set", "$tuple", "$frozenset"]),
                st.lists(st.integers(0, 3), max_size=3)),  # a rendering's tags, which unrender rebuilds
    max_leaves=25)


@settings(max_examples=1500, deadline=None)
@given(JSON_VALUES, st.booleans(), st.booleans())
def test_states_pid1_calls_untagged_are_what_unrender_gives(value: object, ascii_only: bool, escaped: bool) -> None:
    """PID 1 lets the zygote skip ``unrender`` for a state whose text holds no ``"$`` and no
    ``\\u0024`` (``pid1_job_requests``): for such text, the parsed value is exactly what
    ``unrender`` returns (types, key order, values: equal ``marshal`` bytes)."""
    text = json.dumps({"a": ["j", value]}, ensure_ascii=ascii_only, separators=(",", ":")).encode()
    if escaped:  # the same text, its strings' leading "$" spelled as JSON's escape
        text = text.replace(b'"$', b'"\\u0024')
    fields, states = pid1_job_requests.checks_request({"checks": [{"check_func": "x"}], "initial_state_b64": "e30=",
                                                       "final_state_b64": base64.b64encode(text).decode()})
    parsed = json.loads(states["final_state"])
    untagged = child_restore.decode_state(parsed, None, tagged=False)
    walked = child_restore.decode_state(parsed, None, tagged=True)
    if "final_state" in fields["untagged"]:
        assert marshal.dumps(untagged, 2) == marshal.dumps(walked, 2)  # version 2: no shared references
    else:
        assert b'"$' in text or b"\\u0024" in text
