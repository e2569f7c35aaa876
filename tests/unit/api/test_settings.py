"""The API's settings refuse values out of their documented ranges (pydantic-settings,
read from ``SANDPIT_*`` variables): the step's event-loop wait and spin."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sandpit.api.settings import ApiSettings, is_placeholder, new_operator_key


def test_the_step_spin_defaults_within_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDPIT_STEP_INLINE_SPIN_S", raising=False)
    monkeypatch.delenv("SANDPIT_STEP_INLINE_WAIT_S", raising=False)
    settings = ApiSettings()
    assert 0 < settings.step_inline_spin_s <= settings.step_inline_wait_s


@pytest.mark.parametrize("value", ["0", "0.0005", "0.05"])
def test_the_step_spin_takes_zero_to_50_ms(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SANDPIT_STEP_INLINE_SPIN_S", value)
    assert ApiSettings().step_inline_spin_s == float(value)


@pytest.mark.parametrize("value", ["-0.001", "0.051", "1", "nan", "inf", "fast", ""])
def test_the_step_spin_refuses_what_is_not_a_bounded_duration(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SANDPIT_STEP_INLINE_SPIN_S", value)
    with pytest.raises(ValidationError, match="step_inline_spin_s"):
        ApiSettings()


def test_a_new_operator_key_is_never_refused_as_a_placeholder() -> None:
    """Random URL-safe keys spell ``test``, ``todo`` or ``xxxx`` now and then (about one
    in 20,000 of ``secrets.token_urlsafe(32)`` is refused); the ones ``new_operator_key``
    gives are random, distinct and accepted."""
    keys = [new_operator_key() for _ in range(20_000)]
    assert len(set(keys)) == len(keys) and all(len(key) == 43 for key in keys)
    assert not any(is_placeholder(key) for key in keys)
    assert ApiSettings(operator_key=keys[0]).operator_key is not None
    assert is_placeholder("x" * 20 + "test" + "abcdefgh12345")  # the check it passes is the real one
