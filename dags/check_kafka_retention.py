"""
### check_kafka_retention

**Purpose.** Every hour, for each pipeline the stack runs (one mapped task each), prove
that a failed engine can still be restored and that its topics have the shape the
failover protocol relies on. Each check is a separate, named
result in the log and in the returned XCom:

- inbound `retention.ms` > window retention + persist interval + restore margin (the
  persist interval is read from `persist_standby_state`'s schedule, the only place it is
  set; the margin is `TWINSTREAM_RESTORE_MARGIN_S`);
- inbound `retention.bytes`, less one segment, keeps that long at the measured input rate;
- inbound `segment.ms` ≤ `retention.ms`;
- one inbound partition; replication factor ≥ 3 and `min.insync.replicas` ≥ 2 on the inbound
  and outbound topics (a warning only in a single-broker dev setup);
  `unclean.leader.election.enable=false`;
- outbound `retention.ms` ≥ twice the audit interval (`audit_output_topic`'s schedule);
- the newest valid snapshot's next offset ≥ the inbound log-start offset.

A failed check fails the run with the setting, its value, the required value and the
`kafka-configs.sh` command that fixes it. Trigger with `apply_fix` to let the DAG set the
retention settings itself; the log shows each value before and after.

**Connections.** `kafka_default` (the Kafka provider's `KafkaAdminClientHook`); topic names
and intervals from the `TWINSTREAM_*` settings.

**Recovery.** Fix the setting (the message gives the command, or rerun with `apply_fix`)
and clear the run. Partition count and replication are not configs: they need an
operator (recreate the topic, reassign partitions).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task

from twinstream.platform import registry
from twinstream.platform.settings import TaskSettings, load

# Reads the pipelines file only (no pipeline code is imported at parse time).
PIPELINES = list(registry.stack(load(TaskSettings)))

DEFAULT_ARGS = {
    "owner": "twinstream",
    "retries": 1,
    "retry_delay": timedelta(minutes=1),
}


@dag(
    dag_id="check_kafka_retention",
    schedule=timedelta(hours=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "kafka"],
    doc_md=__doc__,
    params={
        "apply_fix": Param(
            False,
            type="boolean",
            title="Apply the fix",
            description="Set the failing retention settings to their required values.",
        )
    },
)
def check_kafka_retention() -> None:
    @task
    def check_retention(pipeline: str, params: dict[str, Any]) -> list[str]:
        import logging

        from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook
        from airflow.sdk.exceptions import AirflowFailException

        from twinstream.ops import retention

        log = logging.getLogger("twinstream.ops.retention")
        settings = registry.pipeline_settings(pipeline)
        admin = KafkaAdminClientHook(kafka_config_id="kafka_default").get_conn
        persist_ms = retention.dag_interval_ms(settings.dags_dir, "persist_standby_state")
        audit_ms = retention.dag_interval_ms(settings.dags_dir, "audit_output_topic")
        facts = retention.gather(settings, admin, persist_ms, audit_ms)
        report = retention.evaluate(facts)
        fixes = retention.retention_fixes(facts, report)
        if params["apply_fix"] and fixes:
            for change in retention.apply_fixes(admin, fixes):
                log.warning("applied: %s", change)
            facts = retention.gather(settings, admin, persist_ms, audit_ms)
            report = retention.evaluate(facts)
        lines = [check.line() for check in report.checks]
        for line in lines:
            log.info("%s: %s", pipeline, line)
        if report.failed:
            raise AirflowFailException(
                f"{pipeline}: {len(report.failed)} retention check(s) failed:\n"
                + "\n".join(c.line() for c in report.failed)
            )
        return lines

    # One mapped task per pipeline the stack runs: each has its own topics and snapshots.
    check_retention.expand(pipeline=PIPELINES)


check_kafka_retention()
