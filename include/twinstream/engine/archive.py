"""The Spark class archive: `make install` runs the configured pipeline's plan over its
sample records in a JVM that writes the classes it loaded (`python -m
twinstream.engine.archive`); every session `twinstream.engine.spark` starts then maps it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from twinstream.engine.local import run
from twinstream.engine.pipeline import spark_conf
from twinstream.engine.spark import DRIVER_JAVA_OPTIONS, class_archive, session, stop_session
from twinstream.platform import registry
from twinstream.platform.settings import EngineSettings, load


def build_class_archive(settings: EngineSettings, echo: Callable[[str], None] = print) -> Path:
    """Run the configured pipeline's plan over its sample records (none if it declares no
    sample) in a JVM that writes the classes it loaded to the class archive on exit."""

    target = class_archive(settings)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    pipeline = registry.load(settings)
    started = time.monotonic()
    echo(f"writing {target}: pipeline {pipeline.name}'s plan in a JVM that records its classes")
    conf = {
        **spark_conf(pipeline),
        # Errors only: the JVM warns of every class it leaves out (signed jars, generated
        # classes), thousands of lines that say nothing about whether the archive works.
        DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds=error",
    }
    spark = session(settings, "twinstream-class-archive", master="local[1]", conf=conf)
    try:
        records = list(pipeline.sample(500, 1, 50)) if pipeline.sample is not None else []
        run(pipeline, enumerate(records), settings, batches=2)
    finally:
        # The JVM writes the archive as it exits: stop_session waits for that.
        stop_session(spark, timeout_s=300)
    if not partial.is_file():
        raise RuntimeError(f"the JVM wrote no class archive to {partial}; see its output above")
    partial.replace(target)
    size_mb = target.stat().st_size / 2**20
    echo(f"wrote {target} ({size_mb:.0f} MB) in {time.monotonic() - started:.0f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m twinstream.engine.archive (it takes no arguments)", file=sys.stderr)
        return 2
    base = load(EngineSettings)
    # Any pipeline's plan loads Spark's classes: the environment's, else the file's first.
    listed = registry.names(base.pipelines_file)
    if not base.pipeline and not listed:
        print(f"no pipeline in {base.pipelines_file}: add one (twinstream new-pipeline)")
        return 2
    build_class_archive(registry.settings_for(base, base.pipeline or listed[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
