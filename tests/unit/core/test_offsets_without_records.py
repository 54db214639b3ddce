"""An inbound topic a transactional producer writes (the publisher adapters) has offsets
that hold no record a read_committed reader sees: each transaction's marker, an aborted
transaction's records. A batch accounts for them, once, with coverage rows, so that the
gate sees its offsets contiguous (it took a marker for a gap to recompute, for ever, and
published nothing more: found on `make up` with bench.publishers, 2026-11-27)."""

from __future__ import annotations

from twinstream.core.rows import NONE, OUT, Output, covered, with_offsets_without_records


def out(msg_id: int, partition: int = 0, value: str = "v") -> Output:
    return Output(msg_id, OUT, None, value, partition)


def test_markers_inside_before_and_after_a_batchs_records_are_covered_in_order():
    # Partition 0: a marker at 10 (the end of the batch before's transaction), records
    # 11-13, a marker at 14, an aborted transaction's 15-16 and its marker 17, record 18,
    # and the batch ends after the marker 19.
    rows = [out(11), out(12, value="a"), out(12, value="b"), out(13), out(18)]
    filled = with_offsets_without_records(rows, {0: 10}, {0: 20})
    assert [(r.msg_id, r.kind) for r in filled] == [
        (10, NONE),
        (11, OUT),
        (12, OUT),
        (12, OUT),
        (13, OUT),
        (14, NONE),
        (15, NONE),
        (16, NONE),
        (17, NONE),
        (18, OUT),
        (19, NONE),
    ]
    assert [r.value for r in filled if r.msg_id == 12] == ["a", "b"]  # their order kept


def test_each_partition_by_its_own_range_and_one_without_records_whole():
    rows = [out(5, 0), out(6, 0), out(3, 2)]
    filled = with_offsets_without_records(rows, {0: 5, 1: 0, 2: 3}, {0: 7, 1: 2, 2: 5})
    assert [(r.partition, r.msg_id, r.kind) for r in filled] == [
        (0, 5, OUT),
        (0, 6, OUT),
        (1, 0, NONE),
        (1, 1, NONE),
        (2, 3, OUT),
        (2, 4, NONE),
    ]


def test_a_plain_producers_batch_is_left_as_it_is():
    rows = [out(0), covered(1), out(2), out(0, 1)]
    assert with_offsets_without_records(rows, {0: 0, 1: 0}, {0: 3, 1: 1}) == rows
