"""What a client of Kafka or ZooKeeper, and the failover core, receive instead of the whole
`Settings`: where the cluster is, who this process is on it, and which topics and nodes are
the pipeline's. Each is built once, at a process's edge, from the one environment-reading
`Settings` (`Settings.zookeeper()`, `Settings.topics()`, `twinstream.platform.kafka.connection`),
and holds everything its clients need: the credentials file is read when it is built, never
again per client.

Every Kafka client's librdkafka and Java properties come from `KafkaConnection`, so each
non-default setting is chosen (and explained) once, here; and which of their errors are
worth asking again (`is_transient`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from confluent_kafka import KafkaException

# SCRAM over TLS: the mechanism the stack's users are made with (twinstream.platform.kafka_auth).
MECHANISM = "SCRAM-SHA-512"
# Named alike in librdkafka and the Java client.
SASL_OVER_TLS = {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM}

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


@dataclass(frozen=True)
class KafkaConnection:
    """Where the Kafka cluster is and who this process's clients are on it."""

    bootstrap_servers: str
    # (user, password) of SASL/SCRAM over TLS; None: PLAINTEXT, no security.
    login: tuple[str, str] | None = field(default=None, repr=False)
    # The CA the brokers' certificates are verified with (security only).
    ca_path: Path | None = None
    # Where the password came from, for the message that says what to check when Kafka
    # refuses it.
    credentials_path: Path | None = None

    @property
    def user(self) -> str | None:
        return self.login[0] if self.login else None

    def librdkafka(self, **overrides: Any) -> dict[str, Any]:
        """Settings shared by every librdkafka client: where the cluster is, who this
        client is, and `overrides`."""
        where = {
            "bootstrap.servers": self.bootstrap_servers,
            # The stack binds to loopback only; resolving "localhost" to ::1 first would stall.
            "broker.address.family": "v4",
        }
        return {**where, **self._librdkafka_security(), **overrides}

    def _librdkafka_security(self) -> dict[str, Any]:
        if self.login is None:
            return {}
        user, password = self.login
        return {
            **SASL_OVER_TLS,
            "sasl.username": user,
            "sasl.password": password,
            # The stack's own CA, not the system's: the brokers' certificate is ours.
            "ssl.ca.location": str(self.ca_path),
        }

    def java_security(self) -> dict[str, str]:
        """The same security for a Java client (Spark's Kafka source, the baselines): PEM
        trust store."""
        if self.login is None:
            return {}
        user, password = self.login
        return {
            **SASL_OVER_TLS,
            "sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{user}" password="{password}";'
            ),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_path),
        }

    def spark_options(self) -> dict[str, str]:
        """java_security as options of Spark's Kafka source ("kafka." before each)."""
        return {f"kafka.{k}": v for k, v in self.java_security().items()}

    def producer(self, **overrides: Any) -> dict[str, Any]:
        """A producer that never loses or reorders an acknowledged record."""
        return self.librdkafka(
            **{
                **PRODUCER_GUARANTEES,
                # Small batches within 5 ms: latency matters more than throughput here.
                "linger.ms": 5,
                **overrides,
            }
        )

    def consumer(self, group_id: str, **overrides: Any) -> dict[str, Any]:
        """A consumer that sees only committed transactional output."""
        return self.librdkafka(
            **{
                "group.id": group_id,
                **READER_GUARANTEES,
                # Twinstream readers track positions themselves (msg_id), not in the group.
                "enable.auto.commit": False,
                **overrides,
            }
        )

    def admin(self, **overrides: Any) -> dict[str, Any]:
        return self.librdkafka(**overrides)


@dataclass(frozen=True)
class ZooKeeperConnection:
    """Where ZooKeeper is and who this process is on it (SASL DIGEST-MD5)."""

    # kazoo's connect string: every server, and the chroot if there is one.
    hosts: str
    session_timeout_s: float
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class PipelineTopics:
    """A pipeline's names in Kafka: its four topics and its shared transactional id."""

    pipeline: str
    inbound: str
    outbound: str
    dlq: str
    progress: str

    @property
    def transactional_id(self) -> str:
        """Shared by every engine of the pipeline: a new active's init fences the old one."""
        return f"twinstream-{self.pipeline}"


# Errors that say the cluster was not ready rather than that the request is wrong (names of
# KafkaError's codes). Right after the brokers start, librdkafka may swap its bootstrap
# connections for the brokers it learned from metadata and fail requests in flight with
# _DESTROY_BROKER.
_TRANSIENT = (
    "_DESTROY_BROKER",
    "_TRANSPORT",
    "_TIMED_OUT",
    "_ALL_BROKERS_DOWN",
    "NOT_CONTROLLER",
    "REQUEST_TIMED_OUT",
    # A partition's leader just died and its successor is not known yet.
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    # A fresh client's metadata does not name a partition yet: make test's stack start saw
    # it for partition 2 of a topic the metadata had just listed with three. The caller's
    # deadline still ends a wait for a partition that does not exist.
    "_UNKNOWN_PARTITION",
)


@functools.cache
def _transient_codes() -> frozenset[int]:
    # Here, not at the top: whoever holds a KafkaException has loaded the client already,
    # and the settings (which import this module) must not load it for everyone.
    from confluent_kafka import KafkaError

    return frozenset(getattr(KafkaError, name) for name in _TRANSIENT)


def is_transient(exc: KafkaException) -> bool:
    """Whether asking again may succeed: a retriable error, or one of _TRANSIENT."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return False
    return bool(error.retriable()) or error.code() in _transient_codes()
