"""The agreement check (twinstream.core.agreement): digests, and a standby's comparison of
the active's published ranges with its own rows, against a fake buffer."""

from __future__ import annotations

import pytest

from twinstream.core import agreement as agreement_module
from twinstream.core.agreement import (
    NOT_HELD,
    NOT_YET,
    Agreement,
    Held,
    PublishedRange,
    digest,
    first_difference,
)
from twinstream.core.gate import Gate
from twinstream.core.outbound import published_range
from twinstream.core.rows import DLQ, NONE, OUT, Output


def out(msg_id: int, value: str, key: str | None = "k", partition: int = 0) -> Output:
    return Output(msg_id, OUT, key, value, partition)


def none(msg_id: int, partition: int = 0) -> Output:
    return Output(msg_id, NONE, None, "", partition)


# -- the digest ---------------------------------------------------------------------------


def test_the_digest_ignores_coverage_rows_and_a_fan_outs_order():
    rows = [out(1, "a"), none(2), out(3, "b"), out(3, "c")]
    assert digest(rows) == digest([out(3, "c"), out(1, "a"), out(3, "b")])


@pytest.mark.parametrize(
    "changed",
    [
        [out(1, "a"), out(3, "b"), out(3, "C")],  # one byte of a value
        [out(1, "a"), out(3, "b")],  # a row fewer
        [out(1, "a"), out(3, "b"), out(3, "c"), out(3, "c")],  # a row more
        [out(1, "a", key=None), out(3, "b"), out(3, "c")],  # no key instead of "k"
        [out(1, "a", key=""), out(3, "b"), out(3, "c")],  # an empty key instead of "k"
        [Output(1, DLQ, "k", "a"), out(3, "b"), out(3, "c")],  # a dead letter instead
        [out(2, "a"), out(3, "b"), out(3, "c")],  # another msg_id
        [out(1, "a|3|b"), out(3, "c")],  # separators inside a value
    ],
)
def test_the_digest_changes_with_any_difference(changed):
    assert digest([out(1, "a"), out(3, "b"), out(3, "c")]) != digest(changed)


def test_no_key_and_a_dash_key_differ():
    assert digest([out(1, "a", key=None)]) != digest([out(1, "a", key="-")])


def test_a_progress_record_reads_as_its_range():
    r = published_range(
        2,
        b'{"first":5,"last":9,"outputs":1,"dead_letters":0,"digest":"ab"}',
        [("msg_id", b"9"), ("engine_id", b"b"), ("epoch", b"4")],
        1234,
    )
    assert r == PublishedRange(2, 5, 9, "ab", 4, "b", 1234)
    old = published_range(0, b'{"first":5,"last":9,"outputs":1,"dead_letters":0}', None, 0)
    assert old is not None
    assert old.digest is None
    assert published_range(0, b"not json", None, 0) is None
    versioned = published_range(
        0, b'{"first":5,"last":9,"digest":"ab"}', [("version", b"2+0123456789ab")], 0
    )
    assert versioned is not None
    assert versioned.version == "2+0123456789ab"


# -- a standby's comparison ---------------------------------------------------------------


class Buffer:
    """The engine's rows of each partition and how far it has processed."""

    def __init__(self, rows: list[Output], start: int = 0) -> None:
        self.rows = rows
        self.start = start
        self.read_back: list[PublishedRange] = []
        self.published: list[Output] = []

    def between(self, partition: int, first: int, last: int) -> Held:
        mine = [r for r in self.rows if r.partition == partition]
        if not mine or mine[-1].msg_id < last:
            return NOT_YET
        if first < self.start:
            return NOT_HELD
        return [r for r in mine if first <= r.msg_id <= last]

    def published_rows(self, r: PublishedRange) -> list[Output]:
        self.read_back.append(r)
        return self.published


def checker(buffer: Buffer, bound: int = 1000) -> Agreement:
    return Agreement(
        "b", "p", buffer.between, buffer.published_rows, lambda: bound, wall_clock=lambda: 9.0
    )


def test_equal_ranges_agree_and_are_released_to_the_gate():
    rows = [out(0, "a"), none(1), out(2, "b")]
    buffer = Buffer(rows)
    check = checker(buffer)
    check.offer(
        [PublishedRange(0, 0, 1, digest(rows[:2])), PublishedRange(0, 2, 2, digest(rows[2:]))]
    )
    assert check.check(standby=True) == {0: 2}
    status = check.status()
    assert (status.state, status.checked, status.ranges_agreed) == ("agrees", {0: 2}, 2)
    assert status.digested_rows == 3
    assert buffer.read_back == []  # read back only on a difference


def test_a_range_not_processed_yet_waits_and_keeps_its_rows():
    buffer = Buffer([out(0, "a")])
    check = checker(buffer)
    check.offer([PublishedRange(0, 1, 4, "x")])
    # Everything below the waiting range may go; the range's rows are kept until compared.
    assert check.check(standby=True) == {0: 0}
    assert check.status().state == "unchecked"
    buffer.rows += [out(1, "b"), none(2), none(3), out(4, "c")]
    check.offer([])
    assert check.check(standby=True) == {0: 4}
    assert check.status().state == "disagrees"  # "x" is no digest of these rows


def test_ranges_it_cannot_compare_are_counted_unchecked_never_guessed():
    buffer = Buffer([out(i, "v") for i in range(20)], start=5)
    check = checker(buffer, bound=10)
    check.offer(
        [
            PublishedRange(0, 0, 4, "x"),  # no longer held
            PublishedRange(0, 5, 19, "x"),  # larger than the buffer may hold
            PublishedRange(0, 5, 6, None),  # a record without a digest (an older engine)
        ]
    )
    assert check.check(standby=True) == {0: 6}
    status = check.status()
    assert (status.state, status.ranges_unchecked, status.ranges_agreed) == ("unchecked", 3, 0)


def test_a_difference_names_the_first_differing_msg_id_with_both_rows_and_sticks():
    mine = [out(0, "a"), out(1, "b"), none(2), out(3, "engine-b")]
    theirs = [out(0, "a"), out(1, "b"), out(3, "engine-a")]
    buffer = Buffer(mine)
    buffer.published = theirs
    check = checker(buffer)
    check.offer([PublishedRange(0, 0, 3, digest(theirs), 7, "a", 100)])
    assert check.check(standby=True) == {0: 3}
    status = check.status()
    assert status.state == "disagrees"
    assert status.difference is not None
    assert status.difference.msg_id == 3
    assert [r.value for r in status.difference.active_rows] == ["engine-a"]
    assert [r.value for r in status.difference.engine_rows] == ["engine-b"]
    assert status.difference.text() == "msg_id 3 (the active's transaction of msg_id 0..3, epoch 7)"
    assert not check.eligible
    # Sticky: later equal ranges do not make it agree again; they are only released.
    buffer.rows.append(out(4, "z"))
    check.offer([PublishedRange(0, 4, 4, digest([out(4, "z")]))])
    assert check.check(standby=True) == {0: 4}
    assert check.status().state == "disagrees"
    assert check.override()
    assert check.eligible
    assert check.status().overridden
    check.reset("restored from s1")
    assert (check.status().state, check.eligible) == ("unchecked", True)


def test_a_difference_whose_rows_cannot_be_read_back_still_disagrees():
    buffer = Buffer([out(0, "a"), out(1, "b")])

    def unreadable(_r: PublishedRange) -> list[Output]:
        raise TimeoutError("broker down")

    check = Agreement("b", "p", buffer.between, unreadable, lambda: 1000)
    check.offer([PublishedRange(0, 0, 1, "other")])
    check.check(standby=True)
    status = check.status()
    assert status.state == "disagrees"
    assert status.difference is not None
    assert status.difference.msg_id == 0


def test_the_active_settles_its_own_ranges_without_comparing():
    buffer = Buffer([out(0, "a")])
    check = checker(buffer)
    check.offer([PublishedRange(0, 0, 0, "other"), PublishedRange(1, 0, 9, "x")])
    assert check.check(standby=False) == {0: 0, 1: 9}
    assert check.status().state == "unchecked"
    assert check.override() is False  # nothing to override


def test_partitions_are_compared_each_on_its_own():
    rows = [out(0, "a", partition=0), out(0, "b", partition=1)]
    buffer = Buffer(rows)
    check = checker(buffer)
    check.offer(
        [PublishedRange(1, 0, 0, digest(rows[1:])), PublishedRange(0, 0, 0, digest(rows[:1]))]
    )
    assert check.check(standby=True) == {0: 0, 1: 0}
    assert check.status().checked == {0: 0, 1: 0}


def test_a_standby_far_behind_queues_a_bounded_number_of_ranges(monkeypatch):
    monkeypatch.setattr(agreement_module, "MAX_PENDING", 3)
    check = checker(Buffer([]))
    check.offer([PublishedRange(0, i, i, "x", timestamp_ms=i) for i in range(5)])
    assert check.status().ranges_unchecked == 2
    assert check.check(standby=True) == {0: 1}  # waits at the oldest kept range, msg_id 2


def test_first_difference_without_a_differing_row_points_at_the_range():
    r = PublishedRange(0, 4, 6, "x")
    found = first_difference(r, [out(5, "a")], [out(5, "a")], 1.0)
    assert (found.msg_id, found.active_rows, found.engine_rows) == (4, [], [])


# -- the gate's side: whole msg_ids -------------------------------------------------------


def test_the_gate_gives_a_range_it_holds_and_says_when_it_does_not():
    gate = Gate("b", "p", 3)
    gate.joined()
    gate.note_published({0: 100})  # the active is far ahead: the ring keeps only 3 rows
    gate.on_batch(1, [out(0, "a"), none(1), out(2, "b"), out(3, "c")])
    assert gate.rows_between(0, 1, 3) == [none(1), out(2, "b"), out(3, "c")]
    assert gate.rows_between(0, 0, 3) == NOT_HELD
    assert gate.rows_between(0, 2, 4) == NOT_YET
    assert gate.rows_between(1, 0, 0) == NOT_YET


def test_the_ring_drops_a_fan_outs_rows_together_or_not_at_all():
    gate = Gate("b", "p", 2)
    gate.joined()
    gate.note_published({0: 100})
    gate.on_batch(1, [out(0, "a"), out(1, "x"), out(1, "y"), out(2, "b")])
    # Dropping one of msg_id 1's rows would leave it half held: the ring keeps 3 rows.
    assert [r.msg_id for r in gate.buffered()] == [1, 1, 2]
    assert gate.rows_between(0, 1, 2) == [out(1, "x"), out(1, "y"), out(2, "b")]
    gate.on_batch(2, [out(3, "c")])
    assert [r.msg_id for r in gate.buffered()] == [2, 3]


def test_a_restore_s_reset_during_a_check_is_not_lost_to_the_check_s_result():
    """The main loop checks while an admin API thread resets (a restore): the reset waits
    for the check, so the restored engine starts unchecked, not with the old difference."""
    import threading

    mine, theirs = [out(0, "engine-b")], [out(0, "engine-a")]
    buffer = Buffer(mine)
    reading, release = threading.Event(), threading.Event()

    def slow_read_back(r: PublishedRange) -> list[Output]:
        reading.set()
        assert release.wait(5)
        return theirs

    check = Agreement("b", "p", buffer.between, slow_read_back, lambda: 1000)
    check.offer([PublishedRange(0, 0, 0, digest(theirs), 7, "a", 100)])
    checking = threading.Thread(target=check.check, args=(True,), name="main-loop")
    checking.start()
    assert reading.wait(5)
    resetting = threading.Thread(target=check.reset, args=("restored",), name="admin-api")
    resetting.start()
    resetting.join(0.2)
    assert resetting.is_alive()  # waits for the check in flight
    assert check.status().state == "unchecked"  # a status read does not wait
    release.set()
    checking.join(5)
    resetting.join(5)
    assert check.status().state == "unchecked"
    assert check.eligible


# -- a shadow: the active runs other code ---------------------------------------------------


def shadow_checker(buffer: Buffer, clock: list[float]) -> Agreement:
    return Agreement(
        "b",
        "p",
        buffer.between,
        buffer.published_rows,
        lambda: 1000,
        wall_clock=lambda: clock[0],
        version="2+bbbbbbbbbbbb",
    )


def test_a_standby_on_other_code_reports_what_differs_and_is_never_barred_for_it():
    """A deploy's new version beside the old: its differences are its new logic's. They are
    counted, read back at most every few seconds, shown with both versions' rows, and the
    engine stays eligible to lead."""
    mine = [out(0, "new"), out(1, "same"), none(2), out(3, "new")]
    theirs = [out(0, "old"), out(1, "same"), out(3, "old")]
    buffer = Buffer(mine)
    buffer.published = theirs
    clock = [100.0]
    check = shadow_checker(buffer, clock)
    old = "1+aaaaaaaaaaaa"
    check.offer([PublishedRange(0, 0, 3, digest(theirs), 7, "a", 100, old)])
    assert check.check(standby=True) == {0: 3}
    status = check.status()
    assert status.state == "shadow"
    assert check.eligible
    assert status.difference is None
    shadow = status.shadow
    assert shadow is not None
    assert (shadow.active_version, shadow.version) == (old, "2+bbbbbbbbbbbb")
    assert (shadow.ranges_compared, shadow.ranges_differing, shadow.rows_compared) == (1, 1, 3)
    assert (shadow.ranges_read_back, shadow.msg_ids_differing) == (1, 2)
    [example] = shadow.examples
    assert example.msg_id == 0
    assert [r.value for r in example.active_rows] == ["old"]
    assert [r.value for r in example.engine_rows] == ["new"]
    # A second differing range within the read-back interval is counted, not read back.
    buffer.rows.append(out(4, "new"))
    buffer.published = [out(4, "old")]
    check.offer([PublishedRange(0, 4, 4, digest([out(4, "old")]), 7, "a", 200, old)])
    check.check(standby=True)
    shadow = check.status().shadow
    assert shadow is not None
    assert (shadow.ranges_differing, shadow.ranges_read_back) == (2, 1)
    assert len(buffer.read_back) == 1
    # An equal range of the old version is counted as compared, not differing.
    buffer.rows.append(out(5, "x"))
    check.offer([PublishedRange(0, 5, 5, digest([out(5, "x")]), 7, "a", 300, old)])
    check.check(standby=True)
    shadow = check.status().shadow
    assert shadow is not None
    assert (shadow.ranges_compared, shadow.ranges_differing) == (3, 2)
    assert check.eligible


def test_after_the_switch_the_same_versions_rows_are_compared_and_a_difference_bars_again():
    """Once the active runs this engine's code, differences are faults again."""
    buffer = Buffer([out(0, "new"), out(1, "new")])
    clock = [100.0]
    check = shadow_checker(buffer, clock)
    check.offer([PublishedRange(0, 0, 0, digest([out(0, "old")]), 7, "a", 1, "1+aaaaaaaaaaaa")])
    check.check(standby=True)
    assert check.status().state == "shadow"
    same = "2+bbbbbbbbbbbb"
    check.offer([PublishedRange(0, 1, 1, digest([out(1, "other")]), 8, "c", 2, same)])
    check.check(standby=True)
    status = check.status()
    assert status.state == "disagrees"
    assert not check.eligible


def test_ranges_without_a_version_or_of_an_engine_without_one_are_compared_as_before():
    """Older engines wrote no version header: their ranges are faults when they differ."""
    buffer = Buffer([out(0, "new")])
    buffer.published = [out(0, "old")]
    check = shadow_checker(buffer, [0.0])
    check.offer([PublishedRange(0, 0, 0, digest([out(0, "old")]))])
    check.check(standby=True)
    assert check.status().state == "disagrees"
