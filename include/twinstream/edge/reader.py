"""Reading the outbound and dead-letter topics as a subscriber does: read_committed.

Guarantees: a reader sees only committed records, in offset order within each partition;
librdkafka's own log lines go to Python logging at DEBUG (twinstream.platform.kafka.LibrdkafkaLog),
never to the terminal, and a failure librdkafka cannot recover from by itself (a login
Kafka refuses, a topic the user may not read, no broker answering, no such topic) ends
the read with a ReadFailed that names the fix, never an empty result.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from twinstream.core.outbound import MSG_ID_HEADER, VERSION_HEADER, header
from twinstream.platform.kafka import LibrdkafkaLog, consumer_config, kafka_user
from twinstream.platform.settings import CommonSettings

log = logging.getLogger(__name__)

# A login Kafka refuses: librdkafka retries it forever, so a reader would wait in silence.
AUTHENTICATION = {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}


# How long a reader of every partition waits for the topic's metadata.
METADATA_TIMEOUT_S = 15.0


class ReadFailed(RuntimeError):
    """A read that cannot go on; the message says what to do."""


class _Errors:
    """The consumer's error_cb: librdkafka reports here what it retries by itself (a broker
    connection that dropped) and what it cannot fix (a refused login); which it was shows
    only when nothing arrives, so each is kept and logged at DEBUG."""

    def __init__(self) -> None:
        self.last: KafkaError | None = None
        self.denied: KafkaError | None = None
        self.denials = 0

    def __call__(self, error: KafkaError) -> None:
        log.debug("Kafka client error: %s", error)
        self.last = error
        if error.code() in AUTHENTICATION or error.code() in AUTHORIZATION:
            self.denied = error
            self.denials += 1


def said(error: KafkaError | None) -> str:
    """An error as one line: its name and librdkafka's text."""
    return "no answer" if error is None else f"{error.name()}: {error.str()}"


def failure(settings: CommonSettings, topic: str, error: KafkaError | None) -> ReadFailed:
    """What to do about `error`, met reading `topic` (None: nothing answered at all)."""
    user = kafka_user(settings) if settings.kafka_security else "the client"
    code = error.code() if error is not None else None
    if code in AUTHENTICATION:
        return ReadFailed(
            f"Kafka refuses the login of {user} ({said(error)}): `make up` gives every pipeline "
            f"user the password in {settings.kafka_credentials_path}; run it, or set "
            "TWINSTREAM_KAFKA_CREDENTIALS_FILE to the file the stack was made with"
        )
    if code in AUTHORIZATION:
        return ReadFailed(
            f"Kafka denies {user} reading {topic} ({said(error)}): a pipeline's reader may read "
            "its own .out, .dlq and .progress only (`twinstream kafka-config --role reader` "
            "lists them)"
        )
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return ReadFailed(
            f"topic {topic} does not exist: `make up` makes every pipeline's topics (is "
            f"pipeline {settings.pipeline} in {settings.pipelines_file}?)"
        )
    return ReadFailed(
        f"no Kafka broker answers at {settings.bootstrap_servers}"
        + (f" ({said(error)})" if error is not None else "")
        + ": start the stack (`make up`), or set TWINSTREAM_KAFKA_BOOTSTRAP to its brokers"
    )


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
    # The version of the pipeline's code that computed it (its `version` header), if any.
    version: str | None = None

    @property
    def value(self) -> str:
        return self.raw.decode("utf-8", errors="replace")


def read_committed(
    settings: CommonSettings,
    topic: str,
    start_offset: int | Mapping[int, int] = 0,
    idle_timeout_s: float = 5.0,
    max_records: int | None = None,
    follow: bool = False,
    partition: int | None = 0,
) -> Iterator[Record]:
    """Committed records of one partition of a topic from `start_offset` (`partition`
    None: of every partition, each from `start_offset`, in no order across partitions; a
    mapping partition -> offset: of those partitions, each from its own offset, or with
    `partition` None of every partition, those not in it from their start).
    Stops at the end of the partitions (or, with `follow`, after `idle_timeout_s` without a
    record). Raises ReadFailed, naming the fix, when Kafka refuses the read or nothing
    answers within `idle_timeout_s` after librdkafka reported a refusal."""
    errors = _Errors()
    consumer = Consumer(
        consumer_config(
            settings,
            f"twinstream-subscribe-{uuid.uuid4()}",
            **{"enable.partition.eof": True, "logger": LibrdkafkaLog(), "error_cb": errors},
        )
    )
    seen = 0
    # Whether any broker has answered this consumer (metadata, a record, a partition's
    # end): a refusal reported before then is why nothing arrives.
    answered = False
    try:
        if partition is None:
            every = partitions(consumer, settings, topic, errors)
            answered = True
            if isinstance(start_offset, Mapping):
                unknown = sorted(set(start_offset) - set(every))
                if unknown:
                    raise ValueError(
                        f"{topic} has no partition {unknown[0]}: it has {len(every)} "
                        f"(0..{len(every) - 1})"
                    )
                starts = {p: start_offset.get(p, OFFSET_BEGINNING) for p in every}
            else:
                starts = dict.fromkeys(every, start_offset)
        elif isinstance(start_offset, Mapping):
            starts = dict(start_offset)
        else:
            starts = {partition: start_offset}
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        open_ = set(starts)
        idle_since = time.monotonic()
        while max_records is None or seen < max_records:
            msg = consumer.poll(0.5)
            if msg is None:
                if time.monotonic() - idle_since > idle_timeout_s:
                    if not answered and errors.denied is not None:
                        raise failure(settings, topic, errors.denied)
                    return
                continue
            answered = True
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_.discard(msg.partition() or 0)
                    if not follow and not open_:
                        return
                    continue
                if error.code() in AUTHENTICATION or error.code() in AUTHORIZATION:
                    raise failure(settings, topic, error)
                raise KafkaException(error)
            idle_since = time.monotonic()
            headers = msg.headers()
            msg_id, engine, epoch, version = (
                header(headers, h) for h in (MSG_ID_HEADER, "engine_id", "epoch", VERSION_HEADER)
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
                version=version,
            )
    finally:
        consumer.close()


def partitions(
    consumer: Consumer, settings: CommonSettings, topic: str, errors: _Errors
) -> list[int]:
    """The topic's partitions, from the brokers; ReadFailed naming the fix if they cannot
    say (no broker answers, the login or the topic refused, no such topic). Asked in short
    tries: a login refused by more connections than there are brokers is not a dropped
    connection, and waiting out the whole budget would not change it."""
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    brokers = len(settings.bootstrap_servers.split(","))
    while True:
        try:
            meta = consumer.list_topics(topic, timeout=1.0).topics[topic]
            break
        except KafkaException as exc:
            consumer.poll(0)  # serve the error_cb: why no broker answered, if librdkafka knows
            if errors.denials > brokers or time.monotonic() >= deadline:
                raise failure(
                    settings, topic, errors.denied or errors.last or exc.args[0]
                ) from None
    if meta.error is not None:
        raise failure(settings, topic, meta.error)
    if not meta.partitions:
        raise failure(settings, topic, KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    return sorted(meta.partitions)
