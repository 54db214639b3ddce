"""devkit.harness.reached: when a wait for an engine's catch-up is over. An engine
restarted with its checkpoint at the topic's end processes no row again: its query's
position (`read_up_to`) says it has read everything, and the wait must see that."""

from __future__ import annotations

from devkit.harness import reached

ENDS = {0: 100, 1: 50}


def test_processed_up_to_each_partitions_last_offset_is_caught_up() -> None:
    assert reached({"processed": {"0": 99, "1": 49}}, ENDS)
    assert not reached({"processed": {"0": 99, "1": 48}}, ENDS)
    assert not reached({"processed": {"0": 99}}, ENDS)


def test_a_query_that_read_to_the_end_with_nothing_processed_is_caught_up() -> None:
    assert reached({"processed": {}, "read_up_to": {"0": 100, "1": 50}}, ENDS)
    assert reached({"processed": {"1": 49}, "read_up_to": {"0": 100}}, ENDS)
    assert not reached({"processed": {}, "read_up_to": {"0": 100, "1": 49}}, ENDS)


def test_published_is_never_taken_from_the_querys_position() -> None:
    info = {"published": {}, "read_up_to": {"0": 100, "1": 50}}
    assert not reached(info, ENDS, field="published")
    assert reached({"published": {"0": 99, "1": 49}}, ENDS, field="published")


def test_an_engine_that_answered_nothing_is_not_caught_up() -> None:
    assert not reached({}, ENDS)
    assert reached({}, {})
