"""`twinstream`: command-line tools for users of a pipeline.

twinstream publish --rate 1000 --count 60000       synthetic host metrics
twinstream publish --file metrics.jsonl            a CSV or JSONL file
twinstream subscribe --output out.csv              outbound -> CSV (read_committed)
twinstream status                                  every engine's role, lag, buffer
twinstream quarantine list                         offsets the engines quarantined
twinstream quarantine release 1234                 release one once its bug is fixed
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import TextIO

import httpx

from twinstream.config import Settings, SettingsError, load_settings
from twinstream.hostmetrics import FIELDS
from twinstream.publisher import from_file, publish, synthetic
from twinstream.subscriber import read_committed

OUTPUT_COLUMNS = [*FIELDS, "msg_id", "window_count", "cpu_user_avg20", "mem_used_sum20"]


def _progress(line: str) -> None:
    print(f"\r{line}", end="", file=sys.stderr, flush=True)


def cmd_publish(settings: Settings, args: argparse.Namespace) -> int:
    if args.file:
        records = from_file(Path(args.file))
        total = None
    else:
        records = synthetic(
            args.count,
            hosts=args.hosts,
            seed=args.seed,
            broken_every=args.broken_every,
            max_record_bytes=settings.max_record_bytes,
        )
        total = args.count
    progress = publish(settings, records, rate=args.rate, total=total, on_progress=_progress)
    print(file=sys.stderr)
    print(f"{progress.acked} records published to {settings.inbound_topic}")
    return 0


def cmd_subscribe(settings: Settings, args: argparse.Namespace) -> int:
    out: TextIO = open(args.output, "w", newline="") if args.output else sys.stdout  # noqa: SIM115
    try:
        writer = csv.DictWriter(out, fieldnames=OUTPUT_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        count = 0
        for record in read_committed(
            settings,
            settings.outbound_topic,
            start_offset=args.from_offset,
            idle_timeout_s=args.idle_timeout,
            max_records=args.max,
            follow=args.follow,
        ):
            writer.writerow(json.loads(record.value))
            count += 1
            if args.output and count % 1000 == 0:
                _progress(f"{count} records written to {args.output}")
    finally:
        if args.output:
            out.close()
    print(f"\n{count} records from {settings.outbound_topic}", file=sys.stderr)
    return 0


def cmd_status(settings: Settings, _args: argparse.Namespace) -> int:
    token = settings.secret("admin_token")
    headers = {"Authorization": f"Bearer {token}"}
    columns = [
        "engine",
        "role",
        "state",
        "lag",
        "buffer",
        "processed",
        "published",
        "in_sync",
        "zk",
    ]
    rows = []
    active = 0
    for engine_id in settings.engine_ids:
        url = settings.engine_admin_url(engine_id)
        try:
            server = httpx.get(f"{url}/server", headers=headers, timeout=5).json()
            pipe = httpx.get(f"{url}/pipeline", headers=headers, timeout=5).json()
        except (httpx.HTTPError, ValueError) as exc:
            rows.append([engine_id, "unreachable", type(exc).__name__, *[""] * 6])
            continue
        active += server["role"] == "active"
        rows.append(
            [
                engine_id,
                server["role"],
                pipe["state"],
                str(pipe["lag"]),
                f"{pipe['buffer_fill']}/{pipe['buffer_size']}",
                str(pipe["last_msg_id_processed"]),
                str(pipe["last_msg_id_published"]),
                "yes" if pipe["in_sync"] else "no",
                server["zk_state"],
            ]
        )
        if pipe["uncovered_ranges"]:
            rows[-1][2] += f" UNCOVERED {pipe['uncovered_ranges']}"
        if pipe.get("quarantined"):
            rows[-1][2] += f" QUARANTINED {len(pipe['quarantined'])} (twinstream quarantine list)"
        if pipe.get("paused"):
            rows[-1][2] += " PAUSED"
        for repair in pipe.get("repairs") or []:
            done = f"in {repair['seconds']} s" if repair["seconds"] is not None else "repairing"
            rows[-1][2] += f" REPAIRED {repair['first']}..{repair['last']} {done}"
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    if active != 1:
        print(f"WARNING: {active} active engines (want exactly 1)", file=sys.stderr)
        return 1
    return 0


def cmd_quarantine(settings: Settings, args: argparse.Namespace) -> int:
    from twinstream.core.election import zk_client
    from twinstream.core.quarantine import QuarantineStore

    client = zk_client(settings)
    client.start(timeout=15)
    try:
        store = QuarantineStore(client, settings.quarantine_path)
        if args.action == "list":
            entries = store.entries()
            for offset, reason in sorted(entries.items()):
                print(f"{offset}\t{reason}")
            print(f"{len(entries)} quarantined in pipeline {settings.pipeline}", file=sys.stderr)
            return 0
        if args.offset is None:
            raise ValueError("release needs the offset: twinstream quarantine release OFFSET")
        if not store.release(args.offset):
            print(
                f"msg_id {args.offset} is not quarantined in pipeline {settings.pipeline} "
                "(see `twinstream quarantine list`)",
                file=sys.stderr,
            )
            return 1
        print(
            f"released msg_id {args.offset}: its dead letter in {settings.dlq_topic} stays "
            "(each offset is published once); a replay of it (a restore from an earlier "
            "snapshot, a cold rebuild) processes it normally. To process the record now, "
            "publish its raw bytes again (the dead letter's `raw`, base64)."
        )
        return 0
    finally:
        client.stop()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twinstream", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    pub = sub.add_parser("publish", help="send host metrics to the inbound topic")
    pub.add_argument("--file", help="a .csv or .jsonl file to send instead of synthetic data")
    pub.add_argument("--rate", type=float, default=1000.0, help="records per second (0: max)")
    pub.add_argument("--count", type=int, default=10_000, help="synthetic records to send")
    pub.add_argument("--hosts", type=int, default=10, help="distinct synthetic hosts")
    pub.add_argument("--seed", type=int, default=1)
    pub.add_argument(
        "--broken-every",
        type=int,
        default=0,
        metavar="N",
        help="make every Nth synthetic record invalid (cycling through each kind)",
    )

    subp = sub.add_parser("subscribe", help="write the outbound topic as CSV")
    subp.add_argument("--output", help="CSV file (default: standard output)")
    subp.add_argument("--from-offset", type=int, default=0)
    subp.add_argument("--max", type=int, default=None, help="stop after this many records")
    subp.add_argument("--follow", action="store_true", help="keep reading new records")
    subp.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="with --follow, stop after this many seconds without a record",
    )

    sub.add_parser("status", help="every engine's role, lag and buffer as a table")
    quar = sub.add_parser("quarantine", help="list or release quarantined inbound offsets")
    quar.add_argument("action", choices=["list", "release"])
    quar.add_argument("offset", nargs="?", type=int, help="the msg_id to release")
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        handler = {
            "publish": cmd_publish,
            "subscribe": cmd_subscribe,
            "status": cmd_status,
            "quarantine": cmd_quarantine,
        }
        return handler[args.command](settings, args)
    except (SettingsError, ValueError, OSError, RuntimeError) as exc:
        print(f"\ntwinstream {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
