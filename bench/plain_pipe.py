"""The ceiling for bench/drain.py: one plain confluent-kafka process with the pair's
transform and none of its machinery.

It reads the inbound backlog from its first offset, puts every record through the
hostmetrics example's own logic (`pipelines.hostmetrics.logic`: the same per-host window
of 20 events and the same JSON output the pair computes, here in a dict in this process's
memory), and writes one output record per input, in Kafka transactions of up to `batch`
inputs that also carry the consumer's position (exactly-once, as Kafka's
consume-transform-produce loop does it). What it leaves out is what Twinstream adds: no
Spark (no state store, no checkpoint, no micro-batch planning), no standby, no election,
no dead-letter reasons beyond "not valid", no failover. A record the logic rejects goes
to the output as a dead letter all the same, so every input gives one output record.

    .venv/bin/python -m bench.plain_pipe INBOUND OUTBOUND TOTAL [PARTITIONS]  # TWINSTREAM_*

TOTAL is the backlog's record count over every inbound partition; PARTITIONS (1 unless
given, as bench/drain.py's backlog) the inbound partitions it reads, one consumer for all.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipelines.hostmetrics.logic import Event, Overflow, Window, parse_time, step
from twinstream.platform.kafka import consumer_config, producer_config
from twinstream.platform.settings import Settings, load_settings

RETENTION_MS = 60 * 60 * 1000  # the pair's default window retention


def transform(
    windows: dict[str, Window], msg_id: int, value: bytes | None
) -> tuple[str | None, str]:
    """(key, value) of the one output of a record: its window's output, or a dead letter."""
    try:
        doc: Any = json.loads(value or b"")
        event = Event(
            msg_id=msg_id,
            host=str(doc["host"]),
            ts=str(doc["ts"]),
            ts_ms=parse_time(str(doc["ts"])),
            cpu_user=float(doc["cpu_user"]),
            cpu_system=float(doc["cpu_system"]),
            mem_used_mb=int(doc["mem_used_mb"]),
            mem_free_mb=int(doc["mem_free_mb"]),
        )
        window, output = step(windows.get(event.host), event, RETENTION_MS)
    except (ValueError, KeyError, TypeError, Overflow) as exc:
        return None, json.dumps({"msg_id": msg_id, "reason": f"invalid: {exc}"})
    windows[event.host] = window
    return output.key, output.value


def drain(
    settings: Settings,
    inbound: str,
    outbound: str,
    total: int,
    batch: int = 5_000,
    partitions: int = 1,
) -> float:
    """Consume `total` records from the start of `inbound`'s first `partitions` partitions
    (offsets [0, total) of a single one) and publish their outputs; the seconds from the
    first record read to the last transaction committed. The backlog is written without
    transactions, so a partition's offsets count its records."""
    group = f"twinstream-plain-pipe-{uuid.uuid4()}"
    # Its position is committed inside each transaction (consumer_config never auto-commits).
    consumer = Consumer(consumer_config(settings, group))
    # Exactly-once output: a transaction per batch of inputs.
    producer = Producer(producer_config(settings, **{"transactional.id": group}))
    windows: dict[str, Window] = {}
    try:
        producer.init_transactions(30)
        consumer.assign([TopicPartition(inbound, p, 0) for p in range(partitions)])
        # The next offset of each partition: the position committed with each transaction.
        positions: dict[int, int] = {}
        started = None
        while sum(positions.values()) < total:
            messages = consumer.consume(batch, timeout=1.0)
            if not messages:
                continue
            started = started or time.monotonic()
            producer.begin_transaction()
            for message in messages:
                if message.error() is not None:
                    raise KafkaException(message.error())
                msg_id = int(message.offset() or 0)  # a consumed record always has one
                key, value = transform(windows, msg_id, message.value())
                producer.produce(
                    outbound,
                    key=key,
                    value=value,
                    headers=[("msg_id", str(msg_id).encode())],
                )
                producer.poll(0)
                positions[message.partition() or 0] = msg_id + 1
            producer.send_offsets_to_transaction(
                [TopicPartition(inbound, p, end) for p, end in positions.items()],
                consumer.consumer_group_metadata(),
                30,
            )
            producer.commit_transaction(60)
        return time.monotonic() - (started or time.monotonic())
    finally:
        producer.flush(10)
        consumer.close()


def main(argv: list[str]) -> int:
    inbound, outbound, total = argv[0], argv[1], int(argv[2])
    partitions = int(argv[3]) if len(argv) > 3 else 1
    seconds = drain(load_settings(), inbound, outbound, total, partitions=partitions)
    print(json.dumps({"events": total, "seconds": round(seconds, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
