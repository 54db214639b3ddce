"""The retention guard against real Kafka, run by `dag.test()` on a pipeline of its own.
(The output audit through SparkSubmitOperator and Great Expectations runs on the three
partitions tests/chaos/test_partitions.py's quarantine run publishes, in `make chaos`.)"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from devkit.harness import Pipeline
from tests.integration.engines import load_dag, task_states
from twinstream.ops import retention
from twinstream.platform.kafka import (
    admin_config,
    alter_topic_configs,
    describe_topic_configs,
)
from twinstream.platform.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

HOUR_MS = 3_600_000


def test_a_short_inbound_retention_fails_the_guard_until_fixed(pipeline: Pipeline, dag_run_env):
    dag_run_env(pipeline)
    settings = load_settings()
    admin = AdminClient(admin_config(settings))
    inbound = settings.inbound_topic
    dag = load_dag("check_kafka_retention")
    assert dag.test().state == "success"

    alter_topic_configs(admin, inbound, {"retention.ms": str(HOUR_MS)})
    failed = dag.test()
    assert failed.state == "failed", task_states(failed)
    # The message the task fails with: each failed check, its values and its fix.
    persist_ms = retention.dag_interval_ms(settings.dags_dir, "persist_standby_state")
    audit_ms = retention.dag_interval_ms(settings.dags_dir, "audit_output_topic")
    report = retention.evaluate(retention.gather(settings, admin, persist_ms, audit_ms))
    required = settings.window_retention_ms + persist_ms + settings.restore_margin_s * 1000
    failed_checks = {c.name: c for c in report.failed}
    # One-day segments now outlive the one-hour retention, too.
    assert set(failed_checks) == {"inbound retention.ms", "inbound segment.ms"}
    line = failed_checks["inbound retention.ms"].line()
    assert f"retention.ms={HOUR_MS} ms" in line
    assert f"> {required} ms" in line
    assert f"--entity-name {inbound} --alter --add-config retention.ms={required + 1}" in line

    # Fixed by hand with the commands' own values: the guard passes.
    for check in failed_checks.values():
        setting, value = check.fix.rsplit(" ", 1)[1].split("=")
        alter_topic_configs(admin, inbound, {setting: value})
    assert dag.test().state == "success"

    # Broken again, then fixed by the DAG itself.
    alter_topic_configs(admin, inbound, {"retention.ms": str(HOUR_MS)})
    fixed = dag.test(run_conf={"apply_fix": True})
    assert fixed.state == "success", task_states(fixed)
    configs = describe_topic_configs(admin, inbound)
    assert configs["retention.ms"] == str(required + 1)
    assert int(configs["segment.ms"]) <= required + 1
