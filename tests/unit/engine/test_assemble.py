"""A batch's rows for the gate (twinstream.engine.pipeline.assemble), from the plan's columns as the
batch hands them over in whatever order Spark gave: every engine must publish the same rows
in the same order, one dead letter or the outputs or one coverage row per record."""

from __future__ import annotations

import random

from twinstream.core.rows import DLQ, NONE, OUT, Output, covered, dead_letter, record_id
from twinstream.engine.pipeline import QUARANTINED, assemble

Row = tuple[int, str, str | None, str | None, bytes | None]


def columns(
    rows: list[Row],
) -> tuple[list[int], list[str], list[str | None], list[str | None], list[bytes | None]]:
    return (
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
    )


BATCH: list[Row] = [
    (10, NONE, None, None, None),  # a record with outputs: its coverage row goes
    (10, OUT, "k2", '{"v":1}', None),
    (10, OUT, "k1", '{"v":2}', None),
    (10, OUT, None, '{"v":0}', None),
    (11, NONE, None, None, None),  # no output: it keeps its coverage row
    (12, DLQ, None, "invalid: not JSON", b"{oops"),
    (13, QUARANTINED, None, QUARANTINED, b"boom"),
    (14, NONE, None, None, None),  # the per-record guard's dead letter wins over outputs
    (14, DLQ, None, "error: ValueError: bad", b'{"x":1}'),
]


def test_rows_come_in_msg_id_then_key_then_value_order_whatever_order_spark_gave() -> None:
    expected = [
        Output(10, OUT, None, '{"v":0}'),
        Output(10, OUT, "k1", '{"v":2}'),
        Output(10, OUT, "k2", '{"v":1}'),
        covered(11),
        dead_letter(12, "invalid: not JSON", b"{oops", 1_000_000),
        dead_letter(13, "quarantined: the batch failed on it alone", b"boom", 1_000_000),
        dead_letter(14, "error: ValueError: bad", b'{"x":1}', 1_000_000),
    ]
    quarantined = {13: "quarantined: the batch failed on it alone"}
    for seed in range(5):
        rows = list(BATCH)
        random.Random(seed).shuffle(rows)
        assert assemble(*columns(rows), quarantined) == expected


def test_a_record_whose_outputs_would_not_fit_one_message_becomes_its_dead_letter() -> None:
    big = "x" * 20_000
    rows = assemble(
        *columns([(5, OUT, None, big, None), (5, OUT, None, "small", None)]), {}, 16_384
    )
    assert [r.kind for r in rows] == [DLQ]
    assert "oversize" in rows[0].value


def test_record_ids_of_several_partitions_become_rows_of_their_partition_in_order() -> None:
    """In the plan a record's msg_id holds its partition above its offset; a row's msg_id
    is the offset, with the partition beside it."""
    batch: list[Row] = [
        (record_id(2, 5), OUT, "k", "late", None),
        (record_id(0, 7), NONE, None, None, None),
        (record_id(1, 7), DLQ, None, "not_json: x", b"{"),
        (record_id(0, 6), OUT, "k", "early", None),
    ]
    rows = assemble(*columns(batch), {}, 1_000_000)
    assert [(r.partition, r.msg_id, r.kind) for r in rows] == [
        (0, 6, OUT),
        (0, 7, NONE),
        (1, 7, DLQ),
        (2, 5, OUT),
    ]
    assert rows[2] == dead_letter(7, "not_json: x", b"{", 1_000_000, partition=1)
    assert record_id(0, 12345) == 12345  # one partition: the msg_id is the offset
