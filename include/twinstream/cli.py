"""`twinstream`: command-line tools for users of a pipeline.

twinstream publish --pipeline hostmetrics --count 60000    the pipeline's sample records
twinstream publish --pipeline payments --file p.jsonl       a CSV or JSONL file
twinstream subscribe --pipeline payments --output out.csv   outbound -> CSV (read_committed)
twinstream status [--pipeline NAME] [--watch] [--json]   engines, takeovers, snapshots, audit
twinstream quarantine list                         offsets the engines quarantined
twinstream quarantine release 1234                 release one once its bug is fixed
twinstream new-pipeline NAME                       a runnable pipeline and its test
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from twinstream import registry
from twinstream.config import Settings, SettingsError, load_settings
from twinstream.contract import ContractError, field_types
from twinstream.engine_client import EngineClient
from twinstream.overview import Overview, overview
from twinstream.publisher import from_file, publish
from twinstream.subscriber import read_committed


def _progress(line: str) -> None:
    print(f"\r{line}", end="", file=sys.stderr, flush=True)


def cmd_publish(settings: Settings, args: argparse.Namespace) -> int:
    contract = registry.load(settings)
    records: Iterable[bytes]
    if args.file:
        records = from_file(Path(args.file), field_types(contract.schema))
        total = None
    else:
        if contract.sample is None:
            raise ValueError(
                f"pipeline {settings.pipeline} declares no sample records: send a file "
                "(--file records.jsonl or .csv)"
            )
        records = contract.sample(args.count, args.seed, args.broken_every)
        total = args.count
    progress = publish(
        settings,
        records,
        rate=args.rate,
        total=total,
        on_progress=_progress,
        key_field=contract.partition_by,
    )
    print(file=sys.stderr)
    print(f"{progress.acked} records published to {settings.inbound_topic}")
    return 0


def cmd_subscribe(settings: Settings, args: argparse.Namespace) -> int:
    contract = registry.load(settings)
    columns = ["msg_id", *field_types(contract.value_schema or "")]
    out: TextIO = open(args.output, "w", newline="") if args.output else sys.stdout  # noqa: SIM115
    try:
        writer: csv.DictWriter[str] | None = None
        count = 0
        for record in read_committed(
            # As the pipeline's reader, which may read its outputs and nothing else.
            settings.model_copy(update={"kafka_role": "reader"}),
            settings.outbound_topic,
            start_offset=args.from_offset,
            idle_timeout_s=args.idle_timeout,
            max_records=args.max,
            follow=args.follow,
        ):
            try:
                value = json.loads(record.value)
            except ValueError:
                value = {"value": record.value}
            if not isinstance(value, dict):
                value = {"value": value}
            row = {**value, "msg_id": record.msg_id}
            if writer is None:
                # The value's fields as the pipeline declares them, else the first record's.
                fields = columns if len(columns) > 1 else ["msg_id", *value]
                writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
                writer.writeheader()
            writer.writerow(row)
            count += 1
            if args.output and count % 1000 == 0:
                _progress(f"{count} records written to {args.output}")
    finally:
        if args.output:
            out.close()
    print(f"\n{count} records from {settings.outbound_topic}", file=sys.stderr)
    return 0


def cmd_status(settings: Settings, args: argparse.Namespace | None) -> int:
    """Every engine of every pipeline of the stack (or of --pipeline) as a table, with each
    pipeline's last takeovers, newest snapshot and last audit; exit 1 if a pipeline has a
    problem (not exactly one active, a gap, a standby that cannot cover a takeover, a failed
    audit), 2 if the engines refuse the token or none answers (one line saying so)."""
    from twinstream.status_view import render, watch

    token = settings.secret("admin_token")
    chosen = getattr(args, "pipeline", None)
    pipelines = registry.stack(settings)
    if chosen:
        pipelines = {chosen: registry.settings_for(settings, chosen)}

    def engine(pipeline: Settings, engine_id: str) -> EngineClient:
        return EngineClient.from_settings(pipeline, engine_id, token, 5.0)

    def look() -> Overview:
        return overview(pipelines, engine)

    if getattr(args, "watch", None) is not None:
        return watch(look, float(getattr(args, "watch", 2.0)))
    seen = look()
    failure = unusable(seen, settings)
    if failure is not None:
        print(f"twinstream status: {failure}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(seen.model_dump_json(indent=2))
    else:
        render(seen)
    return 0 if seen.ok else 1


def unusable(seen: Overview, settings: Settings) -> str | None:
    """One line, when the status says nothing of any engine: those that answer refuse the
    token (the others being down), or none answers."""
    engines = [e for p in seen.pipelines for e in p.engines]
    if not engines or any(e.problem is None for e in engines):
        return None
    refusing = [e for e in engines if e.unauthorized]
    if refusing:
        down = len(engines) - len(refusing)
        return (
            f"every engine refuses the admin token ({refusing[0].problem})"
            + (f", {down} more not answering" if down else "")
            + ": set TWINSTREAM_ADMIN_TOKEN to the token the engines were started with (the "
            f"local stack's is in {settings.state_dir / 'admin-token'})"
        )
    return (
        f"no engine answers (engine {engines[0].engine_id}: {engines[0].problem}): start "
        "the stack (`make up`) or check TWINSTREAM_BIND_HOST and the admin ports"
    )


def parse_record(text: str) -> int:
    """`1234` (partition 0) or `2:1234`, as logs and `quarantine list` write a msg_id, to a
    record id."""
    from twinstream.core.rows import PARTITION_SHIFT, record_id

    partition, _, offset = text.rpartition(":")
    try:
        if int(partition or 0) < 0 or not 0 <= int(offset) < 1 << PARTITION_SHIFT:
            raise ValueError
        return record_id(int(partition or 0), int(offset))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a msg_id: give OFFSET (partition 0) or PARTITION:OFFSET, "
            "both whole numbers, as `twinstream quarantine list` prints them"
        ) from None


def cmd_quarantine(settings: Settings, args: argparse.Namespace) -> int:
    from twinstream.core.election import zk_client
    from twinstream.core.quarantine import QuarantineStore
    from twinstream.core.rows import record_text

    client = zk_client(settings)
    client.start(timeout=15)
    try:
        store = QuarantineStore(client, settings.quarantine_path)
        if args.action == "list":
            entries = store.entries()
            for record, reason in sorted(entries.items()):
                print(f"{record_text(record)}\t{reason}")
            print(f"{len(entries)} quarantined in pipeline {settings.pipeline}", file=sys.stderr)
            return 0
        if args.offset is None:
            raise ValueError(
                "release needs the msg_id: twinstream quarantine release OFFSET (partition 0) "
                "or PARTITION:OFFSET, as `twinstream quarantine list` prints it"
            )
        record = parse_record(args.offset)
        if not store.release(record):
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


def cmd_new_pipeline(settings: Settings, args: argparse.Namespace) -> int:
    from twinstream.skeleton import write

    folder = Path(args.dir)
    for path in write(args.name, folder):
        print(f"wrote {path}")
    # Engine ids and admin ports are the stack's: offer ones no pipeline uses yet.
    free = registry.free_engines(settings)
    engines = ", ".join(f'"{e}"' for e, _ in free)
    ports = ", ".join(str(p) for _, p in free)
    print(
        f"\nnext: `pytest {folder / args.name / 'test_pipeline.py'}` (from {folder}), then "
        f"list it in {settings.pipelines_file} (its folder must be beside that file, or on "
        f'PYTHONPATH):\n\n[{args.name}]\nmodule = "{args.name}.pipeline"\n'
        f"engines = [{engines}]\nadmin_ports = [{ports}]\n\n"
        "and `make up` runs its engines beside the others' (README: Write your own pipeline)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twinstream", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    pub = sub.add_parser("publish", help="send records to a pipeline's inbound topic")
    pub.add_argument("--file", help="a .csv or .jsonl file to send instead of sample records")
    pub.add_argument("--rate", type=float, default=1000.0, help="records per second (0: max)")
    pub.add_argument("--count", type=int, default=10_000, help="sample records to send")
    pub.add_argument("--seed", type=int, default=1)
    pub.add_argument(
        "--broken-every",
        type=int,
        default=0,
        metavar="N",
        help="make every Nth sample record invalid (each kind the pipeline rejects in turn)",
    )

    subp = sub.add_parser("subscribe", help="write a pipeline's outbound topic as CSV")
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

    status = sub.add_parser(
        "status", help="every pipeline's engines: role, lag and buffer as a table"
    )
    new = sub.add_parser("new-pipeline", help="write a runnable pipeline and its test")
    new.add_argument("name", help="the pipeline's name (a Python package name)")
    new.add_argument("--dir", default=".", help="where to write it (default: here)")
    quar = sub.add_parser("quarantine", help="list or release quarantined inbound offsets")
    quar.add_argument("action", choices=["list", "release"])
    quar.add_argument(
        "offset", nargs="?", help="the msg_id to release: OFFSET (partition 0) or PARTITION:OFFSET"
    )
    status.add_argument("--pipeline", help="only this pipeline (default: every one)")
    status.add_argument(
        "--json", action="store_true", help="the status as JSON (twinstream.overview's model)"
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C",
    )
    for command in (pub, subp, quar):
        command.add_argument(
            "--pipeline", help="one of the pipelines file's (default: TWINSTREAM_PIPELINE)"
        )
    args = parser.parse_args(argv)
    try:
        chosen = getattr(args, "pipeline", None)
        settings = load_settings()
        if chosen:
            settings = registry.settings_for(settings, chosen)
        handler = {
            "publish": cmd_publish,
            "subscribe": cmd_subscribe,
            "status": cmd_status,
            "quarantine": cmd_quarantine,
            "new-pipeline": cmd_new_pipeline,
        }
        return handler[args.command](settings, args)
    except (SettingsError, ContractError, ValueError, OSError, RuntimeError) as exc:
        print(f"\ntwinstream {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
