"""The batch-size rule (twinstream.engine.batching): level with the head, a batch takes what
arrived; behind, it takes the limit, which is `max_batch_s` of work at the measured rate."""

import pytest

from twinstream.engine.batching import DrainRate, batch_limit, next_batch

LIMIT = batch_limit(2_000.0, max_batch_s=3.0, floor=2_000, ceiling=20_000)


def test_level_with_the_head_a_batch_is_what_arrived():
    # 1,000 events/s, a trigger every 250 ms: a level engine's batch is ~250 records.
    assert next_batch(250, LIMIT) == 250
    assert next_batch(0, LIMIT) == 0


def test_behind_a_batch_is_large_but_bounded_in_time():
    assert LIMIT == 6_000  # 3 s at 2,000 records/s
    assert next_batch(300_000, LIMIT) == LIMIT


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (None, 20_000),  # nothing measured yet: the configured bound
        (float("nan"), 20_000),
        (0.0, 20_000),
        (100.0, 2_000),  # a slow engine: the floor keeps the fixed cost a small part
        (5_000.0, 15_000),
        (50_000.0, 20_000),  # a fast one: never above the ceiling (the memory bound)
    ],
)
def test_the_limit_is_max_batch_s_of_work_within_floor_and_ceiling(rate, expected):
    assert batch_limit(rate, max_batch_s=3.0, floor=2_000, ceiling=20_000) == expected


def test_a_ceiling_below_the_floor_wins():
    # A pipeline configured for tiny batches (a test's 200) keeps them.
    assert batch_limit(5_000.0, max_batch_s=3.0, floor=2_000, ceiling=200) == 200


def progress(batch, rows, ms):
    return {"batchId": batch, "numInputRows": rows, "durationMs": {"triggerExecution": ms}}


def test_the_drain_rate_counts_only_full_batches_once_each_and_survives_a_restart(tmp_path):
    path = tmp_path / "engines" / "a" / "drain-rate.json"
    rate = DrainRate(path)
    assert rate.value is None
    # A level engine's batches, mostly fixed cost: 1,900 rows in 1.6 s is no drain rate
    # (it sized catch-up batches at 3,663 records on make up, and a rejoin took 274 s).
    rate.add(progress(1, 200, 700), limit=20_000)
    rate.add(progress(2, 1_900, 1_600), limit=20_000)
    assert rate.value is None
    rate.add(progress(3, 20_000, 8_000), limit=20_000)
    rate.add(progress(3, 20_000, 8_000), limit=20_000)  # the same report read again
    assert rate.value == pytest.approx(2_500)
    rate.add(progress(4, 15_000, 3_000), limit=15_000)
    assert rate.value == pytest.approx(0.8 * 2_500 + 0.2 * 5_000)
    rate.save()
    assert DrainRate(path).value == pytest.approx(rate.value, abs=0.1)


def test_a_damaged_rate_file_is_measured_afresh(tmp_path):
    path = tmp_path / "drain-rate.json"
    path.write_text("{not json")
    assert DrainRate(path).value is None
