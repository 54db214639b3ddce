"""Profile of one engine under load: where its CPU goes, in Python and in the JVM.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.profile --rate 2000 --seconds 60

A private pipeline with an active and a standby engine (the stack's own engines stopped
meanwhile), a steady synthetic load at `--rate` events/s, and, once the pair runs warm,
`--seconds` of sampling on the active:
  - py-spy (https://github.com/benfred/py-spy) on the engine's Python process (the Spark
    driver side: the foreachBatch sink, the gate, the Kafka producer) and on the Python
    workers Spark forks for the pandas state function (the `pyspark.daemon` below the JVM),
    100 samples a second, threads that wait left out;
  - the CPU seconds of each process of the engine (Python driver, JVM, Python workers), from
    /proc, over the same window;
  - Spark's own timing of each micro-batch (the engine's once-a-minute log line:
    StreamingQueryProgress.durationMs and the state store's commit time).
Writes docs/bench/profile/: the collapsed stacks per process (driver.txt, workers.txt; they
load into https://www.speedscope.app or flamegraph.pl) and profile.json with the CPU split
and the top functions (own samples, and with their callees); prints the same.
docs/profile.md reads these figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench import idle
from devkit.harness import bench_pipeline, machine
from twinstream.platform.settings import REPO_ROOT

SAMPLE_RATE = 100  # py-spy samples a second


def engine_processes(pid: int) -> dict[str, list[psutil.Process]]:
    """The engine's processes by part: its Python driver, the Spark JVM below it, and the
    Python workers below the JVM (pyspark.daemon and its forks)."""
    driver = psutil.Process(pid)
    parts: dict[str, list[psutil.Process]] = {"python driver": [driver], "jvm": [], "workers": []}
    for child in driver.children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "java" in child.name() or "org.apache.spark" in cmdline:
            parts["jvm"].append(child)
        elif "pyspark" in cmdline or "python" in child.name():
            parts["workers"].append(child)
    return parts


def cpu_seconds(processes: list[psutil.Process]) -> float:
    return sum(idle.cpu(proc) or 0.0 for proc in processes)


def record(pid: int, seconds: float, out: Path, subprocesses: bool) -> subprocess.Popen[bytes]:
    """py-spy record in the background: collapsed stacks to `out`.txt."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(seconds)),
        "--rate",
        str(SAMPLE_RATE),
        "--format",
        "raw",
        "--output",
        str(out.with_suffix(".txt")),
        "--nonblocking",  # never pause the engine: its batches are what is measured
    ]
    if subprocesses:
        command.append("--subprocesses")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def top_functions(collapsed: Path, n: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks ("frame;frame;frame count"): the functions with the
    most samples of their own (leaf) and with their callees (anywhere on the stack), as
    shares of all samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # py-spy names a frame "function (file:line)"; the line number splits one function.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return {"samples": 0, "own": [], "with_callees": []}

    def shares(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * c / total, 1)) for f, c in counter.most_common(n)]

    return {"samples": total, "own": shares(own), "with_callees": shares(inclusive)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=2000.0, help="events/s of steady load")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the sampling")
    parser.add_argument("--warm-up", type=float, default=60.0, help="seconds of load first")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench" / "profile")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)

    with bench_pipeline("twinstream-bench-profile-") as pipeline:
        active, _standby = pipeline.start_pair()
        total = int(args.rate * (args.warm_up + args.seconds + 30))
        load = pipeline.load(total, rate=args.rate)
        print(f"warm-up: {args.rate:,.0f} events/s for {args.warm_up:.0f} s", flush=True)
        time.sleep(args.warm_up)  # the load runs meanwhile: the warm-up is the load itself
        parts = engine_processes(active.pid)
        before = {part: cpu_seconds(procs) for part, procs in parts.items()}
        started = time.monotonic()
        print(f"sampling engine {active.engine_id} for {args.seconds:.0f} s", flush=True)
        recorders = {
            "driver": record(active.pid, args.seconds, args.output / "driver", False),
        }
        daemons = [
            p for p in parts["workers"] if "pyspark.daemon" in " ".join(p.cmdline())
        ] or parts["workers"][:1]
        if daemons:
            recorders["workers"] = record(
                daemons[0].pid, args.seconds, args.output / "workers", True
            )
        for name, proc in recorders.items():
            _, err = proc.communicate(timeout=args.seconds + 120)
            if proc.returncode != 0:
                print(f"py-spy on the {name}: {err.decode(errors='replace')[-500:]}")
        elapsed = time.monotonic() - started
        parts = engine_processes(active.pid)  # workers may have been forked meanwhile
        after = {part: cpu_seconds(procs) for part, procs in parts.items()}
        published = active.get("/pipeline")
        pipeline.stop_load(load)
        log_lines = [
            line
            for line in active.log_path.read_text(errors="replace").splitlines()
            if "batches sampled" in line
        ]

    cores = {part: round((after[part] - before[part]) / elapsed, 2) for part in after}
    figures: dict[str, Any] = {
        "rate_per_s": args.rate,
        "sampled_s": round(elapsed, 1),
        "cores_used": cores,
        "batch_timings": log_lines[-2:],
        "python": {
            name: top_functions((args.output / name).with_suffix(".txt"))
            for name in recorders
            if (args.output / name).with_suffix(".txt").exists()
        },
        "events_per_s_reported": published.get("events_per_s"),
        "machine": machine(),
    }
    (args.output / "profile.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
