"""Kafka client configuration and idempotent topic administration.

Every Kafka client in Twinstream is configured here, so each non-default setting is chosen
(and explained) once. Topic administration is idempotent: creating a topic that exists is a
no-op, and a config that drifted from the settings is put back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from twinstream.platform.connections import (
    PRODUCER_GUARANTEES,
    READER_GUARANTEES,
    KafkaConnection,
    is_transient,
)
from twinstream.platform.kafka_auth import (
    ADMIN_USER,
    Credentials,
    Grants,
    grants,
    user_name,
)
from twinstream.platform.settings import (
    DAY_MS,
    CommonSettings,
    PipelineSettings,
)

log = logging.getLogger(__name__)


def connection(settings: CommonSettings) -> KafkaConnection:
    """Where the cluster is and who the settings' clients are (their kafka_role, in their
    pipeline): the one place the credentials file is read. A process builds it once and
    gives it to its clients (the engine: twinstream.engine.app)."""
    if not settings.kafka_security:
        return KafkaConnection(settings.bootstrap_servers)
    user = kafka_user(settings)
    path = settings.kafka_credentials_path
    return KafkaConnection(
        settings.bootstrap_servers,
        login=(user, Credentials.load(path).password(user)),
        ca_path=settings.kafka_ca_path,
        credentials_path=path,
    )


def kafka_user(settings: CommonSettings) -> str:
    role = settings.kafka_role
    return ADMIN_USER if role == "admin" else user_name(settings.pipeline, role)


# One-off clients at a process's edge (a task, a CLI command, a test): each call builds its
# connection afresh. A process that keeps clients builds `connection` once instead.


def producer_config(settings: CommonSettings, **overrides: Any) -> dict[str, Any]:
    """KafkaConnection.producer of the settings' connection."""
    return connection(settings).producer(**overrides)


def consumer_config(settings: CommonSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """KafkaConnection.consumer of the settings' connection."""
    return connection(settings).consumer(group_id, **overrides)


def admin_config(settings: CommonSettings, **overrides: Any) -> dict[str, Any]:
    """KafkaConnection.admin of the settings' connection."""
    return connection(settings).admin(**overrides)


UserRole = Literal["publisher", "reader"]


@dataclass(frozen=True)
class UserClient:
    """A user's own client of a pipeline, as its publisher or reader: the settings to give
    librdkafka or the Java client, and what the user's ACLs let it do."""

    pipeline: str
    role: UserRole
    user: str | None  # None: the cluster runs without Kafka security
    librdkafka: dict[str, str]
    java: dict[str, str]
    grants: Grants


def user_client(settings: CommonSettings, role: UserRole) -> UserClient:
    """The settings `twinstream kafka-config` prints: the same as the platform's own
    clients' (KafkaConnection, the guarantees), never a copy. Reads the credentials file
    once."""
    as_role = settings.model_copy(update={"kafka_role": role})
    kafka = connection(as_role)
    guarantees = PRODUCER_GUARANTEES if role == "publisher" else READER_GUARANTEES
    librdkafka = kafka.librdkafka(**guarantees)
    java = {"bootstrap.servers": kafka.bootstrap_servers, **kafka.java_security(), **guarantees}
    return UserClient(
        pipeline=settings.pipeline,
        role=role,
        user=kafka.user,
        librdkafka={k: _text(v) for k, v in librdkafka.items()},
        java={k: _text(v) for k, v in java.items()},
        grants=grants(as_role, role),
    )


def _text(value: object) -> str:
    """A setting as a properties file writes it (`true`, not Python's `True`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class LibrdkafkaLog:
    """librdkafka's log lines into Python logging at DEBUG (a client's `logger`), for a
    command whose user must not see a connection librdkafka retries by itself (a transient
    `SASL authentication error: ... Broker transport failure`): a failure that lasts reaches
    them as the command's own error, which names the fix (see twinstream.edge.reader)."""

    def __init__(self, name: str = "twinstream.librdkafka") -> None:
        self._log = logging.getLogger(name)

    def log(self, level: int, msg: str, *args: object) -> None:
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("%s %s", logging.getLevelName(level), msg % args if args else msg)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict)


def topic_specs(settings: PipelineSettings) -> list[TopicSpec]:
    """The four topics of a pipeline, as the settings describe them."""

    def spec(name: str, retention_ms: int, written_by_engines: bool = True) -> TopicSpec:
        size = (
            # Room above the engines' own limit for a record batch's framing.
            {"max.message.bytes": str(settings.max_message_bytes + 1024)}
            if written_by_engines
            else {}
        )
        return TopicSpec(
            name=name,
            # As many as the inbound topic: an output goes to its record's partition number,
            # and partition p of .progress says how far inbound partition p is published.
            partitions=settings.partitions,
            replication_factor=settings.replication_factor,
            configs={
                "min.insync.replicas": str(settings.min_insync_replicas),
                # An out-of-sync replica must never become leader: it would drop records.
                "unclean.leader.election.enable": "false",
                "retention.ms": str(retention_ms),
                # Kafka deletes whole segments: one that lives longer than the retention
                # (the default rolls weekly) keeps records well past it.
                "segment.ms": str(min(retention_ms, DAY_MS)),
                **size,
            },
        )

    return [
        spec(settings.inbound_topic, settings.inbound_retention_ms, written_by_engines=False),
        spec(settings.outbound_topic, settings.outbound_retention_ms),
        spec(settings.dlq_topic, settings.dlq_retention_ms),
        # What the audit needs to account for inputs without output: kept as long as the
        # outputs it accounts for.
        spec(settings.progress_topic, settings.outbound_retention_ms),
    ]


def watermarks(
    settings: CommonSettings,
    topic: str,
    timeout_s: float = 15.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    partition: int = 0,
) -> tuple[int, int]:
    """(log-start offset, high watermark) of one partition of a topic (the first by
    default), with a short-lived consumer (long-lived clients ask their own consumer
    instead). A transient error (the partition's leader just died, its successor not yet
    known) is retried until `timeout_s`."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    deadline = clock() + timeout_s
    consumer = Consumer(consumer_config(settings, f"twinstream-marks-{uuid.uuid4()}"))
    try:
        while True:
            try:
                # Short tries: one spent waiting on a dead leader would use up the budget.
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition),
                    timeout=min(5.0, max(1.0, deadline - clock())),
                )
                return int(low), int(high)
            except KafkaException as exc:
                if not is_transient(exc) or clock() >= deadline:
                    raise
                log.info("watermarks of %s: %s; retrying", topic, exc)
                sleep(0.5)
    finally:
        consumer.close()


def partition_ends(settings: CommonSettings, topic: str, timeout_s: float = 15.0) -> dict[int, int]:
    """Each partition's high watermark (the offset after its last record) of a topic of
    any number of partitions: where a reader that wants only what comes next starts."""
    import uuid

    from confluent_kafka import Consumer

    consumer = Consumer(consumer_config(settings, f"twinstream-marks-{uuid.uuid4()}"))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if meta.error is not None or not meta.partitions:
            raise RuntimeError(f"Kafka has no partitions of {topic}: {meta.error}")
        partitions = sorted(meta.partitions)
    finally:
        consumer.close()
    return {p: watermarks(settings, topic, timeout_s, partition=p)[1] for p in partitions}


class TopicShapeError(RuntimeError):
    """An existing topic's partitions or replication differ and cannot be fixed in place."""


@dataclass(frozen=True)
class TopicChange:
    topic: str
    action: str  # "created" | "unchanged" | "updated"
    details: tuple[str, ...] = ()

    def __str__(self) -> str:
        suffix = f" ({', '.join(self.details)})" if self.details else ""
        return f"{self.topic}: {self.action}{suffix}"


class TopicNotListed(RuntimeError):
    """A topic created a moment ago that the broker asked does not list yet: worth asking
    again within ensure_topics, and only there (elsewhere a missing topic is an error)."""


def ensure_topics(
    admin: AdminClient,
    specs: Iterable[TopicSpec],
    timeout_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[TopicChange]:
    """Create missing topics and put drifted configs back; report what was done per topic.

    Idempotent, so a transient cluster error (brokers still settling) retries the whole
    pass until `timeout_s` has gone by; any other error is raised at once."""
    specs = list(specs)
    deadline = clock() + timeout_s
    attempt = 1
    # A create that timed out may still have taken effect; the retry then finds the topic
    # present, and must still report it as created by this run, not as found unchanged.
    requested: set[str] = set()
    while True:
        try:
            return _ensure_topics_once(admin, specs, timeout_s, requested)
        except (KafkaException, TopicNotListed) as exc:
            again = isinstance(exc, TopicNotListed) or is_transient(exc)
            if not again or clock() >= deadline:
                raise
            log.warning("topics: attempt %s failed transiently (%s); retrying", attempt, exc)
            attempt += 1
            sleep(1.0)


def _ensure_topics_once(
    admin: AdminClient, specs: list[TopicSpec], timeout_s: float, requested: set[str]
) -> list[TopicChange]:
    existing = admin.list_topics(timeout=timeout_s).topics
    changes: dict[str, TopicChange] = {}

    missing = [s for s in specs if s.name not in existing]
    if missing:
        earlier = set(requested)  # created by an earlier pass whose reply was lost
        requested.update(s.name for s in missing)
        futures = admin.create_topics(
            [
                NewTopic(
                    s.name,
                    num_partitions=s.partitions,
                    replication_factor=s.replication_factor,
                    config=dict(s.configs),
                )
                for s in missing
            ],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result()
                changes[name] = TopicChange(name, "created")
            except KafkaException as exc:
                # Another `up` (or a compose init container) may have won the race; or
                # this run's earlier pass created it, and the broker asked did not list it.
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                if name not in earlier:
                    requested.discard(name)
        existing = admin.list_topics(timeout=timeout_s).topics

    for spec in specs:
        if spec.name in changes:
            continue
        if spec.name not in existing:
            # Created a moment ago (by this pass or a concurrent `up`), but the broker that
            # answered has not caught up with the controller yet: the next pass finds it.
            raise TopicNotListed(f"topic {spec.name} created but not yet in the brokers' metadata")
        meta = existing[spec.name]
        partitions = len(meta.partitions)
        replicas = len(next(iter(meta.partitions.values())).replicas) if partitions else 0
        if partitions != spec.partitions or replicas != spec.replication_factor:
            raise TopicShapeError(
                f"topic {spec.name} has {partitions} partition(s) x RF {replicas}, "
                f"configuration wants {spec.partitions} x RF {spec.replication_factor}; "
                "Kafka cannot change this in place: delete the topic (losing its data; "
                "`make clean` deletes the local stack's) or configure what it has "
                "(`partitions` in the pipelines file, TWINSTREAM_REPLICATION_FACTOR)"
            )
        current = describe_topic_configs(admin, spec.name, timeout_s)
        drift = {k: v for k, v in spec.configs.items() if current.get(k) != v}
        if not drift:
            action = "created" if spec.name in requested else "unchanged"
            changes[spec.name] = TopicChange(spec.name, action)
            continue
        alter_topic_configs(admin, spec.name, drift, timeout_s)
        changes[spec.name] = TopicChange(
            spec.name,
            "updated",
            tuple(f"{k} {current.get(k)} -> {v}" for k, v in sorted(drift.items())),
        )
    return [changes[s.name] for s in specs]


def describe_topic_configs(
    admin: AdminClient, topic: str, timeout_s: float = 30.0
) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result()
    return {name: entry.value for name, entry in entries.items()}


def alter_topic_configs(
    admin: AdminClient, topic: str, configs: Mapping[str, str], timeout_s: float = 30.0
) -> None:
    """Set only the named configs (incremental: the topic's other overrides stay)."""
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in configs.items()
        ],
    )
    admin.incremental_alter_configs([resource], request_timeout=timeout_s)[resource].result()
    log.info("topic %s: set %s", topic, dict(configs))
