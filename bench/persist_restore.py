"""Persist and restore benchmark: how long a lost engine takes to be a hot standby again.

    make up                      # the local stack must be running
    .venv/bin/python bench/persist_restore.py --backlog 1000000

Runs a pipeline of its own with two engines on the running local stack (whose own engines
are stopped meanwhile). Persists the standby `b` (timing the persist and the snapshot's
size), then loses it: kill -9 and its checkpoint deleted, as when a machine dies. While it
is gone, `--backlog` events arrive and the active publishes them. Then `b` is restored from
the snapshot and the time until it is in sync (lag under TWINSTREAM_IN_SYNC_LAG) is
measured, with the lag and replay rate every second. Finally its buffered outputs are
compared with the published ones and every inbound offset is checked to be in the outbound
or dead-letter topic exactly once.

Prints the figures, writes them to docs/bench/persist_restore.json and the lag curve to
docs/bench/persist_restore.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from twinstream.config import REPO_ROOT
from twinstream.engine_client import EngineClient
from twinstream.harness import audit, bench_pipeline, ranges, wait_for
from twinstream.operate import check_buffer


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=1_000_000, help="events to replay")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    parser.add_argument("--no-audit", action="store_true", help="skip the exactly-once audit")
    args = parser.parse_args()

    with bench_pipeline("twinstream-bench-restore-") as pipeline:
        a, b = pipeline.start_pair()
        pipeline.join_load(pipeline.load(20_000, rate=0))
        wait_for(lambda: b.get("/pipeline")["in_sync"], 300, "b in sync")

        started = time.monotonic()
        response = b.post("/pipeline/persist", timeout_s=600)
        response.raise_for_status()
        persist_s = time.monotonic() - started
        manifest = response.json()
        print(
            f"persisted b in {persist_s:.2f} s: {manifest['snapshot_id']}, "
            f"{manifest['size_bytes']:,} bytes, next offset {manifest['next_offset']}",
            flush=True,
        )

        b.kill9()
        shutil.rmtree(pipeline.settings.engine_dir("b"))
        print(f"b lost; publishing a backlog of {args.backlog:,} events", flush=True)
        started = time.monotonic()
        pipeline.join_load(pipeline.load(args.backlog, rate=0), timeout_s=3600)
        print(f"  published in {time.monotonic() - started:.0f} s", flush=True)

        def a_caught_up() -> bool:
            info = a.get("/pipeline")
            print(f"  active a: lag {info['lag']}", flush=True)
            return bool((info["last_msg_id_published"] or -1) >= pipeline.produced - 1)

        wait_for(a_caught_up, 3600, "the active through the backlog", every_s=10)

        b = pipeline.start("b")
        wait_for(lambda: (b.try_get("/pipeline") or {}).get("state") == "stopped", 300, "b up")
        b.remember_tree()
        started = time.monotonic()
        report = b.post("/pipeline/restore", {"snapshot": manifest["snapshot_id"]})
        report.raise_for_status()
        samples: list[dict[str, Any]] = []
        while True:
            info = b.get("/pipeline")
            elapsed = time.monotonic() - started
            samples.append(
                {"t": round(elapsed, 1), "lag": info["lag"], "rate": info["events_per_s"]}
            )
            print(
                f"  {elapsed:6.0f} s: {info['state']}, lag {info['lag']}, "
                f"{info['events_per_s']} events/s",
                flush=True,
            )
            if info["in_sync"]:
                break
            if elapsed > 3600 or info["state"] not in ("restoring", "running"):
                raise SystemExit(f"b did not get in sync: {info}")
            time.sleep(1.0)
        in_sync_s = time.monotonic() - started
        print(f"b in sync {in_sync_s:.1f} s after the restore request", flush=True)

        client = EngineClient("b", b.url, b.token, timeout_s=60)
        comparison = check_buffer(client, pipeline.settings, 2000)
        client.close()
        audit_result: dict[str, Any] = {"skipped": True}
        if not args.no_audit:
            result = audit(pipeline.outputs(), pipeline.produced)
            audit_result = {
                "messages": pipeline.produced,
                "gaps": ranges(result.missing)[:20],
                "duplicates": ranges(result.duplicated)[:20],
            }

    replayed = pipeline.produced - int(manifest["next_offset"])
    figures = {
        "backlog_events": args.backlog,
        "replayed_events": replayed,
        "persist_s": round(persist_s, 2),
        "snapshot_bytes": manifest["size_bytes"],
        "restore_to_in_sync_s": round(in_sync_s, 1),
        "replay_events_per_s": round(replayed / in_sync_s),
        "buffer_compared": comparison.compared,
        "buffer_mismatches": len(comparison.mismatches),
        "audit": audit_result,
        "machine": f"{os.cpu_count()} cores",
        "lag_samples": samples,
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "lag_samples"}, indent=2))
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "persist_restore.json").write_text(json.dumps(figures, indent=2) + "\n")
    _plot(samples, args.output / "persist_restore.png", args.backlog)
    bad = audit_result.get("gaps") or audit_result.get("duplicates") or comparison.mismatches
    return 1 if bad else 0


def _plot(samples: list[dict[str, Any]], path: Path, backlog: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s["t"] for s in samples], [s["lag"] or 0 for s in samples])
    ax.set_xlabel("seconds since the restore request")
    ax.set_ylabel("lag (events)")
    ax.set_title(f"Restore of engine b: replaying a backlog of {backlog:,} events")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
