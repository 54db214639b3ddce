"""A pipeline falling behind is a problem in `twinstream status`, on the page and in
/metrics; each partition's buffer is shown against its own bound (issue 33, point 6).

The lag's trend (twinstream.engine.lag_trend) from a fake clock: a lag that rises through a minute
is "growing"; a burst the pair absorbs, a drained backlog, the sawtooth of large batches
and too little history are not. The overview names the problem with what to do; the CLI
table shows `p0 9,800/10,000 · p1 ...`, never a sum over one partition's bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.fakes import FakeClock, pipeline_info
from tests.unit.ops.test_overview import fake_engines, pipelines
from twinstream.core.rows import OUT, Output
from twinstream.engine.api import LagTrend, buffer_text
from twinstream.engine.lag_trend import LagHistory
from twinstream.engine.lifecycle import State
from twinstream.engine.metrics import EngineMetrics
from twinstream.ops.overview import FALLING_BEHIND_FIX, WARN, covers, overview
from twinstream.ops.status_view import console, engines_table


def history_of(lag_at: Callable[[float], int], seconds: float = 60, every_s: float = 1.0):
    """A LagHistory fed once a second (as the engine's main loop does) for `seconds`."""
    clock = FakeClock(1000.0)
    history = LagHistory(clock=clock)
    t = 0.0
    while t <= seconds:
        history.add(lag_at(t))
        clock.sleep(every_s)
        t += every_s
    clock.now -= every_s  # the trend is read at the last sample
    return history


def test_a_lag_that_rises_through_the_window_is_growing() -> None:
    # The trial: the pair reached 31,497 with the inbound rate above what it processes.
    trend = history_of(lambda t: 12_000 + int(t * 325)).trend()
    assert trend is not None
    assert trend.growing
    assert trend.quarters == sorted(trend.quarters)
    assert trend.first < trend.last


@pytest.mark.parametrize(
    ("name", "lag_at"),
    [
        # 30,000 messages at once, drained within 10 s.
        ("a burst the pair absorbs", lambda t: 30_000 - 3_000 * int(t - 20) if 20 <= t < 30 else 0),
        # A big backlog (a restart) draining through the whole window.
        ("a backlog draining", lambda t: 200_000 - int(t * 3_000)),
        # Batches of 20,000: the lag swings from ~0 to 20,000 between triggers.
        ("the sawtooth of large batches", lambda t: int(t) % 5 * 5_000),
        # Rising, but by less than MIN_GROWTH over the minute.
        ("a slow creep", lambda t: 100 + int(t * 10)),
        # A burst late in the window that is still rising: two quarters flat before it.
        ("a burst in the last quarter", lambda t: 0 if t < 45 else int((t - 45) * 2_000)),
    ],
)
def test_what_is_not_falling_behind(name: str, lag_at: Callable[[float], int]) -> None:
    trend = history_of(lag_at).trend()
    assert trend is not None, name
    assert not trend.growing, (name, trend)


def test_too_little_history_gives_no_trend_rather_than_a_guess() -> None:
    assert history_of(lambda t: int(t * 1_000), seconds=40).trend() is None
    assert LagHistory().trend() is None
    # A hole in the sampling (the lag unknown for 20 s: Kafka did not answer).
    history = history_of(lambda t: int(t * 1_000))
    clock = history._clock
    assert isinstance(clock, FakeClock)
    clock.sleep(20)
    for _ in range(10):
        history.add(None)
        clock.sleep(1)
    assert history.trend() is None


def test_samples_are_kept_at_most_one_per_two_seconds() -> None:
    history = history_of(lambda t: 5, every_s=0.1, seconds=10)
    assert 5 <= len(history._samples) <= 6


GROWING = LagTrend(window_s=60, first=12_000, last=31_497, quarters=[14, 19, 25, 30], growing=True)
STEADY = LagTrend(window_s=60, first=200, last=180, quarters=[200, 190, 210, 180], growing=False)


def two_engines(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The hostmetrics pair a (active) and b (standby); payments' c and d healthy."""
    healthy = {"in_sync": True, "lag": 10}
    return {
        "a": ({"role": "active", "epoch": 7}, a),
        "b": ({"role": "standby", "epoch": 7}, b),
        "c": ({"role": "active", "epoch": 7}, healthy),
        "d": ({"role": "standby", "epoch": 7}, healthy),
    }


def problems(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    seen = overview(pipelines(tmp_path), fake_engines(two_engines(a, b)), with_history=False)
    host, pay = seen.pipelines
    assert pay.problems == []
    # Only falling behind here: no standby in sync is a problem of its own (test_overview).
    return [p for p in host.problems if not p.startswith("no standby could take over")]


def test_both_engines_out_of_sync_and_behind_is_falling_behind(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        {"in_sync": False, "lag": 31_497, "lag_trend": STEADY.model_dump()},
        {"in_sync": False, "lag": 30_112},
    )
    (problem,) = found
    assert problem.startswith(
        "falling behind: no engine is in sync (lag a 31,497, b 30,112; in sync is within 3 s "
        "of the engine's own rate)"
    )
    assert problem.endswith(FALLING_BEHIND_FIX)
    assert "more cores" in problem
    assert "docs/falling-behind.md" in problem


def test_a_growing_lag_is_falling_behind_even_while_in_sync(tmp_path: Path) -> None:
    found = problems(
        tmp_path,
        {"in_sync": True, "lag": 4_000, "lag_trend": GROWING.model_dump()},
        {"in_sync": True, "lag": 3_900},
    )
    assert found == [
        "falling behind: the lag of engine a grew from 12,000 to 31,497 over the last 60 s. "
        + FALLING_BEHIND_FIX
    ]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # One engine in sync: the pair keeps up (the other may be restoring).
        ({"in_sync": True, "lag": 100}, {"in_sync": False, "lag": 90_000, "state": "restoring"}),
        # Just started: no lag known yet, so no evidence of being behind.
        ({"in_sync": False, "lag": None}, {"in_sync": False, "lag": None}),
        # Behind by less than in_sync_lag while neither counts as in sync yet.
        ({"in_sync": False, "lag": 300}, {"in_sync": False, "lag": 200}),
        # A steady lag's trend.
        ({"in_sync": True, "lag": 200, "lag_trend": STEADY.model_dump()}, {"in_sync": True}),
    ],
)
def test_what_is_no_falling_behind_problem(
    tmp_path: Path, a: dict[str, Any], b: dict[str, Any]
) -> None:
    assert problems(tmp_path, a, b) == []


def test_an_engine_whose_lag_grows_is_a_warning_with_a_note(tmp_path: Path) -> None:
    answers = two_engines(
        {"in_sync": True, "lag": 4_000, "lag_trend": GROWING.model_dump()}, {"in_sync": True}
    )
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    a = seen.pipelines[0].engines[0]
    assert a.health == WARN
    out = console()
    with out.capture() as captured:
        out.print(engines_table(seen.pipelines[0]))
    assert "LAG GROWING 12,000 -> 31,497 in 60 s" in captured.get()
    # The JSON model (twinstream status --json, the page) carries the trend.
    model = json.loads(seen.model_dump_json())
    assert model["pipelines"][0]["engines"][0]["lag_trend"]["growing"] is True


def test_the_buffer_is_shown_per_partition_against_its_own_bound(tmp_path: Path) -> None:
    fills = {0: 9_800, 1: 10_000, 2: 10_200}
    assert buffer_text(fills, 30_000, 10_000) == (
        "p0 9,800/10,000 · p1 10,000/10,000 · p2 10,200/10,000"
    )
    # No per-partition figures (an older engine): the sum, never against the bound.
    assert buffer_text({}, 30_000, 10_000) == "30,000 total"
    assert buffer_text({}, 0, 10_000) == "0/10,000"
    assert buffer_text({}, None, None) == "-"

    answers = two_engines(
        {"in_sync": True, "buffer_fill": 30_000, "buffer_size": 10_000, "buffer_fills": fills},
        {"in_sync": True},
    )
    seen = overview(pipelines(tmp_path), fake_engines(answers), with_history=False)
    out = console()
    with out.capture() as captured:
        out.print(engines_table(seen.pipelines[0]))
    table = captured.get()
    assert "p0 9,800/10,000 · p1 10,000/10,000 · p2 10,200/10,000" in table
    assert "30,000/10,000" not in table
    model = json.loads(seen.model_dump_json())["pipelines"][0]["engines"][0]
    assert model["buffer_fills"] == {"0": 9_800, "1": 10_000, "2": 10_200}
    assert model["buffer_size"] == 10_000


def test_a_partition_s_buffer_covers_only_its_own_partition() -> None:
    active = pipeline_info(published={0: 100, 1: 50})
    # 15 rows needed (10 of p0, 5 of p1) and 15 held, but p1 holds only 2 of its 5.
    standby = pipeline_info(processed={0: 110, 1: 55}, buffer_fill=15, buffer_fills={0: 13, 1: 2})
    assert covers(standby, active) == (15, False)
    standby = pipeline_info(processed={0: 110, 1: 55}, buffer_fill=15, buffer_fills={0: 10, 1: 5})
    assert covers(standby, active) == (15, True)


def test_metrics_expose_in_sync_behind_lag_growing_and_each_partition_s_buffer() -> None:
    metrics = EngineMetrics("a", "hostmetrics")
    metrics.update(
        lag=31_497,
        buffer_fills={0: 9_800, 1: 10_000},
        buffer_bound=10_000,
        quarantined=0,
        in_sync=False,
        behind=True,
        lag_growing=True,
    )
    text = metrics.render().decode()
    labels = 'engine="a",pipeline="hostmetrics"'
    for line in (
        f"twinstream_in_sync{{{labels}}} 0.0",
        f"twinstream_behind{{{labels}}} 1.0",
        f"twinstream_lag_growing{{{labels}}} 1.0",
        f"twinstream_lag{{{labels}}} 31497.0",
        f"twinstream_buffer_fill{{{labels}}} 19800.0",
        f"twinstream_buffer_bound{{{labels}}} 10000.0",
        'twinstream_partition_buffer_fill{engine="a",partition="0",pipeline="hostmetrics"} 9800.0',
        'twinstream_partition_buffer_fill{engine="a",partition="1",pipeline="hostmetrics"} 10000.0',
    ):
        assert line in text.splitlines(), line


def test_the_engine_reports_each_partition_s_buffer_and_its_lag_trend(engine) -> None:
    topic = engine.settings.inbound_topic
    engine.watermarks.highs.return_value = {0: 200, 1: 100}
    engine._query.lastProgress = {"sources": [{"endOffset": json.dumps({topic: {"0": 3, "1": 2}})}]}
    engine.gate.joined()
    rows = [Output(m, OUT, "k", "{}", 0) for m in range(3)] + [Output(0, OUT, "k", "{}", 1)]
    engine.gate.on_batch(0, rows)
    clock = FakeClock(0.0)
    engine.lag_history = LagHistory(clock=clock)
    for step in range(61):
        engine.watermarks.highs.return_value = {0: 200 + 100 * step, 1: 100}
        engine.log_batch_timings(every_s=3600)  # the main loop's sample, once a second
        clock.sleep(1)
    clock.now -= 1
    info = engine.pipeline()
    assert info.buffer_fills == {0: 3, 1: 1}
    assert info.buffer_text() == "p0 3/10,000 · p1 1/10,000"
    assert info.lag_trend is not None
    assert info.lag_trend.growing
    assert info.lag == 197 + 98 + 6_000
    text = engine.metrics()
    assert 'twinstream_lag_growing{engine="a",pipeline="hostmetrics"} 1.0' in text
    assert 'fill{engine="a",partition="1",pipeline="hostmetrics"} 1.0' in text


def test_a_stopped_engine_s_lag_is_no_trend(engine) -> None:
    engine.lifecycle.move(State.STOPPED, "stopped")
    engine.sample_lag(5_000)
    assert not engine.lag_history._samples
