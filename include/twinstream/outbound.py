"""Kafka side of the gate: the fencing transactional publisher and the reader of the last
committed msg_id."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from twinstream.config import Settings
from twinstream.gate import Fenced, TransientPublishError
from twinstream.hostmetrics import Output
from twinstream.kafka import consumer_config, producer_config

if TYPE_CHECKING:
    from confluent_kafka._types import HeadersType

log = logging.getLogger(__name__)
MSG_ID_HEADER = "msg_id"


class KafkaPublisher:
    """Publishes to the outbound and dead-letter topics in one transaction per call.

    Constructing it runs init_transactions on the pipeline's shared transactional id, which
    aborts any transaction an earlier holder left open and fences that holder's producer.
    """

    def __init__(self, settings: Settings, engine_id: str, timeout_s: float = 10.0) -> None:
        self._settings = settings
        self._engine_id = engine_id.encode()
        self._timeout_s = timeout_s
        self._producer = Producer(
            producer_config(
                settings,
                **{
                    "transactional.id": settings.transactional_id,
                    # An active that dies mid-transaction is fenced by the next init anyway;
                    # the broker-side timeout only bounds an orphan nobody replaces.
                    "transaction.timeout.ms": 10_000,
                    "client.id": f"twinstream-{settings.pipeline}-{engine_id}",
                },
            )
        )
        try:
            self._producer.init_transactions(timeout_s)
        except KafkaException as exc:
            self._producer = None  # type: ignore[assignment]
            raise TransientPublishError(f"init_transactions failed: {exc}") from exc

    def publish(self, rows: Sequence[Output], epoch: int) -> None:
        topics = {"out": self._settings.outbound_topic, "dlq": self._settings.dlq_topic}
        epoch_header = str(epoch).encode()
        try:
            self._producer.begin_transaction()
            for row in rows:
                self._producer.produce(
                    topics[row.kind],
                    key=row.key.encode() if row.key is not None else None,
                    value=row.value.encode(),
                    headers=[
                        (MSG_ID_HEADER, str(row.msg_id).encode()),
                        ("engine_id", self._engine_id),
                        ("epoch", epoch_header),
                    ],
                )
                # Serve delivery reports so the local queue never fills on large batches.
                self._producer.poll(0)
            self._producer.commit_transaction(self._timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or error.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            ):
                raise Fenced(str(error)) from exc
            self._abort()
            raise TransientPublishError(str(error)) from exc
        except BufferError as exc:
            self._abort()
            raise TransientPublishError(f"local queue full: {exc}") from exc

    def _abort(self) -> None:
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as exc:
            log.warning("abort_transaction failed: %s", exc)

    def close(self) -> None:
        # No flush: anything unsent belongs to an uncommitted transaction, which the broker
        # aborts when the next active initialises the transactional id.
        self._producer = None  # type: ignore[assignment]


def header(headers: HeadersType | None, name: str) -> str | None:
    """One header's value as text, whichever shape confluent_kafka returned them in."""
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for key, value in pairs:
        if key == name and value is not None:
            return value.decode() if isinstance(value, bytes) else value
    return None


def last_msg_id(settings: Settings, topic: str, timeout_s: float = 10.0) -> int | None:
    """The msg_id of the last committed record of a one-partition topic (read_committed),
    read from its header: offsets cannot be counted, transaction markers leave holes."""
    consumer = Consumer(
        consumer_config(
            settings,
            f"twinstream-lastread-{uuid.uuid4()}",
            **{"enable.partition.eof": True},
        )
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)
        span = 64
        while True:
            start = max(low, high - span)
            found = _scan(consumer, topic, start, timeout_s)
            if found is not None or start == low:
                return found
            span *= 8  # only transaction markers or aborted records there: look further back
    finally:
        consumer.close()


def _scan(consumer: Consumer, topic: str, start: int, timeout_s: float) -> int | None:
    consumer.assign([TopicPartition(topic, 0, start)])
    found = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return found
            raise KafkaException(error)
        value = header(msg.headers(), MSG_ID_HEADER)
        if value is not None:
            found = int(value)
    raise TimeoutError(f"reading the tail of {topic} did not reach its end in {timeout_s}s")


def last_published(settings: Settings) -> int:
    """The last msg_id committed to the outbound or dead-letter topic; when both are empty,
    the offset before the inbound topic's first retained record (-1 for a new topic)."""
    found = [last_msg_id(settings, t) for t in (settings.outbound_topic, settings.dlq_topic)]
    known = [f for f in found if f is not None]
    if known:
        return max(known)
    consumer = Consumer(consumer_config(settings, f"twinstream-lastread-{uuid.uuid4()}"))
    try:
        low, _ = consumer.get_watermark_offsets(
            TopicPartition(settings.inbound_topic, 0), timeout=10
        )
    finally:
        consumer.close()
    return low - 1
