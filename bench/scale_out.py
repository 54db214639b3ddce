"""Scale-out: how fast a Twinstream pair drains one backlog with 1, 2 and 3 inbound
partitions, and with 3 on a Spark standalone cluster, in one run; and whether publishing
from the driver is the ceiling.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.scale_out --backlog 100000

With the stack's own engines stopped (the two cores go to the engines measured), for each
configuration a private hostmetrics pipeline gets the same `--backlog` events of `--hosts`
hosts, keyed by host (a host's events in one partition), then an active and a hot standby
drain it:
  (1) 1 partition, (2) 2 partitions, (3) 3 partitions, each engine Spark local[2];
  (4) 3 partitions, each engine an application of one core on a standalone master and a
      worker of two cores (devkit.spark_cluster, started and stopped here).
Each rate is measured from the first output to the last (start-ups left out alike). The
active's own batch timings (its log: the batch's Spark job, collected to the driver, and
the gate, which publishes on the driver) say what share of a batch the driver's publishing
takes. Prints every figure; writes docs/bench/scale_out.json and docs/bench/scale_out.png.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from bench.plots import plot_drains, write_figures
from bench.throughput import wait_drained
from devkit.harness import (
    EngineProcess,
    OutputSampler,
    Pipeline,
    bench_pipeline,
    machine,
    wait_for,
)
from devkit.spark_cluster import StandaloneCluster
from twinstream.platform.settings import REPO_ROOT

# The engine's batch-timing line (twinstream.engine.positions.BatchTimings.summary).
TIMINGS = re.compile(
    r"medians: (?P<total>\d+) ms .*?(?P<rows>[\d,]+) input rows; in addBatch, of "
    r"(?P<batches>\d+) batches: job (?P<job>\d+) ms, gate (?P<gate>\d+) ms"
)


def batch_timings(engine: EngineProcess) -> dict[str, int] | None:
    """The engine's batch-timing line of the drain's largest batches (the most input rows),
    as numbers: its last lines describe the few small batches after the backlog ran out."""
    found: list[dict[str, int]] = []
    for line in engine.log_path.read_text(errors="replace").splitlines():
        match = TIMINGS.search(line)
        if match:
            found.append({k: int(v.replace(",", "")) for k, v in match.groupdict().items()})
    return max(found, key=lambda t: t["rows"], default=None)


def drain(pipeline: Pipeline, total: int, what: str) -> tuple[OutputSampler, dict[str, Any]]:
    """An active and a standby drain the pipeline's backlog."""
    s = pipeline.settings
    sampler = OutputSampler(s, [s.outbound_topic, s.dlq_topic])
    try:
        engines = [pipeline.start(e) for e in ("a", "b")]
        pipeline.wait_running(*engines, timeout_s=300)
        wait_drained(sampler, total, what)
        active = wait_for(pipeline.active, 30, "the active")
        # One more timing line after the drain: the engines log one every 5 s here.
        time.sleep(6)
        timings = batch_timings(active)
    finally:
        sampler.stop()
        pipeline.stop_all()
    rate, seconds = sampler.drain_rate(total)
    figures: dict[str, Any] = {
        "what": what,
        "events_per_s": round(rate),
        "seconds": round(seconds, 1),
        "active_batch_timings_ms": timings,
    }
    if timings:
        figures["gate_share_of_batch"] = round(timings["gate"] / max(1, timings["total"]), 3)
    print(f"  {what}: {rate:,.0f} events/s over {seconds:.1f} s; active's batches {timings}")
    return sampler, figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=30)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    parser.add_argument("--skip-cluster", action="store_true")
    args = parser.parse_args()

    runs: dict[str, dict[str, Any]] = {}
    samplers: dict[str, OutputSampler] = {}
    with bench_pipeline("twinstream-bench-scale-out-") as base:
        env = {**base.env, "TWINSTREAM_BATCH_TIMINGS_LOG_S": "5"}
        configurations: list[tuple[str, int, dict[str, str]]] = [
            (f"{n} partition{'s' if n > 1 else ''}, local[2]", n, {}) for n in (1, 2, 3)
        ]
        cluster = None
        if not args.skip_cluster:
            cluster = StandaloneCluster(base.settings, base.workdir / "spark-cluster", cores=2)
            print(f"starting a Spark standalone master and worker at {cluster.master}")
            cluster.start()
            configurations.append(
                (
                    "3 partitions, standalone cluster, 1 core per engine",
                    3,
                    {"TWINSTREAM_SPARK_MASTER": cluster.master, "TWINSTREAM_SPARK_CORES": "1"},
                )
            )
        try:
            for label, partitions, extra in configurations:
                pipeline = Pipeline(
                    {**env, **extra}, base.workdir / f"run{len(runs)}", partitions=partitions
                )
                print(f"{label}: loading {args.backlog:,} events", flush=True)
                pipeline.join_load(
                    pipeline.load(args.backlog, rate=0, hosts=args.hosts), timeout_s=3600
                )
                ends = pipeline.inbound_ends()
                total = sum(ends.values())
                print(f"  per partition: {ends}", flush=True)
                sampler, figures = drain(pipeline, total, label)
                figures["partitions"] = partitions
                figures["records_per_partition"] = ends
                runs[label] = figures
                samplers[label] = sampler
        finally:
            if cluster is not None:
                cluster.stop()

    one = next(iter(runs.values()))["events_per_s"]
    figures = {
        "backlog_events": args.backlog,
        "hosts": args.hosts,
        "runs": list(runs.values()),
        "ratio_to_one_partition": {
            label: round(r["events_per_s"] / max(1, one), 3) for label, r in runs.items()
        },
        "machine": machine(),
    }
    write_figures(args.output, "scale_out", figures)
    path = plot_drains(
        args.output / "scale_out.png",
        f"A pair draining {args.backlog:,} events by partitions and where Spark runs",
        {label: s.samples for label, s in samplers.items()},
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
