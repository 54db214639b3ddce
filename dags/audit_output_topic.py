"""
### audit_output_topic

**Purpose.** Every audit interval (`TWINSTREAM_AUDIT_INTERVAL_S`, default 600 s), prove
for each pipeline the stack runs (one mapped task group each) that its output has no gap
and no duplicate: `spark_jobs/audit_output.py`, submitted with
`SparkSubmitOperator`, reads the progress, outbound and dead-letter topics (read_committed)
from where the previous audit ended up to the end the `up_to` Param chooses (by default
everything the pipeline has committed), and validates them with the Great Expectations
suites in `twinstream.ops.audit`: the published transactions' ranges tile the
inbound offsets from the last audited msg_id, each exactly once (every inbound offset
accounted for, with or without output), each range's outputs and dead letters are as many
as its progress record says, and the output values meet the pipeline's own expectations
(`twinstream.contract`). The result is kept as JSON and as GX Data Docs in
`<state>/audit/<pipeline>/`.

**Below the engines.** The Spark job runs at `TWINSTREAM_JOB_NICENESS` (10), its JVM
inheriting the niceness from the task's thread: an audit can wait a minute, an output
cannot. Airflow's own servers keep `TWINSTREAM_AIRFLOW_NICENESS` (0).

**Where an audit ends** (the `up_to` Param, in each inbound partition, never inside a
published transaction):

- `committed` (default): the end of the last progress record committed, which the active
  writes in the same transaction as its outputs: everything published so far, so an audit
  triggered right after a test covers all of the test. Inputs not published yet are not
  gaps (no committed record claims them): the next audit covers them.
- `margin`: the inbound high watermark less `TWINSTREAM_AUDIT_INFLIGHT_MSGS` (20,000),
  the audit's end before `up_to` existed; it leaves the newest inputs to the next audit.
- `<partition>:<msg_id>[,...]`, e.g. `0:5000,1:4200`: the msg_ids below each end (moved
  down to the start of a transaction that straddles it); a partition not named is not
  audited this time. A msg_id below the end that no committed record covers is reported
  missing (not published yet, or lost), and an end above the inbound high watermark is
  refused.

**Connections.** `spark_default` (`local[2]` locally, a Spark master in compose); Kafka and
the state folder from the `TWINSTREAM_*` settings. Spark's Kafka connector comes from
`TWINSTREAM_JARS_DIR/spark-kafka`.

**Tasks.** `audit_output` runs the job, which writes its verdict to `last-audit.json`
beside the cursor; `verdict` (run however the job ended) fails the run when the audit
found a problem or the job wrote no report. `verdict` and `agreement` each record how they
ended in `<state>/audit/<pipeline>/runs/<run id>/`: `twinstream status` and the
Twinstream page show the last run task by task, and a failed task fails the run there. A crashed or
unreachable job is retried; a finding is not (the same data gives the same finding, and
the next scheduled run checks the range again). `agreement`, beside them, asks every
engine of the pipeline (`GET /pipeline` `agreement`) and fails when one says its rows
disagree with the published output, naming the msg_id, the active's transaction it lies
in and both sides' rows; an engine that does not answer is logged, not failed
(`watch_engines` deals with it). It needs the engines' connections,
`twinstream_engine_<id>`.

**Recovery.** A failed audit names the missing and the duplicated msg_id ranges, merged,
and each expectation that failed (its suite, type, column, bounds and observed value). Its
cursor does not move, so the next run audits the same range again: find the cause (the
engines' logs, `GET /pipeline` `uncovered_ranges`), then move the cursor past the range by
hand (`<state>/audit/<pipeline>/cursor.json`) once it is understood. To audit other
copies of one pipeline's topics, trigger with `pipeline` and the Params `outbound_topic`,
`dlq_topic`, `progress_topic` (topic names) and `cursor`: an id, not a path; that audit's
cursor and report are kept in `<state>/audit/<pipeline>/cursors/<id>/`. A failed
`agreement` says which engine disagrees: `watch_engines` restores it (`restore_and_resync`,
snapshot `proven`); or override it (`POST /pipeline/override`) to let it lead.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, task, task_group

from twinstream.ops.audit import (
    CURSOR_ID_PATTERN,
    TOPIC_NAME_PATTERN,
    UP_TO_PATTERN,
    below_the_engines,
)
from twinstream.platform import registry
from twinstream.platform.settings import REPO_ROOT, TaskSettings, load

# Read from the environment and the pipelines file only (no network, no Variables, no
# pipeline code).
SETTINGS = load(TaskSettings)
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
        "up_to": Param(
            "committed",
            type="string",
            pattern=UP_TO_PATTERN,
            examples=["committed", "margin"],
            description=(
                "Where the audit ends in each inbound partition: 'committed' (everything "
                "the pipeline has published), 'margin' (the inbound end less "
                "TWINSTREAM_AUDIT_INFLIGHT_MSGS), or an end per partition such as "
                "'0:5000,1:4200' (the msg_ids below each end; unnamed partitions wait for "
                "the next audit)."
            ),
        ),
    },
)
def audit_output_topic() -> None:
    @task
    def pipelines(params: dict[str, Any]) -> list[str]:
        from twinstream.ops.audit import chosen_pipelines

        return chosen_pipelines(PIPELINES, params)

    @task
    def job_args(pipeline: str, params: dict[str, Any], run_id: str) -> list[str]:
        from twinstream.ops.audit import job_args

        return job_args(pipeline, params, run_id)

    # After the job however it ended: a job that failed is this task's failure too, and the
    # run's record (twinstream.ops.audit_runs) says so.
    @task(trigger_rule="all_done")
    def verdict(pipeline: str, params: dict[str, Any], run_id: str) -> dict[str, Any]:
        from twinstream.ops.audit import audit_verdict

        return audit_verdict(registry.pipeline_settings(pipeline).audit_dir, params, run_id)

    @task
    def agreement(pipeline: str, run_id: str) -> str:
        from twinstream.ops.operate import agreement_task

        return agreement_task(registry.pipeline_settings(pipeline), run_id)

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
            # Below the engines (TWINSTREAM_JOB_NICENESS): its JVM inherits the niceness.
            pre_execute=below_the_engines(SETTINGS.job_niceness),
        )
        audit_output >> verdict(pipeline)
        # Not after the job: the engines' word needs no Spark, and a failed job does not
        # hide a disagreement.
        agreement(pipeline)

    each_pipeline.expand(pipeline=pipelines())


audit_output_topic()
