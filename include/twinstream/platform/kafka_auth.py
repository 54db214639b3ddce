"""Who may do what on Kafka: the stack's SCRAM users and each pipeline's ACLs.

Guarantee (with the brokers' StandardAuthorizer and allow.everyone.if.no.acl.found=false):
each pipeline has three users, and these ACLs are all they get:

- `<pipeline>-engine`, its engines: read `.in`; read and write `.out`, `.dlq`, `.progress`;
  write and describe its transactional id (so only they can fence one another);
- `<pipeline>-publisher`: write `.in`, nothing else;
- `<pipeline>-reader`, the audit and subscribers: read `.out`, `.dlq`, `.progress`, not `.in`.

Readers (engines and readers) may use consumer groups named `twinstream-` and Spark's
`spark-kafka-source-` (prefixed): Twinstream's consumers assign partitions and commit
nothing, but a group id is always set. One more user belongs to the stack: the operator's
(`twinstream-admin`, a super user: topics, configs, the retention guard). Every user is
made by `up`, as the stack's own identity (the servers' certificate, over the brokers'
mutual-TLS listener: twinstream.stack.render.kafka_listeners), never at format time: a
stack formatted before Kafka security gets its users the same way.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from twinstream.platform.connections import is_transient
from twinstream.platform.settings import PipelineSettings, Settings

if TYPE_CHECKING:
    from confluent_kafka.admin import AclBinding, AdminClient

    from twinstream.platform.settings import Settings

log = logging.getLogger(__name__)

Role = Literal["engine", "publisher", "reader"]
ROLES: tuple[Role, ...] = ("engine", "publisher", "reader")
ADMIN_USER = "twinstream-admin"
# Kafka's minimum for SCRAM is 4096.
ITERATIONS = 8192
# Consumer groups every reader may use (Twinstream's own, and Spark's Kafka source's).
GROUP_PREFIXES = ("twinstream-", "spark-kafka-source-")
# The publisher adapters' reads of the inbound topic's tail (by assignment: they join no
# group, but librdkafka asks for the group's coordinator all the same).
PUBLISHER_GROUP_PREFIX = "twinstream-publisher-"
# A password goes into a JAAS line and StorageTool's [name=..,password=..]: hex only.
PASSWORD = re.compile(r"^[0-9a-f]{32,128}$")


def user_name(pipeline: str, role: Role) -> str:
    return f"{pipeline}-{role}"


def principal(user: str) -> str:
    return f"User:{user}"


def users(pipelines: Iterable[str]) -> list[str]:
    """Every user of a stack running `pipelines`, the admin first."""
    return [ADMIN_USER, *(user_name(p, r) for p in pipelines for r in ROLES)]


class CredentialsError(ValueError):
    pass


class Credentials:
    """The stack's SCRAM passwords, one JSON file (user -> password) only its owner reads."""

    def __init__(self, path: Path, passwords: Mapping[str, str]) -> None:
        self.path = path
        self.passwords = dict(passwords)

    @classmethod
    def load(cls, path: Path) -> Credentials:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise CredentialsError(
                f"no Kafka credentials at {path}: run `make up`, which makes them"
            ) from None
        except json.JSONDecodeError as exc:
            raise CredentialsError(
                f"{path} is not JSON ({exc}): restore it, or delete it and run `make clean` "
                "and `make up` to start over with new credentials"
            ) from None
        if not isinstance(data, dict) or not all(
            isinstance(v, str) and PASSWORD.match(v) for v in data.values()
        ):
            raise CredentialsError(
                f"{path} must map each user to a hex password: restore it from a backup"
            )
        return cls(path, data)

    @classmethod
    def ensure(cls, path: Path, wanted: Iterable[str]) -> tuple[Credentials, list[str]]:
        """The file with a password for every user in `wanted` (new ones random); the users
        added."""
        creds = cls.load(path) if path.exists() else cls(path, {})
        added = [u for u in wanted if u not in creds.passwords]
        for user in added:
            creds.passwords[user] = secrets.token_hex(24)
        if added or not path.exists():
            creds.save()
        return creds, added

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.passwords, out, indent=2, sort_keys=True)
            out.write("\n")
        tmp.replace(self.path)

    def password(self, user: str) -> str:
        try:
            return self.passwords[user]
        except KeyError:
            raise CredentialsError(
                f"no Kafka password for {user} in {self.path}: run `make up`, which makes "
                "one for every pipeline of the pipelines file"
            ) from None


def acl_bindings(settings: PipelineSettings) -> list[AclBinding]:
    """The ACLs of one pipeline (its settings), as the module says."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    p = settings.pipeline
    engine, publisher, reader = (principal(user_name(p, r)) for r in ROLES)
    outputs = (settings.outbound_topic, settings.dlq_topic, settings.progress_topic)
    inbound = settings.inbound_topic
    grants: list[tuple[ResourceType, str, ResourcePatternType, str, AclOperation]] = []

    def topic(name: str, who: str, *ops: AclOperation) -> None:
        grants.extend(
            (ResourceType.TOPIC, name, ResourcePatternType.LITERAL, who, op) for op in ops
        )

    read = (AclOperation.READ, AclOperation.DESCRIBE)
    topic(inbound, engine, *read)
    # The publisher adapters read the inbound topic's tail: where the last active stopped
    # (twinstream.edge.publisher.last_published).
    topic(inbound, publisher, AclOperation.WRITE, *read)
    for name in outputs:
        topic(name, engine, AclOperation.WRITE, *read)
        topic(name, reader, *read)
    # The engines' transactional id, and the publisher adapters' (their own: an adapter
    # fences adapters, never an engine).
    for txn, who in (
        (settings.transactional_id, engine),
        (f"{settings.transactional_id}-publisher", publisher),
    ):
        for op in (AclOperation.WRITE, AclOperation.DESCRIBE):
            grants.append(
                (ResourceType.TRANSACTIONAL_ID, txn, ResourcePatternType.LITERAL, who, op)
            )
    publisher_groups = (PUBLISHER_GROUP_PREFIX,)
    for who, prefixes in (
        (engine, GROUP_PREFIXES),
        (reader, GROUP_PREFIXES),
        (publisher, publisher_groups),
    ):
        for prefix in prefixes:
            grants.append(
                (ResourceType.GROUP, prefix, ResourcePatternType.PREFIXED, who, AclOperation.READ)
            )
    return [
        AclBinding(kind, name, pattern, who, "*", op, AclPermissionType.ALLOW)
        for kind, name, pattern, who, op in grants
    ]


@dataclass(frozen=True)
class Grants:
    """What one of a pipeline's users may do, as its ACLs say: topics by operation (READ,
    WRITE, ...) and the consumer-group prefixes it may use."""

    topics: dict[str, list[str]]
    group_prefixes: list[str]


def grants(settings: PipelineSettings, role: Role) -> Grants:
    """One role's ACLs of the settings' pipeline, read from acl_bindings itself: what a
    user is told it may do is what Kafka is told to let it do."""
    from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

    who = principal(user_name(settings.pipeline, role))
    topics: dict[str, list[str]] = {}
    prefixes: list[str] = []
    for binding in acl_bindings(settings):
        if binding.principal != who:
            continue
        if binding.restype == ResourceType.TOPIC:
            op = binding.operation
            names = topics.setdefault(op.name if isinstance(op, AclOperation) else str(op), [])
            if binding.name not in names:
                names.append(binding.name)
        elif (
            binding.restype == ResourceType.GROUP
            and binding.resource_pattern_type == ResourcePatternType.PREFIXED
            and binding.name not in prefixes
        ):
            prefixes.append(binding.name)
    return Grants(topics, prefixes)


def provision(
    admin: AdminClient,
    pipelines: Iterable[Settings],
    credentials: Credentials,
    timeout_s: float = 30.0,
) -> list[str]:
    """Set the admin's and every pipeline's users' passwords as the credentials say (a user
    Kafka does not know is made), and grant the pipelines' ACLs (granting one that exists
    changes nothing); what was done, one line each. As a super user: the stack's own
    identity (twinstream.stack.tls.kafka_superuser_config)."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialAlteration,
        UserScramCredentialUpsertion,
    )

    pipelines = list(pipelines)
    wanted = users(p.pipeline for p in pipelines)
    # Every user's password set again, known or not: the same password changes nothing
    # (connections stay up), and one changed in the file (a rotation) takes effect.
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS),
            credentials.password(user).encode(),
        )
        for user in wanted
    ]
    done: list[str] = []
    _idempotent(lambda: admin.alter_user_scram_credentials(upserts), "set passwords", timeout_s)
    done.append(f"{len(wanted)} users' passwords set")
    bindings = [b for p in pipelines for b in acl_bindings(p)]
    _idempotent(
        lambda: admin.create_acls(bindings, request_timeout=timeout_s), "grant ACLs", timeout_s
    )
    done.append(f"{len(bindings)} ACLs of {', '.join(p.pipeline for p in pipelines)} granted")
    return done


def _idempotent(
    submit: Callable[[], Mapping[Any, Any]],
    what: str,
    timeout_s: float,
    attempts: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Run an admin request whose repetition changes nothing until all its futures finish,
    asking again when one times out: a request forwarded to a KRaft controller that loses
    its leadership meanwhile (under load, the forwarding broker switches controllers) is
    never answered, and its future waits out its timeout."""
    from confluent_kafka import KafkaException

    for attempt in range(1, attempts + 1):
        try:
            for future in submit().values():
                future.result(timeout=timeout_s)
            return
        except concurrent.futures.TimeoutError:
            if attempt == attempts:
                raise TimeoutError(
                    f"Kafka did not answer the request to {what} within {timeout_s:.0f}s, "
                    f"{attempts} times: check that the brokers and their controller quorum "
                    "are up (make status) and run it again"
                ) from None
            log.warning(
                "Kafka did not answer the request to %s in %.0fs; asking again", what, timeout_s
            )
        except KafkaException as exc:
            # Right after the brokers start, a request may fail in flight with
            # _DESTROY_BROKER (the admin client swaps its bootstrap connection for the
            # brokers it learns of); the cluster is not ready yet, the request is fine.
            if attempt == attempts or not is_transient(exc):
                raise
            log.warning("Kafka failed the request to %s (%s); asking again", what, exc)
            sleep(1.0)


def grant_read(
    admin: AdminClient,
    settings: PipelineSettings,
    topic: str,
    role: Role = "reader",
    timeout_s: float = 30.0,
) -> None:
    """Let one of the settings' pipeline's users (its reader, by default) read `topic` too:
    the audit of a copy of an output, engines draining another pipeline's backlog in a
    benchmark. As the admin."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    who = principal(user_name(settings.pipeline, role))
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            who,
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for op in (AclOperation.READ, AclOperation.DESCRIBE)
    ]
    for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
