"""Deploy benchmark: a change of the stack's hostmetrics pipeline deployed under load with
`twinstream deploy`'s steps (twinstream.ops.deploy), then rolled back; optionally the same
with a changed state shape (a replay of the retained input).

    make up                      # the local stack must be running
    .venv/bin/python -m bench.deploy --rate 1000 --hosts 10000
    .venv/bin/python -m bench.deploy --shape    # also a deploy whose state's shape changed

A version 2 of pipelines/hostmetrics is written by appending to its pipeline.py (its
declared version, so that its outputs stay the first version's: the figures are about the
switch), deployed with --yes, then the file is put back as it was and the version before is
deployed with --rollback. With --shape the same again with Keyed.state changed too, so
that the first engine of each version replays the retained input. The file is put back
whatever happens (and the run says so if the engines still run the bench's version).

Measured, each deploy, from a read_committed consumer of the outbound and dead-letter
topics: the longest time between two records arriving while it ran (the output's longest
gap; at 1,000 events/s a record arrives every few milliseconds between batches, so this is
the longest pause in the output); the takeover time the deploy measured (the stop of the
active's pipeline to the first record of the new epoch); how long the deploy took; where
the new logic began and the cutover per partition; for a replay, its starting offsets and
the records it replayed; and how long after the new version's first engine was in sync its
shadow's summary had ranges compared (what the page shows). At the end every inbound offset
of the run is checked to be published exactly once. Prints the figures, writes
docs/bench/deploy.json and docs/bench/deploy.png (output rate, deploys marked).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.failover import warm_up
from bench.plots import plot, rate_series, write_figures
from devkit.chaos import SteadyLoad, SupervisedEngines, audit_load, flagged
from devkit.harness import OutputSampler, example_pipeline, inbound_ends, machine, summary
from twinstream.ops import deploy
from twinstream.platform.kafka import consumer_config
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings

PIPELINE_FILE = REPO_ROOT / "pipelines" / "hostmetrics" / "pipeline.py"

VERSION_2 = """

# bench.deploy's version (removed when the run ends).
import dataclasses as _bench  # noqa: E402

pipeline = _bench.replace(pipeline, version="bench-2-{run}")
"""

SHAPE_CHANGED = """

# bench.deploy's version with another state shape (removed when the run ends).
import dataclasses as _bench  # noqa: E402

pipeline = _bench.replace(
    pipeline,
    version="bench-3-{run}",
    keyed=_bench.replace(pipeline.keyed, state=pipeline.keyed.state + ", bench_note STRING"),
)
"""


class GapWatch(threading.Thread):
    """The outbound and dead-letter topics read_committed from their ends: the arrival
    time of every poll that brought records; `longest(since, until)` is the longest time
    between two such arrivals in a window."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="gap-watch", daemon=True)
        self._consumer = Consumer(consumer_config(settings, f"bench-deploy-{uuid.uuid4()}"))
        parts = []
        for topic in (settings.outbound_topic, settings.dlq_topic):
            meta = self._consumer.list_topics(topic, timeout=15).topics[topic]
            for p in sorted(meta.partitions):
                _low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), 15)
                parts.append(TopicPartition(topic, p, high))
        self._consumer.assign(parts)
        self.arrivals: list[float] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                got = [m for m in self._consumer.consume(1000, 0.05) if m.error() is None]
                if got:
                    self.arrivals.append(time.monotonic())
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=30)

    def longest(self, since: float, until: float) -> tuple[float, float]:
        """The longest time between two arrivals in the window, and when it began."""
        times = [since, *(t for t in self.arrivals if since <= t <= until), until]
        return max((b - a, a) for a, b in itertools.pairwise(times))


@contextlib.contextmanager
def code(extra: str) -> Iterator[None]:
    """pipelines/hostmetrics/pipeline.py with `extra` appended, put back after."""
    original = PIPELINE_FILE.read_text()
    PIPELINE_FILE.write_text(original + extra)
    try:
        yield
    finally:
        PIPELINE_FILE.write_text(original)


def one_deploy(
    stack: Settings,
    watch: GapWatch,
    what: str,
    rollback: bool,
    marks: list[tuple[float, str]],
    t0: float,
    wait_s: float,
) -> dict[str, Any]:
    """Deploy what is on disk now (--yes); the figures."""
    engines: list[str] = []
    level_at: dict[str, float] = {}
    lines: list[tuple[float, str]] = []

    def echo(line: str) -> None:
        lines.append((time.monotonic(), line))
        print(f"  {line}", flush=True)
        # sync_check's line: "engine b: running, lag 12, ... : in sync".
        if line.strip().endswith(": in sync") and not level_at:
            level_at[line.strip().split(":")[0].removeprefix("engine ")] = time.monotonic()

    shadow_s: list[float] = []

    def confirm(question: str) -> bool:
        # The shadow's summary as the page reads it: GET /pipeline of the first engine.
        if level_at:
            ((first, at),) = level_at.items()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                shadow = d.engines[first].pipeline().agreement.shadow
                if shadow is not None and shadow.ranges_compared > 0:
                    shadow_s.append(time.monotonic() - at)
                    break
                time.sleep(0.5)
        print(f"  {question} yes", flush=True)
        return True

    started = time.monotonic()
    marks.append((started - t0, what))
    with contextlib.ExitStack() as closing:
        d, target = deploy.on_stack(
            stack,
            "hostmetrics",
            closing,
            client=deploy.token_client,
            startup_timeout_s=stack.startup_timeout_s,
            confirm=confirm,
            echo=echo,
            no_tests=True,
            wait_s=wait_s,
        )
        engines = list(d.engines)
        record = deploy.run(d, target, rollback=rollback)
    ended = time.monotonic()
    replayed = None
    if record.rebuilt == deploy.REPLAY:
        # From where the replay began to the cutover: what the first engine computed again.
        replayed = sum(record.cutover.get(p, s) - s + 1 for p, s in record.start.items())
    gap, gap_at = watch.longest(started, ended)
    # What the deploy was doing when the output paused longest: its last line before.
    during = [line for at, line in lines if at <= gap_at]
    figures = {
        "what": what,
        "version": record.version,
        "previous": record.previous,
        "rebuilt": record.rebuilt,
        "engines": engines,
        "deploy_s": round(ended - started, 1),
        "longest_output_gap_s": round(gap, 3),
        "longest_gap_began_s": round(gap_at - started, 1),
        "longest_gap_during": during[-1].strip() if during else "the deploy's start",
        "takeover_s": record.takeover_s,
        "start": record.start,
        "cutover": record.cutover,
        "replayed_records": replayed,
        "shadow_summary_after_level_s": round(shadow_s[0], 1) if shadow_s else None,
    }
    print(f"{what}: {figures}", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=1000.0, help="inbound events per second")
    parser.add_argument("--hosts", type=int, default=10_000, help="distinct hosts (keys)")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds of load first")
    parser.add_argument("--shape", action="store_true", help="also a changed state shape")
    parser.add_argument("--wait", type=float, default=600.0, help="each engine's catch-up")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    settings = example_pipeline()
    stack = load_settings()
    engines = SupervisedEngines(settings)
    if not engines.supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    firsts = inbound_ends(settings)
    t0 = time.monotonic()
    sampler = OutputSampler(settings, [settings.outbound_topic, settings.dlq_topic])
    watch = GapWatch(settings)
    watch.start()
    load = SteadyLoad(settings, args.rate, args.hosts).start()
    marks: list[tuple[float, str]] = []
    deploys: list[dict[str, Any]] = []

    def done(figures: dict[str, Any]) -> None:
        # Written after each deploy, marked incomplete: a run stopped before its end (a
        # catch-up of many minutes on a loaded machine) still leaves what it measured.
        deploys.append(figures)
        partial = {"rate_per_s": args.rate, "hosts": args.hosts, "complete": False}
        write_figures(args.output, "deploy", {**partial, "deploys": deploys}, echo=False)

    try:
        warm_up(engines, time.monotonic(), args.settle)
        # A version of this run's own: a run stopped before its switch leaves a deploy of
        # its version recorded, which a later deploy of that version would continue (and
        # refuse once no standby runs it), so every run declares a new one.
        run = time.strftime("%Y%m%dT%H%M%S")
        with code(VERSION_2.format(run=run)):
            done(one_deploy(stack, watch, "deploy", False, marks, t0, args.wait))
        done(one_deploy(stack, watch, "rollback", True, marks, t0, args.wait))
        if args.shape:
            with code(SHAPE_CHANGED.format(run=run)):
                done(one_deploy(stack, watch, "shape", False, marks, t0, args.wait))
            done(one_deploy(stack, watch, "shape rollback", True, marks, t0, args.wait))
    finally:
        sent = load.stop()
        print(f"waiting for all {sent:,} events of the run to be published", flush=True)
    audited = audit_load(engines, firsts, sent)
    watch.stop()
    sampler.stop()
    engines.close()
    ok = all(f.ok for f in audited.values())
    figures: dict[str, Any] = {
        "rate_per_s": args.rate,
        "hosts": args.hosts,
        "complete": True,
        "messages": sent,
        "deploys": deploys,
        "longest_output_gap_s": summary([d["longest_output_gap_s"] for d in deploys]),
        "gaps": flagged(audited, "missing"),
        "duplicates": flagged(audited, "duplicated"),
        "machine": machine(),
    }
    write_figures(args.output, "deploy", figures)
    path = plot(
        args.output / "deploy.png",
        f"Output rate under {args.rate:,.0f} events/s over {args.hosts:,} hosts, with deploys",
        {"output events/s, 3 s average": rate_series(sampler.samples, t0, window_s=3.0)},
        "output events/s",
        marks=marks,
        xlabel="seconds",
    )
    print(f"wrote {path}; exactly once: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
