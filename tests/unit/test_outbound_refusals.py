"""A record Kafka refuses for what it is becomes its dead letter; it never stalls the
others (today's loss of the whole output behind one oversize dead letter)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import twinstream.outbound as outbound
from twinstream.config import Settings
from twinstream.gate import TransientPublishError
from twinstream.rows import Output


class FakeProducer:
    """Refuses values over `limit` at produce(), as librdkafka does over message.max.bytes,
    and records what each transaction committed."""

    def __init__(self, config: dict[str, Any], down: bool = False) -> None:
        self.limit = int(config["message.max.bytes"])
        self.down = down
        self.pending: list[tuple[str, bytes]] = []
        self.committed: list[list[tuple[str, bytes]]] = []
        self.aborted = 0

    def list_topics(self, timeout: float) -> None: ...
    def begin_transaction(self) -> None:
        self.pending = []

    def produce(self, topic: str, key: bytes | None, value: bytes, **_: Any) -> None:
        if len(value) > self.limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        self.pending.append((topic, value))

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "brokers down"))
        self.committed.append(self.pending)

    def abort_transaction(self, timeout: float) -> None:
        self.aborted += 1


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> tuple[outbound.KafkaPublisher, FakeProducer]:
    made: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(outbound, "Producer", producer)
    settings = Settings(max_message_bytes=16_384)
    return outbound.KafkaPublisher(settings, "a"), made[0]


def test_a_refused_row_is_replaced_by_its_dead_letter_and_the_rest_commit(publisher):
    pub, producer = publisher
    rows = [
        Output(1, "out", "h", "small"),
        Output(2, "out", "h", "x" * 20_000),  # over the 16,384-byte limit
        Output(3, "out", "h", "small too"),
    ]
    pub.publish(rows, epoch=1)
    [committed] = producer.committed
    assert [t for t, _ in committed] == ["hostmetrics.out", "hostmetrics.dlq", "hostmetrics.out"]
    letter = json.loads(committed[1][1])
    assert letter["msg_id"] == 2
    assert letter["reason"].startswith("unpublishable: MSG_SIZE_TOO_LARGE")
    assert letter["truncated"] is True
    assert letter["raw_bytes"] == 20_000
    assert producer.aborted == 1


def test_a_cluster_outage_stays_a_transient_error_with_nothing_replaced(publisher):
    pub, producer = publisher
    producer.down = True
    with pytest.raises(TransientPublishError):
        pub.publish([Output(1, "out", "h", "small")], epoch=1)
    assert producer.committed == []
