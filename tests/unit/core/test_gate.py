"""The gate's guarantees with a fake publisher: publish once, in order, only when active and
connected; replays dropped; takeover covers from the last committed msg_id; gaps reported."""

import logging

import pytest

from tests.unit.fakes import FakeClock
from twinstream.core.gate import Fenced, Gate, TransientPublishError, Uncovered, merge
from twinstream.core.rows import Output, covered


def rows(*ids):
    return [Output(i, "out", "h", f"v{i}") for i in ids]


class FakePublisher:
    def __init__(self, fail=None):
        self.transactions = []
        self.fail = fail
        self.closed = False

    def publish(self, batch, epoch):
        if self.fail is not None:
            raise self.fail
        self.transactions.append(([r.msg_id for r in batch], epoch))

    def close(self):
        self.closed = True


def active_gate(buffer=100, last=-1, publisher=None):
    # A bound well above what these tests hold back: they are about order and coverage.
    gate = Gate("a", "p", buffer, max_buffer_size=1000)
    gate.joined()
    publisher = publisher or FakePublisher()
    gate.take_over(7, fence=lambda: publisher, last_committed=lambda: {0: last})
    return gate, publisher


def test_a_standby_buffers_and_publishes_nothing():
    gate = Gate("a", "p", 100)
    gate.joined()
    assert gate.on_batch(0, rows(0, 1, 2)) == 0
    status = gate.status()
    assert (status.role, status.buffer_fill, status.last_msg_id_processed) == ("standby", 3, 2)


def test_the_buffer_keeps_only_the_last_n_rows():
    gate = Gate("a", "p", 3)
    gate.on_batch(0, rows(0, 1, 2, 3, 4))
    assert [r.msg_id for r in gate.buffered()] == [2, 3, 4]


def test_the_active_publishes_each_batch_in_order_once():
    gate, publisher = active_gate()
    gate.on_batch(0, rows(2, 0, 1))
    gate.on_batch(1, rows(3))
    assert publisher.transactions == [([0, 1, 2], 7), ([3], 7)]
    assert gate.status().last_msg_id_published == 3


def test_a_replayed_batch_is_dropped_not_republished():
    gate, publisher = active_gate()
    gate.on_batch(5, rows(0, 1))
    gate.on_batch(5, rows(0, 1))  # Spark re-runs a batch whose commit it had not written
    gate.on_batch(6, rows(1, 2))
    assert publisher.transactions == [([0, 1], 7), ([2], 7)]


@pytest.mark.parametrize(
    ("buffered", "last_committed", "published"),
    [
        ((0, 1, 2, 3, 4), 2, [3, 4]),  # standby ahead: its buffer covers the rest
        ((0, 1), 4, []),  # standby behind: nothing until it passes msg_id 4
        ((), -1, []),
    ],
)
def test_takeover_publishes_what_the_buffer_holds_after_the_last_committed(
    buffered, last_committed, published
):
    gate = Gate("b", "p", 100)
    gate.joined()
    gate.on_batch(0, rows(*buffered))
    publisher = FakePublisher()
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: {0: last_committed})
    assert [ids for ids, _ in publisher.transactions] == ([published] if published else [])
    assert gate.status().uncovered_ranges == []


def test_a_standby_behind_publishes_only_past_the_last_committed():
    gate = Gate("b", "p", 100)
    gate.joined()
    gate.on_batch(0, rows(0, 1))
    publisher = FakePublisher()
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: {0: 4})
    gate.on_batch(1, rows(2, 3, 4, 5, 6))
    assert publisher.transactions == [([5, 6], 8)]


def test_a_range_no_buffer_covers_is_reported_exactly(caplog):
    gate = Gate("b", "p", 3)
    gate.restore(rows(17, 18, 19))  # a snapshot's buffer: 13..16 are in no buffer
    gate.joined()
    publisher = FakePublisher()
    with caplog.at_level(logging.ERROR):
        gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 12})
    assert gate.status().uncovered_ranges == [Uncovered(0, 13, 16)]
    assert publisher.transactions == [([17, 18, 19], 9)]
    assert "UNCOVERED msg_id 13..16 (4 messages)" in caplog.text


def test_suspended_holds_commits_until_connected_again():
    gate, publisher = active_gate()
    gate.zk_connected(False)
    gate.on_batch(0, rows(0, 1))
    assert publisher.transactions == []
    gate.zk_connected(True)
    assert publisher.transactions == [([0, 1], 7)]


def test_a_fenced_active_steps_down_and_commits_nothing():
    gate, publisher = active_gate(publisher=FakePublisher(fail=Fenced("epoch")))
    gate.on_batch(0, rows(0))
    assert gate.status().role == "standby"
    assert publisher.closed
    assert gate.status().last_msg_id_published == -1


def test_a_producer_that_failed_for_good_resigns_and_its_rows_survive_to_the_next_epoch():
    # Seen after a 3-minute outbound outage: the coordinator had timed the transaction out,
    # every abort then failed fatally (INVALID_TXN_STATE) and the active retried it forever.
    # Now it leaves the leadership, keeps what it could not publish, and a new producer
    # (this engine re-elected, here) publishes it at the next epoch.
    resigned = []
    gate = Gate("a", "p", 2, max_buffer_size=1000, on_fenced=lambda: resigned.append(True))
    gate.joined()
    broken = FakePublisher(fail=TransientPublishError("outage"))
    gate.take_over(7, fence=lambda: broken, last_committed=lambda: {0: -1})
    gate.on_batch(0, rows(0, 1, 2))
    gate.on_batch(1, rows(3, 4))
    broken.fail = Fenced("the producer failed for good: INVALID_TXN_STATE")
    gate.on_batch(2, rows(5))
    assert resigned == [True]
    assert gate.status().role == "standby"
    assert [r.msg_id for r in gate.buffered()] == [0, 1, 2, 3, 4, 5]
    fresh = FakePublisher()
    gate.take_over(8, fence=lambda: fresh, last_committed=lambda: {0: -1})
    assert fresh.transactions == [([0, 1, 2, 3, 4, 5], 8)]


def test_a_transient_failure_is_retried_with_the_next_batch():
    publisher = FakePublisher(fail=TransientPublishError("broker restarting"))
    gate, _ = active_gate(publisher=publisher)
    gate.on_batch(0, rows(0, 1))
    publisher.fail = None
    gate.on_batch(1, rows(2))
    assert publisher.transactions == [([0, 1, 2], 7)]


def test_stepping_down_stops_publishing():
    gate, publisher = active_gate()
    gate.step_down("resigned")
    gate.on_batch(0, rows(0))
    assert publisher.transactions == []
    assert gate.status().role == "standby"


def test_a_batch_larger_than_the_buffer_is_published_whole_by_the_active():
    gate, publisher = active_gate(buffer=3)
    gate.on_batch(0, rows(*range(10)))
    assert publisher.transactions == [(list(range(10)), 7)]
    assert [r.msg_id for r in gate.buffered()] == [7, 8, 9]


def test_rows_held_by_a_failed_commit_survive_the_ring_until_published():
    publisher = FakePublisher(fail=TransientPublishError("timeout"))
    gate, _ = active_gate(buffer=3, publisher=publisher)
    gate.on_batch(0, rows(*range(5)))
    gate.on_batch(1, rows(5, 6))
    publisher.fail = None
    gate.on_batch(2, rows(7))
    assert publisher.transactions == [(list(range(8)), 7)]
    assert gate.status().uncovered_ranges == []


def test_a_standby_keeps_what_the_active_has_not_published_beyond_n():
    gate = Gate("b", "p", 3, max_buffer_size=100)
    gate.joined()
    gate.note_published({0: 4})
    gate.on_batch(0, rows(*range(0, 20)))
    # 5..19 are unpublished: all kept, though N is 3.
    assert [r.msg_id for r in gate.buffered()] == list(range(5, 20))
    gate.note_published({0: 15})
    assert [r.msg_id for r in gate.buffered()] == [16, 17, 18, 19]
    gate.note_published({0: 30})
    assert [r.msg_id for r in gate.buffered()] == [17, 18, 19]  # never below N


def test_a_standby_far_ahead_of_a_lagging_active_still_covers_the_takeover(caplog):
    # The loss the kill benchmark found: the active 3N behind its standby.
    gate = Gate("b", "p", 10, max_buffer_size=1000)
    gate.joined()
    gate.note_published({0: 99})
    gate.on_batch(0, rows(*range(0, 130)))
    publisher = FakePublisher()
    with caplog.at_level(logging.ERROR):
        gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 99})
    assert gate.status().uncovered_ranges == []
    assert publisher.transactions == [(list(range(100, 130)), 9)]
    assert "UNCOVERED" not in caplog.text


def test_past_the_cap_a_standby_pauses_its_query_until_the_active_catches_up(caplog):
    clock = FakeClock()
    seen: list[tuple[int, str | None]] = []

    def sleep(seconds):
        clock.sleep(seconds)
        status = gate.status()
        seen.append((status.buffer_fill, status.paused))
        if len(seen) == 4:
            gate.note_published({0: 6})  # what the engine's main loop reads from the outbound topic

    gate = Gate("b", "p", 3, max_buffer_size=5, sleep=sleep, clock=clock)
    gate.joined()
    gate.note_published({0: -1})
    with caplog.at_level(logging.WARNING):
        gate.on_batch(0, rows(*range(0, 8)))  # returns only once the active is past 6
    # Paused with every row kept (nothing dropped above the active's position), then resumed.
    assert [fill for fill, _ in seen] == [8, 8, 8, 8]
    assert "waiting for the active to publish" in str(seen[0][1])
    assert [r.msg_id for r in gate.buffered()] == [5, 6, 7]
    assert gate.status().paused is None
    assert caplog.text.count("query paused") == 1
    assert "query resumed after 1.5 s paused" in caplog.text  # 0.1 + 0.2 + 0.4 + 0.8


def test_an_active_that_cannot_publish_pauses_at_the_bound_and_retries_with_backoff():
    waits = []
    publisher = FakePublisher(fail=TransientPublishError("brokers down"))

    def sleep(seconds):
        waits.append(seconds)
        if len(waits) == 3:
            publisher.fail = None  # the outage ends

    gate = Gate("a", "p", 3, max_buffer_size=5, sleep=sleep)
    gate.joined()
    gate.take_over(7, fence=lambda: publisher, last_committed=lambda: {0: -1})
    gate.on_batch(0, rows(0, 1, 2))  # 3 unpublished: under the bound, the query goes on
    assert (waits, gate.status().unpublished) == ([], 3)
    gate.on_batch(1, rows(3, 4, 5, 6))  # 7: paused until published
    assert waits == [0.1, 0.2, 0.4]
    assert publisher.transactions == [([0, 1, 2, 3, 4, 5, 6], 7)]
    assert gate.status().unpublished == 0
    assert gate.status().last_msg_id_published == 6


def test_a_paused_batch_returns_when_the_query_is_being_stopped():
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        gate.abandon_waits()

    gate = Gate("b", "p", 3, max_buffer_size=5, sleep=sleep)
    gate.joined()
    gate.on_batch(0, rows(*range(0, 8)))
    assert len(gate.buffered()) == 8  # kept: its rows are the buffer's, not the query's
    # The stopping query's next batch does not pause either: the stop need not wait.
    gate.on_batch(1, rows(8, 9))
    assert len(sleeps) == 1
    gate.resume_waits()  # the next query: its batches pause for room again
    gate.on_batch(2, rows(10))
    assert len(sleeps) == 2


def test_without_the_actives_position_a_standby_keeps_every_row():
    gate = Gate("b", "p", 3, max_buffer_size=100)
    gate.joined()
    gate.on_batch(0, rows(*range(0, 10)))
    assert [r.msg_id for r in gate.buffered()] == list(range(10))


def test_an_active_keeps_only_the_last_n():
    gate, _ = active_gate(buffer=3)
    gate.note_published({0: -1})  # a stale position from its standby days does not count
    gate.on_batch(0, rows(*range(0, 10)))
    assert [r.msg_id for r in gate.buffered()] == [7, 8, 9]


def test_a_gap_no_buffer_covers_is_recomputed_not_skipped(caplog):
    """Both engines restarted at once: the new active's query resumes past the last
    published msg_id, its buffer empty. It asks for the gap to be recomputed, publishes
    nothing past it meanwhile, and publishes it in order once the rewound query brings it."""
    clock = FakeClock()
    gaps = []

    def on_gap(partition, first, last):
        assert partition == 0
        gaps.append((first, last))
        return True

    gate = Gate("b", "p", 100, max_buffer_size=1000, clock=clock, on_gap=on_gap)
    gate.joined()
    publisher = FakePublisher()
    gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 9})
    with caplog.at_level(logging.WARNING):
        gate.on_batch(5, rows(15, 16, 17))  # the checkpoint was ahead: 10..14 are in no buffer
        gate.on_batch(6, rows(18, 19))
        assert (gaps, publisher.transactions) == ([(10, 14)], [])
        assert gate.status().repairs[0].seconds is None  # in progress
        gate.rewind({0: 8})  # the engine rewound its checkpoint to the batch ending at msg_id 7
        clock.sleep(2.5)
        gate.on_batch(3, rows(8, 9, 10, 11, 12, 13, 14, 15))
        gate.on_batch(4, rows(16, 17, 18, 19))
    assert publisher.transactions == [(list(range(10, 16)), 9), ([16, 17, 18, 19], 9)]
    [repair] = gate.status().repairs
    assert (repair.first, repair.last, repair.seconds) == (10, 14, 2.5)
    assert gate.status().uncovered_ranges == []
    assert "REPAIRED msg_id 10..14 (5 messages) in 2.5 s" in caplog.text


def recording(gaps: list[tuple[int, int, int]]):
    """An engine's on_gap that can always recompute, noting what it was asked."""

    def on_gap(partition: int, first: int, last: int) -> bool:
        gaps.append((partition, first, last))
        return True

    return on_gap


def test_a_gap_known_at_takeover_is_repaired_before_the_first_batch():
    """The new active holds nothing and its query resumes past the last published msg_id
    (its checkpoint went on, its buffer died with it): the repair starts at the takeover,
    not when the first batch (of a cold JVM, catching up) reaches the gate."""
    gaps: list[tuple[int, int, int]] = []
    gate = Gate("b", "p", 100, max_buffer_size=1000, on_gap=recording(gaps))
    gate.joined()
    publisher = FakePublisher()
    gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 9, 1: 4})
    assert gate.resumes_at(lambda: {0: 10, 1: 12}) is True
    assert gaps == [(1, 5, 11)]  # partition 0 resumes right after what was published
    assert gate.status().repairs[0].seconds is None
    assert gate.resumes_at(lambda: {1: 12}) is False  # one repair at a time
    gate.on_batch(5, [Output(12, "out", "h", "v", partition=1)])
    assert publisher.transactions == []  # held until the rewound query brings 5..11


@pytest.mark.parametrize(
    "before", ["standby", "processed", "no gap"], ids=lambda s: s.replace(" ", "-")
)
def test_what_the_gate_holds_decides_the_gap_not_the_checkpoint(before):
    """A standby, an active that has processed rows (its buffer decides, at its next batch),
    and a query resuming right after the last published msg_id: no repair at takeover."""
    gaps: list[tuple[int, int, int]] = []
    gate = Gate("b", "p", 100, max_buffer_size=1000, on_gap=recording(gaps))
    gate.joined()
    if before == "processed":
        gate.on_batch(0, rows(3, 4, 5))
    if before != "standby":
        gate.take_over(9, fence=FakePublisher, last_committed=lambda: {0: 2})
    assert gate.resumes_at(lambda: {0: 3 if before == "no gap" else 40}) is False
    assert gaps == []


def active_after_a_gap(can_repair: bool) -> tuple[Gate, FakePublisher]:
    """An active whose first batch starts at msg_id 15, the last published being 9."""
    gate = Gate(
        "b", "p", 100, max_buffer_size=1000, on_gap=lambda partition, first, last: can_repair
    )
    gate.joined()
    publisher = FakePublisher()
    gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 9})
    gate.on_batch(5, rows(15, 16))
    return gate, publisher


def test_a_gap_that_cannot_be_recomputed_is_reported_and_the_rest_published():
    gate, publisher = active_after_a_gap(can_repair=False)
    assert gate.status().uncovered_ranges == [Uncovered(0, 10, 14)]
    assert publisher.transactions == [([15, 16], 9)]


def test_a_repair_that_fails_is_reported_and_the_rest_published():
    gate, publisher = active_after_a_gap(can_repair=True)
    gate.repair_failed("the rewind raised")
    assert gate.status().uncovered_ranges == [Uncovered(0, 10, 14)]
    assert gate.status().repairs == []
    assert publisher.transactions == [([15, 16], 9)]
    gate.on_batch(6, rows(17))
    assert publisher.transactions[-1] == ([17], 9)


def fan_out(msg_id, n):
    return [Output(msg_id, "out", "k", f"v{msg_id}.{i}") for i in range(n)]


def test_a_fan_out_is_kept_and_published_whole_in_its_order():
    gate, publisher = active_gate()
    gate.on_batch(0, [*fan_out(1, 3), *rows(0)])
    assert publisher.transactions == [([0, 1, 1, 1], 7)]
    assert [r.value for r in gate.buffered()] == ["v0", "v1.0", "v1.1", "v1.2"]


def test_a_takeover_publishes_every_row_of_each_msg_id_after_the_last_committed():
    publisher = FakePublisher()
    gate = Gate("b", "p", 100, max_buffer_size=1000)
    gate.joined()
    gate.on_batch(0, [*fan_out(0, 2), *fan_out(1, 2), covered(2), *fan_out(3, 3)])
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: {0: 1})
    assert publisher.transactions == [([2, 3, 3, 3], 8)]


def test_coverage_rows_keep_a_filtered_range_from_looking_like_a_gap():
    gaps = []

    def on_gap(partition, first, last):
        assert partition == 0
        gaps.append((first, last))
        return False

    gate, publisher = active_gate(last=4)
    gate._on_gap = on_gap
    # 5..9 produced nothing, 10 an alert: the gate still sees 5 first.
    gate.on_batch(3, [*(covered(i) for i in range(5, 10)), *rows(10)])
    assert publisher.transactions == [([5, 6, 7, 8, 9, 10], 7)]
    assert gaps == []
    assert gate.status().uncovered_ranges == []


def test_a_stepped_down_active_keeps_whole_fan_outs_it_could_not_publish():
    gate, _ = active_gate(publisher=FakePublisher(fail=TransientPublishError("down")))
    gate.on_batch(0, [*fan_out(0, 2), *fan_out(1, 2)])
    gate.step_down("lost the session")
    assert [(r.msg_id, r.value) for r in gate.buffered()] == [
        (0, "v0.0"),
        (0, "v0.1"),
        (1, "v1.0"),
        (1, "v1.1"),
    ]


def test_merge_takes_each_msg_id_whole_from_the_first_source_that_has_it():
    first = [*fan_out(1, 2)]
    second = [Output(1, "out", "k", "other"), *rows(2)]
    assert [(r.msg_id, r.value) for r in merge(second[1:], first, second)] == [
        (1, "v1.0"),
        (1, "v1.1"),
        (2, "v2"),
    ]


# -- several inbound partitions: (partition, msg_id) is a record's identity ------------------


def prows(partition, *ids):
    return [Output(i, "out", "k", f"v{partition}.{i}", partition) for i in ids]


class PartitionPublisher(FakePublisher):
    def publish(self, batch, epoch):
        if self.fail is not None:
            raise self.fail
        self.transactions.append(([r.position for r in batch], epoch))


def test_one_transaction_carries_every_partitions_rows_each_in_offset_order():
    publisher = PartitionPublisher()
    gate, _ = active_gate(publisher=publisher)
    gate.take_over(7, fence=lambda: publisher, last_committed=lambda: {0: -1, 1: -1, 2: -1})
    gate.on_batch(0, [*prows(2, 1, 0), *prows(0, 5, 4, 3, 2, 1, 0), *prows(1, 0)])
    assert publisher.transactions == [
        ([(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 0), (2, 0), (2, 1)], 7)
    ]
    status = gate.status()
    assert status.published == {0: 5, 1: 0, 2: 1}
    # One number means nothing with several partitions.
    assert (status.last_msg_id_published, status.last_msg_id_processed) == (None, None)


def test_a_replay_is_told_per_partition_a_low_offset_of_another_partition_is_new():
    publisher = PartitionPublisher()
    gate = Gate("a", "p", 100, max_buffer_size=1000)
    gate.joined()
    gate.take_over(7, fence=lambda: publisher, last_committed=lambda: {0: -1, 1: -1})
    gate.on_batch(0, prows(0, 10, 11))  # partition 0 begins at 10 (retention)
    gate.on_batch(1, [*prows(0, 11), *prows(1, 0, 1)])  # 0:11 replayed, 1:0.. new
    assert [t for t, _ in publisher.transactions][1] == [(1, 0), (1, 1)]


def test_a_takeover_publishes_each_partition_after_its_own_last_committed():
    gate = Gate("b", "p", 100)
    gate.joined()
    gate.on_batch(0, [*prows(0, 0, 1, 2, 3, 4), *prows(1, 0, 1, 2, 3, 4, 5, 6, 7)])
    publisher = PartitionPublisher()
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: {0: 2, 1: 5})
    assert publisher.transactions == [([(0, 3), (0, 4), (1, 6), (1, 7)], 8)]
    assert gate.status().uncovered_ranges == []


def test_a_standby_keeps_each_partitions_rows_above_the_actives_position_there():
    gate = Gate("b", "p", 2, max_buffer_size=100)
    gate.joined()
    gate.note_published({0: 5, 1: 1})
    gate.on_batch(0, [*prows(0, *range(8)), *prows(1, *range(8))])
    kept = [r.position for r in gate.buffered()]
    assert kept == [(0, 6), (0, 7), *((1, i) for i in range(2, 8))]


def test_a_gap_in_one_partition_is_recomputed_there_and_holds_every_partition():
    gaps = []

    def on_gap(partition, first, last):
        gaps.append((partition, first, last))
        return True

    publisher = PartitionPublisher()
    gate = Gate("b", "p", 100, max_buffer_size=1000, on_gap=on_gap)
    gate.joined()
    gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 4, 1: 9})
    gate.on_batch(5, [*prows(0, 5, 6), *prows(1, 15, 16)])  # 1:10..1:14 in no buffer
    assert (gaps, publisher.transactions) == ([(1, 10, 14)], [])
    # The engine rewound its checkpoint to a batch that ended at 0:5 and 1:9.
    gate.rewind({0: 5, 1: 10})
    gate.on_batch(3, [*prows(0, 5, 6, 7), *prows(1, *range(10, 17))])
    published = [p for t, _ in publisher.transactions for p in t]
    assert published == [(0, 5), (0, 6), (0, 7), *((1, i) for i in range(10, 17))]
    [repair] = gate.status().repairs
    assert (repair.partition, repair.first, repair.last) == (1, 10, 14)
    assert repair.seconds is not None


def test_a_gap_that_cannot_be_recomputed_is_reported_with_its_partition(caplog):
    publisher = PartitionPublisher()
    gate = Gate("b", "p", 100, max_buffer_size=1000)
    gate.joined()
    gate.take_over(9, fence=lambda: publisher, last_committed=lambda: {0: 4, 2: 9})
    with caplog.at_level(logging.ERROR):
        gate.on_batch(5, [*prows(0, 5), *prows(2, 12)])
    assert gate.status().uncovered_ranges == [Uncovered(2, 10, 11)]
    assert publisher.transactions == [([(0, 5), (2, 12)], 9)]
    assert "UNCOVERED msg_id 2:10..2:11 (2 messages)" in caplog.text


def test_a_restored_buffer_of_several_partitions_continues_each_after_its_last_row():
    gate = Gate("b", "p", 100)
    gate.restore([*prows(1, 3, 4), *prows(0, 7)])
    gate.joined()
    gate.on_batch(0, [*prows(0, 7, 8), *prows(1, 4, 5)])
    assert [r.position for r in gate.buffered()] == [(0, 7), (0, 8), (1, 3), (1, 4), (1, 5)]
    assert gate.status().processed == {0: 8, 1: 5}


def test_each_takeover_is_remembered_with_when_it_won_and_its_first_commit():
    clock = FakeClock()
    gate = Gate("b", "p", 100, clock=clock, wall_clock=lambda: 1_800_000_000.0 + clock())
    gate.joined()
    gate.on_batch(0, rows(0, 1))
    publisher = FakePublisher()

    def fence():
        clock.sleep(0.25)  # init_transactions
        return publisher

    gate.take_over(8, fence=fence, last_committed=lambda: {0: 4})
    (record,) = gate.status().takeovers
    assert (record.epoch, record.fence_and_read_s, record.first_commit_s) == (8, 0.25, None)
    assert record.at == 1_800_000_000.0
    clock.sleep(1.5)  # the standby was behind: its next batch brings the first rows
    gate.on_batch(1, rows(2, 3, 4, 5))
    assert gate.status().takeovers[0].first_commit_s == pytest.approx(1.75)
    gate.step_down("drill")
    gate.take_over(9, fence=fence, last_committed=lambda: {0: 5})
    assert [t.epoch for t in gate.status().takeovers] == [9, 8]


def test_a_gate_logs_under_its_own_name_with_the_engine_and_the_pipeline(caplog):
    """The engine's one adapter (twinstream.core.logs.EngineLog) gives every part its
    prefix and extra; the record still names the module that wrote it."""
    from twinstream.core.logs import EngineLog

    engine_log = EngineLog(logging.getLogger("twinstream.engine.app"), "a", "p")
    gate = Gate("a", "p", 3, log=engine_log)
    gate.joined()
    gate.take_over(2, fence=lambda: FakePublisher(), last_committed=lambda: {})
    (record,) = [r for r in caplog.records if "ACTIVE at epoch 2" in r.getMessage()]
    assert record.name == "twinstream.core.gate"
    assert record.getMessage().startswith("engine a pipeline p: ACTIVE at epoch 2")
    assert (record.engine, record.pipeline) == ("a", "p")
