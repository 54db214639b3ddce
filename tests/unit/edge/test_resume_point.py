"""Where a new active publisher adapter resumes: the committed inbound record with the
highest `seq` in the tails of every partition, read together (twinstream.edge.publisher.
last_in_tails), with a fake consumer holding each partition's log."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from twinstream.edge import publisher
from twinstream.edge.publisher import SEQ_HEADER, SOURCE_HEADER, ResumePoint, last_in_tails
from twinstream.edge.sources import Position

TOPIC = "p.in"


class Message:
    def __init__(self, partition: int, offset: int, headers: Any, eof: bool = False) -> None:
        self._partition, self._offset, self._headers, self._eof = partition, offset, headers, eof

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> Any:
        return self._headers

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None


def adapter_record(seq: int) -> list[tuple[str, bytes]]:
    return [
        (SEQ_HEADER, str(seq).encode()),
        (SOURCE_HEADER, Position("f.jsonl", 7, "abc", seq * 10).text().encode()),
    ]


class Consumer:
    """Each partition's log (offset -> headers, None: another producer's record); polls
    interleave the assigned partitions, as librdkafka's fetches do."""

    def __init__(self, logs: dict[int, list[Any]]) -> None:
        self.logs = logs
        self.assignments: list[dict[int, int]] = []
        self._queue: list[Message] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return 0, len(self.logs[tp.partition])

    def assign(self, tps: list[Any]) -> None:
        self.assignments.append({tp.partition: tp.offset for tp in tps})
        streams = [
            [
                *(
                    Message(tp.partition, o, self.logs[tp.partition][o])
                    for o in range(tp.offset, len(self.logs[tp.partition]))
                ),
                Message(tp.partition, len(self.logs[tp.partition]), None, eof=True),
            ]
            for tp in tps
        ]
        self._queue = [m for group in zip(*_padded(streams), strict=True) for m in group if m]

    def poll(self, timeout: float) -> Message | None:
        return self._queue.pop(0) if self._queue else None


def _padded(streams: list[list[Message]]) -> list[list[Message | None]]:
    longest = max(len(s) for s in streams)
    return [[*s, *([None] * (longest - len(s)))] for s in streams]


def test_the_highest_seq_of_every_partitions_tail_read_in_one_assignment():
    logs = {
        0: [adapter_record(s) for s in (1, 4, 7)],
        1: [adapter_record(s) for s in (2, 5, 9)],
        2: [adapter_record(s) for s in (3, 6, 8)],
    }
    consumer = Consumer(logs)
    point = last_in_tails(consumer, TOPIC, [0, 1, 2], 1.0)  # type: ignore[arg-type]
    assert point == ResumePoint(Position("f.jsonl", 7, "abc", 90), 9)
    assert len(consumer.assignments) == 1  # the partitions together, not one by one


def test_a_tail_without_an_adapters_record_is_read_further_back(monkeypatch):
    monkeypatch.setattr(publisher, "TAIL_WINDOW", 2)
    # Partition 0: the adapters' records, then 5 of another producer's; partition 1 empty.
    logs: dict[int, list[Any]] = {
        0: [adapter_record(3), adapter_record(11), *([None] * 5)],
        1: [],
        2: [None],
    }
    consumer = Consumer(logs)
    point = last_in_tails(consumer, TOPIC, [0, 1, 2], 1.0)  # type: ignore[arg-type]
    assert point.seq == 11
    # 2 records back, then 8 (to the log's start): partition 2 ran out at once.
    assert consumer.assignments == [{0: 5, 2: 0}, {0: 0}]


def test_no_adapters_record_anywhere_resumes_at_the_sources_start():
    consumer = Consumer({0: [None, None], 1: []})
    assert last_in_tails(consumer, TOPIC, [0, 1], 1.0) == ResumePoint()  # type: ignore[arg-type]


def test_a_partition_that_does_not_answer_is_an_error_not_a_start_from_scratch():
    class Silent(Consumer):
        def poll(self, timeout: float) -> Message | None:
            return None

    with pytest.raises(Exception, match=r"no answer reading p\.in"):
        last_in_tails(Silent({0: [adapter_record(1)]}), TOPIC, [0], 0.1)  # type: ignore[arg-type]
