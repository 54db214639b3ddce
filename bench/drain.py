"""One benchmark that says it all: how fast a Twinstream pair drains a backlog against a
plain Kafka pipe and the usual alternatives, and its latency under steady load.

    make up                      # the local stack must be running (make install builds java/)
    .venv/bin/python -m bench.drain --backlog 300000

In one run on the running stack, one after the other:
 0. right after `make up`: the end-to-end latency of the stack's own hostmetrics engines in
    the first `--first-seconds` (60) of `--first-rate` (1,000) events/s, then the CPU the
    idle stack uses over 60 s (bench/idle.py); then takeovers on the stack's own pair under
    1,000 events/s: `--takeovers` (20) kill -9 of the active with its standby in sync,
    then `--young-takeovers` (5) kill -9 of the active of a pair (re)started 60 s before,
    whatever its standby's lag; every event of these rounds audited exactly once;
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
    `--rates` (100, 1,000, 2,000 and 5,000 events/s), fresh engines warmed up first;
 4. the time back to redundancy: at 1,000 events/s, `--rejoins` times, the standby killed
    (kill -9) and started again at once, as a supervisor does, until it reports in sync
    (GET /pipeline `in_sync`: its pipeline running and within TWINSTREAM_IN_SYNC_LAG).
Prints every figure, the ratios last; writes docs/bench/drain.json and docs/bench/drain.png.
"""

from __future__ import annotations

import argparse
import contextlib
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
from bench.failover import warm_up
from bench.latency import latency_figures, measure_steps
from bench.plots import plot_drains, write_figures
from bench.throughput import drain_with_engines, on_backlog, wait_drained
from devkit.chaos import (
    SteadyLoad,
    SupervisedEngines,
    audit_load,
    audit_summary,
    failover_round,
)
from devkit.harness import (
    EngineProcess,
    Load,
    OutputSampler,
    Pipeline,
    VisibleTimes,
    bench_pipeline,
    example_pipeline,
    inbound_ends,
    machine,
    summary,
    wait_for,
)
from twinstream.engine.client import EngineError
from twinstream.platform import registry
from twinstream.platform.kafka import watermarks
from twinstream.platform.settings import REPO_ROOT, Settings

LABELS = {
    "plain": "plain confluent-kafka pipe (the ceiling)",
    "pair": "Twinstream, active + standby",
    "kafka_streams": "Kafka Streams, 2 instances, 1 standby replica",
    "flink": "Flink, one job, exactly-once sink",
}

PARTS = ["first", "idle", "takeover", *LABELS, "latency", "rejoin"]


def drain_plain(pipeline: Pipeline, total: int) -> OutputSampler:
    s = pipeline.settings
    sampler = OutputSampler(s, [s.outbound_topic])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.plain_pipe",
            s.inbound_topic,
            s.outbound_topic,
            str(total),
            # Every inbound partition (bench/keys.py's backlogs have the stack's three).
            str(s.partitions),
        ],
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


def young_pair(engines: SupervisedEngines, age_s: float) -> tuple[tuple[str, str], int | None]:
    """Restart both engines of the stack's pipeline at once, as `make up` or a host's reboot
    does, and return (active, standby) `age_s` after the restart, with the standby's lag
    then: the round strikes at that age whatever the standby's state, that being what it
    measures."""
    names = [f"engine-{e}" for e in engines.clients]
    for name in names:
        engines.supervisor.stop(name)
    for name in names:
        engines.supervisor.start(name)
    started = time.monotonic()

    def roles() -> tuple[str, str] | None:
        found: dict[str, str] = {}
        for engine_id, client in engines.clients.items():
            with contextlib.suppress(EngineError):
                found[client.server().role] = engine_id
        if "active" in found and "standby" in found:
            return found["active"], found["standby"]
        return None

    wait_for(roles, 180, "the restarted engines to elect an active and a standby")
    # The scenario is an age: "engines started 60 s before", not a condition to poll for.
    time.sleep(max(0.0, started + age_s - time.monotonic()))
    pair: tuple[str, str] = wait_for(roles, 60, "an active and a standby")
    try:
        return pair, engines.clients[pair[1]].pipeline().lag
    except EngineError:
        return pair, None


def takeovers(
    settings: Settings, rate: float, rounds: int, young_rounds: int, young_age_s: float = 60.0
) -> dict[str, Any]:
    """Takeover after kill -9 of the active on the stack's own pair under steady load:
    `rounds` with an in-sync standby, then `young_rounds` on engines `young_age_s` old."""
    engines = SupervisedEngines(settings)
    if not engines.supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    firsts = inbound_ends(settings)
    load = SteadyLoad(settings, rate).start()
    steady: list[float] = []
    # Kill to a standby reporting itself active: the part before its first output.
    steady_roles: list[float] = []
    young: list[float] = []
    young_lags: list[int | None] = []
    try:
        warm_up(engines, time.monotonic())
        for n in range(1, rounds + 1):
            r = failover_round(engines, "kill", rejoin_timeout_s=600)
            if r.takeover.first_output_s is None:
                raise SystemExit(f"no output after the takeover: {r.takeover.describe()}")
            steady.append(r.takeover.first_output_s)
            if r.takeover.role_s is not None:
                steady_roles.append(r.takeover.role_s)
            print(f"  takeover {n}/{rounds}: {r.takeover.describe()}", flush=True)
        for n in range(1, young_rounds + 1):
            pair, lag = young_pair(engines, young_age_s)
            r = failover_round(engines, "kill", rejoin_timeout_s=600, pair=pair)
            if r.takeover.first_output_s is None:
                raise SystemExit(f"no output after the takeover: {r.takeover.describe()}")
            young.append(r.takeover.first_output_s)
            young_lags.append(lag)
            print(
                f"  takeover on engines {young_age_s:.0f} s old {n}/{young_rounds} (standby "
                f"{lag} behind): {r.takeover.describe()}",
                flush=True,
            )
    finally:
        sent = load.stop()
    try:
        audited = audit_load(engines, firsts, sent)
    finally:
        engines.close()
    if not all(f.ok for f in audited.values()):
        raise SystemExit(f"the takeover rounds lost or repeated events: {audit_summary(audited)}")
    return {
        "rate": rate,
        "events": sent,
        "in_sync_s": summary(steady) if steady else None,
        "in_sync_active_s": summary(steady_roles) if steady_roles else None,
        "young_age_s": young_age_s,
        "young_s": summary(young) if young else None,
        "young_standby_lags": young_lags,
    }


def first_minute(settings: Settings, rate: float, seconds: float) -> dict[str, Any]:
    """Latency of the stack's own pipeline as `make up` left it, over the first `seconds`."""
    from pipelines.hostmetrics.generate import synthetic

    contract = registry.load(settings)
    if contract.name != "hostmetrics":
        raise SystemExit("the first-minute part drives the stack's hostmetrics pipeline")
    visible = VisibleTimes(settings)
    firsts = inbound_ends(settings)
    count = int(rate * seconds)
    records = list(synthetic(count, max_record_bytes=settings.max_record_bytes, seed=11))
    try:
        # Keyed as the contract says: each host's records in one partition, in order.
        load = Load(settings, records, rate, "first-minute", key_field=contract.partition_by)
        Pipeline.join_load(load, timeout_s=seconds + 120)
        ends = inbound_ends(settings)
        wait_for(lambda: visible.has(ends), 600, f"the last records {ends} visible", every_s=0.5)
        latencies = list(visible.latencies(firsts, ends).values())
    finally:
        visible.stop()
    return {
        "rate": rate,
        "seconds": seconds,
        **latency_figures(latencies),
    }


def on_private_pipelines(
    args: argparse.Namespace, parts: set[str]
) -> tuple[dict[str, OutputSampler], int, list[dict[str, Any]], list[float]]:
    """Parts 1-4, on pipelines of their own with the stack's engines stopped: the drains'
    samplers, the backlog's size, the latency steps, the rejoin times."""
    samplers: dict[str, OutputSampler] = {}
    steps: list[dict[str, Any]] = []
    rejoin_s: list[float] = []
    total = 0
    with bench_pipeline("twinstream-bench-drain-") as backlog:
        if parts & set(LABELS):
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
    return samplers, total, steps, rejoin_s


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000, 2000, 5000])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of a latency step")
    parser.add_argument("--warm-up", type=float, default=60.0, help="seconds before the steps")
    parser.add_argument("--rejoins", type=int, default=5, help="kill -9 rounds of the standby")
    parser.add_argument(
        "--takeovers", type=int, default=20, help="kill -9 rounds of the stack's active"
    )
    parser.add_argument(
        "--young-takeovers", type=int, default=5, help="rounds on engines started 60 s before"
    )
    parser.add_argument("--first-rate", type=float, default=1000.0)
    parser.add_argument("--first-seconds", type=float, default=60.0)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        help="run only these parts",
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()
    parts = set(args.only or PARTS)

    steps: list[dict[str, Any]] = []
    rejoin_s: list[float] = []
    early: dict[str, Any] = {}
    idle_cpu: dict[str, Any] = {}
    takeover: dict[str, Any] = {}
    # The stack's own pipeline as it runs (three partitions in pipelines.toml).
    stack = example_pipeline()
    if "first" in parts:
        print(f"(first) the stack's own engines, {args.first_rate:,.0f} events/s", flush=True)
        early = first_minute(stack, args.first_rate, args.first_seconds)
        print(f"  {early}", flush=True)
    if "idle" in parts:
        print("(idle) the stack's CPU with no load, 60 s", flush=True)
        idle_cpu = idle.sample(stack, 60.0)
        print(f"  {idle_cpu['cores_total']} cores: {idle_cpu['cores_by_part']}", flush=True)
    if "takeover" in parts:
        print(
            f"(takeover) kill -9 of the stack's active at 1,000 events/s: {args.takeovers} "
            f"rounds, then {args.young_takeovers} on engines started 60 s before",
            flush=True,
        )
        takeover = takeovers(stack, 1000.0, args.takeovers, args.young_takeovers)
    samplers: dict[str, OutputSampler] = {}
    total = 0
    if parts & {*LABELS, "latency", "rejoin"}:
        samplers, total, steps, rejoin_s = on_private_pipelines(args, parts)

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
        "takeover": takeover,
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
    if takeover.get("in_sync_s"):
        t = takeover["in_sync_s"]
        print(
            f"takeover after kill -9, {t['n']} rounds: median {t['median']} s, worst {t['worst']} s"
        )
    if takeover.get("young_s"):
        t = takeover["young_s"]
        print(
            f"takeover on engines 60 s old, {t['n']} rounds: median {t['median']} s, "
            f"worst {t['worst']} s"
        )
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
    write_figures(args.output, "drain", figures, echo=False)
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
