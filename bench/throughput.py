"""Throughput benchmark: what hot standby costs against a plain Spark query.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.throughput --backlog 1000000

Pre-loads `--backlog` synthetic events into a private pipeline's inbound topic, then
drains the same backlog three times, one after the other, so all three share the machine
and the run:
  (a) a plain Spark Structured Streaming query with the same transform (same source
      options, same applyInPandasWithState per host) writing with Spark's own Kafka sink:
      no election, no transactions, no failover;
  (b) one Twinstream engine, active, alone;
  (c) an active and a standby Twinstream engine together (the production setup: on this
      machine the standby competes for the same two cores).
Each rate is measured from the first output record to the last, on the outbound and
dead-letter topics' high watermarks sampled every 0.5 s: Spark's start-up is left out of
all three alike. Prints the rates and the ratios b/a and c/a, writes them to
docs/bench/throughput.json and the output rate over time to docs/bench/throughput.png.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from bench.plots import plot_drains, write_figures
from devkit.harness import (
    OutputSampler,
    Pipeline,
    bench_pipeline,
    machine,
    stack_env,
    wait_for,
)
from twinstream.platform.kafka import TopicSpec, admin_config, ensure_topics, watermarks
from twinstream.platform.kafka_auth import grant_read
from twinstream.platform.settings import REPO_ROOT, Settings


def plain_spark(settings: Settings, workdir: Path, total: int) -> OutputSampler:
    """(a): the transform with Spark's Kafka sink, drained with availableNow."""
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import functions as F

    from twinstream.engine.pipeline import plan, read_inbound, spark_conf, validated
    from twinstream.engine.spark import session, stop_session
    from twinstream.platform import registry

    out, dlq = f"{settings.pipeline}.plain.out", f"{settings.pipeline}.plain.dlq"
    ensure_topics(AdminClient(admin_config(settings)), [TopicSpec(out, 1, 3), TopicSpec(dlq, 1, 3)])
    pipeline = registry.load(settings)
    spark = session(settings, "twinstream-bench-plain", conf=spark_conf(pipeline))
    sampler = OutputSampler(settings, [out, dlq])
    try:
        rows = plan(validated(read_inbound(spark, settings), pipeline, settings), pipeline)
        query = (
            rows.where(F.col("kind") != "none")
            .select(
                F.when(F.col("kind") == "out", F.lit(out)).otherwise(F.lit(dlq)).alias("topic"),
                F.col("key"),
                F.col("value"),
            )
            .writeStream.format("kafka")
            .queryName("bench_plain_spark")
            .option("kafka.bootstrap.servers", settings.bootstrap_servers)
            .option("checkpointLocation", str(workdir / "plain-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        while query.isActive:
            print(f"  plain Spark: {sampler.latest:,} of {total:,} outputs", flush=True)
            query.awaitTermination(10)
        if query.exception() is not None:
            raise SystemExit(f"the plain query failed: {query.exception()}")
        wait_for(lambda: sampler.latest >= total, 60, "the plain query's last output")
    finally:
        sampler.stop()
        stop_session(spark)
    return sampler


def on_backlog(backlog: Pipeline, name: str) -> Pipeline:
    """A pipeline of its own (outputs, election, checkpoints) reading `backlog`'s inbound,
    with its partitions (an engine writes each output to its record's partition number:
    its topics need as many)."""
    other = Pipeline(stack_env(), backlog.workdir / name, partitions=backlog.settings.partitions)
    other.env["TWINSTREAM_INBOUND_TOPIC"] = backlog.settings.inbound_topic
    other.settings = other._settings()
    if other.settings.kafka_security:
        # Its engine user may read its own inbound topic only: grant it the backlog's.
        admin = AdminClient(admin_config(other.settings))
        grant_read(admin, other.settings, backlog.settings.inbound_topic, role="engine")
    return other


def wait_drained(
    sampler: OutputSampler, total: int, what: str, alive: Callable[[], None] | None = None
) -> None:
    """Until `total` outputs, a progress line every 10 s; `alive` raises if the drainer
    died."""

    def drained() -> bool:
        if alive is not None:
            alive()
        print(f"  {what}: {sampler.latest:,} of {total:,} outputs", flush=True)
        return sampler.latest >= total

    wait_for(drained, 3600, f"{what} through the backlog", every_s=10)
    time.sleep(1.0)  # one more sample after the end, for the plot


def drain_with_engines(
    pipeline: Pipeline, engine_ids: tuple[str, ...], total: int
) -> OutputSampler:
    """The engines of `pipeline` drain its inbound backlog."""
    s = pipeline.settings
    sampler = OutputSampler(s, [s.outbound_topic, s.dlq_topic])
    try:
        engines = [pipeline.start(e) for e in engine_ids]
        pipeline.wait_running(*engines, timeout_s=300)
        wait_drained(sampler, total, "engines " + "+".join(engine_ids))
    finally:
        sampler.stop()
        pipeline.stop_all()
    return sampler


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    samplers: dict[str, OutputSampler] = {}
    with bench_pipeline("twinstream-bench-throughput-") as pipeline:
        print(f"loading a backlog of {args.backlog:,} events", flush=True)
        started = time.monotonic()
        pipeline.join_load(pipeline.load(args.backlog, rate=0), timeout_s=3600)
        print(f"  loaded in {time.monotonic() - started:.0f} s", flush=True)
        total = watermarks(pipeline.settings, pipeline.settings.inbound_topic)[1]

        print("(a) plain Spark query, Spark's Kafka sink", flush=True)
        samplers["a"] = plain_spark(pipeline.settings, pipeline.workdir, total)
        print("(b) one Twinstream engine, active alone", flush=True)
        samplers["b"] = drain_with_engines(pipeline, ("a",), total)
        # (c) needs fresh outbound topics, election and checkpoints on the same backlog.
        pair = on_backlog(pipeline, "pair")
        print("(c) active and standby Twinstream engines together", flush=True)
        samplers["c"] = drain_with_engines(pair, ("a", "b"), total)

    labels = {
        "a": "plain Spark query, Spark Kafka sink",
        "b": "Twinstream, active alone",
        "c": "Twinstream, active + standby",
    }
    for key, sampler in samplers.items():
        rate, seconds = sampler.drain_rate(total)
        results[key] = {
            "what": labels[key],
            "events_per_s": round(rate),
            "seconds": round(seconds, 1),
        }
        print(f"({key}) {labels[key]}: {rate:,.0f} events/s ({seconds:.1f} s)")
    figures = {
        "backlog_events": total,
        "runs": results,
        "ratio_b_to_a": round(results["b"]["events_per_s"] / results["a"]["events_per_s"], 3),
        "ratio_c_to_a": round(results["c"]["events_per_s"] / results["a"]["events_per_s"], 3),
        "machine": machine(),
    }
    write_figures(args.output, "throughput", figures)
    path = plot_drains(
        args.output / "throughput.png",
        f"Draining a backlog of {total:,} events",
        {labels[key]: sampler.samples for key, sampler in samplers.items()},
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
