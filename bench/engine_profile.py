"""Where an engine's CPU goes while it drains: py-spy over its Python processes (the driver
and the Python workers Spark forks) and async-profiler over its JVM, at once, for a window
of a running drain; the samples split into the parts of the record's path.

`bench.keys --profile KEYS` runs it on the active engine of the pair's drain at KEYS
distinct keys. Both profilers sample CPU only (py-spy leaves idle threads out; async-profiler
`-e cpu`), so a part's share is of the CPU the engine used, and its µs per record are its
CPU seconds over the records the pair published in the window. The collapsed stacks stay
beside the JSON, gzipped (`python.collapsed.gz`, `jvm.collapsed.gz`), for a flame graph.
"""

from __future__ import annotations

import collections
import gzip
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from devkit.harness import Pipeline
from twinstream.platform.kafka import partition_ends
from twinstream.platform.settings import Settings

PY_SPY_RATE = 100  # samples per second, per process
JVM_INTERVAL_MS = 10  # async-profiler's CPU sampling interval

# (part, a frame any of whose markers it holds), first match wins: the JVM's side.
JVM_PARTS: Sequence[tuple[str, tuple[str, ...]]] = (
    ("JIT compilers", ("CompileBroker", "C2Compiler", "Compilation::", "Compile::")),
    ("GC", ("G1", "GCTaskThread", "ConcurrentGCThread")),
    ("read Kafka, validate, shuffle (map stage)", ("ShuffleMapTask",)),
    ("collect to the driver (toArrow)", ("collectAsArrowToPython",)),
    ("stateful task: Arrow to and from Python, state store", ("ResultTask",)),
    ("micro-batch planning and commits", ("MicroBatchExecution", "StreamExecution")),
)
# The Python side: (part, frames any of which marks it), first match wins.
PYTHON_PARTS: Sequence[tuple[str, tuple[str, ...]]] = (
    ("worker: the pipeline's step", ("@STEP",)),
    ("worker: twinstream's processor (dicts in, frame out)", ("twinstream/engine/state/",)),
    ("worker: pyspark's Arrow and pandas conversions", ("pyspark.daemon", "pyspark/worker.py")),
    ("driver: the batch to Python (toArrow, assemble)", ("rows_of (",)),
    ("driver: the Kafka transaction", ("_publish (",)),
    ("driver: the gate (buffer, order)", ("on_batch (", "zk_connected (")),
    ("driver: other threads (py4j, kazoo, admin API)", ("",)),
)


def load_collapsed(path: Path) -> list[tuple[list[str], int]]:
    """`frame;frame;... count` lines (both profilers' collapsed format)."""
    rows = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            rows.append((stack.split(";"), int(count)))
    return rows


def split(
    rows: Iterable[tuple[list[str], int]],
    parts: Sequence[tuple[str, tuple[str, ...]]],
    step_frames: Sequence[str] = (),
) -> dict[str, int]:
    """Samples per part. A frame of the step's own module (`step_frames`) marks the step:
    the `@STEP` marker of PYTHON_PARTS."""
    counts: collections.Counter[str] = collections.Counter()
    for stack, count in rows:
        joined = ";".join(stack)
        if step_frames and any(f in joined for f in step_frames):
            joined += ";@STEP"
        part = next((name for name, marks in parts if any(m in joined for m in marks)), "other")
        counts[part] += count
    return dict(counts)


def gzipped(path: Path) -> Path:
    """`path` compressed beside itself (collapsed stacks shrink ~10x), the original removed."""
    target = path.with_name(path.name + ".gz")
    with path.open("rb") as src, gzip.open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return target


class EngineProfile(threading.Thread):
    """Profiles the pair's active for `seconds` once it has published `after` records."""

    def __init__(
        self,
        pipeline: Pipeline,
        folder: Path,
        seconds: float,
        step_frames: Sequence[str],
        profiler_jar: Path,
        after: int = 40_000,
    ) -> None:
        super().__init__(daemon=True, name="engine-profile")
        self.pipeline = pipeline
        self.folder = folder
        self.seconds = seconds
        self.step_frames = list(step_frames)
        self.jar = profiler_jar
        # Records the active publishes before the window opens: past a young engine's
        # first batches (its JIT compiling), so that the window shows the steady cost.
        self.after = after
        self.result: dict[str, Any] = {}
        self._stop_event = threading.Event()
        self.start()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(self.seconds + 120)

    def run(self) -> None:
        try:
            self.result = self._profile()
        except Exception as exc:  # the drain's figures stand without the profile
            print(f"  profile: not taken: {type(exc).__name__}: {exc}", flush=True)

    def _active(self) -> Any:
        while not self._stop_event.wait(0.5):
            active = self.pipeline.active()
            if active is not None:
                info = active.try_get("/pipeline") or {}
                # Each partition's last published msg_id (-1 before any; and
                # `last_msg_id_published` is None for a pipeline of several partitions).
                published = sum(v + 1 for v in (info.get("published") or {}).values())
                if published >= self.after:
                    return active
        return None

    @staticmethod
    def _published(settings: Settings) -> int:
        return sum(
            sum(partition_ends(settings, topic).values())
            for topic in (settings.outbound_topic, settings.dlq_topic)
        )

    def _profile(self) -> dict[str, Any]:
        active = self._active()
        if active is None:
            raise RuntimeError("the drain ended before the pair published")
        jvm = next((c for c in psutil.Process(active.pid).children() if c.name() == "java"), None)
        if jvm is None:
            raise RuntimeError(f"engine {active.engine_id} has no JVM child")
        self.folder.mkdir(parents=True, exist_ok=True)
        python_out, jvm_out = self.folder / "python.collapsed", self.folder / "jvm.collapsed"
        s = self.pipeline.settings
        # The output topics' ends, read at both ends of the window (a sampler thread's last
        # sample lagged the window by tens of seconds on two busy cores); a transaction's
        # marker adds one offset per partition, a few per 20,000 records.
        first = self._published(s)
        seconds = str(round(self.seconds))
        print(f"  profile: engine {active.engine_id} (active) for {seconds} s", flush=True)
        py_spy = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(active.pid),
                "--subprocesses",
                "--nonblocking",
                "--rate",
                str(PY_SPY_RATE),
                "--duration",
                seconds,
                "--format",
                "raw",
                "-o",
                str(python_out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        profiler = subprocess.Popen(
            [
                "java",
                "-jar",
                str(self.jar),
                "profiler",
                "-e",
                "cpu",
                "-i",
                f"{JVM_INTERVAL_MS}ms",
                "-d",
                seconds,
                "-o",
                "collapsed",
                "-f",
                str(jvm_out),
                str(jvm.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started = time.monotonic()
        try:
            _, py_err = py_spy.communicate(timeout=self.seconds + 60)
            _, jvm_err = profiler.communicate(timeout=self.seconds + 60)
        finally:
            for proc in (py_spy, profiler):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            window = time.monotonic() - started
        records = self._published(s) - first
        if not python_out.exists() or not jvm_out.exists():
            raise RuntimeError(
                f"a profiler wrote nothing: py-spy said {py_err.decode()[-300:]!r}, "
                f"async-profiler {jvm_err.decode()[-300:]!r}"
            )
        python = split(load_collapsed(python_out), PYTHON_PARTS, self.step_frames)
        jvm_parts = split(load_collapsed(jvm_out), JVM_PARTS)
        stacks = [str(gzipped(python_out)), str(gzipped(jvm_out))]
        cpu = {f"python: {k}": v / PY_SPY_RATE for k, v in python.items()}
        cpu |= {f"jvm: {k}": v * JVM_INTERVAL_MS / 1000 for k, v in jvm_parts.items()}
        total = sum(cpu.values())
        per_record = {k: round(v / records * 1e6, 1) for k, v in cpu.items()} if records else {}
        return {
            "engine": active.engine_id,
            "window_s": round(window, 1),
            "records_published_in_window": records,
            "cpu_s": round(total, 1),
            "cpu_s_by_part": {k: round(v, 2) for k, v in sorted(cpu.items())},
            "us_per_record_by_part": dict(sorted(per_record.items())),
            "us_per_record": round(total / records * 1e6, 1) if records else None,
            "stacks": stacks,
        }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"engine {result['engine']}: {result['cpu_s']} CPU s in {result['window_s']} s, "
        f"{result['records_published_in_window']:,} records published: "
        f"{result['us_per_record']} µs of CPU per record"
    ]
    for part, micros in sorted(result["us_per_record_by_part"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {micros:>8.1f} µs  {part}")
    return "\n".join(lines)
