"""Latency benchmark: end-to-end latency at steady input rates, with a hot standby running.

    make up                      # the local stack must be running
    .venv/bin/python -m bench.latency --rates 1000 5000 20000 --seconds 60

A private pipeline with an active and a standby engine. For each rate in turn, synthetic
events are produced (acks=all) for `--seconds`; a read_committed consumer of the outbound
and dead-letter topics notes when each msg_id becomes visible. Latency = that moment minus
the inbound record's timestamp (set by the producer when it sends), both on this machine's
clock. Before the steps, `--warm-up` seconds at the first rate are published and not
measured. Per rate: p50, p99 and max latency over the step (its first 10 s left out), the
input rate achieved, and whether the lag grew: an unsustained rate shows as a lag that
rises through the step. Prints the figures, writes docs/bench/latency.json and
docs/bench/latency.png (latency and output rate over time, steps marked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.plots import plot, rate_series, write_figures
from devkit.harness import (
    OutputSampler,
    Pipeline,
    VisibleTimes,
    bench_pipeline,
    machine,
    percentile,
    wait_for,
)
from twinstream.platform.settings import REPO_ROOT

WARM_UP_S = 10.0


def latency_figures(latencies: list[float]) -> dict[str, Any]:
    """p50, p99 and max in ms of latencies in seconds, and how many were measured."""
    return {
        "p50_ms": round(1000 * percentile(latencies, 0.50)),
        "p99_ms": round(1000 * percentile(latencies, 0.99)),
        "max_ms": round(1000 * max(latencies)),
        "measured": len(latencies),
    }


def measure_steps(
    pipeline: Pipeline, rates: list[float], seconds: float, warm_up_s: float
) -> tuple[list[dict[str, Any]], OutputSampler, list[tuple[float, float]], float]:
    """Start an active and a standby, warm them up at the first rate for `warm_up_s`, then
    hold each rate for `seconds`: per step its latency percentiles, the rate achieved and
    whether the lag grew. Also returns the output sampler, (seconds, latency ms) points for
    a plot (every 10th output) and the monotonic start of the steps."""
    s = pipeline.settings
    a, _b = pipeline.start_pair()
    visible = VisibleTimes(s)
    sampler = OutputSampler(s, [s.outbound_topic, s.dlq_topic])
    steps: list[dict[str, Any]] = []
    points: list[tuple[float, float]] = []
    try:
        # Fresh engines run their first batches several times slower (JIT, Python
        # workers, RocksDB): without a warm-up the first step measures the start-up.
        print(f"warm-up: {rates[0]:,.0f} events/s for {warm_up_s:.0f} s", flush=True)
        Pipeline.join_load(pipeline.load(int(rates[0] * warm_up_s), rate=rates[0]), timeout_s=600)
        warm_ends = pipeline.inbound_ends()
        wait_for(lambda: visible.has(warm_ends), 600, "the warm-up published", every_s=0.5)
        t0, wall_t0 = time.monotonic(), time.time()
        for rate in rates:
            firsts = pipeline.inbound_ends()
            count = int(rate * seconds)
            print(f"step {rate:,.0f} events/s for {seconds:.0f} s", flush=True)
            started, wall_started = time.monotonic(), time.time()
            load = pipeline.load(count, rate=rate)
            lags = []
            while load.is_alive():
                lag = a.get("/pipeline")["lag"] or 0
                lags.append(lag)
                time.sleep(1.0)
            Pipeline.join_load(load, timeout_s=600)
            sent_s = time.monotonic() - started
            ends = pipeline.inbound_ends()

            def last_visible(ends: dict[int, int] = ends) -> bool:
                return visible.has(ends)

            wait_for(last_visible, 600, f"the step's last records {ends} visible", every_s=0.5)
            measured = visible.latencies(firsts, ends)
            # The step's first WARM_UP_S seconds of input are left out.
            since_ms = int(1000 * (wall_started + WARM_UP_S))
            latencies = list(visible.latencies(firsts, ends, since_ms).values())
            # Every 10th, for the plot: seconds since the start, latency in ms.
            points.extend(
                (visible.seen[m] - wall_t0, 1000 * v) for m, v in list(measured.items())[::10]
            )
            third = max(1, len(lags) // 3)
            growing = statistics.mean(lags[-third:]) > statistics.mean(lags[:third]) + rate
            step = {
                "rate_target": rate,
                "rate_achieved": round(count / sent_s),
                **latency_figures(latencies),
                "lag_max": max(lags) if lags else 0,
                "lag_growing": growing,
                "ends_s": round(time.monotonic() - t0, 1),
            }
            steps.append(step)
            print(json.dumps(step), flush=True)
    finally:
        sampler.stop()
        visible.stop()
    return steps, sampler, points, t0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each step")
    parser.add_argument(
        "--warm-up", type=float, default=60.0, help="seconds at the first rate, not measured"
    )
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()

    with bench_pipeline("twinstream-bench-latency-") as pipeline:
        steps, sampler, points, t0 = measure_steps(pipeline, args.rates, args.seconds, args.warm_up)

    sustained = [st["rate_achieved"] for st in steps if not st["lag_growing"]]
    figures = {
        "steps": steps,
        "highest_rate_sustained": max(sustained) if sustained else None,
        "setup": "active + standby engines, synthetic hostmetrics, acks=all",
        "machine": machine(),
    }
    write_figures(args.output, "latency", figures)
    path = plot(
        args.output / "latency.png",
        "Output rate and end-to-end latency at steady input rates (active + standby)",
        {"output events/s, 5 s average": rate_series(sampler.samples, t0, window_s=5.0)},
        "output events/s",
        marks=[(st["ends_s"], "end of a rate step") for st in steps],
        xlabel="seconds",
        second=(
            "latency (ms)",
            {
                "producer -> read_committed consumer": (
                    [t for t, _ in points],
                    [v for _, v in points],
                )
            },
        ),
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
