"""Any contract pipeline (`twinstream.contract`) as one Spark Structured Streaming query:
inbound Kafka records -> validation in the JVM -> the user's transform -> rows for the gate.

Split as Spark's examples are: `read_inbound` (the source), pure DataFrame functions
(`validated`, `plan`) and `start_query`, which hands each micro-batch to a typed
`process_batch(df, batch_id)`; `rows_of` turns a batch into the gate's rows.

One source, two branches, one union: the user's transform of the valid records, and a
stateless branch that gives every other record its dead letter and every valid one a
coverage row (dropped in `rows_of` when the record has output). Both branches read the same
source instance, so the query has one source (a restart on its checkpoint resumes it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from twinstream.contract import DEAD_LETTER, MSG_ID, RAW, ContractError, Pipeline
from twinstream.core.logs import EngineLog
from twinstream.core.quarantine import describe
from twinstream.core.rows import (
    DLQ,
    NONE,
    OUT,
    PARTITION_SHIFT,
    Output,
    covered,
    dead_letter,
    fits,
    split_record_id,
)
from twinstream.platform.kafka import connection
from twinstream.platform.settings import EngineSettings, PipelineSettings

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.types import DataType

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# The kind of a quarantined record's row: its raw bytes, for the driver to dead-letter with
# the quarantine's reason (which lives in ZooKeeper, not in the plan).
QUARANTINED = "quarantined"

KEYED_CONF = {
    # A Keyed pipeline's integer members reach the step as int or None (pandas' Int64),
    # never as a float: a BIGINT beyond 2**53 would not survive one. Only for Keyed
    # pipelines: a transform's own pandas code may expect numpy's int64.
    "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype": "true",
}
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")
# JSON's whitespace (RFC 8259): space, tab, line feed, carriage return.
_JSON_SPACE = " \t\n\r"
_FRACTIONAL = ("float", "double")


def spark_conf(pipeline: Pipeline | None = None) -> dict[str, str]:
    return {
        **(pipeline.spark_conf if pipeline is not None else {}),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        # A commit writes a changelog of the batch's updates, not a snapshot of the whole
        # store (snapshots become the background maintenance's work). Off by default in
        # Spark 4.3; here it halved the state commit of a batch (140 -> 76 ms at 1,000
        # events/s). Switching it either way works on an existing checkpoint.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Counting the store's rows costs a read per write; nothing here reads the count
        # (numTotalStateRows becomes 0).
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
        # Pinned into the checkpoint's offsets: changing it later breaks restore. One
        # partition: a single-partition source gains nothing from more, and every extra
        # state-store partition costs each micro-batch a task and a RocksDB commit.
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(KEYED_CONF if pipeline is not None and pipeline.keyed is not None else {}),
        "spark.ui.enabled": "false",
        # Spark draws progress bars on stderr when its log level is WARN: the engine's log
        # filled with them ("[Stage 12:> (0 + 1) / 1]") between the lines a person reads.
        "spark.ui.showConsoleProgress": "false",
        # The engine's own stop/start must not wait for Spark's default 10 s grace.
        "spark.sql.streaming.stopTimeout": "30s",
        # The checkpoint history a gap repair can rewind to (twinstream.core.checkpoint):
        # 500 batches are about two minutes at the 250 ms trigger (Spark's default keeps 100).
        "spark.sql.streaming.minBatchesToRetain": "500",
    }


def read_inbound(
    spark: SparkSession,
    settings: EngineSettings,
    starting_offsets: Mapping[int, int] | None = None,
    max_offsets: int | None = None,
) -> DataFrame:
    """`starting_offsets` (partition -> offset) place a query without a checkpoint (a cold
    rebuild); None means the beginning of the topic. `max_offsets`: a batch's most records
    (twinstream.engine.batching); None: the settings' max_offsets_per_trigger."""
    starting = (
        "earliest"
        if starting_offsets is None
        else json.dumps({settings.inbound_topic: {str(p): o for p, o in starting_offsets.items()}})
    )
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", settings.inbound_topic)
        # Only for a query without a checkpoint; a restart resumes from the checkpoint.
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", str(max_offsets or settings.max_offsets_per_trigger))
        # Never reads uncommitted records if a producer of the inbound topic uses
        # transactions.
        .option("kafka.isolation.level", "read_committed")
        # SASL/SCRAM over TLS, as the settings' Kafka user (the engines').
        .options(**connection(settings).spark_options())
        .load()
    )


def _type_check(
    name: str, data_type: DataType, found: Column, typed: Column, optional: bool = False
) -> Column:
    """The reason a present member does not fit its declared type, or NULL. `found` is the
    JSON type the record holds (schema_of_variant; NULL when the member is absent), `typed`
    the value from_json read. An optional member absent or null is no reason; present with
    a value, it is checked as any other."""
    from pyspark.sql import functions as F

    kind = data_type.simpleString()
    if kind == "string":
        fits_type = found == "STRING"
    elif kind == "boolean":
        fits_type = found == "BOOLEAN"
    elif kind in _INTEGRAL:
        # An integer literal: JSON's 2e3 or 2.0 is a float, not a count.
        fits_type = found.isin("BIGINT", "INT", "SMALLINT", "TINYINT") | found.rlike(
            r"^DECIMAL\(\d+,0\)$"
        )
    elif kind in _FRACTIONAL or kind.startswith("decimal"):
        fits_type = found.isin("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT") | (
            found.startswith("DECIMAL")
        )
    else:  # structs, arrays, maps, dates: what from_json could read
        fits_type = typed.isNotNull()
    reason = (
        F.when(found == "VOID", F.lit(f"wrong_type: {name} is null"))
        .when(
            ~fits_type, F.concat(F.lit(f"wrong_type: {name} is "), found, F.lit(f", want {kind}"))
        )
        .when(typed.isNull(), F.lit(f"out_of_range: {name} does not fit {kind}"))
    )
    if kind in _FRACTIONAL:
        reason = reason.when(
            F.isnan(typed) | (F.abs(typed) == F.lit(float("inf"))),
            F.lit(f"out_of_range: {name} is not finite"),
        )
    if kind == "tinyint":
        # Jackson reads 128 to 255 as a byte that wraps (128 is -128), where every other
        # integer type's overflow is NULL: the variant holds the number as written.
        reason = reason.when(
            F.expr(f"try_variant_get(_doc, '$.{name}', 'int')") != typed,
            F.lit(f"out_of_range: {name} does not fit {kind}"),
        )
    if optional:
        return F.when(found.isNotNull() & (found != "VOID"), reason)
    return reason


def validated(
    inbound: DataFrame,
    pipeline: Pipeline,
    settings: EngineSettings,
    quarantined: Iterable[int] = (),
) -> DataFrame:
    """Every inbound record as msg_id, `_raw`, the schema's fields (typed) and `reason`:
    NULL for a valid record, else why it is a dead letter; QUARANTINED for an excluded
    offset. All in the JVM: one parse as a variant (strict JSON, the members' JSON types),
    one with the schema (the typed values, exactly as Jackson reads them)."""
    from pyspark.sql import functions as F

    schema = pipeline.struct()
    parsed = F.from_json(F.col("value").cast("string"), schema, {"allowNonNumericNumbers": "false"})
    doc = F.expr("try_parse_json(cast(value as string))")
    excluded = sorted(quarantined)
    # A record's msg_id in the plan: its offset, its partition above (core.rows.record_id).
    # The tests' and the warm-up's file source has no partition column: partition 0.
    record = F.col("offset")
    if "partition" in inbound.columns:
        record = F.shiftleft(F.col("partition").cast("long"), PARTITION_SHIFT).bitwiseOR(record)
    if excluded:
        # A quarantined record is not even parsed: the parser may be what fails on it.
        skip = record.isin(excluded)
        doc = F.when(~skip, doc)
        parsed = F.when(~skip, parsed)
    # The typed fields as columns, so that the checks' SQL can name them; each member's
    # JSON type once per record (NULL when absent), for every check that asks (an
    # expression repeated in the branches of a CASE is evaluated again in each).
    found = [f"__found_{i}" for i in range(len(schema.fields))]
    base = inbound.select(
        record.alias(MSG_ID),
        F.col("value").alias(RAW),
        doc.alias("_doc"),
        parsed.alias("_typed"),
    ).select(
        MSG_ID,
        RAW,
        "_doc",
        *(F.col("_typed").getField(f.name).alias(f.name) for f in schema.fields),
        *(
            F.expr(f"schema_of_variant(variant_get(_doc, '$.{f.name}'))").alias(name)
            for f, name in zip(schema.fields, found, strict=True)
        ),
    )
    raw_text = F.col(RAW).cast("string")
    keys = F.json_object_keys(raw_text)
    limit = settings.max_record_bytes
    size = F.length(F.col(RAW))
    not_parsed = (
        F.when(
            F.size(keys) != F.size(F.array_distinct(keys)),
            F.lit("duplicate_key: an object names a member twice"),
        )
        .when(
            raw_text.rlike(r"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}"),
            F.lit("bad_encoding: a string holds a lone surrogate, or the record is not JSON"),
        )
        .otherwise(F.lit("not_json: not a JSON document (syntax, nesting over 1000, NaN)"))
    )
    optional = set(pipeline.optional)
    # The required members absent, named in schema order ("" when none): concat_ws skips
    # NULLs (array_compact was a filter by a lambda, which Spark interprets per record).
    missing = F.concat_ws(
        ", ",
        F.lit(None).cast("string"),
        *(
            F.when(F.col(name).isNull(), F.lit(f.name))
            for f, name in zip(schema.fields, found, strict=True)
            if f.name not in optional
        ),
    )
    members = [
        _type_check(f.name, f.dataType, F.col(name), F.col(f"`{f.name}`"), f.name in optional)
        for f, name in zip(schema.fields, found, strict=True)
    ]
    # The bounds' checks, then the pipeline's own (Pipeline.rules).
    checks = [
        F.when(~F.coalesce(F.expr(condition), F.lit(False)), F.lit(reason))
        for reason, condition in pipeline.rules().items()
    ]
    reason = (
        F.when(F.col(RAW).isNull(), F.lit("not_json: a record without a value (a tombstone)"))
        .when(
            size > limit,
            F.concat(F.lit("oversize: "), size.cast("string"), F.lit(f" bytes, over {limit}")),
        )
        .when(~F.expr(f"is_valid_utf8(cast({RAW} as string))"), F.lit("not_json: not UTF-8"))
        .when(F.col("_doc").isNull(), not_parsed)
        # JSON's whitespace trimmed, not a regular expression: a search for `}` followed by
        # whitespace to the end tried every `}` of the record (1 µs a record of ~17).
        .when(
            ~F.ltrim(raw_text, F.lit(_JSON_SPACE)).startswith("{"),
            F.lit("not_json: a JSON value that is not an object"),
        )
        # Jackson reads the first value and ignores what follows it.
        .when(
            ~F.rtrim(raw_text, F.lit(_JSON_SPACE)).endswith("}"),
            F.lit("not_json: something follows the JSON object"),
        )
        .when(missing != "", F.concat(F.lit("missing_field: "), missing))
    )
    # The first rule a record breaks is its reason: members in schema order, then checks.
    first = F.coalesce(*members, *checks) if members or checks else F.lit(None).cast("string")
    reason = reason.otherwise(first)
    fault = settings.fault_marker
    if fault:
        # Test-only fault injection (TWINSTREAM_FAULT_MARKER): a bug outside the per-record
        # guard, failing the whole batch on every engine, for the quarantine to find.
        reason = F.when(
            F.instr(raw_text, fault) > 0,
            F.raise_error(F.lit(f"fault injected: a record holds {fault!r}")).cast("string"),
        ).otherwise(reason)
    # Last, so that it wins: a quarantined record reaches neither the rules above (one of
    # them may be what fails) nor the transform.
    if excluded:
        reason = F.when(F.col(MSG_ID).isin(excluded), F.lit(QUARANTINED)).otherwise(reason)
    return base.select(MSG_ID, RAW, *(f.name for f in schema.fields), reason.alias("reason"))


def plan(validated_records: DataFrame, pipeline: Pipeline) -> DataFrame:
    """The rows of every record (msg_id, kind, key, value, raw): the transform's outputs
    of the valid ones, the dead letters and quarantined records, a coverage row per valid
    record."""
    if pipeline.keyed is not None:
        return keyed_plan(validated_records, pipeline)
    return _transform_plan(validated_records, pipeline)


def _row_columns(pipeline: Pipeline) -> tuple[Column, Column]:
    """The Kafka key and value of an output row, from the pipeline's `key` and `value`."""
    from pyspark.sql import functions as F

    if pipeline.value_format == "text":
        value = F.col(pipeline.value[0]).cast("string")
    else:
        value = F.to_json(F.struct(*(F.col(c) for c in pipeline.value)))
    key = F.col(pipeline.key).cast("string") if pipeline.key else F.lit(None).cast("string")
    return key, value


def keyed_plan(validated_records: DataFrame, pipeline: Pipeline) -> DataFrame:
    """A `Keyed` pipeline's rows in one pass: every record, valid or not, goes once through
    one stateful operator grouped by its inbound partition (`twinstream.engine.state.processor`),
    which runs the step on the valid ones and gives every record its row: outputs, a
    coverage row, or a dead letter. One source scan and one trip to Python per batch."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType, _parse_datatype_string

    from twinstream.engine.state.processor import (
        KIND,
        PARTITION,
        REASON,
        KeyedProcessor,
        output_schema,
    )

    keyed = pipeline.keyed
    assert keyed is not None
    assert pipeline.partition_by is not None
    valid = F.col("reason").isNull()
    members = [f.name for f in pipeline.struct().fields]
    derived = [F.when(valid, F.expr(sql)).alias(name) for name, sql in keyed.derive.items()]
    records = validated_records.select(
        MSG_ID,
        F.shiftright(F.col(MSG_ID), PARTITION_SHIFT).cast("int").alias(PARTITION),
        F.col("reason").alias(REASON),
        RAW,
        *members,
        *derived,
    )
    schema = output_schema(keyed.output)
    parsed = _parse_datatype_string(keyed.output)
    assert isinstance(parsed, StructType)
    output_columns = [f.name for f in parsed.fields]
    integral = [f.name for f in pipeline.struct().fields if f.dataType.simpleString() in _INTEGRAL]
    processor = KeyedProcessor(
        keyed,
        pipeline.partition_by,
        [MSG_ID, *members, *keyed.derive],
        output_columns,
        integral,
    )
    out = records.groupBy(PARTITION).transformWithStateInPandas(
        statefulProcessor=processor,
        outputStructType=schema,
        outputMode="Append",
        timeMode="None",
    )
    key, value = _row_columns(pipeline)
    kind = F.col(KIND)
    return out.select(
        F.col(MSG_ID).alias("msg_id"),
        kind.alias("kind"),
        F.when(kind == OUT, key).alias("key"),
        F.when(kind == OUT, value).otherwise(F.col(REASON)).alias("value"),
        F.when(kind != OUT, F.col(RAW)).alias("raw"),
    )


def _transform_plan(validated_records: DataFrame, pipeline: Pipeline) -> DataFrame:
    from pyspark.sql import functions as F

    assert pipeline.transform is not None
    valid = validated_records.where(F.col("reason").isNull()).drop("reason")
    out = pipeline.transform(valid)
    columns = set(out.columns)
    needed = {MSG_ID, *pipeline.value, *([pipeline.key] if pipeline.key else [])}
    if not needed <= columns:
        raise ContractError(
            f"pipeline {pipeline.name}: the transform's output lacks {sorted(needed - columns)} "
            f"(it has {sorted(columns)})"
        )
    key, value = _row_columns(pipeline)
    letter = F.col(DEAD_LETTER) if DEAD_LETTER in columns else F.lit(None).cast("string")
    outputs = out.select(
        F.col(MSG_ID).cast("long").alias("msg_id"),
        F.when(letter.isNotNull(), F.lit(DLQ)).otherwise(F.lit(OUT)).alias("kind"),
        F.when(letter.isNull(), key).alias("key"),
        F.coalesce(letter, value).alias("value"),
        (F.col(RAW) if RAW in columns else F.lit(None).cast("binary")).cast("binary").alias("raw"),
    )
    reason = F.col("reason")
    others = validated_records.select(
        F.col(MSG_ID).alias("msg_id"),
        F.when(reason.isNull(), F.lit(NONE))
        .when(reason == QUARANTINED, F.lit(QUARANTINED))
        .otherwise(F.lit(DLQ))
        .alias("kind"),
        F.lit(None).cast("string").alias("key"),
        reason.alias("value"),
        F.when(reason.isNotNull(), F.col(RAW)).alias("raw"),
    )
    return outputs.unionByName(others)


def rows_of(
    batch: DataFrame,
    quarantined: Mapping[int, str] | None = None,
    max_message_bytes: int = 1_000_000,
) -> list[Output]:
    """The batch's rows for the gate (see `assemble`). The batch's one Spark action: it
    comes to the driver as Arrow, column by column, not as pickled Row objects."""
    table = batch.toArrow()
    return assemble(
        table.column("msg_id").to_pylist(),
        table.column("kind").to_pylist(),
        table.column("key").to_pylist(),
        table.column("value").to_pylist(),
        table.column("raw").to_pylist(),
        quarantined,
        max_message_bytes,
    )


def assemble(
    msg_ids: Sequence[int],
    kinds: Sequence[str],
    keys: Sequence[str | None],
    values: Sequence[str | None],
    raws: Sequence[bytes | None],
    quarantined: Mapping[int, str] | None = None,
    max_message_bytes: int = 1_000_000,
) -> list[Output]:
    """A batch's rows (the plan's columns, in any order) for the gate: in (partition,
    msg_id) order and, within a msg_id, ordered by key and value (Spark's union and shuffle
    give them in any order; every engine must publish the same bytes). The plan's msg_ids
    are record ids (`twinstream.core.rows.record_id`), as are the quarantine's keys; a row's
    msg_id is the offset in its partition. Dead letters are built here
    (`twinstream.core.rows.dead_letter`); a coverage row stays only for a record with no
    other row; a record with an output too large for one message becomes its dead letter
    instead."""
    by_id: dict[int, list[tuple[str | None, str]]] = {}
    letters: dict[int, tuple[str, bytes]] = {}
    for msg_id, kind, key, value, raw in zip(msg_ids, kinds, keys, values, raws, strict=True):
        if kind == OUT:
            # A text pipeline's null value stays None: a tombstone, as it always was.
            by_id.setdefault(msg_id, []).append((key, cast(str, value)))
        elif kind == NONE:
            by_id.setdefault(msg_id, [])
        else:
            reason = value or "error: no reason"
            if kind == QUARANTINED and quarantined is not None:
                reason = quarantined.get(msg_id, reason)
            letters.setdefault(msg_id, (reason, raw or b""))
            by_id.setdefault(msg_id, [])
    rows: list[Output] = []
    for record in sorted(by_id):
        partition, offset = split_record_id(record)
        if record in letters:
            reason, raw = letters[record]
            rows.append(dead_letter(offset, reason, raw, max_message_bytes, partition))
            continue
        outputs = [Output(offset, OUT, key, value, partition) for key, value in by_id[record]]
        if len(outputs) > 1:
            outputs.sort(key=lambda o: (o.key or "", o.value))
        if not outputs:
            rows.append(covered(offset, partition))
        elif all(fits(o, max_message_bytes) for o in outputs):
            rows.extend(outputs)
        else:
            raw_text = "\n".join(o.value for o in outputs).encode("utf-8", "backslashreplace")
            reason = "oversize: an output would not fit one message"
            rows.append(dead_letter(offset, reason, raw_text, max_message_bytes, partition))
    return rows


def run_on_records(
    spark: SparkSession,
    settings: EngineSettings,
    pipeline: Pipeline,
    records: Sequence[tuple[int, bytes | None]],
    folder: Path,
    batches: int = 1,
    timeout_s: float | None = None,
    partitions: Sequence[int] | None = None,
) -> list[Output]:
    """The rows the gate would get for `records` ((offset, value) pairs in offset order),
    through the pipeline's whole plan in `batches` micro-batches: a file source in place of
    Kafka (the columns the plan reads: offset, value, and the partition when `partitions`
    gives each record's) and a throw-away checkpoint, both in `folder`. Publishes nothing
    and touches no topic or state of the pipeline: the tests' reference runs and the
    engines' warm-up."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = folder / "source"
    source.mkdir(parents=True, exist_ok=True)
    size = max(1, -(-len(records) // max(1, batches)))
    for n, first in enumerate(range(0, len(records), size)):
        part = records[first : first + size]
        path = source / f"part-{n:05d}.parquet"
        columns = {
            "offset": pa.array([o for o, _ in part], pa.int64()),
            "value": pa.array([v for _, v in part], pa.binary()),
        }
        if partitions is not None:
            columns["partition"] = pa.array(partitions[first : first + size], pa.int32())
        pq.write_table(pa.table(columns), path)
        # The file source reads the oldest file first (by modification time, not name):
        # the batches must come in msg_id order.
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    rows: list[Output] = []

    def collect(batch: DataFrame, _batch_id: int) -> None:
        rows.extend(rows_of(batch, {}, settings.max_message_bytes))

    schema = "offset BIGINT, value BINARY" + (", partition INT" if partitions is not None else "")
    inbound = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(source))
    query = (
        plan(validated(inbound, pipeline, settings), pipeline)
        .writeStream.option("checkpointLocation", str(folder / "checkpoint"))
        .outputMode("append")
        .foreachBatch(collect)
        .trigger(availableNow=True)
        .start()
    )
    try:
        if timeout_s is None:
            query.awaitTermination()
        elif not query.awaitTermination(int(timeout_s)):
            raise TimeoutError(f"the run did not finish in {timeout_s:.0f} s")
        if query.exception() is not None:
            raise RuntimeError(f"the run failed: {query.exception()}")
    finally:
        query.stop()
    return sorted(rows, key=lambda r: r.position)


def warm_up(
    spark: SparkSession,
    settings: EngineSettings,
    pipeline: Pipeline,
    folder: Path,
    count: int,
    timeout_s: float = 120.0,
) -> int:
    """Run the pipeline's whole plan once over `count` of its own sample records
    (`Pipeline.sample`) before the real query starts, so that the first batches of real
    records do not pay the cold costs: the JIT and generated code of validation, the
    transform and the state store, Spark's Python workers and their imports of pandas, Arrow
    and the user's module. On `make up` a cold engine's first batch with records took
    21.7 s, the next ones 9.1 and 5.4 s, then ~2.7 s; alone, this warm-up of 2,000 records
    takes 11 s cold and 2 s warm. Returns the rows it gave (0: the pipeline has no sample)."""
    if pipeline.sample is None or count <= 0:
        return 0
    records = list(enumerate(pipeline.sample(count, 1, 0)))
    return len(run_on_records(spark, settings, pipeline, records, folder, 1, timeout_s))


def warm_up_engine(
    spark: SparkSession,
    settings: EngineSettings,
    pipeline: Pipeline,
    engine_id: str,
    backlog: Callable[[], int | None],
) -> None:
    """An engine's warm-up (`warm_up`), once per session, before its query, unless it has
    `backlog()` records to catch up on already: those warm it as well, and sooner. A
    failure costs the warm-up only, never the engine."""
    count = settings.warm_up_records
    if count <= 0 or pipeline.sample is None:
        return
    elog = EngineLog(log, engine_id, settings.pipeline)
    try:
        behind = backlog()
    except (OSError, ValueError):  # the query reports an unreadable checkpoint itself
        behind = None
    if behind is not None and behind >= count:
        # Real records warm it as well, and sooner: a restart after a kill has the
        # input of its downtime to catch up on (the warm-up cost a rejoin ~10 s).
        elog.info(
            "no warm-up, %s inbound records to catch up on",
            behind,
        )
        return
    folder = settings.engine_dir(engine_id) / "warm-up"
    started = time.monotonic()
    try:
        shutil.rmtree(folder, ignore_errors=True)
        rows = warm_up(spark, settings, pipeline, folder, count)
    except Exception as exc:  # the real query works or fails on its own
        elog.warning(
            "warm-up failed after %.1f s, the query starts cold: %s",
            time.monotonic() - started,
            describe(exc),
        )
    else:
        elog.info(
            "warmed up in %.1f s (%s sample records, %s rows)",
            time.monotonic() - started,
            count,
            rows,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def query_name(settings: PipelineSettings, engine_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"twinstream_{settings.pipeline}_{engine_id}")


def start_query(
    spark: SparkSession,
    settings: EngineSettings,
    pipeline: Pipeline,
    engine_id: str,
    process_batch: Callable[[DataFrame, int], None],
    starting_offsets: Mapping[int, int] | None = None,
    quarantined: Iterable[int] = (),
    max_offsets: int | None = None,
) -> StreamingQuery:
    inbound = read_inbound(spark, settings, starting_offsets, max_offsets)
    return (
        plan(validated(inbound, pipeline, settings, quarantined), pipeline)
        .writeStream.queryName(query_name(settings, engine_id))
        .option("checkpointLocation", settings.checkpoint_uri(engine_id))
        .outputMode("append")
        .trigger(processingTime=f"{settings.trigger_interval_ms} milliseconds")
        .foreachBatch(process_batch)
        .start()
    )
