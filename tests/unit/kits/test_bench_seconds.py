"""bench/seconds.py's pure parts: each figure against issue 35's targets, and the pair's
capacity from a ramp (no services)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.seconds import (
    TARGETS,
    arguments,
    capacity_from_ramp,
    counted,
    held,
    lag_growing,
    make_up_seconds,
    plot_run,
    ramp_rates,
    verdicts,
)


def saw(seconds: int, batch: int, period: int, climb: float = 0.0) -> list[tuple[float, int]]:
    """A micro-batch pair's lag: up to a batch, emptied every `period` s, plus `climb`/s."""
    return [(float(t), int((t % period) * batch / period + climb * t)) for t in range(seconds)]


def step(target: float, achieved: float, growing: bool) -> dict[str, Any]:
    return {"rate_target": target, "rate_achieved": achieved, "lag_growing": growing}


def test_a_level_saw_tooth_is_not_a_growing_lag() -> None:
    assert not lag_growing(saw(45, batch=8000, period=4), rate=4000)


def test_a_lag_that_climbs_by_a_tenth_of_the_input_grows() -> None:
    assert lag_growing(saw(45, batch=8000, period=4, climb=600), rate=6000)


def test_a_backlog_carried_in_and_drained_is_not_growing() -> None:
    draining = [(float(t), max(0, 40_000 - 2_000 * t)) for t in range(45)]
    assert not lag_growing(draining, rate=3000)


def test_too_few_samples_say_nothing() -> None:
    assert not lag_growing([(0.0, 0), (1.0, 10_000), (2.0, 20_000)], rate=100)


def test_capacity_is_the_last_step_held_before_the_lag_grew() -> None:
    steps = [
        step(100, 100, False),
        step(1000, 998, False),
        step(2000, 1990, False),
        step(2500, 2480, False),
        step(3000, 2990, True),
        step(3500, 3490, False),  # after the first miss: not looked at
    ]
    capacity, why = capacity_from_ramp(steps)
    assert capacity == 2480
    assert "grew at 3,000" in why


def test_a_feeder_that_cannot_keep_the_rate_ends_the_ramp_and_says_so() -> None:
    capacity, why = capacity_from_ramp([step(2000, 2000, False), step(2500, 2100, False)])
    assert capacity == 2000
    assert "feeder" in why
    assert not held(step(2500, 2100, False))


def test_a_ramp_held_to_its_end_gives_a_lower_bound() -> None:
    capacity, why = capacity_from_ramp([step(2000, 1999, False), step(2500, 2490, False)])
    assert capacity == 2490
    assert "at least" in why


def test_no_step_held_gives_no_capacity() -> None:
    assert capacity_from_ramp([step(100, 100, True)])[0] is None


def test_ramp_rates_run_from_start_to_the_last_by_step() -> None:
    assert ramp_rates(2000, 500, 3500) == [2000, 2500, 3000, 3500]


def figures() -> dict[str, Any]:
    return {
        "first_minute": {"p99_s": 2.5},
        "latency": {"100": {"p99_s": 0.8}, "1000": {"p99_s": 1.4}},
        "kill_active": {"50": {"worst_s": 1.9}, "80": {"worst_s": 3.2}},
        "kill_both": {"worst_s": 29.0},
        "rejoin": {},
        "audit": {"lost": 0, "duplicated": 2},
        "make_up_s": None,
    }


def test_each_figure_is_met_or_missed_against_its_target() -> None:
    found = {v.target.key: v for v in verdicts(figures())}
    assert set(found) == {t.key for t in TARGETS}
    assert found["first_minute.p99_s"].met is True
    assert found["latency.100.p99_s"].met is True
    assert found["latency.1000.p99_s"].met is False
    assert found["kill_active.50.worst_s"].met is True
    assert found["kill_active.80.worst_s"].met is False
    assert found["kill_both.worst_s"].met is True
    assert found["audit.lost"].met is True
    assert found["audit.duplicated"].met is False


def test_a_figure_not_measured_is_neither_met_nor_missed() -> None:
    found = {v.target.key: v for v in verdicts(figures())}
    assert found["rejoin.worst_s"].met is None
    assert found["make_up_s"].met is None
    assert "not measured" in found["rejoin.worst_s"].line()


def test_a_target_exactly_reached_is_met_and_lines_say_which() -> None:
    found = {v.target.key: v for v in verdicts({"kill_active": {"50": {"worst_s": 2.0}}})}
    assert found["kill_active.50.worst_s"].met is True
    assert found["kill_active.50.worst_s"].line().endswith("(target <= 2 s): met")
    missed = {v.target.key: v for v in verdicts(figures())}["latency.1000.p99_s"].line()
    assert "1.40 s (target <= 1 s): MISSED" in missed


def test_make_up_seconds_from_its_output() -> None:
    assert make_up_seconds("MAKE_UP_RC=0 SECONDS=241.7\n") == 241.7
    assert make_up_seconds("kafka-1 healthy after 40.0s\n\nreal\t4m15.9s\nuser\t1m2.0s\n") == 255.9
    assert make_up_seconds("real\t12.5s\n") == 12.5
    # make up's own lines say how long each service took, not the whole: not taken.
    assert (
        make_up_seconds("'.venv/.installed' is up to date.\nkafka-1 healthy after 58.6s\n") is None
    )


def test_counted_ranges_are_inclusive() -> None:
    assert counted([(5, 5), (10, 19)]) == 11
    assert counted([]) == 0


def test_the_defaults_are_the_issue_s() -> None:
    args = arguments([])
    assert args.hosts == 10_000
    assert args.rates == [100, 1000]
    assert args.seconds == 60
    assert args.rounds == 20
    assert args.shares == [0.5, 0.8]
    assert args.double_kills == 3
    assert args.rejoins == 3
    assert not args.first


def test_the_run_s_plot_is_written(tmp_path: Path) -> None:
    """Output rate with the steps and kills marked, the latency below (matplotlib, no
    services)."""
    run = SimpleNamespace(
        sampler=SimpleNamespace(samples=[(100.0 + t, 1000 * t) for t in range(60)]),
        t0=100.0,
        hosts=10_000,
        marks=[(5.0, "latency"), (20.0, "kill active (50 %)"), (40.0, "kill both")],
        latency_points=[(float(t), 300.0 + t) for t in range(30)],
    )
    path = plot_run(run, tmp_path / "seconds.png")  # type: ignore[arg-type]
    assert path.stat().st_size > 10_000
