"""The transactional publisher against a fake producer: a record Kafka refuses for what it
is becomes its dead letter and never stalls the others; a commit that times out is
committed again, as librdkafka's transactional API asks, not aborted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

import twinstream.core.outbound as outbound
from twinstream.core.agreement import digest
from twinstream.core.gate import Fenced, TransientPublishError, by_partition
from twinstream.core.rows import Output, covered
from twinstream.platform.connections import KafkaConnection
from twinstream.platform.settings import Settings


class FakeProducer:
    """Refuses values over `limit` at produce(), as librdkafka does over message.max.bytes,
    and records what each transaction committed."""

    def __init__(self, config: dict[str, Any], down: bool = False) -> None:
        self.limit = int(config["message.max.bytes"])
        self.down = down
        self.pending: list[tuple[str, bytes]] = []
        self.committed: list[list[tuple[str, bytes]]] = []
        # (topic, partition, msg_id header) of every record produced, in order.
        self.placed: list[tuple[str, int, str]] = []
        # (topic, headers) of every record produced, in order.
        self.headers: list[tuple[str, dict[str, bytes]]] = []
        self.aborted = 0
        # Errors the next commit_transaction / abort_transaction calls raise, in order.
        self.commit_errors: list[KafkaError] = []
        self.abort_errors: list[KafkaError] = []
        self.init_errors: list[KafkaError] = []
        self.inits = 0

    def list_topics(self, timeout: float) -> None: ...

    def init_transactions(self, timeout: float) -> None:
        if self.init_errors:
            raise KafkaException(self.init_errors.pop(0))
        self.inits += 1

    def begin_transaction(self) -> None:
        self.pending = []

    def produce(self, topic: str, key: bytes | None, value: bytes, **record: Any) -> None:
        if len(value) > self.limit:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        self.pending.append((topic, value))
        msg_id = dict(record["headers"])["msg_id"].decode()
        self.placed.append((topic, record["partition"], msg_id))
        self.headers.append((topic, dict(record["headers"])))

    def poll(self, timeout: float) -> int:
        return 0

    def commit_transaction(self, timeout: float) -> None:
        if self.commit_errors:
            raise KafkaException(self.commit_errors.pop(0))
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "brokers down"))
        self.committed.append(self.pending)

    def abort_transaction(self, timeout: float) -> None:
        if self.abort_errors:
            raise KafkaException(self.abort_errors.pop(0))
        self.aborted += 1


KAFKA = KafkaConnection(
    "127.0.0.1:9092",
    login=("hostmetrics-engine", "secret"),
    ca_path=Path("ca.pem"),
    credentials_path=Path("kafka-credentials.json"),
)
TOPICS = Settings(pipeline="hostmetrics").topics()


@pytest.fixture
def publisher(monkeypatch: pytest.MonkeyPatch) -> tuple[outbound.KafkaPublisher, FakeProducer]:
    made: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(outbound, "Producer", producer)
    # The publisher gets only what it uses: the connection, the names, its message limit.
    return outbound.KafkaPublisher(KAFKA, TOPICS, "a", max_message_bytes=16_384), made[0]


def test_a_refused_row_is_replaced_by_its_dead_letter_and_the_rest_commit(publisher):
    pub, producer = publisher
    rows = [
        Output(1, "out", "h", "small"),
        Output(2, "out", "h", "x" * 20_000),  # over the 16,384-byte limit
        Output(3, "out", "h", "small too"),
    ]
    pub.publish(rows, epoch=1)
    [committed] = producer.committed
    assert [t for t, _ in committed] == [
        "hostmetrics.out",
        "hostmetrics.dlq",
        "hostmetrics.out",
        "hostmetrics.progress",
    ]
    letter = json.loads(committed[1][1])
    assert letter["msg_id"] == 2
    assert letter["reason"].startswith("unpublishable: MSG_SIZE_TOO_LARGE")
    assert letter["truncated"] is True
    assert letter["raw_bytes"] == 20_000
    assert producer.aborted == 1


def test_each_transaction_ends_with_its_progress_record_and_coverage_rows_stay_unpublished(
    publisher,
):
    pub, producer = publisher
    rows = [
        Output(7, "out", "c", "alert"),
        covered(8),
        covered(9),
        Output(10, "out", "c", "a"),
        Output(10, "out", "c", "b"),  # a fan-out: both rows, in order
        Output(11, "dlq", None, "letter"),
        covered(12),
    ]
    pub.publish(rows, epoch=3)
    [committed] = producer.committed
    assert [(t, v) for t, v in committed[:-1]] == [
        ("hostmetrics.out", b"alert"),
        ("hostmetrics.out", b"a"),
        ("hostmetrics.out", b"b"),
        ("hostmetrics.dlq", b"letter"),
    ]
    topic, value = committed[-1]
    assert topic == "hostmetrics.progress"
    assert json.loads(value) == {
        "first": 7,
        "last": 12,
        "outputs": 3,
        "dead_letters": 1,
        # The rows' digest, for the standbys' agreement check (coverage rows do not count).
        "digest": digest(rows),
    }
    assert digest(rows) == digest(rows[::-1]) != digest(rows[:-2])


def test_only_coverage_rows_still_commit_their_progress(publisher):
    pub, producer = publisher
    pub.publish([covered(1), covered(2)], epoch=1)
    assert producer.committed == [
        [
            (
                "hostmetrics.progress",
                b'{"first":1,"last":2,"outputs":0,"dead_letters":0,"digest":"%s"}'
                % digest([]).encode(),
            )
        ]
    ]


def test_a_fan_out_with_a_refused_row_becomes_one_dead_letter(publisher):
    pub, producer = publisher
    rows = [
        Output(1, "out", "h", "small"),
        Output(1, "out", "h", "x" * 20_000),
        Output(2, "out", "h", "fine"),
    ]
    pub.publish(rows, epoch=1)
    [committed] = producer.committed
    assert [t for t, _ in committed] == [
        "hostmetrics.dlq",
        "hostmetrics.out",
        "hostmetrics.progress",
    ]
    assert json.loads(committed[0][1])["msg_id"] == 1


def test_a_cluster_outage_stays_a_transient_error_with_nothing_replaced(publisher):
    pub, producer = publisher
    producer.down = True
    with pytest.raises(TransientPublishError):
        pub.publish([Output(1, "out", "h", "small")], epoch=1)
    assert producer.committed == []


def test_a_commit_that_timed_out_is_committed_again_not_aborted(publisher):
    # Seen in the outage test: aborting after a timed-out commit conflicts with the commit
    # still in progress ("Conflicting commit_transaction API call"), forever.
    pub, producer = publisher
    producer.commit_errors = [KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)]
    pub.publish([Output(1, "out", "h", "v")], epoch=1)
    assert len(producer.committed) == 1
    assert producer.aborted == 0


def test_an_abort_that_does_not_go_through_is_tried_again_before_the_next_transaction(
    publisher,
):
    pub, producer = publisher
    producer.commit_errors = [KafkaError(KafkaError._MSG_TIMED_OUT, "record timed out")]
    producer.abort_errors = [KafkaError(KafkaError._CONFLICT, "commit in progress")]
    with pytest.raises(TransientPublishError):
        pub.publish([Output(1, "out", "h", "v")], epoch=1)
    assert producer.aborted == 0
    pub.publish([Output(1, "out", "h", "v")], epoch=1)  # aborts the old one first
    assert producer.aborted == 1
    assert len(producer.committed) == 1


def test_an_abort_that_fails_for_good_is_fenced_not_retried_forever(publisher):
    # After a 3-minute outage the coordinator had timed the transaction out and bumped the
    # producer's epoch: each abort failed with a fatal INVALID_TXN_STATE, and the active
    # tried again every 2 s for as long as it lived.
    pub, producer = publisher
    producer.commit_errors = [KafkaError(KafkaError._MSG_TIMED_OUT, "record timed out")]
    producer.abort_errors = [KafkaError(KafkaError._CONFLICT, "commit in progress")]
    with pytest.raises(TransientPublishError):
        pub.publish([Output(1, "out", "h", "v")], epoch=1)
    invalid = KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
    producer.abort_errors = [invalid]
    with pytest.raises(Fenced, match="failed for good"):
        pub.publish([Output(1, "out", "h", "v")], epoch=1)
    assert producer.committed == []


def test_a_fence_waits_out_a_coordinator_still_aborting_the_old_transaction(publisher):
    # In an outage the coordinator cannot finish the old holder's abort: init_transactions
    # answers CONCURRENT_TRANSACTIONS until it can. Resigning at once only handed the
    # election to the other engine, again and again.
    pub, producer = publisher
    busy = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS, "busy", retriable=True)
    producer.init_errors = [busy, busy]
    assert pub.fence() is pub
    assert producer.inits == 1


def test_a_fence_that_cannot_succeed_is_a_transient_error(publisher):
    pub, producer = publisher
    producer.init_errors = [KafkaError(KafkaError.INVALID_TRANSACTION_TIMEOUT, "no")]
    with pytest.raises(TransientPublishError, match="init_transactions failed"):
        pub.fence()


def test_a_fence_kafka_denies_names_the_fix(publisher, caplog):
    pub, producer = publisher
    producer.init_errors = [KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no")]
    with pytest.raises(TransientPublishError, match=r"engine user .*`make up`"):
        pub.fence()
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in record.getMessage()
    assert "kafka-credentials.json" in record.getMessage()


def test_a_write_kafka_denies_is_held_and_retried_and_a_fatal_one_replaces_the_producer(
    publisher, caplog
):
    pub, producer = publisher
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed")
    producer.commit_errors = [denied]
    with pytest.raises(TransientPublishError, match=r"TOPIC_AUTHORIZATION_FAILED.*`make up`"):
        pub.publish([Output(1, "out", "h", "v")], epoch=1)
    assert producer.aborted == 1
    # Granted: the same rows go through with the next batch.
    pub.publish([Output(1, "out", "h", "v")], epoch=1)
    assert len(producer.committed) == 1
    producer.commit_errors = [
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no", fatal=True)
    ]
    with pytest.raises(Fenced, match="engine user"):
        pub.publish([Output(2, "out", "h", "v")], epoch=1)
    assert sum(r.levelname == "ERROR" for r in caplog.records) == 2


def test_each_row_goes_to_its_inbound_partition_with_a_progress_record_per_partition(publisher):
    pub, producer = publisher
    rows = [
        Output(4, "out", "k", "a", partition=0),
        covered(5, partition=0),
        Output(2, "dlq", None, "letter", partition=2),
        Output(9, "out", "k", "b", partition=1),
        Output(10, "out", "k", "c", partition=1),
    ]
    pub.publish(rows, epoch=1)
    [committed] = producer.committed  # one transaction across the partitions
    assert producer.placed == [
        ("hostmetrics.out", 0, "4"),
        ("hostmetrics.dlq", 2, "2"),
        ("hostmetrics.out", 1, "9"),
        ("hostmetrics.out", 1, "10"),
        ("hostmetrics.progress", 0, "5"),
        ("hostmetrics.progress", 1, "10"),
        ("hostmetrics.progress", 2, "2"),
    ]
    progress = [json.loads(v) for t, v in committed if t == "hostmetrics.progress"]
    assert [{k: v for k, v in p.items() if k != "digest"} for p in progress] == [
        {"first": 4, "last": 5, "outputs": 1, "dead_letters": 0},
        {"first": 9, "last": 10, "outputs": 2, "dead_letters": 0},
        {"first": 2, "last": 2, "outputs": 0, "dead_letters": 1},
    ]
    # Each partition's digest is of that partition's rows alone.
    groups = by_partition(rows)
    assert [p["digest"] for p in progress] == [digest(groups[p]) for p in (0, 1, 2)]


def test_a_refused_row_of_one_partition_is_replaced_there_not_in_another(publisher):
    pub, producer = publisher
    rows = [
        Output(3, "out", "h", "x" * 20_000, partition=1),  # over the limit
        Output(3, "out", "h", "fine", partition=0),  # the same offset, another record
    ]
    pub.publish(sorted(rows, key=lambda r: r.position), epoch=1)
    placed = [p for p in producer.placed if p[0] != "hostmetrics.progress"]
    assert placed[-2:] == [("hostmetrics.out", 0, "3"), ("hostmetrics.dlq", 1, "3")]


def test_an_inbound_topic_kafka_denies_stops_the_start_naming_the_fix(monkeypatch):
    class Meta:
        error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "no")
        partitions: ClassVar[dict[int, object]] = {}

    class FakeConsumer:
        def __init__(self, config: dict[str, Any]) -> None: ...

        def list_topics(self, topic: str, timeout: float) -> Any:
            return type("M", (), {"topics": {topic: Meta()}})()

    monkeypatch.setattr(outbound, "Consumer", FakeConsumer)
    reader = outbound.LastPublishedReader(KAFKA, TOPICS)
    with pytest.raises(outbound.AccessDenied, match=r"TOPIC_AUTHORIZATION_FAILED.*`make up`"):
        reader.partitions()


def test_every_record_and_progress_record_says_which_version_of_the_code_computed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[FakeProducer] = []

    def producer(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(outbound, "Producer", producer)
    pub = outbound.KafkaPublisher(KAFKA, TOPICS, "a", 16_384, version="2+0123456789ab")
    pub.publish([Output(1, "out", "h", "x"), Output(2, "dlq", None, "{}")], epoch=3)
    topics = [topic for topic, _ in made[0].headers]
    assert topics == ["hostmetrics.out", "hostmetrics.dlq", "hostmetrics.progress"]
    assert {h[outbound.VERSION_HEADER] for _, h in made[0].headers} == {b"2+0123456789ab"}


def test_a_publisher_given_no_version_adds_no_header(publisher):
    pub, producer = publisher
    pub.publish([Output(1, "out", "h", "x")], epoch=1)
    assert all(outbound.VERSION_HEADER not in h for _, h in producer.headers)
