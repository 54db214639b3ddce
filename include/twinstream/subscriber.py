"""Reading the outbound and dead-letter topics as a subscriber does: read_committed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from twinstream.config import Settings
from twinstream.core.outbound import MSG_ID_HEADER, header
from twinstream.kafka import consumer_config


@dataclass(frozen=True)
class Record:
    topic: str
    offset: int
    key: str | None
    raw: bytes
    msg_id: int | None
    engine_id: str | None
    epoch: int | None
    timestamp_ms: int
    # A record without a value (a tombstone), which `raw` shows as empty bytes.
    tombstone: bool = False
    partition: int = 0

    @property
    def value(self) -> str:
        return self.raw.decode("utf-8", errors="replace")


def read_committed(
    settings: Settings,
    topic: str,
    start_offset: int | Mapping[int, int] = 0,
    idle_timeout_s: float = 5.0,
    max_records: int | None = None,
    follow: bool = False,
    partition: int | None = 0,
) -> Iterator[Record]:
    """Committed records of one partition of a topic from `start_offset` (`partition`
    None: of every partition, each from `start_offset`, in no order across partitions; a
    mapping partition -> offset: of those partitions, each from its own offset).
    Stops at the end of the partitions (or, with `follow`, after `idle_timeout_s` without a
    record)."""
    consumer = Consumer(
        consumer_config(
            settings, f"twinstream-subscribe-{uuid.uuid4()}", **{"enable.partition.eof": True}
        )
    )
    seen = 0
    try:
        if isinstance(start_offset, Mapping):
            starts = dict(start_offset)
        elif partition is None:
            meta = consumer.list_topics(topic, timeout=15).topics[topic]
            if meta.error is not None:
                raise KafkaException(meta.error)
            starts = dict.fromkeys(sorted(meta.partitions), start_offset)
        else:
            starts = {partition: start_offset}
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        open_ = set(starts)
        idle_since = time.monotonic()
        while max_records is None or seen < max_records:
            msg = consumer.poll(0.5)
            if msg is None:
                if time.monotonic() - idle_since > idle_timeout_s:
                    return
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_.discard(msg.partition() or 0)
                    if not follow and not open_:
                        return
                    continue
                raise KafkaException(error)
            idle_since = time.monotonic()
            headers = msg.headers()
            msg_id, engine, epoch = (
                header(headers, h) for h in (MSG_ID_HEADER, "engine_id", "epoch")
            )
            key = msg.key()
            value = msg.value()
            seen += 1
            yield Record(
                topic=topic,
                offset=msg.offset() or 0,
                key=key.decode() if isinstance(key, bytes) else key,
                raw=value if isinstance(value, bytes) else b"",
                msg_id=int(msg_id) if msg_id is not None else None,
                engine_id=engine,
                epoch=int(epoch) if epoch is not None else None,
                timestamp_ms=msg.timestamp()[1],
                tombstone=value is None,
                partition=msg.partition() or 0,
            )
    finally:
        consumer.close()
