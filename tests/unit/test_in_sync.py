"""When an engine counts as an in-sync standby: what the persist DAG, the drill and the
restore sensor rely on."""

import pytest

from twinstream.engine.positions import events_per_s, is_in_sync, lag, query_position


@pytest.mark.parametrize(
    ("state", "lag", "reported", "expected"),
    [
        ("running", 0, True, True),
        ("running", 5_000, True, True),  # the boundary: in_sync_lag itself is in sync
        ("running", 5_001, True, False),
        ("running", None, True, False),  # lag unknown (no high watermark)
        # Just (re)started: the lag comes from what the previous query processed, so it
        # must not count until the new query has reported a batch.
        ("running", 0, False, False),
        ("restoring", 10, False, False),
        ("restoring", 10, True, True),
        # A persist stops the query on purpose; the engine stays what it was.
        ("persisting", 10, False, True),
        ("persisting", None, False, False),
        ("stopped", 0, True, False),
        ("failed", 0, True, False),
    ],
)
def test_in_sync(state, lag, reported, expected):
    assert is_in_sync(state, lag, 5_000, reported) is expected


def test_the_query_position_from_pyspark_4s_progress_where_end_offsets_are_json_text():
    progress = {"sources": [{"endOffset": '{"hostmetrics.in":{"0":1234}}'}]}
    assert query_position(progress, "hostmetrics.in") == {0: 1234}


def test_the_query_position_from_an_older_progress_where_end_offsets_are_a_dict():
    progress = {"sources": [{"endOffset": {"hostmetrics.in": {"0": 77}}}]}
    assert query_position(progress, "hostmetrics.in") == {0: 77}


def test_no_query_position_before_the_first_report_or_for_another_topic():
    assert query_position({}, "hostmetrics.in") is None
    assert query_position({"sources": [{"endOffset": None}]}, "hostmetrics.in") is None
    other = {"sources": [{"endOffset": '{"other.in":{"0":5}}'}]}
    assert query_position(other, "hostmetrics.in") is None


def test_the_rate_counts_inbound_offsets_not_spark_s_rows_read_twice():
    progress = {
        "numInputRows": 2000,  # 1,000 records, read by both branches of the plan
        "processedRowsPerSecond": 4000.0,
        "durationMs": {"triggerExecution": 500},
        "sources": [
            {
                "startOffset": '{"hostmetrics.in":{"0":1000}}',
                "endOffset": '{"hostmetrics.in":{"0":2000}}',
            }
        ],
    }
    assert events_per_s(progress, "hostmetrics.in") == 2000.0
    assert events_per_s({}, "hostmetrics.in") is None


def test_positions_rate_and_lag_over_several_partitions():
    progress = {
        "durationMs": {"triggerExecution": 1000},
        "sources": [
            {
                "startOffset": '{"p.in":{"0":10,"1":0}}',
                "endOffset": '{"p.in":{"0":110,"1":50,"2":5}}',
            }
        ],
    }
    assert query_position(progress, "p.in") == {0: 110, 1: 50, 2: 5}
    assert events_per_s(progress, "p.in") == 155.0
    # A partition the query has not read yet counts whole.
    assert lag({0: 120, 1: 50, 2: 5, 3: 9}, {0: 110, 1: 50, 2: 5}) == 10 + 9
