"""
### audit_output_topic

**Purpose.** Every audit interval (`TWINSTREAM_AUDIT_INTERVAL_S`, default 600 s), prove
for each pipeline the stack runs (one mapped task group each) that its output has no gap
and no duplicate: `spark_jobs/audit_output.py`, submitted with
`SparkSubmitOperator`, reads the progress, outbound and dead-letter topics (read_committed)
from where the previous audit ended up to the inbound high watermark minus an in-flight
allowance (`TWINSTREAM_AUDIT_INFLIGHT_MSGS`), and validates them with the Great
Expectations suites in `twinstream.audit`: the published transactions' ranges tile the
inbound offsets from the last audited msg_id, each exactly once (every inbound offset
accounted for, with or without output), each range's outputs and dead letters are as many
as its progress record says, and the output values meet the pipeline's own expectations
(`twinstream.contract`). The result is kept as JSON and as GX Data Docs in
`<state>/audit/<pipeline>/`.

**Connections.** `spark_default` (`local[2]` locally, a Spark master in compose); Kafka and
the state folder from the `TWINSTREAM_*` settings. Spark's Kafka connector comes from
`TWINSTREAM_JARS_DIR/spark-kafka`.

**Tasks.** `audit_output` runs the job, which writes its verdict to `last-audit.json`
beside the cursor; `verdict` fails the run when the audit found a problem. A crashed or
unreachable job is retried; a finding is not (the same data gives the same finding, and
the next scheduled run checks the range again).

**Recovery.** A failed audit names the missing and the duplicated msg_id ranges, merged. Its
cursor does not move, so the next run audits the same range again: find the cause (the
engines' logs, `GET /pipeline` `uncovered_ranges`), then move the cursor past the range by
hand (`<state>/audit/<pipeline>/cursor.json`) once it is understood. To audit other
copies of one pipeline's topics, trigger with `pipeline` and the Params `outbound_topic`,
`dlq_topic`, `progress_topic` (topic names) and `cursor`: an id, not a path; that audit's
cursor and report are kept in `<state>/audit/<pipeline>/cursors/<id>/`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, task, task_group

from twinstream import registry
from twinstream.audit import CURSOR_ID_PATTERN, TOPIC_NAME_PATTERN
from twinstream.config import REPO_ROOT, load_settings

# Read from the environment and the pipelines file only (no network, no Variables, no
# pipeline code).
SETTINGS = load_settings()
PIPELINES = list(registry.stack(SETTINGS))

DEFAULT_ARGS = {
    "owner": "twinstream",
    "retries": 1,
    "retry_delay": timedelta(minutes=1),
}


@dag(
    dag_id="audit_output_topic",
    schedule=timedelta(seconds=SETTINGS.audit_interval_s),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["twinstream", "audit"],
    doc_md=__doc__,
    params={
        "pipeline": Param(
            "",
            type="string",
            enum=["", *PIPELINES],
            description="The pipeline to audit; empty: every pipeline of the stack.",
        ),
        # Other copies of one pipeline's topics, and a cursor of their own (empty: the
        # pipeline's). Only with one pipeline.
        "outbound_topic": Param("", type="string", pattern=TOPIC_NAME_PATTERN),
        "dlq_topic": Param("", type="string", pattern=TOPIC_NAME_PATTERN),
        "progress_topic": Param("", type="string", pattern=TOPIC_NAME_PATTERN),
        "cursor": Param(
            "",
            type="string",
            pattern=CURSOR_ID_PATTERN,
            description=(
                "A cursor of its own, by id (kept in the pipeline's audit folder, "
                "cursors/<id>/); empty for the pipeline's own."
            ),
        ),
    },
)
def audit_output_topic() -> None:
    @task
    def pipelines(params: dict[str, Any]) -> list[str]:
        from twinstream.audit import chosen_pipelines

        return chosen_pipelines(PIPELINES, params)

    @task
    def job_args(pipeline: str, params: dict[str, Any], run_id: str) -> list[str]:
        from twinstream.audit import job_args

        return job_args(pipeline, params, run_id)

    @task
    def verdict(pipeline: str, params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from twinstream.audit import REPORT, AuditFailed, cursor_file
        from twinstream.audit import verdict as read_verdict

        audit_dir = registry.pipeline_settings(pipeline).audit_dir
        report = cursor_file(audit_dir, params["cursor"]).parent / REPORT
        try:
            return read_verdict(report, run_id)
        except AuditFailed as exc:
            raise AirflowFailException(str(exc)) from exc

    # One group per pipeline: each pipeline's audit passes or fails on its own.
    @task_group
    def each_pipeline(pipeline: str) -> None:
        audit_output = SparkSubmitOperator(
            task_id="audit_output",
            application=str(REPO_ROOT / "spark_jobs" / "audit_output.py"),
            conn_id="spark_default",
            # A classpath wildcard: the connector's jars, without listing the folder at
            # parse time.
            driver_class_path=str(SETTINGS.jars_dir / "spark-kafka" / "*"),
            conf={"spark.ui.enabled": "false", "spark.driver.memory": "1g"},
            application_args=job_args(pipeline),
            name="twinstream-audit",
        )
        audit_output >> verdict(pipeline)

    each_pipeline.expand(pipeline=pipelines())


audit_output_topic()
