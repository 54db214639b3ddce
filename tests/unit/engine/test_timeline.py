"""twinstream.engine.timeline with an injected clock: exact per-bucket quantiles, the window, the
bounded sample above MAX_SAMPLES, thread safety, and the merge of a pipeline's engines."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.unit import fakes
from tests.unit.fakes import FakeClock
from twinstream.engine import timeline as tl
from twinstream.engine.api import TimelineInfo
from twinstream.engine.timeline import Timeline, merge

T0 = 1_000_000.0  # a multiple of 5: bucket starts are round


def test_each_bucket_has_the_exact_p50_and_p99_of_its_own_latencies() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)
    # 1..100 ms in one commit and 101..200 ms in two more, in the first bucket: p50 is the
    # 100th smallest of 200 (100 ms), p99 the 198th (198 ms), records' own latencies.
    timeline.published(np.arange(1, 101) / 1000)
    clock.now += 2
    timeline.published([x / 1000 for x in range(101, 151)])
    timeline.published(np.arange(151, 201) / 1000)
    # The next bucket's latencies are not mixed into the first's.
    clock.now = T0 + 5
    timeline.published([7.0, 9.0])
    points = timeline.snapshot()["points"]
    assert [p["t"] for p in points] == [T0, T0 + 5]
    assert points[0]["published"] == 200
    assert points[0]["p50_s"] == pytest.approx(0.100)
    assert points[0]["p99_s"] == pytest.approx(0.198)
    assert (points[1]["p50_s"], points[1]["p99_s"], points[1]["published"]) == (7.0, 9.0, 2)


def test_a_summarised_bucket_keeps_its_figures_and_a_late_report_lands_a_bucket_back() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)
    timeline.published([1.0, 2.0, 3.0])
    clock.now = T0 + 7
    # A commit of a moment ago, reported now, still counts in its own bucket's quantiles.
    timeline.published([10.0], at=T0 + 4)
    clock.now = T0 + 12  # a third bucket opens: the first is summarised
    timeline.rate(1.0)
    first = timeline.snapshot()["points"][0]
    assert (first["p50_s"], first["p99_s"], first["published"]) == (2.0, 10.0, 4)
    # More than a bucket late: counted, but the summary stands (the module's guarantee).
    timeline.published([99.0], at=T0 + 1)
    first = timeline.snapshot()["points"][0]
    assert (first["p50_s"], first["p99_s"], first["published"]) == (2.0, 10.0, 5)


def test_rate_is_the_buckets_mean_and_lag_its_highest_and_gaps_are_none() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)
    for rate, lag in ((100.0, 30), (200.0, 900), (300.0, 10)):
        timeline.rate(rate)
        timeline.lag(lag)
        clock.now += 1
    timeline.lag(None)  # unknown right after a start: no sample, not zero
    timeline.rate(float("nan"))
    (point,) = timeline.snapshot()["points"]
    assert point == {
        "t": T0,
        "p50_s": None,
        "p99_s": None,
        "published": 0,
        "in_per_s": 200.0,
        "lag": 900,
    }


def test_only_the_window_is_kept_and_shown() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(window_s=60, step_s=5, clock=clock)
    timeline.takeover(4)
    for _ in range(30):  # 150 s, one bucket each 5 s
        timeline.published([0.5])
        timeline.lag(1)
        clock.now += 5
    clock.now -= 5
    snap = timeline.snapshot()
    starts = [p["t"] for p in snap["points"]]
    # The buckets any part of which lies in the last 60 s: 12 of them, the newest open.
    assert starts == [clock.now - 5 * i for i in range(11, -1, -1)]
    assert snap["takeovers"] == []  # 145 s ago: out of the window
    assert len(timeline._buckets) == 12  # forgotten, not only hidden
    # A report of a time already out of the window is dropped.
    timeline.published([1.0], at=clock.now - 120)
    assert [p["t"] for p in timeline.snapshot()["points"]] == starts


def test_takeovers_are_marks_in_time_order() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)
    timeline.takeover(5, at=T0 - 3)
    timeline.takeover(4, at=T0 - 30)
    timeline.takeover(6)
    assert timeline.snapshot()["takeovers"] == [
        {"t": T0 - 30, "epoch": 4},
        {"t": T0 - 3, "epoch": 5},
        {"t": T0, "epoch": 6},
    ]


def test_a_busy_bucket_keeps_a_bounded_uniform_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tl, "MAX_SAMPLES", 1_000)
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock, seed=7)
    # 20 commits of 1,000 records each, latencies uniform over 0..10 s: the sample holds at
    # most 1,000, all 20,000 are counted, and its quantiles stay near the truth.
    rng = np.random.default_rng(1)
    for _ in range(20):
        timeline.published(rng.uniform(0, 10, 1_000))
    bucket = timeline._buckets[int(T0 // 5)]
    assert 500 <= bucket.kept <= 1_000
    assert bucket.keep == pytest.approx(1 / 32)
    (point,) = timeline.snapshot()["points"]
    assert point["published"] == 20_000
    assert point["p50_s"] == pytest.approx(5.0, abs=0.6)
    assert point["p99_s"] == pytest.approx(9.9, abs=0.2)


def test_a_commit_of_20000_records_is_kept_as_one_array_not_an_object_each() -> None:
    timeline = Timeline()
    latencies = np.random.default_rng(0).uniform(0, 5, 20_000)
    timeline.published(latencies)
    bucket = next(iter(timeline._buckets.values()))
    # One array per commit, whatever its size.
    assert len(bucket.samples) == 1
    assert bucket.samples[0].size == 20_000


def test_reports_from_many_threads_are_all_counted() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)

    def report() -> None:
        for _ in range(500):
            timeline.published([0.1, 0.2])
            timeline.rate(10.0)
            timeline.snapshot()

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    (point,) = timeline.snapshot()["points"]
    assert point["published"] == 4 * 500 * 2


def test_the_snapshot_is_what_the_admin_api_serves() -> None:
    clock = FakeClock(T0)
    timeline = Timeline(clock=clock)
    timeline.published([0.3])
    timeline.rate(5.0)
    timeline.lag(2)
    timeline.takeover(9)
    snap = timeline.snapshot()
    # Every key the engine gives is a field of the response model (none dropped).
    assert TimelineInfo.model_validate(snap).model_dump() == snap


def test_a_bad_geometry_is_refused() -> None:
    with pytest.raises(ValueError, match="step_s"):
        Timeline(window_s=1, step_s=5)


def _info(points: list[dict[str, object]], takeovers: list[dict[str, object]]) -> TimelineInfo:
    return TimelineInfo.model_validate(fakes.timeline(T0, points=points, takeovers=takeovers))


def _point(
    t: float, published: int = 0, p99: float | None = None, **more: object
) -> dict[str, object]:
    point: dict[str, object] = {
        "t": t,
        "p50_s": None if p99 is None else p99 / 2,
        "p99_s": p99,
        "published": published,
        "in_per_s": None,
        "lag": None,
    }
    return {**point, **more}


def test_merge_takes_latency_from_the_publisher_and_a_lag_line_per_engine() -> None:
    # a was active until its takeover by b at T0 - 12: both published in that bucket.
    a = _info(
        [
            _point(T0 - 20, 500, 0.8, in_per_s=100.0, lag=3),
            _point(T0 - 15, 90, 0.7, in_per_s=110.0, lag=4),
        ],
        [{"t": T0 - 400, "epoch": 2}],
    )
    b = _info(
        [
            _point(T0 - 20, 0, None, in_per_s=120.0, lag=50),
            _point(T0 - 15, 400, 2.5, in_per_s=90.0, lag=60),
            _point(T0 - 10, 300, 0.9, in_per_s=100.0, lag=1),
        ],
        [{"t": T0 - 12, "epoch": 3}],
    )
    merged = merge("p", {"b": b, "a": a}, T0, {"c": "unreachable"})
    assert merged.t == [T0 - 20, T0 - 15, T0 - 10]
    assert merged.published == [500, 400, 300]
    assert merged.p99_s == [0.8, 2.5, 0.9]
    assert merged.in_per_s == [110.0, 100.0, 100.0]
    assert merged.lag == {"a": [3, 4, None], "b": [50, 60, 1]}
    assert [(m.t, m.epoch, m.engine_id) for m in merged.takeovers] == [
        (T0 - 400, 2, "a"),
        (T0 - 12, 3, "b"),
    ]
    assert merged.unread == {"c": "unreachable"}


def test_merge_drops_what_is_out_of_the_window_and_one_epoch_is_one_mark() -> None:
    old = T0 - 2_000
    a = _info(
        [_point(old, 5, 1.0), _point(T0, 5, 1.0)], [{"t": old, "epoch": 1}, {"t": T0, "epoch": 2}]
    )
    b = _info([_point(T0, 0)], [{"t": T0, "epoch": 2}])
    merged = merge("p", {"a": a, "b": b}, T0)
    assert merged.t == [T0]
    assert [m.epoch for m in merged.takeovers] == [2]
    assert merge("p", {}, T0).t == []
