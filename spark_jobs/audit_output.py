"""Audit a pipeline's published output since the last audit (a Spark batch job).

    spark-submit spark_jobs/audit_output.py [--outbound-topic T] [--dlq-topic T]
        [--progress-topic T] [--cursor ID] [--up-to committed|margin|P:END,...] [--run-id ID]

Reads `.progress`, `.out` and `.dlq` (read_committed) from where the last audit ended, up
to what `--up-to` says (`twinstream.ops.audit.choose_ends`; by default the end of the last
progress record committed, i.e. everything the pipeline has published; `margin`: the
inbound high watermark minus TWINSTREAM_AUDIT_INFLIGHT_MSGS; or an end per partition),
checks that the progress records account for every inbound offset exactly once and the
outputs for each, validates them with the Great Expectations suites of `twinstream.ops.audit`
and the pipeline's own expectations (`twinstream.contract`), writes the result as JSON and
Data Docs under TWINSTREAM_STATE_DIR/audit/<pipeline>/, and moves the cursor on only when
the audit passes. Every run writes its verdict to `last-audit.json` beside the cursor (its
summary names each failed expectation). Exit status 1 with
the missing and duplicated msg_id ranges when it fails, 2 on bad input. With `--run-id`
(the Airflow DAG) a failed audit exits 0 once its report is written: the DAG's `verdict`
task fails the run from the report, without the retry a crashed job gets.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twinstream.contract import ContractError
from twinstream.core.rows import PARTITION_SHIFT
from twinstream.ops.audit import (
    REPORT,
    Audited,
    Cursor,
    Position,
    Span,
    UpTo,
    UpToError,
    Validation,
    choose_ends,
    cursor_file,
    find_problems,
    report_summary,
    save_expectations,
    saved_expectations,
    validate,
    version_suites,
)
from twinstream.platform import registry
from twinstream.platform.kafka import connection
from twinstream.platform.settings import (
    CommonSettings,
    SettingsError,
    TaskSettings,
    load,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("twinstream.ops.audit")
PROGRESS_SCHEMA = "first BIGINT, last BIGINT, outputs BIGINT, dead_letters BIGINT"


def read_topic(
    spark: SparkSession, settings: CommonSettings, topic: str, starts: Mapping[int, int]
) -> DataFrame:
    """Committed records of one output topic from `starts` (partition -> offset; Spark
    needs every partition's): partition, offset, msg_id (header), value."""
    from pyspark.sql import functions as F

    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {str(p): o for p, o in starts.items()}}))
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        # As the pipeline's reader: the audit reads the outputs, and may do nothing else.
        .options(**connection(settings.model_copy(update={"kafka_role": "reader"})).spark_options())
        .load()
        .select(
            F.lit(topic).alias("topic"),
            F.col("partition"),
            F.col("offset"),
            F.expr(
                "cast(cast(filter(headers, h -> h.key = 'msg_id')[0].value as string) as long)"
            ).alias("msg_id"),
            # The version of the code that computed the record; null when it carries none
            # (published before records did, or copied without it): get() is NULL past the
            # end where [0] fails the job under ANSI mode.
            F.expr("cast(get(filter(headers, h -> h.key = 'version'), 0).value as string)").alias(
                "version"
            ),
            F.col("value").cast("string").alias("value"),
        )
    )


def per_partition(values: Mapping[int, int]) -> Column:
    """A column holding, for each row, the value of its `partition`."""
    from pyspark.sql import functions as F

    pairs = [item for p, v in sorted(values.items()) for item in (F.lit(p), F.lit(v))]
    return F.create_map(*pairs)[F.col("partition")]


def next_offset(df: DataFrame, partition: int, end: int, start: int) -> int:
    """Where the next audit reads this topic's partition: its first record at or above
    `end`, or just past the last record read when there is none."""
    from pyspark.sql import functions as F

    row = (
        df.where(F.col("partition") == partition)
        .agg(
            F.min(F.when(F.col("msg_id") >= end, F.col("offset"))).alias("first_beyond"),
            F.max("offset").alias("last"),
        )
        .first()
    )
    if row is None or row["last"] is None:
        return start
    if row["first_beyond"] is not None:
        return int(row["first_beyond"])
    return int(row["last"]) + 1


def inbound_highs(settings: TaskSettings) -> dict[int, int]:
    """Each inbound partition's high watermark."""
    from confluent_kafka import Consumer, TopicPartition

    from twinstream.platform.kafka import consumer_config

    topic = settings.inbound_topic
    consumer = Consumer(consumer_config(settings, f"twinstream-audit-{uuid.uuid4()}"))
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        if meta.error is not None or not meta.partitions:
            raise RuntimeError(f"no metadata for topic {topic}: {meta.error}")
        ends = {}
        for p in sorted(meta.partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            ends[p] = int(high)
        return ends
    finally:
        consumer.close()


def write_report(
    cursor_path: Path,
    run_id: str,
    findings: Audited,
    validation: Validation | None,
    run_name: str = "",
    up_to: UpTo | None = None,
    unchecked: list[str] | None = None,
) -> None:
    """What this audit found, pass or fail, machine-readable beside the cursor: the summary
    names each failed expectation (what `twinstream status` shows of a failed audit), and
    the versions whose outputs' values were not checked (their expectations never kept)."""
    expectations_met = validation is None or validation.success
    failed = [] if validation is None else validation.failed
    report = {
        "run": run_name,
        "run_id": run_id,
        "ok": findings.ok and expectations_met,
        "summary": report_summary(findings, failed),
        **findings.report(),
        "up_to": str(up_to or UpTo()),
        "expectations_met": expectations_met,
        "failed_expectations": failed,
        "unchecked_versions": unchecked or [],
        "results": None if validation is None else str(validation.results_path),
        "data_docs": None if validation is None else str(validation.data_docs),
    }
    (cursor_path.parent / REPORT).write_text(json.dumps(report, indent=2))


def audit(
    spark: SparkSession, settings: TaskSettings, args: argparse.Namespace
) -> tuple[Audited, bool]:
    """The findings, and whether the Great Expectations suites passed."""
    from pyspark.sql import functions as F

    contract = registry.load(settings)
    up_to: UpTo = args.up_to
    cursor_path = cursor_file(settings.audit_dir, args.cursor)
    cursor_path.parent.mkdir(parents=True, exist_ok=True)
    cursor = Cursor.load(cursor_path)
    inbound = inbound_highs(settings)
    up_to.check(inbound)  # before any Spark work: a bad end is the operator's to fix
    at = {p: cursor.at(p) for p in inbound}
    progress = read_topic(
        spark, settings, args.progress_topic, {p: a.progress_offset for p, a in at.items()}
    ).cache()
    all_spans_df = (
        progress.select("partition", F.from_json("value", PROGRESS_SCHEMA).alias("p"))
        .select("partition", "p.*")
        .withColumn("size", F.col("last") - F.col("first") + 1)
        # Unique per partition's range start (the coverage suite's `start`).
        .withColumn(
            "start",
            F.shiftleft(F.col("partition").cast("long"), PARTITION_SHIFT).bitwiseOR(F.col("first")),
        )
    )
    committed: dict[int, list[Span]] = {p: [] for p in inbound}
    for r in all_spans_df.collect():
        committed.setdefault(r["partition"], []).append(
            Span(r["first"], r["last"], r["outputs"], r["dead_letters"])
        )
    # Each progress record is committed in the transaction of its outputs, and the outputs
    # are read after it (seconds later): Kafka has written that transaction's commit marker
    # to their partitions by then. Were one late, the transaction would be a mismatch this
    # time, never lost: the cursor stays and the next audit reads it again.
    ends = choose_ends(
        up_to,
        {p: a.next_msg_id for p, a in at.items()},
        committed,
        inbound,
        settings.audit_inflight_msgs,
    )
    spans = {p: [s for s in committed.get(p, []) if s.last < ends[p]] for p in inbound}
    # The same records for the suite, filtered by the ends again: a re-read of the topic
    # (a cache evicted) may see records committed since, which this audit does not cover.
    spans_df = all_spans_df.where(F.col("last") < per_partition(ends)).cache()
    out = read_topic(
        spark, settings, args.outbound_topic, {p: a.out_offset for p, a in at.items()}
    ).cache()
    dlq = read_topic(
        spark, settings, args.dlq_topic, {p: a.dlq_offset for p, a in at.items()}
    ).cache()
    counts = (
        out.withColumn("kind", F.lit("out"))
        .unionByName(dlq.withColumn("kind", F.lit("dlq")))
        .where(F.col("msg_id").isNull() | (F.col("msg_id") < per_partition(ends)))
        .groupBy("partition", "msg_id", "kind")
        .count()
    )
    rows: dict[int, list[tuple[int | None, str, int]]] = {p: [] for p in inbound}
    for r in counts.toLocalIterator():
        rows.setdefault(r["partition"], []).append((r["msg_id"], r["kind"], int(r["count"])))
    findings = Audited(
        {
            p: find_problems(spans.get(p, []), rows.get(p, []), at[p].next_msg_id, ends[p])
            for p in sorted(inbound)
        }
    )
    log.info("audit %s (up to %s): %s", settings.pipeline, up_to, findings.summary())
    nothing = all(ends[p] <= at[p].next_msg_id for p in inbound)
    if nothing and findings.rows == 0 and not any(spans.values()):
        write_report(cursor_path, args.run_id, findings, None, up_to=up_to)
        return findings, True

    suites: list[tuple[str, list[Any], DataFrame]] = []
    unchecked: list[str] = []
    if contract.expectations is not None:
        # Each version's outputs against its own expectations: the code on disk's now, and
        # every other version's as kept when its code was on disk at an audit.
        on_disk = str(registry.code_version(settings, contract))
        now = contract.expectations()
        save_expectations(settings.audit_dir, on_disk, contract.value_schema, now)
        audited = out.where(F.col("msg_id") < per_partition(ends))
        present = [r["version"] for r in audited.select("version").distinct().collect()]
        plan, unchecked = version_suites(
            present,
            on_disk,
            contract.value_schema,
            now,
            lambda v: saved_expectations(settings.audit_dir, v),
        )
        if unchecked:
            log.warning(
                "audit %s: the outputs of version %s are checked for exactly once but not "
                "for their values: their expectations were never kept (no audit ran while "
                "their code was on disk)",
                settings.pipeline,
                ", ".join(unchecked),
            )
        for suite in plan:
            if suite.version is None:
                chosen = audited.where(F.col("version").isNull() | (F.col("version") == on_disk))
            else:
                chosen = audited.where(F.col("version") == suite.version)
            values = chosen.select(
                # The msg_id a pipeline's transform saw: the record id (the partition
                # above the offset, twinstream.core.rows.record_id; the offset on
                # partition 0), which an output that carries its msg_id holds.
                F.shiftleft(F.col("partition").cast("long"), PARTITION_SHIFT)
                .bitwiseOR(F.col("msg_id"))
                .alias("header_msg_id"),
                F.from_json("value", suite.value_schema).alias("v"),
            ).select("header_msg_id", "v.*")
            suites.append((suite.name, suite.expectations, values))
    run_name = (
        f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{at[0].next_msg_id if 0 in at else 0}-{ends.get(0, 0)}"
    )
    validation = validate(
        settings.audit_dir,
        run_name,
        spans_df,
        {p: (at[p].next_msg_id, ends[p]) for p in inbound},
        suites,
    )
    log.info(
        "audit %s: Great Expectations %s; result %s; Data Docs %s",
        settings.pipeline,
        "passed" if validation.success else "FAILED",
        validation.results_path,
        validation.data_docs,
    )
    write_report(cursor_path, args.run_id, findings, validation, run_name, up_to, unchecked)
    if findings.ok and validation.success:
        cursor.moved(
            {
                p: Position(
                    next_msg_id=ends[p],
                    out_offset=next_offset(out, p, ends[p], at[p].out_offset),
                    dlq_offset=next_offset(dlq, p, ends[p], at[p].dlq_offset),
                    progress_offset=next_offset(progress, p, ends[p], at[p].progress_offset),
                )
                for p in inbound
            }
        ).save(cursor_path)
    elif validation.failed:
        log.error(
            "audit %s: failed expectations: %s", settings.pipeline, "; ".join(validation.failed)
        )
    return findings, validation.success


def up_to_arg(text: str) -> UpTo:
    """--up-to, refused by argparse (exit 2) with UpTo.parse's reason."""
    try:
        return UpTo.parse(text)
    except UpToError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--pipeline", default="")
    chosen, _rest = first.parse_known_args(argv)
    try:
        settings = load(TaskSettings)
        if chosen.pipeline:
            settings = registry.settings_for(settings, chosen.pipeline)
    except SettingsError as exc:
        print(f"audit_output: {exc}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--pipeline", default="", help="one of the pipelines file's (default: TWINSTREAM_PIPELINE)"
    )
    parser.add_argument("--outbound-topic", default=settings.outbound_topic)
    parser.add_argument("--dlq-topic", default=settings.dlq_topic)
    parser.add_argument("--progress-topic", default=settings.progress_topic)
    parser.add_argument(
        "--cursor",
        default="",
        help="a cursor id (kept in <state>/audit/<pipeline>/cursors/<id>/; empty: the "
        "pipeline's own, <state>/audit/<pipeline>/cursor.json)",
    )
    parser.add_argument(
        "--up-to",
        type=up_to_arg,
        default=UpTo(),
        help="where the audit ends in each partition: 'committed' (default: everything the "
        "pipeline has committed), 'margin' (the inbound high watermark less "
        "TWINSTREAM_AUDIT_INFLIGHT_MSGS) or an end per partition, '0:5000,1:4200' (the "
        "msg_ids below each end; a partition not named is not audited)",
    )
    parser.add_argument(
        "--run-id",
        default="",
        help="the Airflow run: findings exit 0, the DAG's verdict task fails the run",
    )
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.appName(f"twinstream-audit-{settings.pipeline}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        findings, expectations_met = audit(spark, settings, args)
    except (ContractError, UpToError) as exc:
        print(f"audit_output: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    if not findings.ok:
        log.error("audit %s FAILED: %s", settings.pipeline, findings.summary())
    elif not expectations_met:
        log.error("audit %s FAILED: malformed output values (see above)", settings.pipeline)
    if (findings.ok and expectations_met) or args.run_id:
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
