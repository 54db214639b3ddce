"""An engine warms its plan up on its pipeline's sample records before its query, unless
it has as many records to catch up on already; a warm-up that fails costs only itself."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from twinstream.engine import pipeline as plan_module
from twinstream.platform import registry
from twinstream.platform.settings import load_settings


@pytest.fixture
def warmed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counts: list[int] = []

    def warm_up(_spark: Any, _settings: Any, _pipeline: Any, folder: Any, count: int) -> int:
        counts.append(count)
        return count

    monkeypatch.setattr(plan_module, "warm_up", warm_up)
    return counts


def warm(records: int, backlog: Callable[[], int | None]) -> None:
    """engine a's warm-up with `records` sample records (no Spark: warm_up is faked)."""
    settings = load_settings(pipeline="hostmetrics", warm_up_records=records)
    no_spark: Any = None
    plan_module.warm_up_engine(no_spark, settings, registry.load(settings), "a", backlog)


def test_a_level_engine_warms_up_with_the_configured_count(warmed: list[int]) -> None:
    warm(2_000, lambda: 10)
    assert warmed == [2_000]


def test_an_engine_with_a_backlog_as_large_skips_the_warm_up(
    warmed: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    warm(2_000, lambda: 2_000)
    assert warmed == []
    assert "no warm-up, 2000 inbound records to catch up on" in caplog.text


def test_an_unreadable_checkpoint_or_a_failed_warm_up_never_stops_the_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unreadable() -> int:
        raise OSError("checkpoint unreadable")

    def fails(*_args: Any) -> int:
        raise RuntimeError("the JVM said no")

    monkeypatch.setattr(plan_module, "warm_up", fails)
    warm(2_000, unreadable)
    assert "warm-up failed" in caplog.text
    assert "the JVM said no" in caplog.text


def test_no_warm_up_when_it_is_off(warmed: list[int]) -> None:
    warm(0, lambda: None)
    assert warmed == []
