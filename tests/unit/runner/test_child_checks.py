"""Pure helpers of a check batch's zygote (``child_checks``): syntax error texts, and the
clean-up after a read-only check ran in the zygote, on this file's own two fixed check
sources (run here like the zygote runs them). Untrusted checks only ever run in sandboxes."""

from __future__ import annotations

from sandpit.sandbox_images.runner import child_checks


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
