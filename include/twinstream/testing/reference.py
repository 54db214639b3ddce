"""A reference run of a pipeline: the framework's own plan (`twinstream.pipeline`) over
given records, in one local Spark query with no engine, no gate and no failover.

Tests compare what engines published through kills and takeovers with this: the same
transform, the same validation, other batch boundaries (`batches` files, one per
micro-batch). A pipeline that keeps the contract's rule gives the same rows.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from twinstream.config import Settings
from twinstream.contract import Pipeline
from twinstream.core.rows import Output
from twinstream.pipeline import plan, rows_of, spark_conf, validated

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The runtime settings a reference run needs of a session that may exist already (a test
# process keeps one): static ones (memory, jars) are whatever it was built with.
_RUNTIME = (
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.shuffle.partitions",
    "spark.sql.execution.arrow.pyspark.enabled",
)


def session(settings: Settings, pipeline: Pipeline) -> SparkSession:
    from twinstream.spark import session as new_session

    conf = spark_conf(settings, pipeline)
    spark = new_session(settings, "twinstream-reference", master="local[1]", conf=conf)
    for key in _RUNTIME:
        spark.conf.set(key, conf[key])
    return spark


def run(
    pipeline: Pipeline,
    records: Iterable[tuple[int, bytes | None]],
    settings: Settings,
    batches: int = 3,
) -> list[Output]:
    """The rows the gate would get for `records` ((offset, value) pairs), in msg_id order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ordered: Sequence[tuple[int, bytes | None]] = sorted(records, key=lambda r: r[0])
    spark = session(settings, pipeline)
    rows: list[Output] = []
    with tempfile.TemporaryDirectory(prefix="twinstream-reference-") as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        size = max(1, -(-len(ordered) // max(1, batches)))
        for n, first in enumerate(range(0, len(ordered), size)):
            part = ordered[first : first + size]
            table = pa.table(
                {
                    "offset": pa.array([o for o, _ in part], pa.int64()),
                    "value": pa.array([v for _, v in part], pa.binary()),
                }
            )
            path = source / f"part-{n:05d}.parquet"
            pq.write_table(table, path)
            # The file source reads the oldest file first (by modification time, not
            # name): the batches must come in msg_id order.
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))

        def collect(batch: DataFrame, _batch_id: int) -> None:
            rows.extend(rows_of(batch, {}, settings.max_message_bytes))

        inbound = (
            spark.readStream.schema("offset BIGINT, value BINARY")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
        )
        query = (
            plan(validated(inbound, pipeline, settings), pipeline)
            .writeStream.option("checkpointLocation", str(Path(tmp) / "checkpoint"))
            .outputMode("append")
            .foreachBatch(collect)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"the reference run failed: {query.exception()}")
    return sorted(rows, key=lambda r: r.msg_id)
