"""What Kafka security costs: takeover and drain with it on and off, in one run.

    .venv/bin/python -m bench.security --order off,on,off,on --takeovers 5 --backlog 100000

For each mode in `--order` (alternated, so that this machine's drift falls on both): the
local stack restarted (`twinstream-stack down`, then `up` with TWINSTREAM_KAFKA_SECURITY
set: SASL/SCRAM over TLS and ACLs, or PLAINTEXT without an authorizer), then
 (a) `--takeovers` kill -9 of the stack's active under 1,000 events/s, to the first output
     of the new epoch visible to a read_committed consumer (bench.drain.takeovers; every
     event of the rounds audited exactly once);
 (b) with the stack's engines stopped, a backlog of `--backlog` valid events drained by an
     active and a hot standby, from its first output to its last (bench.throughput).
Prints each mode's figures and the ratios (on / off of the medians, drains and takeovers);
writes docs/bench/security.json and docs/bench/security.png. Ends with the stack up in the
order's last mode: end with `on` (the default) to leave it secure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.drain import takeovers
from bench.plots import plot_drains, write_figures
from bench.throughput import drain_with_engines, on_backlog
from devkit.harness import bench_pipeline, example_pipeline, machine
from twinstream.platform.kafka import watermarks
from twinstream.platform.settings import REPO_ROOT


def restart_stack(secure: bool) -> float:
    """down, then up in the mode asked for; seconds it took."""
    os.environ["TWINSTREAM_KAFKA_SECURITY"] = "true" if secure else "false"
    stack = [str(Path(sys.executable).parent / "twinstream-stack")]
    started = time.monotonic()
    subprocess.run([*stack, "down"], check=True)
    subprocess.run([*stack, "up"], check=True)
    return time.monotonic() - started


def one_mode(secure: bool, args: argparse.Namespace) -> dict[str, Any]:
    mode = "on" if secure else "off"
    print(f"== Kafka security {mode}: restarting the stack", flush=True)
    up_s = restart_stack(secure)
    print(f"  the stack up in {up_s:.0f} s", flush=True)
    stack = example_pipeline()
    assert stack.kafka_security == secure
    print(f"  (a) {args.takeovers} takeovers after kill -9 at 1,000 events/s", flush=True)
    takeover = takeovers(stack, 1000.0, args.takeovers, 0)
    print(f"  (b) the pair drains {args.backlog:,} events", flush=True)
    with bench_pipeline(f"twinstream-bench-security-{mode}-") as backlog:
        backlog.join_load(backlog.load(args.backlog, rate=0), timeout_s=3600)
        total = watermarks(backlog.settings, backlog.settings.inbound_topic)[1]
        sampler = drain_with_engines(on_backlog(backlog, "pair"), ("a", "b"), total)
    rate, seconds = sampler.drain_rate(total)
    print(
        f"  security {mode}: takeover median {takeover['in_sync_s']['median']} s, worst "
        f"{takeover['in_sync_s']['worst']} s; drain {rate:,.0f} events/s",
        flush=True,
    )
    return {
        "security": mode,
        "up_s": round(up_s, 1),
        "takeover": takeover,
        "drain": {"events": total, "events_per_s": round(rate), "seconds": round(seconds, 1)},
        "samples": sampler.samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--order", default="off,on,off,on", help="modes, in order")
    parser.add_argument("--takeovers", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()
    order = [m.strip() for m in args.order.split(",")]
    if not order or set(order) - {"on", "off"}:
        parser.error("--order is a comma-separated list of on and off, e.g. off,on,off,on")
    runs = [one_mode(mode == "on", args) for mode in order]

    def medians(mode: str) -> tuple[float, float, float]:
        mine = [r for r in runs if r["security"] == mode]
        takeover = statistics.median(t for r in mine for t in r["takeover"]["in_sync_s"]["all"])
        active = statistics.median(
            t for r in mine for t in (r["takeover"]["in_sync_active_s"] or {"all": []})["all"]
        )
        drain = statistics.median(r["drain"]["events_per_s"] for r in mine)
        return takeover, active, drain

    ratios: dict[str, float] = {}
    if {"on", "off"} <= set(order):
        (take_on, active_on, drain_on) = medians("on")
        (take_off, active_off, drain_off) = medians("off")
        ratios = {
            "takeover median, on / off": round(take_on / take_off, 3),
            "kill to a new active, median, on / off": round(active_on / active_off, 3),
            "drain events/s, on / off": round(drain_on / drain_off, 3),
        }
    figures = {
        "order": order,
        "runs": [{k: v for k, v in r.items() if k != "samples"} for r in runs],
        "ratios": ratios,
        "machine": machine(),
    }
    write_figures(args.output, "security", figures)
    for r in runs:
        t = r["takeover"]["in_sync_s"]
        print(
            f"security {r['security']}: takeover median {t['median']} s, worst {t['worst']} s; "
            f"drain {r['drain']['events_per_s']:,} events/s"
        )
    for name, ratio in ratios.items():
        print(f"ratio {name}: {ratio}")
    path = plot_drains(
        args.output / "security.png",
        f"The pair draining {args.backlog:,} events, Kafka security on and off",
        {f"{n + 1}. security {r['security']}": r["samples"] for n, r in enumerate(runs)},
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
