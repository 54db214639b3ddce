"""Failover benchmark: kill -9 the active engine N times under steady load.

    make up                      # the local stack must be running
    .venv/bin/python bench/failover.py --kills 10 --rate 1000

Runs a pipeline of its own (topics, election path, transactional id) with two engine
processes on the running local stack. The stack's own engines are stopped for the run, so
that the two cores go to the engines measured, and started again at the end. Each round
waits until the standby is in sync, kills the active with SIGKILL, and measures the
takeover time: from the kill to the first record of the new epoch visible to a
read_committed consumer of the outbound topic. The killed engine is restarted (as
supervisord would) and resumes from its checkpoint as the new standby. At the end every
inbound offset is checked to be in the outbound or dead-letter topic exactly once.

Prints the figures and writes them as JSON to docs/bench/failover.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from twinstream.config import REPO_ROOT
from twinstream.harness import (
    EngineProcess,
    Load,
    Pipeline,
    audit,
    bench_pipeline,
    ranges,
    wait_for,
)
from twinstream.publisher import synthetic
from twinstream.subscriber import read_committed


class Tail(threading.Thread):
    """Follows the outbound topic and notes when each epoch's first record arrived."""

    def __init__(self, pipeline: Pipeline) -> None:
        super().__init__(daemon=True)
        self.pipeline = pipeline
        self.first_seen: dict[int, float] = {}
        self.stop = threading.Event()
        self.start()

    def run(self) -> None:
        settings = self.pipeline.settings
        while not self.stop.is_set():
            for record in read_committed(
                settings, settings.outbound_topic, start_offset=0, idle_timeout_s=3600, follow=True
            ):
                if record.epoch is not None and record.epoch not in self.first_seen:
                    self.first_seen[record.epoch] = time.monotonic()
                if self.stop.is_set():
                    return


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1000.0, help="inbound events per second")
    parser.add_argument(
        "--output", type=Path, default=REPO_ROOT / "docs" / "bench" / "failover.json"
    )
    args = parser.parse_args()

    takeovers: list[float] = []
    with bench_pipeline("twinstream-bench-failover-") as pipeline:
        engines = {e: pipeline.start(e) for e in ("a", "b")}
        pipeline.wait_running(*engines.values())
        tail = Tail(pipeline)
        # Steady load until every round is done, however long restarts and resyncs take.
        stop_load = threading.Event()
        sent = [0]

        def steady() -> Iterator[bytes]:
            for record in synthetic(10**9, max_record_bytes=pipeline.settings.max_record_bytes):
                if stop_load.is_set():
                    return
                sent[0] += 1
                yield record

        load = Load(pipeline.settings, steady(), args.rate, "load")
        for round_no in range(1, args.kills + 1):
            active: EngineProcess = wait_for(pipeline.active, 60, "an active engine")
            standby = next(e for e in pipeline.engines.values() if e is not active)

            def standby_in_sync(s: EngineProcess = standby) -> bool:
                return bool((s.try_get("/pipeline") or {}).get("in_sync"))

            wait_for(standby_in_sync, 120, "standby in sync")
            epoch = int(active.get("/server")["epoch"])
            active.kill9()
            killed = time.monotonic()

            def next_epoch(old: int = epoch) -> int | None:
                return next((e for e in tail.first_seen if e > old), None)

            new_epoch = int(wait_for(next_epoch, 30, "the new epoch's first record"))
            takeover = tail.first_seen[new_epoch] - killed
            takeovers.append(takeover)
            print(
                f"round {round_no:2d}: killed {active.engine_id} (epoch {epoch}), "
                f"{standby.engine_id} published epoch {new_epoch} after {takeover:.3f} s",
                flush=True,
            )
            restarted = pipeline.start(active.engine_id)
            pipeline.wait_running(restarted)
        print("stopping the load; waiting for the output to catch up", flush=True)
        stop_load.set()
        Pipeline.join_load(load, timeout_s=120)
        total = sent[0]
        pipeline.wait_published(total - 1, timeout_s=300)
        tail.stop.set()
        outputs = pipeline.outputs()
        result = audit(outputs, total)
        gaps, dups = ranges(result.missing), ranges(result.duplicated)

    figures = {
        "kills": len(takeovers),
        "rate_per_s": args.rate,
        "messages": total,
        "takeover_s": {
            "median": round(statistics.median(takeovers), 3),
            "p90": round(sorted(takeovers)[int(0.9 * (len(takeovers) - 1))], 3),
            "worst": round(max(takeovers), 3),
            "all": [round(t, 3) for t in takeovers],
        },
        "gaps": len(result.missing),
        "gap_ranges": gaps[:20],
        "duplicates": len(result.duplicated),
        "duplicate_ranges": dups[:20],
        "machine": f"{os.cpu_count()} cores",
    }
    print(json.dumps(figures, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if not gaps and not dups else 1


if __name__ == "__main__":
    raise SystemExit(main())
