"""The retention guard against real Kafka and the output audit through SparkSubmitOperator
and Great Expectations, both run by `dag.test()` on pipelines of their own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from devkit.harness import Pipeline
from tests.integration.engines import load_dag, task_states
from twinstream.edge.reader import read_committed
from twinstream.ops import retention
from twinstream.ops.audit import Cursor
from twinstream.platform.kafka import (
    TopicSpec,
    admin_config,
    alter_topic_configs,
    describe_topic_configs,
    ensure_topics,
    producer_config,
)
from twinstream.platform.kafka_auth import grant_read
from twinstream.platform.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quiet_stack_engines")]

HOUR_MS = 3_600_000
PARTITIONS = 3


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


def _last_audit(path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((path / "last-audit.json").read_text())
    return report


def _copy_outbound(pipeline: Pipeline, target: str, drop: range, repeat: range) -> None:
    """`.out` into `target`, partition for partition, with its headers, without the msg_ids
    in `drop` and with those in `repeat` written twice (in every partition)."""
    settings = pipeline.settings
    ensure_topics(AdminClient(admin_config(settings)), [TopicSpec(target, settings.partitions, 3)])
    producer = Producer(producer_config(settings))
    try:
        for record in read_committed(settings, settings.outbound_topic, partition=None):
            assert record.msg_id is not None
            if record.msg_id in drop:
                continue
            headers: list[tuple[str, str | bytes | None]] = [
                ("msg_id", str(record.msg_id)),
                ("engine_id", record.engine_id),
                ("epoch", str(record.epoch)),
            ]
            for _ in range(2 if record.msg_id in repeat else 1):
                producer.produce(
                    target, record.raw, record.key, partition=record.partition, headers=headers
                )
            producer.poll(0)
    finally:
        assert producer.flush(30) == 0


def _windows(report: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Each partition's audited msg_ids as (first, end)."""
    return {int(p): (f["first_msg_id"], f["end_msg_id"]) for p, f in report["partitions"].items()}


@pytest.mark.parametrize("pipeline", [PARTITIONS], indirect=True)
def test_the_audit_passes_each_partition_and_names_the_ranges_of_a_broken_copy(
    pipeline: Pipeline, dag_run_env, monkeypatch
):
    """Three inbound partitions: the audit proves each one contiguous on its own and leaves
    its cursor where it ended in each, and a copy of `.out` with the same msg_ids dropped
    and repeated in every partition, audited up to the ends it is told, fails, naming the
    ranges of each. (The restore test ran this audit on its three partitions; here it
    costs no Spark job more. A second audit from the first one's cursor was a third Spark
    job, ~30 s of `make test`: where an audit starts and ends is tests/unit/test_audit.py's,
    the cursor's positions after a real audit are asserted here.)

    An audit right after publishing covers every record published (issue 33 point 8): the
    in-flight margin stays at its default, 20,000 msg_ids, far more than these partitions
    hold, and the audit ends where the committed progress records do, not margin below the
    inbound end (which left this whole load unaudited: "nothing to audit below msg_id 0")."""
    # One engine: the audit reads the topics, whoever wrote them.
    engine = pipeline.start("a")
    # Published while Spark starts: the engine reads them as its first batches.
    load = pipeline.load(3_000, rate=0, broken_every=50)
    pipeline.wait_running(engine)
    pipeline.join_load(load)
    pipeline.wait_caught_up(engine, field="published")
    dag_run_env(pipeline)
    # The default margin, said here so that no environment can shrink it to fit the test.
    monkeypatch.setenv("TWINSTREAM_AUDIT_INFLIGHT_MSGS", "20000")
    settings = load_settings()
    dag = load_dag("audit_output_topic")

    ends = pipeline.inbound_ends()
    assert sorted(ends) == list(range(PARTITIONS))
    # Every partition holds past the broken copy's ranges below (keyed by host).
    assert min(ends.values()) > 300, ends
    first = dag.test()
    assert first.state == "success", task_states(first)
    report = _last_audit(settings.audit_dir)
    assert report["up_to"] == "committed"
    assert _windows(report) == {p: (0, end) for p, end in ends.items()}
    for findings in report["partitions"].values():
        assert findings["missing"] == findings["duplicated"] == findings["mismatched"] == []
    assert report["records"] == pipeline.produced
    assert Path(report["data_docs"]).is_file()
    results = json.loads(Path(report["results"]).read_text())
    assert set(results) == {"twinstream_msg_ids", "twinstream_output_values"}
    after_first = Cursor.load(settings.audit_dir / "cursor.json")
    assert {p: after_first.at(p).next_msg_id for p in ends} == ends

    # A copy of .out with msg_ids 100..109 deleted and 200..201 duplicated, in every
    # partition.
    copy = f"{settings.outbound_topic}.copy"
    _copy_outbound(pipeline, copy, drop=range(100, 110), repeat=range(200, 202))
    if settings.kafka_security:
        # Only the pipeline's own outputs are its reader's: an operator auditing another
        # topic grants it (the audit reads as the reader, never as the admin).
        grant_read(AdminClient(admin_config(settings)), settings, copy)
    # Its own cursor, by id: kept in the pipeline's audit folder.
    broken = settings.audit_dir / "cursors" / "copy-audit"
    conf = {
        "outbound_topic": copy,
        "dlq_topic": settings.dlq_topic,
        "progress_topic": settings.progress_topic,
    }
    # Told where to end: each partition's inbound end (the last transaction's boundary).
    up_to = ",".join(f"{p}:{end}" for p, end in sorted(ends.items()))
    failed = dag.test(run_conf={**conf, "cursor": "copy-audit", "up_to": up_to})
    assert failed.state == "failed", task_states(failed)
    # The job ran to its verdict; the verdict failed the run at once, without a retry.
    states = task_states(failed)
    assert (states["each_pipeline.audit_output"], states["each_pipeline.verdict"]) == (
        "success",
        "failed",
    )
    tries = {ti.task_id: ti.try_number for ti in failed.get_task_instances()}
    assert tries["each_pipeline.verdict"] == 1
    report = _last_audit(broken)
    assert report["run_id"] == failed.run_id
    assert not report["ok"]
    assert report["up_to"] == up_to
    assert _windows(report) == {p: (0, end) for p, end in ends.items()}
    # Every offset is in a published transaction (the progress records are intact), but
    # the transactions holding 100..109 and 200..201 no longer have their outputs: named
    # in each partition.
    assert sorted(report["partitions"]) == [str(p) for p in range(PARTITIONS)]
    for findings in report["partitions"].values():
        assert findings["missing"] == findings["duplicated"] == []
        mismatched = findings["mismatched"]
        for lost in (100, 109, 200, 201):
            assert any(a <= lost <= b for a, b in mismatched), (lost, mismatched)
    assert not (broken / "cursor.json").exists()  # a failed audit does not move on
