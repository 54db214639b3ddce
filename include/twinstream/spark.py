"""SparkSession construction shared by the engines, the audit job and tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from twinstream.config import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def kafka_jars(settings: Settings) -> list[str]:
    """Spark's Kafka connector and what it adds to pyspark's own jars (fetched by Maven)."""
    folder = settings.jars_dir / "spark-kafka"
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise FileNotFoundError(
            f"no spark-sql-kafka jar in {folder}: run `make install` (its Maven step)"
        )
    return jars


def session(
    settings: Settings,
    app_name: str,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    from pyspark.sql import SparkSession

    # Python workers must run this interpreter (the virtualenv's), not the system python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(kafka_jars(settings)))
        # Two cores: more shuffle partitions only add scheduling overhead.
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def stop_session(spark: SparkSession, timeout_s: float = 30.0) -> None:
    """Stop the session and the JVM pyspark started for it, by pid.

    `SparkSession.stop()` leaves the gateway JVM running until Python exits; in a long
    test process it then keeps Kafka clients that log against a stack already torn down."""
    import subprocess

    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    # The launcher keeps the JVM's stdin: closing it is the JVM's own signal to exit.
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
