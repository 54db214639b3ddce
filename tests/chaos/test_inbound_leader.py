"""The inbound partition's leader broker stopped: the inbound topic stays writable, every
record back once and in order per partition. `make chaos` only (`chaos_only`:
TWINSTREAM_CHAOS_FULL=1): a broker's stop, its JVM's start and its replicas' catch-up take
over a minute on two cores (76 s of `make test` at pace 2.26). In `make test`: every topic's
three replicas and min.insync.replicas=2, which keep a partition writable with one broker
down, are tests/integration/test_stack.py's `test_topic_configs_are_exactly_as_configured`;
the leader killed under load is tests/chaos/test_chaos.py's.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from devkit.harness import wait_for
from tests.integration.test_stack import in_order_per_partition
from twinstream.edge.feed import publish
from twinstream.platform.kafka import admin_config, partition_ends
from twinstream.stack import health
from twinstream.stack.layout import Layout
from twinstream.stack.supervisor import Supervisor

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.chaos_only
def test_losing_the_partition_leader_keeps_the_inbound_topic_writable(stack, settings):
    supervisor = Supervisor(Layout.of(settings))
    admin = AdminClient(admin_config(settings))
    leader = admin.list_topics(timeout=10).topics[settings.inbound_topic].partitions[0].leader
    victim = f"kafka-{leader}"
    supervisor.stop(victim)
    try:
        assert supervisor.process(victim).state == "STOPPED"
        wait_for(
            lambda: leader not in health.kafka_brokers(settings), 30, f"{victim} to deregister"
        )
        starts = partition_ends(settings, settings.inbound_topic)
        values = [f"while-{victim}-down-{i}".encode() for i in range(1000)]
        publish(settings, values)
        in_order_per_partition(settings, settings.inbound_topic, starts, values)
    finally:
        supervisor.start(victim)
    # Not the guarantee's bound, a readiness wait: a broker's JVM start and rejoin took over
    # 60 s on a slow CI machine while engines ran.
    wait_for(lambda: leader in health.kafka_brokers(settings), 240, f"{victim} to come back")

    def in_sync():
        partitions = admin.list_topics(timeout=10).topics[settings.inbound_topic].partitions
        return all(len(p.isrs) == 3 for p in partitions.values())

    wait_for(in_sync, 60, "all three replicas of every inbound partition back in sync")
