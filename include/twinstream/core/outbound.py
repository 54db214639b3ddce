"""Kafka side of the gate: the fencing transactional publisher and the reader of the last
committed msg_id of each partition.

Guarantee: a row of inbound partition p goes to partition p of the outbound or dead-letter
topic, and each transaction writes, to partition p of the progress topic, one progress
record per partition it has rows of; so the tail of partition p of the three topics says
how far partition p has been published (the topics have as many partitions as the inbound
one: `twinstream.platform.kafka.topic_specs`)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from twinstream.core.agreement import DigestCost, PublishedRange, digest
from twinstream.core.gate import Fenced, TransientPublishError, by_partition
from twinstream.core.logs import EngineLog
from twinstream.core.rows import DLQ, NONE, OUT, Output, dead_letter, encode
from twinstream.platform.connections import KafkaConnection, PipelineTopics

if TYPE_CHECKING:
    from confluent_kafka._types import HeadersType

log = logging.getLogger(__name__)
MSG_ID_HEADER = "msg_id"
# The version of the code that computed a record (twinstream.platform.versions).
VERSION_HEADER = "version"

# Errors that say a record itself cannot be written, whatever the cluster's state: retrying
# it would fail the same way forever.
REFUSALS = {
    # Also what librdkafka's produce() raises for a record over message.max.bytes.
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,
    KafkaError._INVALID_ARG,
}


def is_refusal(error: object) -> bool:
    return isinstance(error, KafkaError) and error.code() in REFUSALS


# Errors that say this engine's Kafka user may not do what publishing needs: no retry fixes
# them, a grant or a password does (and then the next batch goes through, no restart).
ACCESS_DENIED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._AUTHENTICATION,
}


class AccessDenied(RuntimeError):
    """Kafka refuses this engine's user what it needs; the message names the fix."""


def access_denied(error: KafkaError, kafka: KafkaConnection, pipeline: str) -> str | None:
    """What to do about an error that denies this engine access, or None for any other."""
    if error.code() not in ACCESS_DENIED:
        return None
    return (
        f"Kafka denies pipeline {pipeline}'s engine user ({error.name()}): its "
        "users and ACLs are made by `make up` (twinstream.platform.kafka_auth.provision); "
        f"check that {kafka.credentials_path} holds the password Kafka knows"
    )


class KafkaPublisher:
    """Publishes to the outbound and dead-letter topics in one transaction per call, closed
    by a progress record (the msg_id range it covers) on the progress topic.

    `fence()` runs init_transactions on the pipeline's shared transactional id, which aborts
    any transaction an earlier holder left open and fences that holder's producer. A standby
    builds its publisher ahead of time (connections, metadata) and fences only on winning.
    """

    def __init__(
        self,
        kafka: KafkaConnection,
        topics: PipelineTopics,
        engine_id: str,
        max_message_bytes: int,
        timeout_s: float = 10.0,
        digest_cost: DigestCost | None = None,
        version: str = "",
    ) -> None:
        self._kafka = kafka
        # The version of the code that computed the rows (twinstream.platform.versions): a
        # header of every record and progress record, so that the output says which code
        # computed what. "": none given.
        self._version = version.encode()
        self._topics = topics
        # Time spent digesting the published rows (the agreement check's cost on the
        # active), shared by an engine's successive publishers.
        self.digest_cost = digest_cost or DigestCost()
        self._max_message_bytes = max_message_bytes
        self._engine_id = engine_id.encode()
        self._log = EngineLog(log, engine_id, topics.pipeline)
        self._timeout_s = timeout_s
        self._unsettled = False
        self._producer = Producer(
            kafka.producer(
                **{
                    "transactional.id": topics.transactional_id,
                    # An active that dies mid-transaction is fenced by the next init anyway;
                    # the broker-side timeout only bounds an orphan nobody replaces.
                    "transaction.timeout.ms": 10_000,
                    # Under the transaction timeout: in an outage a record fails within it,
                    # so a commit is settled (committed, or aborted and retried) in bounded
                    # time instead of waiting out the default 300 s.
                    "message.timeout.ms": 9_000,
                    "client.id": f"twinstream-{topics.pipeline}-{engine_id}",
                    # The rows are sized for this limit (twinstream.core.rows); the topics accept
                    # a little more (twinstream.platform.kafka.topic_specs).
                    "message.max.bytes": max_message_bytes,
                },
            )
        )
        # Connect and fetch metadata now, so that fence() is one round trip to the coordinator.
        self._producer.list_topics(timeout=timeout_s)

    def fence(self) -> KafkaPublisher:
        """init_transactions, again while the error is retriable, for up to a minute: the
        coordinator answers CONCURRENT_TRANSACTIONS until it has aborted the previous
        holder's open transaction, which it cannot do while a partition of it lacks its
        in-sync replicas (an outage). Giving up sooner only hands the election to the other
        engine, which meets the same wait."""
        deadline = time.monotonic() + 6 * self._timeout_s
        while True:
            try:
                self._producer.init_transactions(self._timeout_s)
                return self
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                denied = access_denied(error, self._kafka, self._topics.pipeline)
                if denied is not None:
                    self._log.error("%s", denied)
                    raise TransientPublishError(denied) from exc
                if not error.retriable() or time.monotonic() > deadline:
                    raise TransientPublishError(f"init_transactions failed: {exc}") from exc
                self._log.warning(
                    "init_transactions: %s; trying again",
                    error,
                )

    def publish(self, rows: Sequence[Output], epoch: int) -> None:
        """Write `rows` in one transaction. A row that Kafka refuses for what it is (too
        large, invalid) rather than for the cluster's state is replaced by its dead letter
        and the transaction retried once: one record never stalls the others."""
        rows = list(rows)
        refused: dict[tuple[int, int], KafkaError] = {}
        # The digests of the rows as computed (twinstream.core.agreement), before any is
        # replaced by its dead letter below: the standbys computed the same rows.
        started = time.perf_counter()
        digests = {p: digest(group) for p, group in by_partition(rows).items()}
        self.digest_cost.seconds += time.perf_counter() - started
        self.digest_cost.rows += len(rows)
        try:
            self._transaction(rows, epoch, refused, digests)
        except TransientPublishError:
            if not refused:
                raise
            rows = self._replace_refused(rows, refused)
            self._log.error(
                "Kafka refused msg_id %s (%s); publishing their dead letters instead",
                ", ".join(f"{p}:{o}" if p else str(o) for p, o in sorted(refused)),
                "; ".join(sorted({e.name() for e in refused.values()})),
            )
            self._transaction(rows, epoch, {}, digests)

    def _replace_refused(
        self, rows: list[Output], refused: dict[tuple[int, int], KafkaError]
    ) -> list[Output]:
        """Each msg_id with a refused row gets one dead letter instead of all its rows (a
        fan-out is published whole or not at all)."""
        replaced: list[Output] = []
        for row in rows:
            if row.position not in refused:
                replaced.append(row)
            elif not replaced or replaced[-1].position != row.position:
                replaced.append(self._dead_letter(row, refused[row.position]))
        return replaced

    def _dead_letter(self, row: Output, error: KafkaError) -> Output:
        return dead_letter(
            row.msg_id,
            f"unpublishable: {error.name()}: {error.str()}",
            row.value.encode("utf-8", "backslashreplace"),
            # Half the limit: a dead letter of a refused row must not be refused in turn.
            self._max_message_bytes // 2,
            row.partition,
        )

    def _transaction(
        self,
        rows: list[Output],
        epoch: int,
        refused: dict[tuple[int, int], KafkaError],
        digests: dict[int, str],
    ) -> None:
        topics = {OUT: self._topics.outbound, DLQ: self._topics.dlq}
        epoch_header = str(epoch).encode()
        if not rows:
            return

        def headers(msg_id: int) -> list[tuple[str, bytes]]:
            found = [
                (MSG_ID_HEADER, str(msg_id).encode()),
                ("engine_id", self._engine_id),
                ("epoch", epoch_header),
            ]
            if self._version:
                found.append((VERSION_HEADER, self._version))
            return found

        def delivered(position: tuple[int, int]) -> Callable[[KafkaError | None, object], None]:
            def report(error: KafkaError | None, _msg: object) -> None:
                if error is not None and is_refusal(error):
                    refused[position] = error

            return report

        if self._unsettled:
            self._abort()  # the last transaction's abort did not go through
            if self._unsettled:
                raise TransientPublishError("the previous transaction is not settled yet")
        try:
            self._producer.begin_transaction()
            for row in rows:
                if row.kind == NONE:
                    continue  # covered by the transaction's progress record
                try:
                    self._produce(
                        topics[row.kind],
                        partition=row.partition,
                        key=row.key.encode() if row.key is not None else None,
                        value=row.value.encode(),
                        headers=headers(row.msg_id),
                        on_delivery=delivered(row.position),
                    )
                except KafkaException as exc:
                    # librdkafka refuses some records before sending (too large): the
                    # transaction cannot hold every row, so it is abandoned below.
                    if not is_refusal(exc.args[0]):
                        raise
                    refused[row.position] = exc.args[0]
                except UnicodeEncodeError as exc:
                    refused[row.position] = KafkaError(KafkaError.INVALID_RECORD, str(exc))
                # Serve delivery reports so the local queue never fills on large batches.
                self._producer.poll(0)
            if refused:
                raise TransientPublishError(f"{len(refused)} record(s) refused")
            for partition, group in sorted(by_partition(rows).items()):
                self._produce(
                    self._topics.progress,
                    partition=partition,
                    key=None,
                    value=progress_record(group, digests.get(partition)).encode(),
                    headers=headers(group[-1].msg_id),
                )
            self._commit()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            denied = access_denied(error, self._kafka, self._topics.pipeline)
            if denied is not None:
                # Said as what it is, whatever happens next: a producer librdkafka gave up on
                # (fatal) is replaced through the election, like a fenced one; otherwise the
                # rows are held and the next batch tries again (a grant needs no restart).
                self._log.error("%s", denied)
                if error.fatal():
                    raise Fenced(denied) from exc
                self._abort()
                raise TransientPublishError(denied) from exc
            if error.fatal() or error.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            ):
                raise Fenced(f"the producer failed for good: {error}") from exc
            self._abort()
            raise TransientPublishError(str(error)) from exc
        except BufferError as exc:
            self._abort()
            raise TransientPublishError(f"local queue full: {exc}") from exc
        except TransientPublishError:
            self._abort()
            raise

    def _produce(self, topic: str, **record: Any) -> None:
        """produce(), waiting for room in librdkafka's local queue: a takeover after an
        outage publishes up to max_buffered_msgs rows in one transaction, more than the
        queue holds (100,000 messages by default)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._producer.produce(topic, **record)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise
                self._producer.poll(0.05)

    def _commit(self) -> None:
        """commit_transaction as librdkafka's transactional API asks: a retriable error
        (the commit timed out, records still in flight) means commit again, the same
        transaction; anything else is raised for the caller to abort. An outage resolves
        a commit within message.timeout.ms (the records fail, the commit with them)."""
        deadline = time.monotonic() + 2 * self._timeout_s
        while True:
            try:
                self._producer.commit_transaction(self._timeout_s)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.fatal() or not error.retriable() or time.monotonic() > deadline:
                    raise
                log.info("commit_transaction: %s; committing again", error)

    def _abort(self) -> None:
        """abort_transaction, again while the error is retriable (an abort, too, waits for
        records in flight). If it still fails, the next transaction first tries again: the
        coordinator cannot finish an abort while a partition of the transaction lacks its
        in-sync replicas, and the gate's lock must not be held for a whole outage. A fatal
        error (after a 3-minute outage the coordinator had timed the transaction out and
        bumped the epoch: INVALID_TXN_STATE) leaves this producer unusable for good:
        Fenced, so that the engine rejoins the election and fences with a new one."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._producer.abort_transaction(self._timeout_s)
                self._unsettled = False
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.code() == KafkaError._STATE:
                    self._unsettled = False  # no transaction in progress: nothing to abort
                    return
                if error.fatal():
                    raise Fenced(f"the producer failed for good: {error}") from exc
                if error.retriable() and time.monotonic() < deadline:
                    continue
                log.warning("abort_transaction failed: %s; trying again first next time", error)
                self._unsettled = True
                return

    def close(self) -> None:
        # No flush: anything unsent belongs to an uncommitted transaction, which the broker
        # aborts when the next active initialises the transactional id.
        self._producer = None  # type: ignore[assignment]


def progress_record(rows: Sequence[Output], rows_digest: str | None = None) -> str:
    """What one transaction covers in one partition (`rows` are that partition's): every
    msg_id from `first` to `last` has its rows in this transaction (outputs, dead letters)
    or had none; with the counts, for the audit, and the rows' digest, for the standbys'
    agreement check (twinstream.core.agreement). The records of partition p of the progress
    topic tile the offsets of inbound partition p, each exactly once."""
    record: dict[str, object] = {
        "first": rows[0].msg_id,
        "last": rows[-1].msg_id,
        "outputs": sum(r.kind == OUT for r in rows),
        "dead_letters": sum(r.kind == DLQ for r in rows),
    }
    if rows_digest is not None:
        record["digest"] = rows_digest
    return encode(record)


def header(headers: HeadersType | None, name: str) -> str | None:
    """One header's value as text, whichever shape confluent_kafka returned them in."""
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for key, value in pairs:
        if key == name and value is not None:
            return value.decode() if isinstance(value, bytes) else value
    return None


class LastPublishedReader:
    """Finds each inbound partition's last msg_id committed to the progress, outbound or
    dead-letter topic (read_committed), from the records' headers in that partition of
    each: offsets cannot be counted, transaction markers leave holes.

    One consumer, created ahead of time and reused: a standby keeps it connected so that a
    takeover does not pay for a new client's bootstrap and metadata round trips.
    """

    def __init__(
        self, kafka: KafkaConnection, topics: PipelineTopics, timeout_s: float = 10.0
    ) -> None:
        self._kafka = kafka
        self._topics = topics
        self._timeout_s = timeout_s
        # The inbound topic's partitions, read once: msg_ids are offsets of these, and a
        # partition added later would need every engine restarted anyway.
        self._partitions: list[int] | None = None
        self._consumer = Consumer(
            kafka.consumer(
                f"twinstream-lastread-{uuid.uuid4()}",
                **{
                    "enable.partition.eof": True,
                    # The end of a partition is only known when a fetch comes back empty;
                    # the broker would hold an empty fetch for 500 ms by default.
                    "fetch.wait.max.ms": 10,
                },
            )
        )

    def __call__(self) -> dict[int, int]:
        """Each inbound partition's last committed msg_id; for a partition with nothing
        published, the offset before its first retained record (-1 for a new topic)."""
        t = self._topics
        partitions = self.partitions()
        # The progress record closes every transaction; the outputs are read too for the
        # transactions published before progress records existed.
        topics = [t.progress, t.outbound, t.dlq]
        found = self.last_msg_ids(topics, partitions)
        last: dict[int, int] = {}
        for partition in partitions:
            known = [v for (_, p), v in found.items() if p == partition and v is not None]
            if known:
                last[partition] = max(known)
                continue
            low, _ = self._consumer.get_watermark_offsets(
                TopicPartition(t.inbound, partition), timeout=self._timeout_s
            )
            last[partition] = int(low) - 1
        return last

    def partitions(self) -> list[int]:
        """The inbound topic's partitions."""
        if self._partitions is None:
            topic = self._topics.inbound
            meta = self._consumer.list_topics(topic, timeout=self._timeout_s).topics[topic]
            if meta.error is not None:
                denied = access_denied(meta.error, self._kafka, self._topics.pipeline)
                # Said with the fix: an engine that may not read its inbound topic stops
                # here, at its start, before anything else.
                raise KafkaException(meta.error) if denied is None else AccessDenied(denied)
            self._partitions = sorted(meta.partitions)
        return self._partitions

    def last_msg_ids(
        self, topics: list[str], partitions: list[int]
    ) -> dict[tuple[str, int], int | None]:
        """The last committed msg_id of each of `partitions` of each topic, read together."""
        keys = [(t, p) for t in topics for p in partitions]
        marks = {
            k: self._consumer.get_watermark_offsets(TopicPartition(*k), timeout=self._timeout_s)
            for k in keys
        }
        found: dict[tuple[str, int], int | None] = dict.fromkeys(keys)
        span = 64
        todo = list(keys)
        while todo:
            starts = {k: max(marks[k][0], marks[k][1] - span) for k in todo}
            scanned = self._scan(starts)
            found.update(scanned)
            # Only transaction markers or aborted records there: look further back.
            todo = [k for k in todo if scanned[k] is None and starts[k] > marks[k][0]]
            span *= 8
        return found

    def _scan(self, starts: dict[tuple[str, int], int]) -> dict[tuple[str, int], int | None]:
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
        found: dict[tuple[str, int], int | None] = dict.fromkeys(starts)
        open_ = set(starts)
        deadline = time.monotonic() + self._timeout_s
        try:
            while open_:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"reading the tails of {sorted(open_)} did not reach their end "
                        f"in {self._timeout_s}s"
                    )
                msg = self._consumer.poll(0.1)
                if msg is None:
                    continue
                key = (msg.topic() or "", msg.partition() or 0)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_.discard(key)
                        continue
                    raise KafkaException(error)
                value = header(msg.headers(), MSG_ID_HEADER)
                if value is not None and key in found:
                    found[key] = int(value)
        finally:
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()


def published_range(
    partition: int, value: bytes | str | None, headers: HeadersType | None, timestamp_ms: int
) -> PublishedRange | None:
    """A progress record as the range it covers (None: not one, e.g. unreadable)."""
    try:
        record = json.loads(value or b"")
        epoch = header(headers, "epoch")
        return PublishedRange(
            partition,
            int(record["first"]),
            int(record["last"]),
            record.get("digest"),
            None if epoch is None else int(epoch),
            header(headers, "engine_id"),
            timestamp_ms,
            header(headers, VERSION_HEADER),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class ProgressFollower:
    """Reads the progress topic as it is written (read_committed), every partition: the
    ranges the active publishes, for a standby's agreement check
    (twinstream.core.agreement). Starts at the topic's end: what was published before is
    checked by no one (the standby's buffer did not survive its restart anyway)."""

    def __init__(self, kafka: KafkaConnection, topics: PipelineTopics, engine_id: str) -> None:
        self._topics = topics
        self._consumer = Consumer(
            kafka.consumer(
                f"twinstream-agreement-{topics.pipeline}-{engine_id}-{uuid.uuid4()}",
                # A standby looks once a second; an empty fetch need not wait 500 ms.
                **{"fetch.wait.max.ms": 100},
            )
        )
        self._assigned = False

    def start(self, partitions: list[int]) -> None:
        """Follow from the end of each partition (the records published from now on)."""
        self._consumer.assign(
            [TopicPartition(self._topics.progress, p, OFFSET_END) for p in partitions]
        )
        self._assigned = True

    def stop(self) -> None:
        if self._assigned:
            self._consumer.unassign()
            self._assigned = False

    def poll(self, max_records: int = 10_000) -> list[PublishedRange]:
        """The ranges published since the last poll (at most `max_records`; the rest next
        time), without waiting."""
        if not self._assigned:
            return []
        found: list[PublishedRange] = []
        while len(found) < max_records:
            batch = self._consumer.consume(num_messages=500, timeout=0)
            if not batch:
                break
            for msg in batch:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("progress topic: %s", error)
                    continue
                _kind, timestamp_ms = msg.timestamp()
                r = published_range(msg.partition() or 0, msg.value(), msg.headers(), timestamp_ms)
                if r is not None:
                    found.append(r)
        return found

    def close(self) -> None:
        self._consumer.close()


def read_published_rows(
    kafka: KafkaConnection, topics: PipelineTopics, r: PublishedRange, timeout_s: float = 30.0
) -> list[Output]:
    """The committed rows of msg_id r.first..r.last of r.partition in the outbound and
    dead-letter topics (a difference's read-back). They were written in the transaction
    the range's progress record closed: the read starts a few minutes of timestamps before
    it and ends at each partition's end."""
    consumer = Consumer(
        kafka.consumer(
            f"twinstream-readback-{uuid.uuid4()}",
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 10},
        )
    )
    kinds = {topics.outbound: OUT, topics.dlq: DLQ}
    # A transaction may take minutes to commit in an outage; its records carry the time
    # they were produced.
    since_ms = max(0, r.timestamp_ms - 600_000)
    found: list[Output] = []
    try:
        wanted = [TopicPartition(t, r.partition, since_ms) for t in kinds]
        starts = consumer.offsets_for_times(wanted, timeout=timeout_s)
        ends = {
            t: consumer.get_watermark_offsets(TopicPartition(t, r.partition), timeout=timeout_s)[1]
            for t in kinds
        }
        assign = [tp for tp in starts if tp.offset >= 0 and tp.offset < ends[tp.topic]]
        if not assign:
            return []
        consumer.assign(assign)
        open_ = {tp.topic for tp in assign}
        deadline = time.monotonic() + timeout_s
        while open_ and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_.discard(msg.topic() or "")
                    continue
                raise KafkaException(error)
            value = header(msg.headers(), MSG_ID_HEADER)
            if value is None or not r.first <= int(value) <= r.last:
                continue
            key = msg.key()
            payload = msg.value() or b""
            found.append(
                Output(
                    int(value),
                    kinds[msg.topic() or ""],
                    None if key is None else key.decode("utf-8", "backslashreplace"),
                    payload.decode("utf-8", "backslashreplace"),
                    r.partition,
                )
            )
    finally:
        consumer.close()
    return found
