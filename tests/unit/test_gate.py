"""The gate's guarantees with a fake publisher: publish once, in order, only when active and
connected; replays dropped; takeover covers from the last committed msg_id; gaps reported."""

import logging

import pytest

from twinstream.gate import Fenced, Gate, TransientPublishError
from twinstream.rows import Output


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
    gate = Gate("a", "p", buffer)
    gate.joined()
    publisher = publisher or FakePublisher()
    gate.take_over(7, fence=lambda: publisher, last_committed=lambda: last)
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
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: last_committed)
    assert [ids for ids, _ in publisher.transactions] == ([published] if published else [])
    assert gate.status().uncovered_ranges == []


def test_a_standby_behind_publishes_only_past_the_last_committed():
    gate = Gate("b", "p", 100)
    gate.joined()
    gate.on_batch(0, rows(0, 1))
    publisher = FakePublisher()
    gate.take_over(8, fence=lambda: publisher, last_committed=lambda: 4)
    gate.on_batch(1, rows(2, 3, 4, 5, 6))
    assert publisher.transactions == [([5, 6], 8)]


def test_a_range_no_buffer_covers_is_reported_exactly(caplog):
    gate = Gate("b", "p", 3)
    gate.joined()
    gate.on_batch(0, rows(*range(10, 20)))  # buffer keeps 17, 18, 19
    publisher = FakePublisher()
    with caplog.at_level(logging.ERROR):
        gate.take_over(9, fence=lambda: publisher, last_committed=lambda: 12)
    assert gate.status().uncovered_ranges == [(13, 16)]
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
    gate.note_published(4)
    gate.on_batch(0, rows(*range(0, 20)))
    # 5..19 are unpublished: all kept, though N is 3.
    assert [r.msg_id for r in gate.buffered()] == list(range(5, 20))
    gate.note_published(15)
    assert [r.msg_id for r in gate.buffered()] == [16, 17, 18, 19]
    gate.note_published(30)
    assert [r.msg_id for r in gate.buffered()] == [17, 18, 19]  # never below N


def test_a_standby_far_ahead_of_a_lagging_active_still_covers_the_takeover(caplog):
    # The loss the kill benchmark found: the active 3N behind its standby.
    gate = Gate("b", "p", 10, max_buffer_size=1000)
    gate.joined()
    gate.note_published(99)
    gate.on_batch(0, rows(*range(0, 130)))
    publisher = FakePublisher()
    with caplog.at_level(logging.ERROR):
        gate.take_over(9, fence=lambda: publisher, last_committed=lambda: 99)
    assert gate.status().uncovered_ranges == []
    assert publisher.transactions == [(list(range(100, 130)), 9)]
    assert "UNCOVERED" not in caplog.text


def test_past_the_cap_a_standby_drops_and_says_so_once(caplog):
    gate = Gate("b", "p", 3, max_buffer_size=5)
    gate.joined()
    gate.note_published(-1)
    with caplog.at_level(logging.ERROR):
        gate.on_batch(0, rows(*range(0, 8)))
        gate.on_batch(1, rows(8, 9))
    assert [r.msg_id for r in gate.buffered()] == [5, 6, 7, 8, 9]
    assert caplog.text.count("more than 5 rows ahead") == 1


def test_without_the_actives_position_the_buffer_is_the_last_n():
    gate = Gate("b", "p", 3, max_buffer_size=100)
    gate.joined()
    gate.on_batch(0, rows(*range(0, 10)))
    assert [r.msg_id for r in gate.buffered()] == [7, 8, 9]


def test_an_active_keeps_only_the_last_n():
    gate, _ = active_gate(buffer=3)
    gate.note_published(-1)  # a stale position from its standby days does not count
    gate.on_batch(0, rows(*range(0, 10)))
    assert [r.msg_id for r in gate.buffered()] == [7, 8, 9]
