"""SparkSession construction shared by the engines, the audit job and tests, and the class
archive that makes their JVMs start fast.

A Spark driver JVM loads some 15,000 classes from 300 jars before its first batch: on two
cores that is most of its start-up. `make install` runs one representative query (the
configured pipeline's plan, state store included) in a JVM that writes what it loaded to
a class-data-sharing archive (JDK AppCDS, `-XX:ArchiveClassesAtExit`); every session this
module starts then maps that archive (`-XX:SharedArchiveFile`) instead of loading and
verifying each class again (measured: the session 5.3 -> 3.2 s, the first job 2.7 -> 1.5 s
on an idle machine; the time back to redundancy after a kill -9 gains the same). The JVM
checks that the archive fits its own version and class path and runs without it when it
does not (with a warning): a stale archive costs the start-up it saved, never correctness.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from twinstream.platform.settings import (
    Connections,
    EngineSettings,
    EngineTuning,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def kafka_jars(settings: Connections) -> list[str]:
    """Spark's Kafka connector and what it adds to pyspark's own jars (fetched by Maven)."""
    folder = settings.jars_dir / "spark-kafka"
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise FileNotFoundError(
            f"no spark-sql-kafka jar in {folder}: run `make install` (its Maven step)"
        )
    return jars


DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def class_archive(settings: Connections) -> Path:
    """The Spark class archive `make install` writes (twinstream.engine.archive)."""
    return settings.jars_dir / "spark-classes.jsa"


def driver_java_options(settings: Connections, conf: Mapping[str, str]) -> str | None:
    """The driver JVM's options: the session's own, and the class archive when there is one
    (not while one is being written)."""
    options = conf.get(DRIVER_JAVA_OPTIONS, "")
    archive = class_archive(settings)
    if archive.is_file() and "-XX:ArchiveClassesAtExit" not in options:
        options = f"{options} -XX:SharedArchiveFile={archive}".strip()
    return options or None


def session_conf(
    settings: EngineSettings,
    app_name: str,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Every setting `session` builds a session with (a spare compares its own with them).
    In order of precedence: `conf`, then this framework's, then TWINSTREAM_SPARK_CONF's."""
    # Python workers must run this interpreter (the virtualenv's), not the system python.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    chosen = settings.engine_spark_master if master is None else master
    merged = {
        **settings.spark_conf,
        **cluster_conf(settings, chosen),
        "spark.jars": ",".join(kafka_jars(settings)),
        # Two cores: more shuffle partitions only add scheduling overhead.
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        **(conf or {}),
        "spark.app.name": app_name,
    }
    if chosen:
        merged["spark.master"] = chosen
    options = driver_java_options(settings, merged)
    if options:
        merged[DRIVER_JAVA_OPTIONS] = options
    return merged


def session(
    settings: EngineSettings,
    app_name: str,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session on `master`, by default the engines' (settings.engine_spark_master; ""
    leaves it to spark-submit), with `session_conf`'s settings."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in session_conf(settings, app_name, master, conf).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def cluster_conf(settings: EngineTuning, master: str) -> dict[str, str]:
    """What executors outside the driver's JVM need: the cores the application may take
    (a standalone master gives the first application every core), and the pipelines'
    folder on their Python workers' path (the user's transform runs there). The executors
    run the driver's PYSPARK_PYTHON, which must exist on every worker."""
    if not master or master.startswith("local"):
        return {}
    conf = {"spark.cores.max": str(settings.spark_cores)}
    path = os.environ.get("PYTHONPATH", "")
    if path:
        conf["spark.executorEnv.PYTHONPATH"] = path
    return conf


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


def pin_code(module: str) -> list[str]:
    """Every module of the pipeline's package (`module[:attribute]`'s top-level one)
    imported so far from under the folder of `module` (already imported; the folder whose
    code its version digests) pickled by value from now on: the engine's Python workers
    then run the functions and classes this process loaded, never the module as it is on
    disk when a worker starts. Returns the modules' names, sorted.

    By reference (cloudpickle's default for an importable module), a worker imports the
    module from disk each time it starts, and Spark starts workers during a query's life:
    once the owner writes the next version over the file, the engine still leading on
    the old one ran whatever the file then held. Seen in make test's rollback: the active,
    on version 2, failed its batch (`Can't get attribute 'StepV2'` on version 1's file) and
    lost the lead; had the names matched, it would have published the other version's
    rows under its own. A module the pipeline imports later, inside a function, is not
    covered: import helpers at the top of the pipeline's module."""
    from pyspark import cloudpickle

    name = module.partition(":")[0]
    root = Path(sys.modules[name].__file__ or "").resolve().parent
    # Its package by name too: a module at the top of a project whose folder also holds
    # the virtualenv and the platform must not pin pyspark's or the platform's modules.
    top = name.split(".")[0]
    pinned = []
    for loaded_name, loaded in list(sys.modules.items()):
        origin = getattr(loaded, "__file__", None)
        if loaded_name.split(".")[0] != top or origin is None:
            continue
        if Path(origin).resolve().is_relative_to(root):
            cloudpickle.register_pickle_by_value(loaded)  # type: ignore[no-untyped-call]
            pinned.append(loaded_name)
    return sorted(pinned)
