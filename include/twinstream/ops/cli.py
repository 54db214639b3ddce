"""`twinstream`: command-line tools for users of a pipeline.

A command that cannot do its work says why in one line on stderr, naming the fix, and exits
non-zero; `subscribe` writes every committed record of every partition, each row in the
same columns, and leaves librdkafka's own log lines off the terminal. A command on one
pipeline works on --pipeline, else TWINSTREAM_PIPELINE, else the pipelines file's only one;
with several and none chosen it names them: the platform has no default pipeline.

twinstream publish --pipeline hostmetrics --count 60000    the pipeline's sample records
twinstream publish --pipeline payments --file p.jsonl       a CSV or JSONL file
twinstream publish --pipeline payments --source FILE|-      a publisher adapter (one of a
                                                   redundant group) following a file, a
                                                   folder, standard input or HTTP
twinstream subscribe --pipeline payments --output out.csv   outbound -> CSV (read_committed,
                                                   every partition)
twinstream subscribe --pipeline payments --to out.jsonl     the same, exactly once into a file
                                                   that keeps its position, until stopped
twinstream kafka-config --pipeline payments --role reader   settings for your own Kafka
                                                   client (--format librdkafka|java|json)
twinstream status [--pipeline NAME] [--watch] [--json]   engines, takeovers, snapshots, audit
twinstream quarantine list [--pipeline NAME]       offsets the engines quarantined
twinstream quarantine release 1234                 release one once its bug is fixed
twinstream new-pipeline NAME                       a runnable pipeline and its test
twinstream remove-pipeline NAME [--yes]            a pipeline off the stack, with its data
twinstream restart ENGINE [--pipeline NAME]        restart one engine of the local stack and
                                                   wait until it is healthy again
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from confluent_kafka import KafkaException

from twinstream.contract import ContractError, Pipeline, field_types
from twinstream.core.rows import PARTITION_SHIFT, positions_text, record_id, record_text
from twinstream.edge.feed import from_file, publish
from twinstream.edge.reader import Record, read_committed
from twinstream.engine.client import EngineClient
from twinstream.ops.overview import AdapterReader, Overview, overview
from twinstream.platform import registry
from twinstream.platform.kafka import UserClient, user_client
from twinstream.platform.settings import (
    AdapterSettings,
    CommonSettings,
    Connections,
    Settings,
    SettingsError,
    load,
    load_settings,
)


def _progress(line: str) -> None:
    print(f"\r{line}", end="", file=sys.stderr, flush=True)


# The commands that work on one pipeline (their --pipeline, TWINSTREAM_PIPELINE, or the
# pipelines file's only one), besides the adapters'; the others work on every pipeline or
# name their engine.
ONE_PIPELINE = ("quarantine", "kafka-config")


def cmd_publish(settings: AdapterSettings, args: argparse.Namespace) -> int:
    if args.source:
        return _publish_from(settings, args)
    contract = registry.load(settings)
    records: Iterable[bytes]
    if args.file:
        records = from_file(Path(args.file), field_types(contract.schema), contract.optional)
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


def _publish_from(settings: CommonSettings, args: argparse.Namespace) -> int:
    """A publisher adapter: follows the source into the inbound topic while elected, until
    SIGTERM or SIGINT (twinstream.edge.publisher)."""
    import signal
    import socket
    import threading

    from twinstream.edge import publisher

    if args.file:
        raise ValueError("--source follows a file as it grows; --file sends one once: give one")
    stdin = args.source == publisher.STDIN_SOURCE
    if args.format is not None and not stdin:
        raise ValueError(
            "--format is for --source - (standard input); a file's name says its format "
            "(.csv or .jsonl, a folder's --pattern)"
        )
    if not 0 <= args.metrics_port <= 65535:
        raise ValueError(f"--metrics-port {args.metrics_port}: give a port (0: no /metrics)")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _n, _f: stop.set())
    adapter_id = args.id or f"{socket.gethostname()}-{os.getpid()}"
    # A long-running, supervised process: each line of its log with its time and the
    # adapter's name, as the engines' (a takeover is read off the two adapters' logs).
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s publisher={adapter_id} %(name)s: %(message)s",
    )
    keep = stdin or args.source.startswith("http://")
    status = publisher.run(
        settings,
        adapter_id,
        args.source if keep else Path(args.source),
        args.pattern,
        stop,
        echo=logging.getLogger(publisher.__name__).info,
        stdin_format=args.format or "jsonl",
        metrics_port=args.metrics_port,
    )
    print(
        f"publisher {adapter_id}: {status.published} lines published, last at "
        f"{status.position or 'nothing'}",
        file=sys.stderr,
    )
    return 0


# The columns every CSV of `subscribe` starts with; a pipeline's own field of the same name
# is written as `value.<name>` (or `key.<name>`), never in their place.
FRAMEWORK_COLUMNS = ("partition", "msg_id")


@dataclass(frozen=True)
class OutputShape:
    """The CSV columns of a pipeline's outbound records, from its contract alone, so that
    every row has the same columns whatever its value holds."""

    key: str | None  # the key column, if the key is not also a field of the value
    fields: tuple[str, ...]  # the value's declared fields
    text: bool  # the value is one column as it is, not a JSON object

    @classmethod
    def of(cls, contract: Pipeline) -> OutputShape:
        if contract.value_schema:
            fields, text = tuple(field_types(contract.value_schema)), False
        elif contract.value_format == "json":
            fields, text = tuple(contract.value), False
        else:
            fields, text = (contract.value[0],), True
        key = contract.key if contract.key and contract.key not in fields else None
        return cls(key, fields, text)

    @property
    def header(self) -> list[str]:
        key = [_column("key", self.key)] if self.key else []
        return [*FRAMEWORK_COLUMNS, *key, *(_column("value", f) for f in self.fields)]


def _column(kind: str, name: str) -> str:
    return f"{kind}.{name}" if name in FRAMEWORK_COLUMNS else name


@dataclass
class Unshown:
    """What the CSV could not show, said on stderr at the end: never dropped in silence."""

    undeclared: dict[str, int] = field(default_factory=dict)  # field -> records with it
    not_objects: int = 0
    first_not_object: str = ""

    def lines(self, pipeline: str) -> list[str]:
        lines = []
        if self.undeclared:
            names = ", ".join(f"{n} ({c} records)" for n, c in sorted(self.undeclared.items()))
            lines.append(
                f"fields pipeline {pipeline} does not declare are not in the CSV: {names}; "
                "declare them in its value_schema (twinstream.contract.Pipeline)"
            )
        if self.not_objects:
            lines.append(
                f"{self.not_objects} values are not JSON objects (the first msg_id "
                f"{self.first_not_object}): their fields are empty; pipeline {pipeline} "
                "declares a JSON value (value_schema or value_format), so its transform "
                "wrote these: read them raw with twinstream.edge.reader.read_committed"
            )
        return lines


def csv_row(record: Record, shape: OutputShape, unshown: Unshown) -> list[str]:
    """One outbound record as the shape's columns: its partition, its msg_id as logs and
    `quarantine list` write one (the outbound partition is its inbound record's), the key,
    each declared field (empty where the value lacks it)."""
    msg_id = (
        record_text(record_id(record.partition, record.msg_id)) if record.msg_id is not None else ""
    )
    cells = [str(record.partition), msg_id]
    if shape.key:
        cells.append(record.key or "")
    if record.tombstone:
        return cells + [""] * len(shape.fields)
    if shape.text:
        return [*cells, record.value]
    try:
        value = json.loads(record.raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        unshown.not_objects += 1
        unshown.first_not_object = unshown.first_not_object or msg_id
        return cells + [""] * len(shape.fields)
    for name in value.keys() - set(shape.fields):
        unshown.undeclared[name] = unshown.undeclared.get(name, 0) + 1
    return cells + [_cell(value.get(f)) for f in shape.fields]


def _cell(value: object) -> str:
    """A JSON value as a CSV cell: text as it is, null empty, anything else as JSON."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def parse_starts(text: str) -> int | dict[int, int]:
    """--from-offset: `OFFSET` (every partition from it) or `PARTITION:OFFSET,...` (those
    partitions from theirs, the others from their start)."""
    try:
        if ":" not in text:
            offset = int(text)
            if offset < 0:
                raise ValueError
            return offset
        starts: dict[int, int] = {}
        for part in text.split(","):
            partition, _, offset_text = part.strip().partition(":")
            p, o = int(partition), int(offset_text)
            if p < 0 or p >= 1 << (63 - PARTITION_SHIFT) or o < 0 or p in starts:
                raise ValueError
            starts[p] = o
        return starts
    except ValueError:
        raise ValueError(
            f"--from-offset {text!r}: give OFFSET (every partition of the outbound topic "
            "from it) or PARTITION:OFFSET[,PARTITION:OFFSET...] (those partitions from "
            "theirs, the others from their start), whole numbers >= 0, each partition once"
        ) from None


def cmd_subscribe(settings: AdapterSettings, args: argparse.Namespace) -> int:
    if args.to:
        return _subscribe_to(settings, args)
    shape = OutputShape.of(registry.load(settings))
    records = read_committed(
        # As the pipeline's reader, which may read its outputs and nothing else.
        settings.model_copy(update={"kafka_role": "reader"}),
        settings.outbound_topic,
        start_offset=parse_starts(args.from_offset),
        idle_timeout_s=args.idle_timeout,
        max_records=args.max,
        follow=args.follow,
        partition=None,
    )
    # The first record (or the end) before the output is opened: a read Kafka refuses
    # leaves no file with a header alone, which would pass for an empty topic.
    first = next(records, None)
    out: TextIO = open(args.output, "w", newline="") if args.output else sys.stdout  # noqa: SIM115
    unshown = Unshown()
    count = 0
    try:
        writer = csv.writer(out)
        writer.writerow(shape.header)
        for record in itertools.chain([first] if first is not None else [], records):
            writer.writerow(csv_row(record, shape, unshown))
            count += 1
            if args.output and count % 1000 == 0:
                _progress(f"{count} records written to {args.output}")
    finally:
        if args.output:
            out.close()
    if args.output and count >= 1000:
        print(file=sys.stderr)
    print(f"{count} records from {settings.outbound_topic}", file=sys.stderr)
    for line in unshown.lines(settings.pipeline):
        print(f"twinstream subscribe: {line}", file=sys.stderr)
    return 0


def _subscribe_to(settings: AdapterSettings, args: argparse.Namespace) -> int:
    """The subscriber adapter: until SIGTERM or SIGINT, every committed output into the
    file exactly once, resuming where the file ends (twinstream.edge.subscriber)."""
    import signal
    import threading

    from twinstream.edge.file_sink import FileSink
    from twinstream.edge.http_sink import HttpSink
    from twinstream.edge.subscriber import deliver

    given = [f for f in ("output", "max", "follow") if getattr(args, f)]
    if given or args.from_offset != "0":
        raise ValueError(
            "--to keeps its own position in its file: give it without --output, "
            "--from-offset, --max or --follow"
        )
    sink: FileSink | HttpSink
    if args.to.startswith(("http://", "https://")):
        if not args.position:
            raise ValueError(
                "--to an HTTP receiver keeps its position in a file of its own: give "
                "--position FILE (kept with the adapter, read back when it starts)"
            )
        sink = HttpSink(
            args.to, Path(args.position), echo=lambda line: print(line, file=sys.stderr)
        )
    else:
        sink = FileSink(Path(args.to))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _n, _f: stop.set())
    resume = sink.position.next_offsets()
    print(
        f"delivering {settings.outbound_topic} to {args.to} "
        f"from {'offset ' + positions_text(resume) if resume else 'the start'}",
        file=sys.stderr,
    )
    try:
        count = deliver(settings, sink, stop, echo=lambda line: print(line, file=sys.stderr))
    finally:
        sink.close()
    print(f"{count} records delivered to {args.to}", file=sys.stderr)
    return 0


def cmd_kafka_config(settings: CommonSettings, args: argparse.Namespace) -> int:
    client = user_client(settings, args.role)
    key_by = registry.load(settings).partition_by if args.role == "publisher" else None
    if args.format == "json":
        print(json.dumps({**asdict(client), "key_by": key_by}, indent=2))
    else:
        print(properties(client, args.format, key_by), end="")
    return 0


def properties(client: UserClient, kind: str, key_by: str | None = None) -> str:
    """A client's settings as a properties file for librdkafka (`kcat -F`, a
    confluent-kafka dict) or the Java client, what its user may do as comments."""
    settings = client.librdkafka if kind == "librdkafka" else client.java
    who = f"user {client.user}" if client.user else "no Kafka security on this cluster"
    lines = [
        f"# {client.role.capitalize()} of pipeline {client.pipeline} ({who}), "
        f"{'librdkafka' if kind == 'librdkafka' else 'Java client'} properties.",
    ]
    if client.user:
        lines.append("# Holds the user's password: keep this private.")
    for op, topics in client.grants.topics.items():
        if op != "DESCRIBE":
            lines.append(f"# May {op.lower()} topics: {', '.join(topics)}")
    prefixes = client.grants.group_prefixes
    if client.role == "reader":
        lines.append(
            "# Keep isolation.level=read_committed: an engine that takes over publishes an "
            "aborted transaction's rows again, so without it a reader sees them twice."
        )
    if prefixes:
        lines.append(
            f"# group.id must start with {' or '.join(prefixes)} (the ACLs allow no other "
            f"consumer group), e.g. group.id={prefixes[0]}{client.pipeline}-mine"
        )
    if key_by:
        lines.append(
            f"# Key each record by its `{key_by}` member: a key's records then share a "
            "partition, in order (the pipeline's state is per key)."
        )
    for name, value in settings.items():
        # A .properties file reads a backslash as an escape.
        lines.append(f"{name}={value.replace(chr(92), chr(92) * 2) if kind == 'java' else value}")
    return "\n".join(lines) + "\n"


def cmd_status(settings: Settings, args: argparse.Namespace | None) -> int:
    """Every engine of every pipeline of the stack (or of --pipeline) as a table, with each
    pipeline's last takeovers, newest snapshot and last audit; exit 1 if a pipeline has a
    problem (not exactly one active, a gap, a standby that cannot cover a takeover, an engine
    whose rows disagree with the published ones, a failed audit), 2 if the engines refuse
    the token or none answers (one line saying so)."""
    from twinstream.engine import timeline
    from twinstream.engine.spare_keeper import read_status
    from twinstream.engine.timeline import PipelineTimeline
    from twinstream.ops.status_view import render, watch

    token = settings.secret("admin_token")
    chosen = getattr(args, "pipeline", None)
    # With --pipeline, main() has made `settings` that pipeline's already. The stack's list
    # is read from the environment's settings only: from a pipeline's, whose engine ids are
    # its own, a pipeline without an engines entry (hostmetrics) would claim them too.
    pipelines = {chosen: settings} if chosen else registry.stack(settings)

    def engine(pipeline: Connections, engine_id: str) -> EngineClient:
        return EngineClient.from_settings(pipeline, engine_id, token, 5.0)

    readers = AdapterReader(settings)

    def look() -> Overview:
        return overview(
            pipelines,
            engine,
            adapters=readers,
            deploys=readers.last_deploy,
            spares=lambda: read_status(settings.spares_dir),
        )

    def timelines() -> dict[str, PipelineTimeline]:
        return {name: timeline.read(name, s, engine) for name, s in pipelines.items()}

    try:
        if getattr(args, "watch", None) is not None:
            charts = None if getattr(args, "no_sparklines", False) else timelines
            return watch(look, float(getattr(args, "watch", 2.0)), timelines=charts)
        seen = look()
    finally:
        readers.close()
    failure = unusable(seen, settings)
    if failure is not None:
        print(f"twinstream status: {failure}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(seen.model_dump_json(indent=2))
    else:
        render(seen)
    return 0 if seen.ok else 1


def unusable(seen: Overview, settings: Connections) -> str | None:
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


def cmd_quarantine(settings: CommonSettings, args: argparse.Namespace) -> int:
    from twinstream.core.election import zk_session
    from twinstream.core.quarantine import QuarantineStore
    from twinstream.core.rows import record_text

    with zk_session(settings.zookeeper()) as client:
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


def cmd_override(settings: CommonSettings, args: argparse.Namespace) -> int:
    """Let an engine that disagrees with the active lead anyway (POST /pipeline/override):
    an operator's decision, e.g. when it is the active whose rows are wrong."""
    from twinstream.engine.client import EngineClient, EngineError

    settings = registry.for_engine(settings, args.engine)
    with EngineClient.from_settings(
        settings, args.engine, settings.secret("admin_token")
    ) as engine:
        try:
            info = engine.override()
        except EngineError as exc:
            if exc.status != 409:
                raise RuntimeError(str(exc)) from exc
            print(f"engine {args.engine}: {exc.reason}", file=sys.stderr)
            return 1
    found = info.agreement.difference
    print(
        f"engine {args.engine} of pipeline {settings.pipeline} may lead although it disagrees "
        f"with the published output{f' at {found.text()}' if found else ''}; restore it "
        "(restore_and_resync, snapshot proven) to end this"
    )
    return 0


def cmd_new_pipeline(settings: CommonSettings, args: argparse.Namespace) -> int:
    from twinstream.ops.skeleton import pipelines_entry, write

    # By default beside the others: the pipelines/ package next to the pipelines file, whose
    # folder the registry puts on the path.
    home = settings.pipelines_file.parent / "pipelines"
    folder = Path(args.dir) if args.dir else home
    for path in write(args.name, folder):
        print(f"wrote {path}")
    package = "pipelines" if folder.resolve() == home.resolve() else ""
    # Engine ids and admin ports are the stack's: offer ones no pipeline uses yet.
    entry = pipelines_entry(args.name, registry.free_engines(settings), package=package)
    where = "" if package else " (its folder must be beside that file, or on PYTHONPATH)"
    print(
        f"\nnext: `pytest {folder / args.name / 'test_pipeline.py'}`, then list it in "
        f"{settings.pipelines_file}{where}:\n\n{entry.rstrip()}\n\n"
        "and `make up` runs its engines beside the others' (README: Write your own pipeline)"
    )
    return 0


def confirmer(yes: bool, stdin: TextIO | None = None) -> Callable[[str], bool]:
    """remove-pipeline's question: yes with --yes; else asked on a terminal, and refused
    (saying to pass --yes) when standard input is not one, as under a script."""
    source = stdin or sys.stdin

    def confirm(question: str) -> bool:
        if yes:
            return True
        if not source.isatty():
            print(
                f"{question.strip()} Not asked: standard input is not a terminal; run again "
                "with --yes to confirm",
                file=sys.stderr,
            )
            return False
        print(f"{question.strip()} [y/N] ", end="", file=sys.stderr, flush=True)
        answer = source.readline()
        return answer.strip().lower() in ("y", "yes")

    return confirm


def cmd_remove_pipeline(settings: Settings, args: argparse.Namespace) -> int:
    from twinstream.stack.remove import remove_pipeline

    return remove_pipeline(settings, args.name, confirm=confirmer(args.yes), echo=print)


# kazoo logs every connection attempt it retries as a warning (`Connection time-out`) with
# no handler of ours, so Python prints it on stderr, above a status table that comes out
# right all the same. A command says itself what it could not do (a status row, its one
# error line); kazoo's errors still pass. A publisher adapter keeps them in its own log.
QUIET_LOGGERS = ("kazoo",)


@contextlib.contextmanager
def quiet_libraries(quiet: bool = True) -> Iterator[None]:
    """Libraries' warnings off stderr for the time of one command, their levels restored
    after (main() may be called more than once in a process, as the tests do)."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS] if quiet else []
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def cmd_restart(settings: Settings, args: argparse.Namespace) -> int:
    from twinstream.stack.restart import restart_engine

    restart_engine(settings, args.engine, pipeline=args.of_pipeline, echo=print)
    return 0


def cmd_deploy(settings: Settings, args: argparse.Namespace) -> int:
    """Bring every engine of one pipeline of the local stack to the code on disk, standbys
    first, then the lead at a transaction boundary (twinstream.ops.deploy)."""
    from twinstream.engine.client import EngineError
    from twinstream.ops import deploy
    from twinstream.ops.operate import OperateError
    from twinstream.stack.core import StackError

    with contextlib.ExitStack() as closing:
        try:
            d, target = deploy.on_stack(
                settings,
                args.name,
                closing,
                client=deploy.token_client,
                startup_timeout_s=settings.startup_timeout_s,
                confirm=confirmer(args.yes),
                no_tests=args.no_tests,
                wait_s=args.wait,
            )
            deploy.run(d, target, rollback=args.rollback)
        except (OperateError, EngineError, StackError) as exc:
            # A step refused or failed: the engines not yet touched run the old version, and
            # the active leads; the message says where it stopped and what to do.
            print(f"\ntwinstream deploy: {exc}", file=sys.stderr)
            return 1
    return 0


# The adapters' commands: each reads the adapters' settings only (AdapterSettings), of one
# pipeline chosen as ONE_PIPELINE's are.
ADAPTERS: dict[str, Callable[[AdapterSettings, argparse.Namespace], int]] = {
    "publish": cmd_publish,
    "subscribe": cmd_subscribe,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="twinstream", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    pub = sub.add_parser("publish", help="send records to a pipeline's inbound topic")
    pub.add_argument("--file", help="a .csv or .jsonl file to send instead of sample records")
    pub.add_argument(
        "--source",
        metavar="FILE|FOLDER|-|http://HOST:PORT",
        help="run as a publisher adapter: follow a .csv or .jsonl file (or a folder's files, "
        "--pattern) as it grows, read standard input (-, --format), or serve POST /records "
        "(JSON lines, an Idempotency-Key each), as one of the pipeline's redundant adapters: "
        "only the elected one writes, a new one resumes after the last line published. "
        "Standard input cannot be read twice: every adapter of the group must be fed the "
        "same bytes (tee), each keeps what it read (64 MB while standby), and a new active "
        "skips its own lines up to the last published one's byte offset; at its end the "
        "adapter stops once all of it is committed",
    )
    pub.add_argument("--pattern", default="*.jsonl", help="with a --source folder: its files")
    pub.add_argument(
        "--format",
        choices=["jsonl", "csv"],
        default=None,
        help="with --source -: standard input's lines are JSON (jsonl, the default) or CSV "
        "with a header line first (csv, typed by the pipeline's schema)",
    )
    pub.add_argument("--id", help="with --source: this adapter's name (default: host-pid)")
    pub.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="with --source: serve Prometheus metrics at GET /metrics on this port of "
        "TWINSTREAM_BIND_HOST, with the engines' admin token (0, the default: none)",
    )
    pub.add_argument("--rate", type=float, default=1000.0, help="records per second (0: max)")
    pub.add_argument("--count", type=int, default=10_000, help="sample records to send")
    pub.add_argument("--seed", type=int, default=1)
    pub.add_argument(
        "--broken-every",
        type=int,
        default=0,
        metavar="N",
        help="make every Nth sample record invalid, as the pipeline's sample() breaks one "
        "(the examples' cycle through each kind they reject; new-pipeline's skeleton makes a "
        "negative amount)",
    )

    subp = sub.add_parser(
        "subscribe",
        help="write a pipeline's outbound topic as CSV: every partition, committed records",
        description="Columns: partition, msg_id (OFFSET on partition 0, PARTITION:OFFSET on "
        "another, as logs and `quarantine list` write it: the inbound record the row came "
        "from), the key if not a value field, then the value's declared fields "
        "(value_schema, else the value columns); a field a record lacks is an empty cell.",
    )
    subp.add_argument("--output", help="CSV file (default: standard output)")
    subp.add_argument(
        "--to",
        metavar="FILE.jsonl|FILE.csv|http://RECEIVER",
        help="run as a subscriber adapter: every committed record into FILE exactly once, "
        "until stopped; its position is kept in the file, so a restart resumes where it ends "
        "(an HTTP receiver gets JSON lines with an Idempotency-Key, retried until it answers)",
    )
    subp.add_argument("--position", help="with --to http://...: the file of its position")
    subp.add_argument(
        "--from-offset",
        default="0",
        metavar="OFFSET|PARTITION:OFFSET,...",
        help="where to start in the outbound topic (its offsets, not msg_ids): OFFSET in "
        "every partition, or PARTITION:OFFSET for those named (the others from their start)",
    )
    subp.add_argument("--max", type=int, default=None, help="stop after this many records")
    subp.add_argument("--follow", action="store_true", help="keep reading new records")
    subp.add_argument(
        "--idle-timeout",
        type=float,
        default=5.0,
        help="with --follow, stop after this many seconds without a record",
    )

    kconf = sub.add_parser(
        "kafka-config",
        help="Kafka client settings for your own publisher or reader of a pipeline",
    )
    kconf.add_argument("--role", choices=["publisher", "reader"], required=True)
    kconf.add_argument(
        "--format",
        choices=["librdkafka", "java", "json"],
        default="librdkafka",
        help="librdkafka properties (confluent-kafka, kcat -F; the default), Java client "
        "properties, or both as JSON",
    )
    remove = sub.add_parser(
        "remove-pipeline",
        help="take a pipeline off the stack: engines, topics, users, state, its table",
    )
    remove.add_argument("name", help="the pipeline's name")
    remove.add_argument(
        "--yes", action="store_true", help="do not ask (needed when stdin is not a terminal)"
    )
    restart = sub.add_parser(
        "restart",
        help="restart one engine of the local stack (its supervisord program) and wait "
        "until it answers its health probe again",
        description="Restarting the active is a failover: a standby takes over, and the "
        "engine comes back as a standby. Under Docker Compose: docker compose restart "
        "engine-ID.",
    )
    restart.add_argument("engine", help="the engine's id (`twinstream status` lists them)")
    # Not `pipeline`: main() would make the settings that pipeline's, and the engines are
    # looked up among the stack's (twinstream.stack.restart.owner).
    restart.add_argument(
        "--pipeline",
        dest="of_pipeline",
        metavar="NAME",
        help="check that the engine is this pipeline's (default: whichever runs it)",
    )
    dep = sub.add_parser(
        "deploy",
        help="run the pipeline's code on disk on every engine of the local stack, with no "
        "gap: standbys first, one at a time, then the lead at an exact msg_id",
        description="The new version's tests run first (test_*.py beside its code). The "
        "first standby restarts on the new code from its checkpoint when the state's shape "
        "(Keyed.state) is unchanged, else it replays the retained input from a window back "
        "(refused when retention does not reach it); where the new logic begins is recorded "
        "once. Every later engine restores a snapshot of the new version. The new version "
        "runs beside the old as a shadow, its differences shown; on your word (or --yes) the "
        "active is stopped and a standby of the new version takes over at a transaction "
        "boundary: the old version's output ends at a msg_id per partition, recorded and "
        "shown, the new one's begins after it. The old active restarts last, as a standby.",
    )
    dep.add_argument("name", metavar="PIPELINE", help="the pipeline, as the pipelines file says")
    dep.add_argument("--yes", action="store_true", help="switch without asking")
    dep.add_argument(
        "--rollback",
        action="store_true",
        help="deploy the version before the last deploy (check its code out first): refused "
        "when the code on disk is another",
    )
    dep.add_argument(
        "--no-tests",
        action="store_true",
        help="deploy although no tests sit beside the pipeline's code (never when they fail)",
    )
    dep.add_argument(
        "--wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long each engine may take to be in sync again (default 600)",
    )
    status = sub.add_parser(
        "status", help="every pipeline's engines: role, lag and buffer as a table"
    )
    new = sub.add_parser("new-pipeline", help="write a runnable pipeline and its test")
    new.add_argument("name", help="the pipeline's name (a Python package name)")
    new.add_argument(
        "--dir",
        default="",
        help="where to write it (default: pipelines/ beside the pipelines file, with the others)",
    )
    override = sub.add_parser(
        "override",
        help="let an engine that disagrees with the active's output lead anyway (until restored)",
    )
    override.add_argument("engine", help="the engine's id (each engine is one pipeline's)")
    quar = sub.add_parser("quarantine", help="list or release quarantined inbound offsets")
    quar.add_argument("action", choices=["list", "release"])
    quar.add_argument(
        "offset", nargs="?", help="the msg_id to release: OFFSET (partition 0) or PARTITION:OFFSET"
    )
    status.add_argument("--pipeline", help="only this pipeline (default: every one)")
    status.add_argument(
        "--json", action="store_true", help="the status as JSON (twinstream.ops.overview's model)"
    )
    status.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="redraw every SECONDS (default 2) until Ctrl-C, with each pipeline's last 15 "
        "minutes as sparklines (p99 latency, input rate, each engine's lag, takeovers)",
    )
    status.add_argument(
        "--no-sparklines",
        action="store_true",
        help="with --watch: the tables only (the engines are not asked for their timelines)",
    )
    for command in (pub, subp, quar, kconf):
        command.add_argument(
            "--pipeline", help="one of the pipelines file's (default: TWINSTREAM_PIPELINE)"
        )
    args = parser.parse_args(argv)
    try:
        chosen = getattr(args, "pipeline", None)
        if args.command in ADAPTERS:
            # An adapter's process (compose runs them so) reads no stack or engine setting.
            adapter = registry.chosen(load(AdapterSettings), chosen)
            with quiet_libraries(quiet=not getattr(args, "source", None)):
                return ADAPTERS[args.command](adapter, args)
        settings = load_settings()
        if args.command in ONE_PIPELINE:
            # --pipeline, TWINSTREAM_PIPELINE or the file's only one; else an error naming them.
            settings = registry.chosen(settings, chosen)
        elif chosen:
            settings = registry.settings_for(settings, chosen)
        handler = {
            "status": cmd_status,
            "quarantine": cmd_quarantine,
            "override": cmd_override,
            "new-pipeline": cmd_new_pipeline,
            "kafka-config": cmd_kafka_config,
            "remove-pipeline": cmd_remove_pipeline,
            "restart": cmd_restart,
            "deploy": cmd_deploy,
        }
        with quiet_libraries(quiet=not getattr(args, "source", None)):
            return handler[args.command](settings, args)
    except (SettingsError, ContractError, ValueError, OSError, RuntimeError, KafkaException) as exc:
        # KafkaException: an error librdkafka has no better words for, still one line.
        print(f"\ntwinstream {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
