"""Checks that the platform under the engines is whole: ZooKeeper serves, every configured
Kafka broker is registered, each topic has the shape the failover protocol relies on, and
every pipeline has a standby that could take over from its active.

Used by the ``platform_health`` DAG; each check raises :class:`PlatformUnhealthy` with a
message an operator can act on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from twinstream.ops.overview import EngineView, no_ready_standby
from twinstream.platform import registry
from twinstream.platform.kafka import TopicSpec, admin_config, describe_topic_configs, topic_specs
from twinstream.platform.settings import CommonSettings, Connections, Settings, TaskSettings
from twinstream.stack import health

log = logging.getLogger(__name__)


class PlatformUnhealthy(RuntimeError):
    """A platform service is down or misconfigured; the message says which and how."""


def check_zookeeper(settings: Connections) -> str:
    """Every server of the connect string probed; healthy while a majority serves (an
    ensemble keeps serving with a minority down, and the report names those)."""
    servers = settings.zk_servers
    answers = [health.zookeeper(settings, n) for n in range(1, len(servers) + 1)]
    detail = "; ".join(
        f"{host}:{port} {text}" for (host, port), (_ok, text) in zip(servers, answers, strict=True)
    )
    serving = sum(ok for ok, _text in answers)
    if serving <= len(servers) // 2:
        raise PlatformUnhealthy(
            f"ZooKeeper at {settings.zk_hosts}: {serving} of {len(servers)} servers serve, "
            f"a quorum needs {len(servers) // 2 + 1} ({detail}); start the servers that do "
            "not answer (locally: make up)"
        )
    log.info("ZooKeeper at %s: %s", settings.zk_hosts, detail)
    return detail


def check_brokers(settings: Settings) -> list[int]:
    registered = health.kafka_brokers(settings)
    expected = set(range(1, len(settings.kafka_ports) + 1))
    missing = sorted(expected - set(registered))
    if missing:
        raise PlatformUnhealthy(
            f"Kafka brokers {missing} are not registered in the cluster at "
            f"{settings.bootstrap_servers} (registered: {sorted(registered)}); with fewer than "
            f"min.insync.replicas={settings.min_insync_replicas} alive, no write succeeds"
        )
    log.info("Kafka brokers registered: %s", sorted(registered))
    return sorted(registered)


def topic_problems(
    spec: TopicSpec, partitions: int, replicas: int, configs: Mapping[str, str] | None
) -> list[str]:
    """How an existing topic differs from its spec (empty when it matches)."""
    if configs is None:
        return [f"topic {spec.name} does not exist (run `make up` or the compose kafka-init)"]
    problems = []
    if partitions != spec.partitions:
        problems.append(f"{spec.name}: {partitions} partitions, want {spec.partitions}")
    if replicas != spec.replication_factor:
        problems.append(
            f"{spec.name}: replication factor {replicas}, want {spec.replication_factor}"
        )
    for key, want in spec.configs.items():
        if key == "retention.ms":
            continue  # the retention guard owns this rule (it depends on persist timing)
        if configs.get(key) != want:
            problems.append(f"{spec.name}: {key}={configs.get(key)}, want {want}")
    return problems


def check_topics(settings: CommonSettings, specs: Iterable[TopicSpec] | None = None) -> list[str]:
    admin = AdminClient(admin_config(settings))
    metadata = admin.list_topics(timeout=10).topics
    problems: list[str] = []
    checked = []
    if specs is None:
        # Every pipeline of the stack has its own topics.
        specs = [s for p in registry.stack(settings).values() for s in topic_specs(p)]
    for spec in specs:
        meta: Any = metadata.get(spec.name)
        if meta is None:
            problems += topic_problems(spec, 0, 0, None)
            continue
        replicas = len(next(iter(meta.partitions.values())).replicas) if meta.partitions else 0
        configs = describe_topic_configs(admin, spec.name)
        problems += topic_problems(spec, len(meta.partitions), replicas, configs)
        checked.append(spec.name)
    if problems:
        raise PlatformUnhealthy("; ".join(problems))
    log.info("topics as configured: %s", checked)
    return checked


def check_standbys(
    pipelines: Mapping[str, TaskSettings], observe: Callable[[TaskSettings], list[EngineView]]
) -> list[str]:
    """Each pipeline's active has a standby that could take over now (in sync, allowed to
    lead, its buffer covering the takeover): else its next failure stops the output, and
    the check fails naming each engine's reason, how long it has lasted and what to do.
    `observe` gives a pipeline's engines as they answer (twinstream.ops.operate)."""
    problems, covered = [], []
    for name, settings in pipelines.items():
        problem = no_ready_standby(observe(settings))
        if problem is None:
            covered.append(name)
        else:
            problems.append(f"pipeline {name}: {problem}")
    if problems:
        raise PlatformUnhealthy("; ".join(problems))
    log.info("every pipeline has a standby that could take over: %s", covered)
    return covered
