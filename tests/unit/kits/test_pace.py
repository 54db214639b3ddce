"""devkit.pace: a time bound scales with the session's measured pace, never below the
reference's bound nor past MAX_PACE, and a pace that is not a number is refused by name."""

from __future__ import annotations

import pytest

from devkit import pace


def test_a_bound_scales_with_the_sessions_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pace.ENV, "1.8")
    assert pace.bound(5) == pytest.approx(9.0)


def test_a_fast_machine_never_tightens_a_bound_nor_a_slow_one_loosens_it_past_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(pace.ENV, "0.4")
    assert pace.bound(30) == 30
    monkeypatch.setenv(pace.ENV, "9")
    assert pace.bound(30) == 30 * pace.MAX_PACE
    monkeypatch.delenv(pace.ENV)
    assert pace.bound(30) == 30


def test_a_pace_that_is_no_number_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(pace.ENV, "fast")
    with pytest.raises(ValueError, match=pace.ENV):
        pace.bound(5)


def test_the_measured_pace_is_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace, "workload", lambda: pace.REFERENCE_S * 1.5)
    assert pace.measure(repeat=3) == pytest.approx(1.5)
    monkeypatch.setattr(pace, "workload", lambda: pace.REFERENCE_S / 3)
    assert pace.measure(repeat=3) == 1.0
    monkeypatch.setattr(pace, "workload", lambda: pace.REFERENCE_S * 100)
    assert pace.measure(repeat=3) == pace.MAX_PACE
