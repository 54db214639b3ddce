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

from twinstream.platform.kafka_auth import (
    ADMIN_USER,
    MECHANISM,
    Credentials,
    Grants,
    grants,
    user_name,
)
from twinstream.platform.settings import DAY_MS, Settings

log = logging.getLogger(__name__)


def client_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Settings shared by every client: where the cluster is, who this client is (the
    settings' kafka_role, in their pipeline) and how fast to notice trouble."""
    return {**_where(settings), **security_config(settings), **overrides}


def _where(settings: Settings) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        # The stack binds to loopback only; resolving "localhost" to ::1 first would stall.
        "broker.address.family": "v4",
    }


def kafka_user(settings: Settings) -> str:
    role = settings.kafka_role
    return ADMIN_USER if role == "admin" else user_name(settings.pipeline, role)


def kafka_login(settings: Settings) -> tuple[str, str] | None:
    """(user, password) the settings' clients log in with; None without Kafka security."""
    if not settings.kafka_security:
        return None
    user = kafka_user(settings)
    return user, Credentials.load(settings.kafka_credentials_path).password(user)


def security_config(settings: Settings) -> dict[str, Any]:
    """librdkafka's SASL/SCRAM-over-TLS settings (nothing without security)."""
    return _librdkafka_security(settings, kafka_login(settings))


def _librdkafka_security(settings: Settings, login: tuple[str, str] | None) -> dict[str, Any]:
    if login is None:
        return {}
    user, password = login
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        # The stack's own CA, not the system's: the brokers' certificate is ours.
        "ssl.ca.location": str(settings.kafka_ca_path),
    }


def spark_kafka_security(settings: Settings) -> dict[str, str]:
    """java_security_config as options of Spark's Kafka source ("kafka." before each)."""
    return {f"kafka.{k}": v for k, v in java_security_config(settings).items()}


def java_security_config(settings: Settings) -> dict[str, str]:
    """The same for a Java client (Spark's Kafka source, the baselines): PEM trust store."""
    return _java_security(settings, kafka_login(settings))


def _java_security(settings: Settings, login: tuple[str, str] | None) -> dict[str, str]:
    if login is None:
        return {}
    user, password = login
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";'
        ),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(settings.kafka_ca_path),
    }


# What makes a producer lose or reorder no acknowledged record: a write counts only once
# every in-sync replica has it (min.insync.replicas=2 on the topics), so losing one broker
# loses no acknowledged record; retries cannot duplicate or reorder records within a
# partition. The same names and values in librdkafka and the Java client.
PRODUCER_GUARANTEES: dict[str, Any] = {"acks": "all", "enable.idempotence": True}
# What makes a reader see only committed output: aborted transactions and in-flight ones
# must never reach it (it would see rows a takeover published again); a new reader starts
# at the beginning of what the topic keeps.
READER_GUARANTEES: dict[str, Any] = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
}


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """A producer that never loses or reorders an acknowledged record."""
    return client_config(
        settings,
        **{
            **PRODUCER_GUARANTEES,
            # Small batches within 5 ms: latency matters more than throughput here.
            "linger.ms": 5,
            **overrides,
        },
    )


def consumer_config(settings: Settings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that sees only committed transactional output."""
    return client_config(
        settings,
        **{
            "group.id": group_id,
            **READER_GUARANTEES,
            # Twinstream readers track positions themselves (msg_id), not in the group.
            "enable.auto.commit": False,
            **overrides,
        },
    )


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


def user_client(settings: Settings, role: UserRole) -> UserClient:
    """The settings `twinstream kafka-config` prints: the same as the platform's own
    clients' (client_config, java_security_config, the guarantees above), never a copy.
    Reads the credentials file once."""
    as_role = settings.model_copy(update={"kafka_role": role})
    login = kafka_login(as_role)
    guarantees = PRODUCER_GUARANTEES if role == "publisher" else READER_GUARANTEES
    librdkafka = {**_where(as_role), **_librdkafka_security(as_role, login), **guarantees}
    java = {
        "bootstrap.servers": as_role.bootstrap_servers,
        **_java_security(as_role, login),
        **guarantees,
    }
    return UserClient(
        pipeline=settings.pipeline,
        role=role,
        user=login[0] if login else None,
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
    them as the command's own error, which names the fix (see twinstream.ops.subscriber)."""

    def __init__(self, name: str = "twinstream.librdkafka") -> None:
        self._log = logging.getLogger(name)

    def log(self, level: int, msg: str, *args: object) -> None:
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("%s %s", logging.getLevelName(level), msg % args if args else msg)


def admin_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    return client_config(settings, **overrides)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings) -> list[TopicSpec]:
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
    settings: Settings,
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


def partition_ends(settings: Settings, topic: str, timeout_s: float = 15.0) -> dict[int, int]:
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


# Errors that say the cluster was not ready rather than that the request is wrong. Right
# after the brokers start, librdkafka may swap its bootstrap connections for the brokers
# it learned from metadata and fail requests in flight with _DESTROY_BROKER.
_TRANSIENT = {
    KafkaError._DESTROY_BROKER,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NOT_CONTROLLER,
    KafkaError.REQUEST_TIMED_OUT,
    # A partition's leader just died and its successor is not known yet.
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
}


class TopicNotListed(RuntimeError):
    """A topic created a moment ago that the broker asked does not list yet: worth asking
    again within ensure_topics, and only there (elsewhere a missing topic is an error)."""


def is_transient(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return False
    return bool(error.retriable()) or error.code() in _TRANSIENT


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
            # (A fresh stack's `up` once failed here with a KeyError.)
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
