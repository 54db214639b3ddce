"""
### platform_health

**Purpose.** Every 10 minutes, prove that the services under the Twinstream engines are
whole: ZooKeeper serves (the engines' election), every configured Kafka broker is
registered, every pipeline's inbound, outbound, dead-letter and progress topics have
the shape the failover protocol relies on (partitions, replication factor and
`min.insync.replicas` as configured, unclean leader election off), and every pipeline's
active has a standby that could take over now (`standby_could_take_over`: in sync,
allowed to lead, its buffer covering the takeover; it fails naming each engine's reason
and how long the pipeline has had none). Retention is checked by `check_kafka_retention`.

**Connections.** The engines' (`twinstream_engine_<id>`) for `standby_could_take_over`;
the other checks read the `TWINSTREAM_*` settings (ports, topics) that the local stack
and compose pass to every Airflow process.

**Recovery.** A failed task names the service and what is wrong. Locally, `make status`
shows each process and `make up` restarts what is down and restores drifted topic
configs; in compose, `docker compose ps` and `docker compose up -d`. The DAG keeps no
state: clearing the failed run re-checks.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task

DEFAULT_ARGS = {
    "owner": "twinstream",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
}


@dag(
    dag_id="platform_health",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "platform"],
    doc_md=__doc__,
)
def platform_health() -> None:
    @task
    def zookeeper_serving() -> str:
        from twinstream.ops.platform_health import check_zookeeper
        from twinstream.platform.settings import TaskSettings, load

        return check_zookeeper(load(TaskSettings))

    @task
    def kafka_brokers_registered() -> list[int]:
        from twinstream.ops.platform_health import check_brokers
        from twinstream.platform.settings import TaskSettings, load

        return check_brokers(load(TaskSettings))

    @task
    def topics_as_configured() -> list[str]:
        from twinstream.ops.platform_health import check_topics
        from twinstream.platform.settings import TaskSettings, load

        return check_topics(load(TaskSettings))

    @task
    def standby_could_take_over() -> list[str]:
        from twinstream.ops.operate import observe_engines
        from twinstream.ops.platform_health import check_standbys
        from twinstream.platform import registry
        from twinstream.platform.settings import TaskSettings, load

        return check_standbys(registry.stack(load(TaskSettings)), observe_engines)

    standby_could_take_over()
    brokers = kafka_brokers_registered()
    zookeeper_serving()
    brokers >> topics_as_configured()


platform_health()
