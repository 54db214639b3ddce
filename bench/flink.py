"""Flink restarting from a checkpoint: the same kill -9 as bench/failover.py's supervisor
baseline, for comparison with a Twinstream pair.

    make up                      # the local stack must be running (make install builds the app)
    .venv/bin/python -m bench.flink --rounds 5 --rate 1000 --checkpoint-ms 1000

Runs java/flink's CheckpointedPipeline, a stateful pipeline (a running count per key in
keyed state) with an exactly-once Kafka sink, in one JVM (Flink's local MiniCluster), on
topics of its own on the running stack (whose engines are stopped meanwhile). Steady
synthetic load at `--rate`. Each round waits until the output is within
TWINSTREAM_IN_SYNC_LAG events of the input, kills the JVM with SIGKILL and restarts it at
once, as a supervisor would; it resumes from its latest retained checkpoint. Flink
checkpoints nothing by default: `--checkpoint-ms` is the interval chosen (1 s, short for
Flink deployments, is its best case here: the exactly-once sink commits only at a
checkpoint, so the interval adds to both the output's latency and the takeover).

Takeover time = from the kill to the first output of the restarted process visible to a
read_committed consumer (bench/failover.py's measure); also until the output has caught
up again. At the end every inbound offset of the run is checked to be in the output
exactly once.

Prints the figures, writes docs/bench/flink.json and docs/bench/flink.png (output rate over
time, kills marked). A round that fails, or Ctrl-C, ends the rounds; the ones before it are
audited and written.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.baseline import (
    FLINK,
    Instance,
    OutputTail,
    arguments,
    figure,
    kill_and_restart,
    output_caught_up,
    run_rounds,
    write_run,
)
from devkit.harness import bench_pipeline, wait_for
from twinstream.platform.settings import Settings


def kill_round(
    settings: Settings, instance: Instance, tail: OutputTail, args: argparse.Namespace
) -> dict[str, Any]:
    """Kill -9 the job once its output has caught up, restart it at once, and time the
    restarted process's first output and its catching up."""

    def caught_up() -> bool:
        return output_caught_up(settings, tail)

    wait_for(caught_up, args.catch_up_timeout, "the output caught up with the input")
    killed, first_output, report = kill_and_restart(
        {instance.name: instance}, instance.name, tail, args.takeover_timeout
    )
    wait_for(lambda: report() or caught_up(), args.catch_up_timeout, "the restarted job caught up")
    return {
        "killed_at": killed,
        "first_output_s": first_output - killed,
        "caught_up_s": time.monotonic() - killed,
    }


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--checkpoint-ms", type=int, default=1000, help="checkpoint interval")
    parser.add_argument("--catch-up-timeout", type=float, default=600.0)
    args = parser.parse_args()

    with bench_pipeline("twinstream-bench-flink-") as pipeline:
        settings = pipeline.settings
        job = Instance(
            "a",
            settings,
            f"{pipeline.name}-flink",
            pipeline.workdir,
            FLINK,
            [str(args.checkpoint_ms)],
        )
        run = run_rounds(
            settings,
            {"a": job},
            lambda tail: kill_round(settings, job, tail, args),
            args,
        )
    return write_run(
        run,
        args.output,
        "flink",
        f"Flink restarted from a checkpoint: output rate under {args.rate:,.0f} events/s,"
        " kill -9 of the job",
        {
            "system": f"Flink 2.0.0 local MiniCluster, exactly-once Kafka sink, "
            f"checkpoint every {args.checkpoint_ms} ms, restarted at once by a supervisor",
            "rate_per_s": args.rate,
            "checkpoint_interval_ms": args.checkpoint_ms,
            "takeover_to_first_output_s": figure(run.rounds, "first_output_s"),
            "caught_up_s": figure(run.rounds, "caught_up_s"),
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
