"""Kafka Streams with a standby replica: the same kill -9 of the active as
bench/failover.py, for comparison with a Twinstream pair.

    make up                      # the local stack must be running (make install builds the app)
    .venv/bin/python bench/kafka_streams.py --rounds 5 --rate 1000

Runs two instances of java/kafka-streams' StandbyPipeline, a stateful pipeline (a running
count per key in a persistent store) with exactly_once_v2 and num.standby.replicas=1 and
every other setting at Kafka Streams' default, as its users run it, on topics of its own on
the running stack (whose engines are stopped meanwhile, so the two cores go to the
instances measured). Steady synthetic load at `--rate`. Each round waits for one instance
holding the task and the other keeping a standby replica within TWINSTREAM_IN_SYNC_LAG
records, kills the active with SIGKILL and restarts it at once, as a supervisor would.

Takeover time = from the kill to the first output of another process visible to a
read_committed consumer (the same measure as bench/failover.py's); also until the
successor reports the task active, and until the pair is whole again. At the end every
inbound offset of the run is checked to be in the output exactly once.

Prints the figures, writes docs/bench/kafka_streams.json and docs/bench/kafka_streams.png
(output rate over time, kills marked). A round that fails, or Ctrl-C, ends the rounds; the
ones before it are audited and written.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twinstream.audit import find_problems
from twinstream.baseline import Instance, pair
from twinstream.chaos import SteadyLoad
from twinstream.config import REPO_ROOT, Settings
from twinstream.harness import OutputSampler, bench_pipeline, machine, summary, wait_for
from twinstream.kafka import watermarks
from twinstream.subscriber import read_committed


class OutputTail(threading.Thread):
    """(monotonic time visible, engine_id) of each committed output, from the topic's end."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(daemon=True, name="output-tail")
        self.settings = settings
        self.seen: list[tuple[float, str | None]] = []
        self.done = threading.Event()
        self.offset = watermarks(settings, settings.outbound_topic)[1]
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            # Short idle timeouts: the loop notices `done` while no output arrives (as
            # during a Kafka Streams takeover, for most of a minute).
            for record in read_committed(
                self.settings, self.settings.outbound_topic, self.offset, 2.0, follow=True
            ):
                self.seen.append((time.monotonic(), record.engine_id))
                self.offset = record.offset + 1

    def first_after(self, since: float, other_than: str) -> float | None:
        """When the first output after `since` from another process than `other_than`
        became visible."""
        return next((t for t, engine in self.seen if t >= since and engine != other_than), None)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def figure(rounds: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return summary(values) if values else None


def process_tag(instance: Instance) -> str:
    """The engine_id its current process writes: instance name and start count."""
    return f"{instance.name}.{instance.starts}"


def progress(instances: dict[str, Instance], since: float, what: str) -> Callable[[], None]:
    """A callable that prints, at most every 5 s, how long `what` has taken and where each
    instance stands: the waits here last up to a minute."""
    last = [time.monotonic()]

    def report() -> None:
        now = time.monotonic()
        if now - last[0] >= 5.0:
            last[0] = now
            states = "; ".join(f"{n}: {i.status}" for n, i in instances.items())
            print(f"  {now - since:5.1f} s {what}: {states}", flush=True)

    return report


def kill_round(
    instances: dict[str, Instance],
    tail: OutputTail,
    current_pair: Callable[[], tuple[str, str] | None],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Kill -9 the instance holding the task once the pair is whole, restart it at once,
    and time the takeover and the rejoin."""
    active, standby = wait_for(
        current_pair, args.rejoin_timeout, "an active and an in-sync standby"
    )
    victim = instances[active]
    tag = process_tag(victim)
    killed = time.monotonic()
    victim.kill9()
    victim.start()  # the supervisor's restart, at once

    report = progress(instances, killed, f"since the kill of {active}")

    def visible() -> float | None:
        report()
        return tail.first_after(killed, tag)

    def rejoined() -> bool:
        report()
        now = current_pair()
        return now is not None and active in now

    first_output = wait_for(
        visible, args.takeover_timeout, f"output after the kill of {active}", every_s=0.05
    )
    successor = instances[standby].active_since
    wait_for(rejoined, args.rejoin_timeout, f"instance {active} back in the pair")
    return {
        "killed": active,
        "killed_at": killed,
        "first_output_s": first_output - killed,
        "to_active_s": None if successor is None else successor - killed,
        "rejoin_s": time.monotonic() - killed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5, help="kills of the active")
    parser.add_argument("--rate", type=float, default=1000.0, help="inbound events per second")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds of load before the first round"
    )
    parser.add_argument("--takeover-timeout", type=float, default=300.0)
    parser.add_argument("--rejoin-timeout", type=float, default=600.0)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    rounds: list[dict[str, Any]] = []
    marks: list[tuple[float, str]] = []
    stopped: str | None = None
    with bench_pipeline("twinstream-bench-kstreams-") as pipeline:
        settings = pipeline.settings
        instances = {
            n: Instance(n, settings, f"{pipeline.name}-kstreams", pipeline.workdir)
            for n in ("a", "b")
        }

        def current_pair() -> tuple[str, str] | None:
            return pair({n: i.status for n, i in instances.items()}, settings.in_sync_lag)

        try:
            first = watermarks(settings, settings.inbound_topic)[1]
            t0 = time.monotonic()
            sampler = OutputSampler(settings, [settings.outbound_topic])
            tail = OutputTail(settings)
            load = SteadyLoad(settings, args.rate).start()
            try:
                for instance in instances.values():
                    instance.start()
                print(f"instances started; {args.settle:.0f} s of load first", flush=True)
                report = progress(instances, t0, "of load")
                wait_for(
                    lambda: report() or time.monotonic() - t0 >= args.settle,
                    args.settle + 5,
                    "the settle time",
                )
                try:
                    for n in range(1, args.rounds + 1):
                        result = kill_round(instances, tail, current_pair, args)
                        marks.append((result.pop("killed_at") - t0, "kill"))
                        rounds.append(result)
                        shown = ", ".join(
                            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in result.items()
                            if v is not None
                        )
                        print(f"kill {n}/{args.rounds}: {shown}", flush=True)
                except (AssertionError, KeyboardInterrupt) as exc:
                    stopped = str(exc) or "interrupted"
                    print(f"run stopped early: {stopped}", flush=True)
            finally:
                sent = load.stop()
            end = first + sent
            print(f"waiting for all {sent:,} events of the run to be output", flush=True)
            wait_for(
                lambda: len(tail.seen) >= sent,
                600,
                "the run's events output",
                every_s=1.0,
            )
            tail.stop()
            sampler.stop()
            ids = [r.msg_id for r in read_committed(settings, settings.outbound_topic, 0)]
            findings = find_problems(ids, first, end)
        finally:
            # Every instance this run started, by pid, however the run ended.
            for instance in instances.values():
                instance.stop()

    figures: dict[str, Any] = {
        "system": "Kafka Streams 4.3.1, exactly_once_v2, num.standby.replicas=1, defaults else",
        "rate_per_s": args.rate,
        "messages": sent,
        "takeover_to_first_output_s": figure(rounds, "first_output_s"),
        "takeover_to_active_s": figure(rounds, "to_active_s"),
        "back_in_pair_s": figure(rounds, "rejoin_s"),
        "stopped_early": stopped,
        "gaps": findings.missing,
        "duplicates": findings.duplicated,
        "machine": machine(),
    }
    print(json.dumps(figures, indent=2))
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "kafka_streams.json").write_text(json.dumps(figures, indent=2) + "\n")
    from twinstream.plots import plot, rate_series

    path = plot(
        args.output / "kafka_streams.png",
        f"Kafka Streams with a standby replica: output rate under {args.rate:,.0f} events/s,"
        " kill -9 of the active",
        {"output events/s, 3 s average": rate_series(sampler.samples, t0, window_s=3.0)},
        "output events/s",
        marks=marks,
    )
    print(f"wrote {path}")
    return 0 if findings.ok and stopped is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
