"""One benchmark that says it all: how fast a Twinstream pair drains a backlog against a
plain Kafka pipe and the usual alternatives, and its latency under steady load.

    make up                      # the local stack must be running (make install builds java/)
    .venv/bin/python -m bench.drain --backlog 300000

In one run on the running stack, one after the other:
 0. right after `make up`: the end-to-end latency of the stack's own hostmetrics engines in
    the first `--first-seconds` (60) of `--first-rate` (1,000) events/s, then the CPU the
    idle stack uses over 60 s (bench/idle.py);
then with the stack's own engines stopped, so that every contender has the two cores:
 1. a backlog of `--backlog` valid hostmetrics events in a private inbound topic;
 2. drains of that same backlog, each into output topics of its own:
    (a) the ceiling: one plain confluent-kafka process (bench/plain_pipe.py) with the same
        per-host window in Python, one JSON output per input, in Kafka transactions;
    (b) the Twinstream pair: an active and a hot standby, started together on the backlog;
    (c) Kafka Streams: two instances with one standby replica, exactly_once_v2;
    (d) Flink: one job (local MiniCluster) with an exactly-once Kafka sink;
    (c) and (d) run the same window (java/baseline-common's HostWindow: the last 20 events
    of each host, the average and the sum, in their own keyed state);
    each rate from its first output to its last (start-ups left out alike);
 3. the pair's end-to-end latency (producer send to read_committed visibility) at steady
    `--rates` (1,000, 2,000 and 5,000 events/s), fresh engines warmed up first;
 4. the time back to redundancy: at 1,000 events/s, `--rejoins` times, the standby killed
    (kill -9) and started again at once, as a supervisor does, until it reports in sync
    (GET /pipeline `in_sync`: its pipeline running and within TWINSTREAM_IN_SYNC_LAG).
Prints every figure, the ratios last; writes docs/bench/drain.json and docs/bench/drain.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import idle
from bench.baseline import FLINK, KAFKA_STREAMS, App, Instance
from bench.latency import latency_figures, measure_steps
from bench.plots import plot_drains
from bench.throughput import drain_with_engines, on_backlog, wait_drained
from twinstream import registry
from twinstream.config import REPO_ROOT, Settings, load_settings
from twinstream.kafka import watermarks
from twinstream.testing.harness import (
    EngineProcess,
    Load,
    OutputSampler,
    Pipeline,
    VisibleTimes,
    bench_pipeline,
    machine,
    wait_for,
)

LABELS = {
    "plain": "plain confluent-kafka pipe (the ceiling)",
    "pair": "Twinstream, active + standby",
    "kafka_streams": "Kafka Streams, 2 instances, 1 standby replica",
    "flink": "Flink, one job, exactly-once sink",
}


def drain_plain(pipeline: Pipeline, total: int) -> OutputSampler:
    s = pipeline.settings
    sampler = OutputSampler(s, [s.outbound_topic])
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.plain_pipe", s.inbound_topic, s.outbound_topic, str(total)],
        env={**os.environ, **pipeline.env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    )

    def alive() -> None:
        if proc.poll() not in (None, 0):
            raise SystemExit(f"the plain pipe failed (exit {proc.returncode})")

    try:
        wait_drained(sampler, total, "plain pipe", alive)
        proc.wait(60)
    finally:
        sampler.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return sampler


def drain_java(pipeline: Pipeline, total: int, app: App, names: tuple[str, ...]) -> OutputSampler:
    s = pipeline.settings
    sampler = OutputSampler(s, [s.outbound_topic])
    # Flink's extra argument is its checkpoint interval (1 s: its exactly-once sink commits
    # only at a checkpoint); then the transform for both.
    extra = ["1000"] if app is FLINK else []
    instances = [
        Instance(
            n, s, f"{pipeline.name}-{app.folder}", pipeline.workdir, app, [*extra, "hostmetrics"]
        )
        for n in names
    ]
    try:
        for instance in instances:
            instance.start()

        def alive() -> None:
            for instance in instances:
                if instance.proc is not None and instance.proc.poll() is not None:
                    raise SystemExit(
                        f"{app.folder} {instance.name} exited; see {instance.log_path}"
                    )

        wait_drained(sampler, total, app.folder, alive)
    finally:
        sampler.stop()
        for instance in instances:
            instance.stop()
    return sampler


def rejoins(pipeline: Pipeline, rate: float, rounds: int) -> list[float]:
    """Seconds from each kill -9 of the standby to the restarted engine in sync."""
    active, standby = pipeline.start_pair()
    load = pipeline.load(int(rate * 3600), rate=rate)
    times: list[float] = []
    try:
        for n in range(rounds):

            def synced(e: EngineProcess = standby) -> bool:
                return bool(e.get("/pipeline")["in_sync"])

            wait_for(synced, 300, "the standby in sync")
            standby.kill9()
            killed = time.monotonic()
            standby = pipeline.start(standby.engine_id)

            def in_sync(e: EngineProcess = standby) -> bool:
                info = e.try_get("/pipeline")
                return bool(info and info["in_sync"] and e.role() == "standby")

            wait_for(in_sync, 600, f"engine {standby.engine_id} back in sync", every_s=0.2)
            times.append(time.monotonic() - killed)
            print(f"  rejoin {n + 1}: in sync {times[-1]:.1f} s after the kill", flush=True)
        assert active.role() == "active"
    finally:
        pipeline.stop_load(load)
        pipeline.stop_all()
    return times


def first_minute(settings: Settings, rate: float, seconds: float) -> dict[str, Any]:
    """Latency of the stack's own pipeline as `make up` left it, over the first `seconds`."""
    from examples.hostmetrics.generate import synthetic

    if registry.load(settings).name != "hostmetrics":
        raise SystemExit("the first-minute part drives the stack's hostmetrics pipeline")
    visible = VisibleTimes(settings)
    first = watermarks(settings, settings.inbound_topic)[1]
    count = int(rate * seconds)
    records = list(synthetic(count, max_record_bytes=settings.max_record_bytes, seed=11))
    try:
        load = Load(settings, records, rate, "first-minute")
        Pipeline.join_load(load, timeout_s=seconds + 120)
        last = first + count - 1
        wait_for(lambda: last in visible.seen, 600, f"msg_id {last} visible", every_s=0.5)
        latencies = list(visible.latencies(first, count).values())
    finally:
        visible.stop()
    return {
        "rate": rate,
        "seconds": seconds,
        **latency_figures(latencies),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 5000])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of a latency step")
    parser.add_argument("--warm-up", type=float, default=60.0, help="seconds before the steps")
    parser.add_argument("--rejoins", type=int, default=5, help="kill -9 rounds of the standby")
    parser.add_argument("--first-rate", type=float, default=1000.0)
    parser.add_argument("--first-seconds", type=float, default=60.0)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["first", "idle", *LABELS, "latency", "rejoin"],
        help="run only these parts",
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()
    parts = set(args.only or ["first", "idle", *LABELS, "latency", "rejoin"])

    samplers: dict[str, OutputSampler] = {}
    steps: list[dict[str, Any]] = []
    rejoin_s: list[float] = []
    early: dict[str, Any] = {}
    idle_cpu: dict[str, Any] = {}
    stack = load_settings()
    if "first" in parts:
        print(f"(first) the stack's own engines, {args.first_rate:,.0f} events/s", flush=True)
        early = first_minute(stack, args.first_rate, args.first_seconds)
        print(f"  {early}", flush=True)
    if "idle" in parts:
        print("(idle) the stack's CPU with no load, 60 s", flush=True)
        idle_cpu = idle.sample(stack, 60.0)
        print(f"  {idle_cpu['cores_total']} cores: {idle_cpu['cores_by_part']}", flush=True)
    with bench_pipeline("twinstream-bench-drain-") as backlog:
        print(f"loading a backlog of {args.backlog:,} valid events", flush=True)
        started = time.monotonic()
        backlog.join_load(backlog.load(args.backlog, rate=0), timeout_s=3600)
        total = watermarks(backlog.settings, backlog.settings.inbound_topic)[1]
        print(f"  loaded in {time.monotonic() - started:.0f} s", flush=True)
        runs: dict[str, Callable[[Pipeline], OutputSampler]] = {
            "plain": lambda p: drain_plain(p, total),
            "pair": lambda p: drain_with_engines(p, ("a", "b"), total),
            "kafka_streams": lambda p: drain_java(p, total, KAFKA_STREAMS, ("a", "b")),
            "flink": lambda p: drain_java(p, total, FLINK, ("a",)),
        }
        for key, run in runs.items():
            if key in parts:
                print(f"({key}) {LABELS[key]}", flush=True)
                samplers[key] = run(on_backlog(backlog, key))
        if "latency" in parts:
            print(f"(latency) the pair at {args.rates} events/s", flush=True)
            # A fresh pipeline with an inbound topic of its own: not the backlog's.
            fresh = Pipeline(backlog.env, backlog.workdir / "latency")
            try:
                steps, *_ = measure_steps(fresh, args.rates, args.seconds, args.warm_up)
            finally:
                fresh.stop_all()
        if "rejoin" in parts:
            print(f"(rejoin) kill -9 of the standby at 1,000 events/s, {args.rejoins} times")
            rejoin_s = rejoins(
                Pipeline(backlog.env, backlog.workdir / "rejoin"), 1000, args.rejoins
            )

    drains: dict[str, Any] = {}
    for key, sampler in samplers.items():
        rate, seconds = sampler.drain_rate(total)
        drains[key] = {
            "what": LABELS[key],
            "events_per_s": round(rate),
            "seconds": round(seconds, 1),
        }
    ratios: dict[str, float] = {}
    if "pair" in drains:
        pair = drains["pair"]["events_per_s"]
        for key in ("plain", "kafka_streams", "flink"):
            if key in drains:
                ratios[f"pair / {key}"] = round(pair / drains[key]["events_per_s"], 3)
    figures = {
        "backlog_events": total,
        "drains": drains,
        "first_minute_after_up": early,
        "idle_stack": idle_cpu,
        "latency_steps": steps,
        "rejoin_s": [round(t, 1) for t in rejoin_s],
        "ratios": ratios,
        "machine": machine(),
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "ratios"}, indent=2))
    for key, value in drains.items():
        print(f"drain ({key}) {value['what']}: {value['events_per_s']:,} events/s")
    if early:
        print(
            f"latency in the first {early['seconds']:.0f} s after make up at "
            f"{early['rate']:,.0f} events/s: p50 {early['p50_ms']} ms, p99 {early['p99_ms']} ms"
        )
    if idle_cpu:
        print(f"idle stack: {idle_cpu['cores_total']:.2f} cores")
    for step in steps:
        held = " (the lag grew: not sustained)" if step["lag_growing"] else ""
        print(
            f"latency at {step['rate_target']:,.0f} events/s: p50 {step['p50_ms']} ms, "
            f"p99 {step['p99_ms']} ms{held}"
        )
    if rejoin_s:
        ordered = sorted(rejoin_s)
        print(
            f"back to redundancy after kill -9 of the standby: median "
            f"{ordered[len(ordered) // 2]:.1f} s, worst {ordered[-1]:.1f} s"
        )
    for name, ratio in ratios.items():
        print(f"ratio {name}: {ratio}")
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "drain.json").write_text(json.dumps(figures, indent=2) + "\n")
    if samplers:
        path = plot_drains(
            args.output / "drain.png",
            f"Draining the same backlog of {total:,} events",
            {LABELS[key]: sampler.samples for key, sampler in samplers.items()},
        )
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
