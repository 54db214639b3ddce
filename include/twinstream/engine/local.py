"""A local run of a pipeline: the framework's own plan (`twinstream.engine.pipeline`) over
given records, in one local Spark query with no engine, no gate and no failover.

Users' tests reach it as `twinstream.testing.reference.run` and compare what engines
published through kills and takeovers with it: the same transform, the same validation,
other batch boundaries (`batches` files, one per micro-batch). A pipeline that keeps the
contract's rule gives the same rows. The class archive (`twinstream.engine.archive`) runs
the plan this way too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from twinstream.contract import Pipeline
from twinstream.core.rows import Output
from twinstream.engine.pipeline import KEYED_CONF, run_on_records, spark_conf
from twinstream.engine.spark import session as new_session
from twinstream.platform.settings import EngineSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The runtime settings a reference run needs of a session that may exist already (a test
# process keeps one): static ones (memory, jars) are whatever it was built with.
_RUNTIME = (
    "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.shuffle.partitions",
    "spark.sql.execution.arrow.pyspark.enabled",
)


def session(settings: EngineSettings, pipeline: Pipeline) -> SparkSession:
    conf = spark_conf(pipeline)
    spark = new_session(settings, "twinstream-reference", master="local[1]", conf=conf)
    for key in _RUNTIME:
        spark.conf.set(key, conf[key])
    for key in KEYED_CONF:
        if key in conf:
            spark.conf.set(key, conf[key])
        else:
            spark.conf.unset(key)
    return spark


def run(
    pipeline: Pipeline,
    records: Iterable[tuple[int, bytes | None]],
    settings: EngineSettings,
    batches: int = 3,
    partitions: Sequence[int] | None = None,
) -> list[Output]:
    """The rows the gate would get for `records` ((offset, value) pairs; `partitions`, if
    given, each one's partition), in (partition, msg_id) order."""
    listed = list(records)
    parts = list(partitions) if partitions is not None else [0] * len(listed)
    order = sorted(range(len(listed)), key=lambda i: (parts[i], listed[i][0]))
    ordered: Sequence[tuple[int, bytes | None]] = [listed[i] for i in order]
    spark = session(settings, pipeline)
    with tempfile.TemporaryDirectory(prefix="twinstream-reference-") as tmp:
        return run_on_records(
            spark,
            settings,
            pipeline,
            ordered,
            Path(tmp),
            batches,
            partitions=None if partitions is None else [parts[i] for i in order],
        )
