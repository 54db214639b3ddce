"""A publisher adapter's takeover after kill -9, under a user's workload (issue 37).

On the stack `make up` left running, its hostmetrics engines publishing (and payments'
running beside them): a file grows by `--rate` (1,000) hostmetrics readings a second over
`--hosts` (10,000) hosts, two publisher adapters follow it (`twinstream publish --source`),
and `--rounds` (5) times the active adapter is killed with kill -9 and started again, as
supervisord would. Measured per round: the seconds from the kill to the first line the
other adapter committed that a read_committed reader of the inbound topic sees (a reader's
view of the takeover), and from the kill to that line's producer timestamp.

    make up
    .venv/bin/python -m bench.publishers --rounds 5

Then audited: every line of the file in the inbound topic exactly once, in file order
(the adapters' `seq` and source-position headers against the offsets the writer noted),
and every inbound offset the run added in exactly one committed transaction of the
engines (`devkit.chaos.audit_ranges`). A progress line at least every 10 s; figures in
`docs/bench/publishers.json` and a plot of the inbound rate with the kills marked in
`docs/bench/publishers.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.plots import plot, rate_series, write_figures
from bench.seconds import counted
from devkit.chaos import SupervisedEngines, audit_ranges
from devkit.harness import example_pipeline, inbound_ends, machine, wait_for
from pipelines.hostmetrics.generate import reading
from twinstream.core.election import zk_client
from twinstream.edge.publisher import (
    PUBLISHER_HEADER,
    SEQ_HEADER,
    SOURCE_HEADER,
    StatusBoard,
    text_headers,
)
from twinstream.edge.sources import Position
from twinstream.platform import registry
from twinstream.platform.kafka import connection
from twinstream.platform.settings import REPO_ROOT, Settings


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.publishers", description=__doc__)
    parser.add_argument("--rate", type=int, default=1_000, help="lines appended a second")
    parser.add_argument("--hosts", type=int, default=10_000, help="distinct hosts (keys)")
    parser.add_argument("--rounds", type=int, default=5, help="kill -9 of the active adapter")
    parser.add_argument(
        "--between", type=float, default=15.0, help="seconds of steady load before each kill"
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    return parser.parse_args(argv)


class Writer(threading.Thread):
    """Appends `rate` readings a second to `path` in tenths of a second; notes where each
    line ends (the source position an adapter gives the line)."""

    def __init__(self, path: Path, rate: int, hosts: int) -> None:
        super().__init__(daemon=True)
        self.path, self.rate, self.hosts = path, rate, hosts
        self.ends: list[int] = []
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._rng = random.Random(37)  # noqa: S311 - reproducible data, not secrets
        self._start = datetime(2026, 1, 1, tzinfo=UTC)

    def append(self, count: int) -> None:
        with self.path.open("ab") as out:
            for _ in range(count):
                i = len(self.ends)
                host = f"host-{self._rng.randrange(self.hosts):05d}"
                out.write(json.dumps(reading(host, self._start, i, self._rng)).encode() + b"\n")
                self.ends.append(out.tell())
        self.samples.append((time.monotonic(), len(self.ends)))

    def run(self) -> None:
        step = max(1, self.rate // 10)
        due = time.monotonic()
        while not self._halt.is_set():
            self.append(step)
            due += step / self.rate
            self._halt.wait(max(0.0, due - time.monotonic()))

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class Follower(threading.Thread):
    """A read_committed reader of the inbound topic from `starts`: each adapter line's
    (time seen, publisher, seq, source position)."""

    def __init__(self, settings: Settings, starts: dict[int, int]) -> None:
        super().__init__(daemon=True)
        self.settings = settings
        self.starts = starts
        self.seen: list[tuple[float, str, int, Position, int]] = []
        self.foreign = 0  # records without the adapters' headers (another producer's)
        self._halt = threading.Event()

    def run(self) -> None:
        consumer = Consumer(connection(self.settings).consumer(f"twinstream-bench-{uuid.uuid4()}"))
        topic = self.settings.inbound_topic
        try:
            consumer.assign([TopicPartition(topic, p, o) for p, o in self.starts.items()])
            while not self._halt.is_set():
                for msg in consumer.consume(1_000, 0.2):
                    error = msg.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            print(f"  inbound reader: {error}", flush=True)
                        continue
                    headers = text_headers(msg.headers())
                    if SEQ_HEADER not in headers:
                        self.foreign += 1
                        continue
                    self.seen.append(
                        (
                            time.time(),
                            headers[PUBLISHER_HEADER],
                            int(headers[SEQ_HEADER]),
                            Position.parse(headers[SOURCE_HEADER]),
                            msg.timestamp()[1],
                        )
                    )
        finally:
            consumer.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


class Adapters:
    """Two publisher adapters on the file, each a process this bench starts and stops by
    pid, with its log beside the file."""

    def __init__(self, settings: Settings, source: Path, folder: Path) -> None:
        self.settings, self.source, self.folder = settings, source, folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.zk = zk_client(settings.zookeeper())
        self.zk.start(timeout=30)

    def start(self, name: str) -> None:
        with (self.folder / f"publisher-{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "twinstream.ops.cli",
                    "publish",
                    "--pipeline",
                    self.settings.pipeline,
                    "--source",
                    str(self.source),
                    "--id",
                    name,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def roles(self) -> dict[str, str]:
        return {
            name: status.role
            for name, status in StatusBoard.read(self.zk, self.settings.topics()).items()
            if name in self.procs
        }

    def active(self) -> str | None:
        actives = [name for name, role in self.roles().items() if role == "active"]
        return actives[0] if len(actives) == 1 else None

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.zk.stop()
        self.zk.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    settings = example_pipeline()
    if registry.load(settings).name != "hostmetrics":
        raise SystemExit("bench.publishers feeds the stack's hostmetrics pipeline")
    engines = SupervisedEngines(settings)
    if not engines.supervisor.is_running():
        raise SystemExit("the local stack is not running: start it with `make up`")
    folder = Path(tempfile.mkdtemp(prefix="twinstream-bench-publishers-"))
    source = folder / "readings.jsonl"
    source.touch()
    print(f"engines: {engines.wait_pair()}; source {source}", flush=True)
    starts = inbound_ends(settings)
    writer = Writer(source, args.rate, args.hosts)
    follower = Follower(settings, starts)
    adapters = Adapters(settings, source, folder)
    others = StatusBoard.read(adapters.zk, settings.topics())
    if others:
        adapters.close()
        raise SystemExit(
            f"publisher adapters {sorted(others)} already run on {settings.pipeline}: stop "
            "them first (`twinstream status` lists them), or the bench would "
            "measure theirs"
        )
    t0 = time.monotonic()
    rounds: list[dict[str, Any]] = []
    marks: list[tuple[float, str]] = []
    figures: dict[str, Any] = {
        "command": "python -m bench.publishers " + " ".join(sys.argv[1:] if argv is None else argv),
        "rate": args.rate,
        "hosts": args.hosts,
        "stopped_early": None,
    }
    try:
        try:
            follower.start()
            for name in ("a", "b"):
                adapters.start(name)
            wait_for(adapters.active, 120, "one publisher adapter active")
            writer.start()
            for n in range(1, args.rounds + 1):
                deadline = time.monotonic() + args.between
                while time.monotonic() < deadline:
                    time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
                    print(
                        f"  round {n}: {len(writer.ends):,} lines written, "
                        f"{len(follower.seen):,} in the inbound topic, adapters {adapters.roles()}",
                        flush=True,
                    )
                wait_for(
                    lambda: sorted(adapters.roles().values()) == ["active", "standby"],
                    60,
                    "one adapter active and the other standby",
                )
                victim = adapters.active()
                assert victim is not None
                seen_before = len(follower.seen)
                killed = time.time()
                adapters.kill9(victim)
                marks.append((time.monotonic() - t0, "kill -9 of the active adapter"))

                def taken_over(after: int = seen_before, dead: str = victim) -> Any:
                    return next((s for s in follower.seen[after:] if s[1] != dead), None)

                first = wait_for(taken_over, 60, "the other adapter's first committed line")
                adapters.start(victim)  # as supervisord restarts it
                rounds.append(
                    {
                        "killed": victim,
                        "visible_s": round(first[0] - killed, 3),
                        "produced_s": round(first[4] / 1000 - killed, 3),
                    }
                )
                print(
                    f"round {n}: adapter {victim} killed; the other's first line visible "
                    f"read_committed after {first[0] - killed:.2f} s",
                    flush=True,
                )
        except (AssertionError, KeyboardInterrupt) as exc:
            figures["stopped_early"] = str(exc) or type(exc).__name__
            print(f"run stopped early: {figures['stopped_early']}", flush=True)
        finally:
            writer.stop()
        total = len(writer.ends)
        wait_for(lambda: len(follower.seen) >= total, 120, f"all {total:,} lines published")
    finally:
        adapters.close()
        follower.stop()
    by_seq = sorted(follower.seen, key=lambda s: s[2])
    seqs = [s[2] for s in by_seq]
    in_order = [s[3].offset for s in by_seq] == writer.ends
    lines = {
        "written": len(writer.ends),
        "published": len(by_seq),
        "seq_contiguous": seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else False,
        "every_line_once_in_file_order": in_order,
        "foreign_records": follower.foreign,
    }
    ends = inbound_ends(settings)
    print("waiting for the engines to publish the run's inbound records", flush=True)
    engines.wait_published(ends, 600)
    found = audit_ranges(settings, starts, ends)
    audit = {
        "events": sum(f.rows for f in found.values()),
        "lost": sum(counted(f.missing) for f in found.values()),
        "duplicated": sum(counted(f.duplicated) for f in found.values()),
        "problems": [f"partition {p}: {f.summary()}" for p, f in found.items() if not f.ok],
    }
    engines.close()
    visible = [r["visible_s"] for r in rounds]
    figures.update(
        {
            "rounds": rounds,
            "takeover_visible_s": {
                "median": statistics.median(visible) if visible else None,
                "worst": max(visible) if visible else None,
            },
            "lines": lines,
            "engines_audit": audit,
            "machine": machine(),
        }
    )
    write_figures(args.output, "publishers", figures)
    seen_samples = [
        (s[0] - (time.time() - time.monotonic()) - t0, i + 1)
        for i, s in enumerate(sorted(follower.seen, key=lambda s: s[0]))
    ]
    plot(
        args.output / "publishers.png",
        f"Publisher adapters at {args.rate:,} lines/s, kill -9 of the active",
        {
            "lines written (file)": rate_series(
                [(t - t0, n) for t, n in writer.samples], 0.0, window_s=1.0
            ),
            "lines committed (inbound, read_committed)": rate_series(
                seen_samples, 0.0, window_s=1.0
            ),
        },
        "lines/s (1 s average)",
        marks=marks,
    )
    ok = (
        lines["every_line_once_in_file_order"]
        and lines["seq_contiguous"]
        and audit["lost"] == audit["duplicated"] == 0
        and not audit["problems"]
    )
    takeover = figures["takeover_visible_s"]
    print(
        f"takeover (kill -9 -> the other adapter's first line visible read_committed) over "
        f"{len(visible)} rounds at {args.rate:,} lines/s: median {takeover['median']} s, "
        f"worst {takeover['worst']} s; "
        f"lines {lines['published']:,}/{lines['written']:,}, in file order: {in_order}; "
        f"engines: {audit['lost']} lost, {audit['duplicated']} duplicated",
        flush=True,
    )
    return 0 if ok and figures["stopped_early"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
