"""The engine's view of its inbound partition (twinstream.engine.positions): cached watermarks, and
a fresh consumer after Kafka failed to answer (an idle consumer can keep a partition
"unknown" for minutes after its broker came back)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaException

from twinstream.engine.positions import BatchTimings, InboundWatermarks
from twinstream.platform.connections import KafkaConnection
from twinstream.platform.settings import load_settings

# The watermarks' consumer is a fake: where it would connect is never used.
KAFKA = KafkaConnection("127.0.0.1:9092")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_high_watermark_is_cached_and_a_failure_brings_a_new_consumer() -> None:
    consumers: list[Any] = []

    def make(_config: dict[str, Any]) -> Any:
        consumer = mock.MagicMock(name=f"consumer{len(consumers)}")
        consumer.get_watermark_offsets.return_value = (5, 40 + len(consumers))
        consumer.list_topics.return_value.topics = {
            "hostmetrics.in": mock.MagicMock(error=None, partitions={0: None})
        }
        consumers.append(consumer)
        return consumer

    clock = Clock()
    marks = InboundWatermarks(
        KAFKA, load_settings(pipeline="hostmetrics").topics(), "a", consumer=make, clock=clock
    )
    assert marks.highs() == {0: 40}
    assert marks.highs() == {0: 40}  # cached: one question to Kafka
    assert consumers[0].get_watermark_offsets.call_count == 1
    clock.now += 1.0
    consumers[0].get_watermark_offsets.side_effect = KafkaException("Local: Unknown partition")
    assert marks.highs() is None  # unknown, never guessed
    consumers[0].close.assert_called_once()
    assert marks.highs() is None  # within the cache period: no new question
    clock.now += 1.0
    assert marks.highs() == {0: 41}  # the new consumer answers
    assert marks.log_starts() == {0: 5}
    marks.close()
    consumers[1].close.assert_called_once()


def test_the_offset_at_a_time_past_a_partitions_log_is_its_end() -> None:
    consumer = mock.MagicMock()
    consumer.list_topics.return_value.topics = {
        "hostmetrics.in": mock.MagicMock(error=None, partitions={0: None, 1: None})
    }
    consumer.offsets_for_times.return_value = [
        mock.MagicMock(partition=0, offset=-1),
        mock.MagicMock(partition=1, offset=12),
    ]
    consumer.get_watermark_offsets.return_value = (0, 77)
    marks = InboundWatermarks(
        KAFKA, load_settings(pipeline="hostmetrics").topics(), "a", consumer=lambda _c: consumer
    )
    assert marks.offsets_at(123) == {0: 77, 1: 12}
    assert marks.log_starts() == {0: 0, 1: 0}
    consumer.get_watermark_offsets.side_effect = KafkaException("down")
    with pytest.raises(KafkaException):
        marks.log_starts()  # a caller decides what an unanswered log start means


def progress(batch: int, total: int, add: int, commit: int) -> dict[str, Any]:
    return {
        "batchId": batch,
        "numInputRows": 2 * batch,
        "durationMs": {"triggerExecution": total, "addBatch": add, "walCommit": 5},
        "stateOperators": [{"commitTimeMs": commit}],
    }


def test_batch_timings_give_medians_per_part_once_per_batch_and_start_over() -> None:
    timings = BatchTimings()
    assert timings.summary() is None
    for batch, total in ((1, 900), (2, 300), (3, 500)):
        timings.add(progress(batch, total, total - 100, total // 2))
        timings.add(progress(batch, 99_999, 0, 0))  # the same report read again: ignored
    summary = timings.summary()
    assert summary == (
        "3 batches sampled, medians: 500 ms (latestOffset 0, walCommit 5, queryPlanning 0, "
        "addBatch 400, commitOffsets 0, stateCommit 250), 4 input rows"
    )
    assert timings.summary() is None  # each summary covers the batches since the last
    timings.add({})  # no report yet
    assert timings.summary() is None
