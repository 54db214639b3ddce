"""The hostmetrics example's own logic, without Spark: the rolling window, event-time
expiry, the output's field order, and its generator. (Validation is the framework's, in the
JVM: tests/integration/test_contract.py.)"""

import json

from pipelines.hostmetrics.generate import BROKEN_KINDS, synthetic
from pipelines.hostmetrics.logic import FIELDS, WINDOW_SIZE, parse_time
from pipelines.hostmetrics.pipeline import advance

GOOD = {
    "host": "web-1",
    "ts": "2026-11-22T10:00:00.250Z",
    "cpu_user": 12.5,
    "cpu_system": 3.0,
    "mem_used_mb": 2048,
    "mem_free_mb": 6144,
}
HOUR_MS = 3_600_000


def run(records):
    """Each record (msg_id, fields) through one host's window: the outputs and reasons."""
    window = None
    results = []
    for msg_id, fields in records:
        record = {"msg_id": msg_id, **GOOD, **fields}
        window, value, reason = advance(window, record, HOUR_MS)
        results.append(json.loads(value) if value is not None else reason)
    return window, results


def test_time_accepts_the_rfc3339_utc_spellings():
    for text in ("2026-11-22T10:00:00Z", "2026-11-22t10:00:00z", "2026-11-22T10:00:00+00:00"):
        assert parse_time(text) == 1795341600000


def test_rolling_window_keeps_the_last_20_events():
    window, outputs = run([(i, {"cpu_user": float(i), "mem_used_mb": i}) for i in range(30)])
    assert outputs[-1]["window_count"] == WINDOW_SIZE
    assert outputs[-1]["cpu_user_avg20"] == sum(range(10, 30)) / 20
    assert outputs[-1]["mem_used_sum20"] == sum(range(10, 30))
    assert outputs[0]["window_count"] == 1
    assert window is not None
    assert len(window.cpu_user) == WINDOW_SIZE


def test_output_carries_the_input_fields_then_the_statistics_in_a_fixed_order():
    _, [output] = run([(41, {})])
    assert list(output) == [
        *FIELDS,
        "msg_id",
        "window_count",
        "cpu_user_avg20",
        "mem_used_sum20",
    ]
    assert output["msg_id"] == 41


def test_host_state_expires_after_the_window_retention_in_event_time():
    _, outputs = run(
        [
            (0, {"ts": "2026-11-22T10:00:00Z"}),
            (1, {"ts": "2026-11-22T10:59:59Z"}),  # within an hour of the last event
            (2, {"ts": "2026-11-22T12:00:00Z"}),  # more than an hour later: fresh window
        ]
    )
    assert [o["window_count"] for o in outputs] == [1, 2, 1]


def test_a_bad_time_or_an_overflow_is_a_reason_and_leaves_the_window_as_it_was():
    window, results = run(
        [
            (0, {"mem_used_mb": 2**63 - 1}),
            (1, {"ts": "22/11/2026 10:00"}),
            (2, {"mem_used_mb": 2**63 - 1}),
            # The transform alone: on a stack the guard's bound (BOUNDS) dead-letters -5
            # before the transform sees it.
            (3, {"mem_used_mb": -5}),
        ]
    )
    assert results[1].startswith("bad_time: ")
    assert results[2] == "overflow: mem_used_sum20 does not fit 64 bits"
    assert results[3]["window_count"] == 2
    assert window is not None
    assert window.mem_used_mb == (2**63 - 1, -5)


def test_synthetic_records_are_reproducible_json_objects_of_the_schema():
    first = list(synthetic(50, seed=3))
    assert first == list(synthetic(50, seed=3))
    assert all(list(json.loads(r)) == list(FIELDS) for r in first)


def test_every_nth_synthetic_record_is_broken_cycling_through_each_kind():
    records = list(synthetic(200, broken_every=20, max_record_bytes=4096))
    broken = [i for i, r in enumerate(records) if r not in set(synthetic(200, seed=1))]
    assert broken == list(range(19, 200, 20))
    assert len(BROKEN_KINDS) == 5
