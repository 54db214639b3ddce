"""Kafka Streams with a standby replica: the same kill -9 of the active as
bench/failover.py, for comparison with a Twinstream pair.

    make up                      # the local stack must be running (make install builds the app)
    .venv/bin/python -m bench.kafka_streams --rounds 5 --rate 1000

Runs two instances of java/kafka-streams' StandbyPipeline, a stateful pipeline (a running
count per key in a persistent store) with exactly_once_v2 and num.standby.replicas=1 and
every other setting at Kafka Streams' default, as its users run it, on topics of its own on
the running stack (whose engines are stopped meanwhile, so the two cores go to the
instances measured). Steady synthetic load at `--rate`. Each round waits for one instance
holding the task, the other keeping a standby replica within TWINSTREAM_IN_SYNC_LAG
records, and the output within as many events of the input, kills the active with SIGKILL
and restarts it at once, as a supervisor would.

Takeover time = from the kill to the first output of another process visible to a
read_committed consumer (the same measure as bench/failover.py's); also until the
successor reports the task active, until the output has caught up with the input again,
and until the pair is whole again. A round starts only once the output has caught up. At
the end every inbound offset of the run is checked to be in the output exactly once.

Prints the figures, writes docs/bench/kafka_streams.json and docs/bench/kafka_streams.png
(output rate over time, kills marked). A round that fails, or Ctrl-C, ends the rounds; the
ones before it are audited and written.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench.baseline import (
    Instance,
    OutputTail,
    arguments,
    figure,
    kill_and_restart,
    output_caught_up,
    pair,
    run_rounds,
    write_run,
)
from devkit.harness import bench_pipeline, wait_for
from twinstream.platform.settings import Settings


def kill_round(
    settings: Settings,
    instances: dict[str, Instance],
    tail: OutputTail,
    current_pair: Callable[[], tuple[str, str] | None],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Kill -9 the instance holding the task once the pair is whole and the output has
    caught up with the input, restart it at once, and time the takeover, the output
    catching up again, and the pair being whole again.

    Both conditions: the standby replica's lag is its changelog's, not the input's. A
    first version waited for the pair alone and struck each new active seconds after its
    first output, 45,000 events behind; the backlog grew round after round."""

    def ready() -> tuple[str, str] | None:
        pair_now = current_pair()
        return pair_now if pair_now and output_caught_up(settings, tail) else None

    active, standby = wait_for(
        ready, args.rejoin_timeout, "an in-sync standby and the output caught up"
    )
    killed, first_output, report = kill_and_restart(instances, active, tail, args.takeover_timeout)

    def caught_up() -> bool:
        report()
        return output_caught_up(settings, tail)

    def rejoined() -> bool:
        report()
        now = current_pair()
        return now is not None and active in now

    successor = instances[standby].active_since
    wait_for(caught_up, args.rejoin_timeout, "the output caught up with the input")
    caught_up_s = time.monotonic() - killed
    wait_for(rejoined, args.rejoin_timeout, f"instance {active} back in the pair")
    return {
        "killed": active,
        "killed_at": killed,
        "first_output_s": first_output - killed,
        "to_active_s": None if successor is None else successor - killed,
        "caught_up_s": caught_up_s,
        "rejoin_s": time.monotonic() - killed,
    }


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--rejoin-timeout", type=float, default=600.0)
    args = parser.parse_args()

    with bench_pipeline("twinstream-bench-kstreams-") as pipeline:
        settings = pipeline.settings
        instances = {
            n: Instance(n, settings, f"{pipeline.name}-kstreams", pipeline.workdir)
            for n in ("a", "b")
        }

        def current_pair() -> tuple[str, str] | None:
            return pair({n: i.status for n, i in instances.items()}, settings.in_sync_lag)

        run = run_rounds(
            settings,
            instances,
            lambda tail: kill_round(settings, instances, tail, current_pair, args),
            args,
        )
    return write_run(
        run,
        args.output,
        "kafka_streams",
        f"Kafka Streams with a standby replica: output rate under {args.rate:,.0f} events/s,"
        " kill -9 of the active",
        {
            "system": "Kafka Streams 4.3.1, exactly_once_v2, num.standby.replicas=1, else default",
            "rate_per_s": args.rate,
            "takeover_to_first_output_s": figure(run.rounds, "first_output_s"),
            "takeover_to_active_s": figure(run.rounds, "to_active_s"),
            "caught_up_s": figure(run.rounds, "caught_up_s"),
            "back_in_pair_s": figure(run.rounds, "rejoin_s"),
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
