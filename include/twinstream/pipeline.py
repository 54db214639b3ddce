"""The hostmetrics pipeline as Spark Structured Streaming: inbound Kafka records ->
per-host stateful transform (RocksDB state store) -> rows for the gate.

Split as Spark's examples are: `read_inbound` (the source), pure DataFrame transforms
(`keyed`, `transform`) and `start_query`, which hands each micro-batch to a typed
`process_batch(df, batch_id)`. The per-host logic is `twinstream.hostmetrics`, shared with
the reference the tests compare against.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from twinstream.config import Settings
from twinstream.hostmetrics import Window, process_host
from twinstream.rows import Output

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

OUTPUT_SCHEMA = "msg_id LONG, kind STRING, key STRING, value STRING"
# The window as JSON text: pyspark 4.3's Python worker fails to read ARRAY fields of a state
# schema (KeyError 'elementType' in ArrayType.fromJson), and JSON round-trips floats exactly.
STATE_SCHEMA = "window STRING, last_ts_ms LONG"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Rows whose host cannot be read share this group; they only produce dead letters.
NO_HOST = ""


def spark_conf(settings: Settings) -> dict[str, str]:
    return {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        # Pinned into the checkpoint's offsets: changing it later breaks restore. One
        # partition: a single-partition source gains nothing from more, and every extra
        # state-store partition costs each micro-batch a task and a RocksDB commit.
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        # The engine's own stop/start must not wait for Spark's default 10 s grace.
        "spark.sql.streaming.stopTimeout": "30s",
    }


def read_inbound(
    spark: SparkSession, settings: Settings, starting_offset: int | None = None
) -> DataFrame:
    """`starting_offset` places a query without a checkpoint (a cold rebuild); None means
    the beginning of the topic."""
    starting = (
        "earliest"
        if starting_offset is None
        else json.dumps({settings.inbound_topic: {"0": starting_offset}})
    )
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", settings.inbound_topic)
        # Only for a query without a checkpoint; a restart resumes from the checkpoint.
        .option("startingOffsets", starting)
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        # Never reads uncommitted records if a producer of the inbound topic uses
        # transactions.
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


def keyed(inbound: DataFrame, settings: Settings) -> DataFrame:
    """msg_id (the inbound offset), the raw bytes and the host to group by."""
    from pyspark.sql import functions as F

    host = F.get_json_object(F.col("value").cast("string"), "$.host")
    too_big = F.length(F.col("value")) > settings.max_record_bytes
    return inbound.select(
        F.col("offset").alias("msg_id"),
        F.col("value").alias("raw"),
        F.when(too_big | host.isNull(), F.lit(NO_HOST)).otherwise(host).alias("host"),
    )


def transform(rows: DataFrame, settings: Settings) -> DataFrame:
    """Per host, in msg_id order: validate, advance the rolling window, emit one row per
    record (output or dead letter)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    retention_ms = settings.window_retention_ms
    limits = settings.record_limits
    max_message_bytes = settings.max_message_bytes

    def per_host(
        key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        (host,) = key
        frame = pd.concat(list(batches), ignore_index=True).sort_values("msg_id")
        records = zip(frame["msg_id"].tolist(), frame["raw"].tolist(), strict=True)
        if host == NO_HOST:
            _, outputs = process_host(None, records, retention_ms, limits, None, max_message_bytes)
        else:
            window = _window_from_state(state.get) if state.exists else None
            window, outputs = process_host(
                window, records, retention_ms, limits, host, max_message_bytes
            )
            if window is not None:
                encoded = json.dumps([window.cpu_user, window.mem_used_mb])
                state.update((encoded, window.last_ts_ms))
        yield pd.DataFrame(
            {
                "msg_id": [o.msg_id for o in outputs],
                "kind": [o.kind for o in outputs],
                "key": [o.key for o in outputs],
                "value": [o.value for o in outputs],
            }
        )

    return rows.groupBy("host").applyInPandasWithState(
        per_host,
        outputStructType=OUTPUT_SCHEMA,
        stateStructType=STATE_SCHEMA,
        outputMode="append",
        # Expiry is decided by event time inside the window logic, so it does not depend on
        # batch boundaries (a watermark timeout would, and engines batch differently).
        timeoutConf=GroupStateTimeout.NoTimeout,
    )


def _window_from_state(values: tuple[Any, ...]) -> Window:
    encoded, last_ts = values
    cpu, mem = json.loads(encoded)
    return Window(tuple(float(c) for c in cpu), tuple(int(m) for m in mem), int(last_ts))


def rows_of(batch: DataFrame) -> list[Output]:
    """The batch's rows, in any order (the gate orders by msg_id: sorting here would cost
    Spark another stage per batch)."""
    return [Output(int(r["msg_id"]), r["kind"], r["key"], r["value"]) for r in batch.collect()]


def query_name(settings: Settings, engine_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"twinstream_{settings.pipeline}_{engine_id}")


def start_query(
    spark: SparkSession,
    settings: Settings,
    engine_id: str,
    process_batch: Callable[[DataFrame, int], None],
    starting_offset: int | None = None,
) -> StreamingQuery:
    checkpoint = settings.checkpoint_dir(engine_id)
    return (
        transform(keyed(read_inbound(spark, settings, starting_offset), settings), settings)
        .writeStream.queryName(query_name(settings, engine_id))
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(processingTime=f"{settings.trigger_interval_ms} milliseconds")
        .foreachBatch(process_batch)
        .start()
    )
