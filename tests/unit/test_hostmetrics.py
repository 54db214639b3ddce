"""The pipeline's pure logic: validation reasons, the rolling window, determinism."""

import base64
import json
import random

import pytest

from twinstream.hostmetrics import (
    WINDOW_SIZE,
    Event,
    Rejection,
    parse,
    parse_time,
    process_host,
    reference,
)

GOOD = {
    "host": "web-1",
    "ts": "2026-11-22T10:00:00.250Z",
    "cpu_user": 12.5,
    "cpu_system": 3,
    "mem_used_mb": 2048,
    "mem_free_mb": 6144,
}
HOUR_MS = 3_600_000


def _raw(**changes):
    record = {**GOOD, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


def test_a_good_record_parses_with_exact_milliseconds():
    event = parse(7, _raw(), 4096)
    assert isinstance(event, Event)
    assert event.ts_ms == 1795341600250
    assert event.cpu_system == 3.0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not_json: "),
        (b"\xff\xfe", "not_json: not UTF-8"),
        (b"[1, 2]", "not_json: a JSON list"),
        (b"", "not_json: "),
        (None, "not_json: "),
        (_raw(cpu_user=...), "missing_field: cpu_user"),
        (_raw(host=..., ts=...), "missing_field: host, ts"),
        (_raw(cpu_user="12"), "wrong_type: cpu_user is str"),
        (_raw(mem_used_mb=1.5), "wrong_type: mem_used_mb is float"),
        (_raw(mem_free_mb=True), "wrong_type: mem_free_mb is bool"),
        (_raw(host=""), "wrong_type: host is empty"),
        (
            b'{"host":"a","ts":"2026-11-22T10:00:00Z","cpu_user":NaN,"cpu_system":1,'
            b'"mem_used_mb":1,"mem_free_mb":1}',
            "out_of_range: cpu_user is not finite",
        ),
        (_raw(ts="yesterday"), "bad_time: "),
        (_raw(ts="2026-11-22T10:00:00+02:00"), "bad_time: "),
        (_raw(ts="2026-11-22T10:00:00"), "bad_time: "),
        (_raw(ts="2026-11-22"), "bad_time: "),
        (_raw(host="x" * 5000), "oversize: "),
    ],
)
def test_bad_records_are_rejected_with_a_coded_reason(raw, reason):
    result = parse(1, raw, 4096)
    assert isinstance(result, Rejection)
    assert result.reason.startswith(reason), result.reason
    assert result.raw == (raw or b"")


def test_time_accepts_the_rfc3339_utc_spellings():
    for text in ("2026-11-22T10:00:00Z", "2026-11-22t10:00:00z", "2026-11-22T10:00:00+00:00"):
        assert parse_time(text) == 1795341600000


def test_rolling_window_keeps_the_last_20_events():
    records = [(i, _raw(cpu_user=float(i), mem_used_mb=i)) for i in range(30)]
    window, outputs = process_host(None, records, HOUR_MS, 4096)
    last = json.loads(outputs[-1].value)
    assert last["window_count"] == WINDOW_SIZE
    assert last["cpu_user_avg20"] == sum(range(10, 30)) / 20
    assert last["mem_used_sum20"] == sum(range(10, 30))
    assert json.loads(outputs[0].value)["window_count"] == 1
    assert window is not None
    assert len(window.cpu_user) == WINDOW_SIZE


def test_output_carries_the_input_fields_then_the_statistics_in_a_fixed_order():
    _, [output] = process_host(None, [(41, _raw())], HOUR_MS, 4096)
    assert output.kind == "out"
    assert output.key == "web-1"
    assert list(json.loads(output.value)) == [
        "host",
        "ts",
        "cpu_user",
        "cpu_system",
        "mem_used_mb",
        "mem_free_mb",
        "msg_id",
        "window_count",
        "cpu_user_avg20",
        "mem_used_sum20",
    ]
    assert json.loads(output.value)["msg_id"] == 41


def test_host_state_expires_after_the_window_retention_in_event_time():
    records = [
        (0, _raw(ts="2026-11-22T10:00:00Z")),
        (1, _raw(ts="2026-11-22T10:59:59Z")),  # within an hour of the last event
        (2, _raw(ts="2026-11-22T12:00:00Z")),  # more than an hour later: fresh window
    ]
    _, outputs = process_host(None, records, HOUR_MS, 4096)
    assert [json.loads(o.value)["window_count"] for o in outputs] == [1, 2, 1]


def test_dead_letters_carry_msg_id_reason_and_the_original_bytes():
    _, [output] = process_host(None, [(9, b"\x00garbage")], HOUR_MS, 4096)
    value = json.loads(output.value)
    assert output.kind == "dlq"
    assert value["msg_id"] == 9
    assert value["reason"].startswith("not_json")
    assert base64.b64decode(value["raw"]) == b"\x00garbage"


def test_output_does_not_depend_on_how_records_are_split_into_batches():
    rng = random.Random(7)
    records = []
    for i in range(500):
        host = f"h{rng.randrange(5)}"
        raw = _raw(host=host, cpu_user=rng.random() * 100, mem_used_mb=rng.randrange(10_000))
        records.append((i, raw if rng.random() > 0.05 else b"broken"))
    expected = list(reference(records, HOUR_MS, 4096))

    by_host: dict[str, list[tuple[int, bytes]]] = {}
    for msg_id, raw in records:
        parsed = parse(msg_id, raw, 4096)
        by_host.setdefault(parsed.host if isinstance(parsed, Event) else "", []).append(
            (msg_id, raw)
        )
    for cut in (1, 7, 64):
        outputs = []
        for host_records in by_host.values():
            window = None
            for start in range(0, len(host_records), cut):
                window, out = process_host(window, host_records[start : start + cut], HOUR_MS, 4096)
                outputs += out
        assert sorted(outputs, key=lambda o: o.msg_id) == expected
