"""The hostmetrics pipeline as Spark Structured Streaming: inbound Kafka records ->
per-host stateful transform (RocksDB state store) -> rows for the gate.

Split as Spark's examples are: `read_inbound` (the source), pure DataFrame transforms
(`keyed`, `transform`) and `start_query`, which hands each micro-batch to a typed
`process_batch(df, batch_id)`. The per-host logic is `twinstream.hostmetrics`, shared with
the reference the tests compare against.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from twinstream.config import Settings
from twinstream.core.rows import Output, dead_letter
from twinstream.hostmetrics import Window, process_host

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
# The kind of a quarantined record's row: its raw bytes (base64), for the driver to
# dead-letter with the quarantine's reason.
QUARANTINED = "quarantined"


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
        # The checkpoint history a gap repair can rewind to (twinstream.core.checkpoint): 500
        # batches are about two minutes at the 250 ms trigger (Spark's default keeps 100).
        "spark.sql.streaming.minBatchesToRetain": "500",
    }


def read_inbound(
    spark: SparkSession,
    settings: Settings,
    starting_offset: int | None = None,
    max_offsets: int | None = None,
) -> DataFrame:
    """`starting_offset` places a query without a checkpoint (a cold rebuild); None means
    the beginning of the topic. `max_offsets` caps a batch below the configured size
    (the quarantine's search splits a failed batch so)."""
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
        .option("maxOffsetsPerTrigger", str(max_offsets or settings.max_offsets_per_trigger))
        # Never reads uncommitted records if a producer of the inbound topic uses
        # transactions.
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


def keyed(inbound: DataFrame, settings: Settings, quarantined: Iterable[int] = ()) -> DataFrame:
    """msg_id (the inbound offset), the raw bytes and the host to group by; a quarantined
    record's group is NULL, a key no record can have (hosts are strings, unreadable ones
    NO_HOST). One plan either way: a union of two branches of the source would be a second
    source to Spark, which a restarted query on the same checkpoint refuses."""
    from pyspark.sql import functions as F

    host = F.get_json_object(F.col("value").cast("string"), "$.host")
    too_big = F.length(F.col("value")) > settings.max_record_bytes
    group = F.when(too_big | host.isNull(), F.lit(NO_HOST)).otherwise(host)
    excluded = sorted(quarantined)
    if excluded:
        group = F.when(F.col("offset").isin(excluded), F.lit(None).cast("string")).otherwise(group)
    return inbound.select(
        F.col("offset").alias("msg_id"),
        F.col("value").alias("raw"),
        group.alias("host"),
    )


def transform(rows: DataFrame, settings: Settings) -> DataFrame:
    """Per host, in msg_id order: validate, advance the rolling window, emit one row per
    record (output or dead letter)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    retention_ms = settings.window_retention_ms
    limits = settings.record_limits
    max_message_bytes = settings.max_message_bytes
    fault_marker = settings.fault_marker.encode()

    def per_host(
        key: tuple[Any, ...], batches: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        import pandas as pd

        (host,) = key
        frame = pd.concat(list(batches), ignore_index=True).sort_values("msg_id")
        if host is None:
            # Quarantined: to the driver as raw bytes, never to the transform or the state.
            yield pd.DataFrame(
                {
                    "msg_id": frame["msg_id"],
                    "kind": QUARANTINED,
                    "key": None,
                    "value": [base64.b64encode(r or b"").decode("ascii") for r in frame["raw"]],
                }
            )
            return
        records = list(zip(frame["msg_id"].tolist(), frame["raw"].tolist(), strict=True))
        if fault_marker and any(fault_marker in (raw or b"") for _, raw in records):
            # Test-only fault injection (TWINSTREAM_FAULT_MARKER): a bug in the transform,
            # outside the per-record guard, that fails the whole batch on every engine.
            raise RuntimeError(f"fault injected: a record holds {fault_marker!r}")
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


def rows_of(
    batch: DataFrame,
    quarantined: Mapping[int, str] | None = None,
    max_message_bytes: int = 1_000_000,
) -> list[Output]:
    """The batch's rows, in any order (the gate orders by msg_id: sorting here would cost
    Spark another stage per batch). A quarantined record arrives as its raw bytes (base64)
    and becomes its dead letter here, with the quarantine's reason."""
    rows = []
    for r in batch.collect():
        msg_id = int(r["msg_id"])
        if r["kind"] == QUARANTINED and quarantined is not None:
            raw = base64.b64decode(r["value"] or "")
            rows.append(dead_letter(msg_id, quarantined[msg_id], raw, max_message_bytes))
        else:
            rows.append(Output(msg_id, r["kind"], r["key"], r["value"]))
    return rows


def query_name(settings: Settings, engine_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", f"twinstream_{settings.pipeline}_{engine_id}")


def start_query(
    spark: SparkSession,
    settings: Settings,
    engine_id: str,
    process_batch: Callable[[DataFrame, int], None],
    starting_offset: int | None = None,
    max_offsets: int | None = None,
    quarantined: Iterable[int] = (),
) -> StreamingQuery:
    checkpoint = settings.checkpoint_dir(engine_id)
    inbound = read_inbound(spark, settings, starting_offset, max_offsets)
    return (
        transform(keyed(inbound, settings, quarantined), settings)
        .writeStream.queryName(query_name(settings, engine_id))
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(processingTime=f"{settings.trigger_interval_ms} milliseconds")
        .foreachBatch(process_batch)
        .start()
    )
