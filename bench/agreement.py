"""What the agreement check costs a batch (twinstream.core.agreement), measured as a user's
workload: `make up`'s hostmetrics engines under a steady load of 10,000 hosts, payments'
engines running beside them.

    make up                      # the local stack must be running, its engines in sync
    .venv/bin/python -m bench.agreement --seconds 120 --rate 2000

Each engine counts the seconds it spends digesting rows for the check
(`twinstream_digest_seconds`: the active its transactions' rows inside the batch, a standby
its own rows beside it) and the seconds its batches spend in its sink
(`twinstream_batch_seconds`: the batch's Spark job, the rows' transfer, the gate). Both are
read from every engine's /metrics every 5 s of the window; the figure is their ratio over
the window, per engine, in the same run. Also the ranges compared and the engines'
agreement. Writes docs/bench/agreement.json and .png.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.plots import plot, write_figures
from devkit.chaos import SteadyLoad
from devkit.harness import example_pipeline, machine
from twinstream.engine.client import EngineClient
from twinstream.platform.settings import REPO_ROOT, Settings

WANTED = {
    "twinstream_digest_seconds": "digest_s",
    "twinstream_batch_seconds_total": "batch_s",
    "twinstream_rows_processed_total": "rows",
    "twinstream_agreement_ranges": "ranges",
    "twinstream_takeovers_total": "takeovers",
}


def read(client: EngineClient) -> dict[str, float]:
    """The engine's counters this benchmark reads (ranges: the agreed ones)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(client.metrics()):
        for sample in family.samples:
            name = WANTED.get(sample.name)
            if name == "ranges" and sample.labels.get("result") != "agreed":
                continue
            if name is not None:
                found[name] = float(sample.value)
    return found


def run(settings: Settings, seconds: float, rate: float, hosts: int) -> dict[str, Any]:
    clients = {
        e: EngineClient.from_settings(settings, e, settings.secret("admin_token"))
        for e in settings.engine_ids
    }
    deadline = time.monotonic() + 900
    while not all(c.pipeline().in_sync for c in clients.values()):
        lags = {e: c.pipeline().lag for e, c in clients.items()}
        if time.monotonic() > deadline:
            raise SystemExit(f"the engines are not in sync after 15 minutes (lags {lags})")
        print(f"waiting for the engines to be in sync before the load: lags {lags}", flush=True)
        time.sleep(5.0)  # a progress line every 5 s, under the deadline above
    roles = {e: c.server().role for e, c in clients.items()}
    if sorted(roles.values()) != ["active", "standby"]:
        raise SystemExit(f"want one active and one standby, the engines are {roles}: make up")
    load = SteadyLoad(settings, rate, hosts=hosts).start()
    started = time.monotonic()
    first = {e: read(c) for e, c in clients.items()}
    series: dict[str, tuple[list[float], list[float]]] = {e: ([], []) for e in clients}
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            time.sleep(5.0)  # the sampling period: nothing to wait for, by design
            for e, c in clients.items():
                now = read(c)
                batch = now["batch_s"] - first[e]["batch_s"]
                if batch > 0:
                    share = 100 * (now["digest_s"] - first[e]["digest_s"]) / batch
                    series[e][0].append(round(elapsed, 1))
                    series[e][1].append(round(share, 3))
            print(
                f"{elapsed:5.0f} s: "
                + ", ".join(f"{e} ({roles[e]}) {s[1][-1]:.2f} %" for e, s in series.items() if s[1])
                + " of batch time digesting",
                flush=True,
            )
    finally:
        sent = load.stop()
    last = {e: read(c) for e, c in clients.items()}
    engines: dict[str, Any] = {}
    for e in clients:
        d = {k: last[e].get(k, 0.0) - first[e].get(k, 0.0) for k in WANTED.values()}
        info = clients[e].pipeline()
        end_role = clients[e].server().role
        engines[e] = {
            # A takeover within the window (a session lost under load) makes an engine
            # both: its figures are then of both roles.
            "role": roles[e] if end_role == roles[e] else f"{roles[e]}, then {end_role}",
            "takeovers": int(d["takeovers"]),
            "digest_s": round(d["digest_s"], 3),
            "batch_s": round(d["batch_s"], 3),
            "digest_share_of_batch_pct": round(100 * d["digest_s"] / d["batch_s"], 3)
            if d["batch_s"]
            else None,
            "rows": int(d["rows"]),
            "digest_us_per_row": round(1e6 * d["digest_s"] / d["rows"], 3) if d["rows"] else None,
            "ranges_agreed": int(d["ranges"]),
            "agreement": info.agreement.state,
        }
    return {
        "pipeline": settings.pipeline,
        "seconds": seconds,
        "rate": rate,
        "hosts": hosts,
        "sent": sent,
        "engines": engines,
        "series": {e: {"t": s[0], "pct": s[1]} for e, s in series.items()},
        "machine": machine(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "bench")
    args = parser.parse_args()
    figures = run(example_pipeline(), args.seconds, args.rate, args.hosts)
    for e, f in figures["engines"].items():
        print(
            f"engine {e} ({f['role']}): {f['digest_s']:.2f} s digesting in {f['batch_s']:.1f} s "
            f"of batches = {f['digest_share_of_batch_pct']} % ({f['digest_us_per_row']} us a "
            f"row over {f['rows']:,} rows); {f['ranges_agreed']} ranges agreed; {f['agreement']}"
        )
    write_figures(args.output, "agreement", figures, echo=False)
    plot(
        args.output / "agreement.png",
        f"Agreement check: digest time as a share of batch time ({figures['hosts']:,} hosts, "
        f"{figures['rate']:,.0f} events/s)",
        {
            f"{e} ({figures['engines'][e]['role']})": (s["t"], s["pct"])
            for e, s in figures["series"].items()
        },
        ylabel="% of batch time",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
