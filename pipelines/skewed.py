"""Skewed: a pipeline that breaks the contract's one rule on purpose, for the agreement
check's tests and demo (twinstream.core.agreement). Every record gives one row, but every
1,000th msg_id's row carries the id of the engine that computed it: engines agree on 999
records in 1,000 and differ on the rest, as a transform that reads the wall clock, a
Python `set`'s order or `random` would. Defined beside the tests' other pipelines; never
run it for real output.

Inbound: {"id": "r-1", "n": 7}
Outbound (key: id): {"id": "r-1", "n": 7, "engine": ""}, "engine": "b" on msg_id 999, 1999...
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from twinstream.contract import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# Which msg_ids carry the engine's id: msg_id % EVERY == EVERY - 1.
EVERY = 1000


def engine_of(records: DataFrame) -> str:
    """The engine's id, from its Spark application's name (`twinstream-<pipeline>-<id>`,
    twinstream.engine.app): what a contract pipeline must never depend on. An engine that
    was a warm spare keeps the spare's name, `twinstream-spare` (twinstream.engine.spare):
    run this pipeline's engines cold."""
    name = records.sparkSession.conf.get("spark.app.name") or ""
    return name.rsplit("-", 1)[-1]


def transform(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    skewed = F.col("msg_id") % EVERY == EVERY - 1
    return records.select(
        "msg_id",
        "id",
        "n",
        F.when(skewed, F.lit(engine_of(records))).otherwise(F.lit("")).alias("engine"),
    )


def sample(count: int, seed: int, broken_every: int) -> Iterator[bytes]:
    for i in range(count):
        yield json.dumps({"id": f"r-{seed}-{i}", "n": i}).encode()


pipeline = Pipeline(
    name="skewed",
    schema="id STRING, n INT",
    transform=transform,
    key="id",
    partition_by="id",
    value=["id", "n", "engine"],
    sample=sample,
)
