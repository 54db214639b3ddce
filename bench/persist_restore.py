"""Persist and restore benchmark: what a persist costs the active, and how long a lost
engine takes to be a hot standby again.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.persist_restore --backlogs 100000 1000000 --rate 1000

Runs a pipeline of its own with two engines on the running local stack (whose own engines
are stopped meanwhile), under steady input at `--rate` events/s throughout.

1. Persist cost: the active's end-to-end latency (producer timestamp to output visible to
   a read_committed consumer) over `--window` seconds without a persist, then over the
   same length with the standby `b` persisted at its start: p50, p99, max of each, and the
   persist's duration and snapshot size.
2. Restore, per backlog: `b` is persisted, then lost (kill -9 and its checkpoint deleted,
   as when a machine dies); while it is gone the backlog arrives on top of the steady
   input and the active publishes it. Then `b` is restored from the snapshot and the time
   until it is in sync (lag under TWINSTREAM_IN_SYNC_LAG) is measured, with the lag every
   second. Replay rate = events replayed / that time; divided by the steady input rate it
   says how many times faster than real time a lost engine catches up.
3. `b`'s buffered outputs are compared with the published ones, and every inbound offset is
   checked to be in the outbound or dead-letter topic exactly once.

Prints the figures, writes docs/bench/persist_restore.json (after each stage, so a run
that stops keeps what it measured), docs/bench/persist_latency.png (the active's latency
over both windows, the persist marked) and docs/bench/persist_restore.png (the lag of each
restore over time). A restore that fails, or Ctrl-C, ends the restores; the figures before
it are audited and written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from bench.plots import plot
from devkit.chaos import SteadyLoad
from devkit.harness import (
    EngineProcess,
    Pipeline,
    VisibleTimes,
    audit,
    bench_pipeline,
    machine,
    percentile,
    ranges,
    wait_for,
)
from twinstream.engine.client import EngineClient
from twinstream.ops.operate import check_buffer
from twinstream.platform.settings import REPO_ROOT


def persist(b: EngineProcess) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    response = b.post("/pipeline/persist", timeout_s=600)
    response.raise_for_status()
    return time.monotonic() - started, response.json()


def latency_window(
    pipeline: Pipeline, visible: VisibleTimes, seconds: float, during: Any = None
) -> tuple[dict[str, int], Any, dict[tuple[int, int], float]]:
    """Latency figures of the input produced over `seconds`, running `during()` at the
    start of the window; also each (partition, msg_id)'s latency."""
    firsts = pipeline.inbound_ends()
    result = during() if during else None
    wait_for(lambda: pipeline.inbound_ends() != firsts, 30, "input flowing")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # the window is the measurement, not a wait
        time.sleep(min(5.0, deadline - time.monotonic()))
    ends = pipeline.inbound_ends()
    wait_for(lambda: visible.has(ends), 120, "the window's last output", every_s=0.5)
    latencies = visible.latencies(firsts, ends)
    values = list(latencies.values())
    figures = {
        "events": len(values),
        "p50_ms": round(1000 * percentile(values, 0.5)),
        "p99_ms": round(1000 * percentile(values, 0.99)),
        "max_ms": round(1000 * max(values)),
    }
    return figures, result, latencies


def latency_series(
    visible: VisibleTimes, latencies: dict[tuple[int, int], float], t0: float
) -> tuple[list[float], list[float]]:
    """(seconds since t0 the output became visible, its latency), in (partition, msg_id)
    order."""
    ids = sorted(latencies)
    return [visible.seen[i] - t0 for i in ids], [latencies[i] for i in ids]


def restore_cycle(
    pipeline: Pipeline, a: EngineProcess, b: EngineProcess, backlog: int, rate: float
) -> tuple[EngineProcess, dict[str, Any]]:
    wait_for(lambda: b.get("/pipeline")["in_sync"], 600, "b in sync")
    persist_s, manifest = persist(b)
    print(f"persisted b in {persist_s:.2f} s ({manifest['size_bytes']:,} bytes)", flush=True)
    b.kill9()
    shutil.rmtree(pipeline.settings.engine_dir("b"))
    print(f"b lost; a backlog of {backlog:,} events arrives", flush=True)
    pipeline.join_load(pipeline.load(backlog, rate=0), timeout_s=3600)

    def a_caught_up() -> bool:
        info = a.get("/pipeline")
        print(f"  active a: lag {info['lag']}", flush=True)
        return bool((info["lag"] or 0) <= pipeline.settings.in_sync_lag)

    wait_for(a_caught_up, 3600, "the active through the backlog", every_s=10)

    b = pipeline.start("b")
    wait_for(lambda: (b.try_get("/pipeline") or {}).get("state") == "stopped", 300, "b up")
    b.remember_tree()
    started = time.monotonic()
    report = b.post("/pipeline/restore", {"snapshot": manifest["snapshot_id"]})
    report.raise_for_status()
    samples: list[tuple[float, int]] = []
    while True:
        info = b.get("/pipeline")
        elapsed = time.monotonic() - started
        samples.append((elapsed, info["lag"] or 0))
        print(f"  {elapsed:6.0f} s: {info['state']}, lag {info['lag']}", flush=True)
        if info["in_sync"]:
            break
        if elapsed > 3600 or info["state"] not in ("restoring", "running"):
            raise RuntimeError(f"b did not get in sync: {info}")
        time.sleep(1.0)
    in_sync_s = time.monotonic() - started
    replayed = int(info["last_msg_id_processed"]) + 1 - int(manifest["next_offset"])
    replay_rate = replayed / in_sync_s
    print(f"b in sync {in_sync_s:.1f} s after the restore request", flush=True)
    return b, {
        "backlog_events": backlog,
        "persist_s": round(persist_s, 2),
        "snapshot_bytes": manifest["size_bytes"],
        "replayed_events": replayed,
        "restore_to_in_sync_s": round(in_sync_s, 1),
        "replay_events_per_s": round(replay_rate),
        "replay_rate_over_input_rate": round(replay_rate / rate, 1),
        "lag_samples": samples,
    }


def write_figures(output: Path, figures: dict[str, Any]) -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / "persist_restore.json").write_text(json.dumps(figures, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlogs", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    parser.add_argument("--rate", type=float, default=1000.0, help="steady input, events/s")
    parser.add_argument("--window", type=float, default=60.0, help="latency window, seconds")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    figures: dict[str, Any] = {"steady_input_per_s": args.rate, "machine": machine()}
    restores: list[dict[str, Any]] = []
    stopped: str | None = None
    comparison = None
    with bench_pipeline("twinstream-bench-restore-") as pipeline:
        a, b = pipeline.start_pair()
        load = SteadyLoad(pipeline.settings, args.rate).start()
        visible = VisibleTimes(pipeline.settings)
        try:
            wait_for(lambda: b.get("/pipeline")["in_sync"], 300, "b in sync")
            t0 = time.time()
            quiet, _, quiet_latencies = latency_window(pipeline, visible, args.window)
            print(f"latency without a persist: {quiet}", flush=True)
            persist_at = time.time() - t0
            with_persist, (persist_s, manifest), persist_latencies = latency_window(
                pipeline, visible, args.window, during=lambda: persist(b)
            )
            print(f"latency with a persist ({persist_s:.2f} s): {with_persist}", flush=True)
            # The latency reader follows every output in Python: stopped now, so that the
            # restores' replay does not share the two cores with it.
            visible.stop()
            figures["persist"] = {
                "duration_s": round(persist_s, 2),
                "snapshot_bytes": manifest["size_bytes"],
                "active_latency_without_persist": quiet,
                "active_latency_with_persist": with_persist,
            }
            write_figures(args.output, figures)
            path = plot(
                args.output / "persist_latency.png",
                f"Active's end-to-end latency under {args.rate:,.0f} events/s, "
                "without and with a persist of the standby",
                {
                    "without a persist": latency_series(visible, quiet_latencies, t0),
                    "with a persist": latency_series(visible, persist_latencies, t0),
                },
                "latency (s)",
                marks=[(persist_at, "persist of the standby")],
            )
            print(f"wrote {path}", flush=True)
            for backlog in args.backlogs:
                try:
                    b, cycle = restore_cycle(pipeline, a, b, backlog, args.rate)
                except (Exception, KeyboardInterrupt) as exc:
                    # The restores so far are measurements: keep them, audit, write.
                    stopped = f"restore of a {backlog:,}-event backlog: {exc!r}"
                    print(f"run stopped early: {stopped}", flush=True)
                    break
                restores.append(cycle)
                figures["restores"] = [
                    {k: v for k, v in r.items() if k != "lag_samples"} for r in restores
                ]
                write_figures(args.output, figures)
            if stopped is None:
                client = EngineClient("b", b.url, b.token, timeout_s=60)
                try:
                    comparison = check_buffer(client, pipeline.settings, 2000)
                finally:
                    client.close()
        finally:
            sent = load.stop()
            visible.stop()
        pipeline.produced += sent
        pipeline.wait_published(pipeline.produced - 1, timeout_s=600)
        result = audit(pipeline.outputs(), pipeline.produced)

    figures.update(
        {
            "buffer_compared": comparison.compared if comparison else None,
            "buffer_mismatches": len(comparison.mismatches) if comparison else None,
            "messages": pipeline.produced,
            "gaps": ranges(result.missing)[:20],
            "duplicates": ranges(result.duplicated)[:20],
            "stopped_early": stopped,
        }
    )
    print(json.dumps(figures, indent=2))
    write_figures(args.output, figures)
    series = {
        f"backlog {r['backlog_events']:,}": (
            [t for t, _ in r["lag_samples"]],
            [lag for _, lag in r["lag_samples"]],
        )
        for r in restores
    }
    if series:
        path = plot(
            args.output / "persist_restore.png",
            f"Restore of a lost engine under {args.rate:,.0f} events/s: lag until in sync",
            series,
            "lag (events)",
            xlabel="seconds since the restore request",
        )
        print(f"wrote {path}")
    bad = figures["gaps"] or figures["duplicates"] or (comparison and comparison.mismatches)
    return 1 if bad or stopped else 0


if __name__ == "__main__":
    raise SystemExit(main())
