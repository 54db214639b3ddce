"""The publisher adapter: one of N identical processes that follow a source (a file or a
folder of files, or standard input: twinstream.edge.sources; HTTP requests:
twinstream.edge.http_source) into a pipeline's inbound topic, of which only the elected one
writes.

Guarantees:
- At most one adapter writes at a time: the adapters elect one active through ZooKeeper
  (the engines' recipe, twinstream.core.election, under the pipeline's own `publishers`
  node), and the active writes only in Kafka transactions under a transactional id the
  adapters share: a new active's `init_transactions` aborts what an old one left open and
  fences it, so a zombie (paused past its session) can commit nothing after that.
- No line twice, none skipped: every record carries its source position and a sequence
  number in headers (`source`, `seq`); a new active reads, after fencing, the committed
  record with the highest sequence number in the inbound topic and resumes right after its
  position. Lines are committed in source order, a transaction at a time.
- Nothing dropped in silence: a line that is not UTF-8 is published as it is, for the
  engines to dead-letter with their reason, and logged with its position and counted
  (`not_utf8`); a line too long to read, or lines of a file rotated away unread, are
  logged with their position and counted in `status`.
- The status says how far the source's end is beyond the last line published
  (`source_lag`, bytes; None on a standby or where it cannot be known), from the source
  itself (`lag`).
- A source that ends (standard input) ends the active adapter once everything it gave is
  committed (`finished`); a standby whose source ended waits until it leads, publishes
  what the last active had not, and is done too.
- Commits wait while the ZooKeeper session is SUSPENDED; a fenced or stepped-down active
  aborts its open transaction and stops writing.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import BaseModel, Field

from twinstream.edge.feed import csv_record, record_key
from twinstream.edge.http_source import HttpSource
from twinstream.edge.sources import STDIN, FileSource, Line, Lost, Position, StreamSource, TooLong
from twinstream.platform.connections import KafkaConnection, PipelineTopics
from twinstream.platform.kafka_auth import PUBLISHER_GROUP_PREFIX
from twinstream.platform.settings import CommonSettings

if TYPE_CHECKING:
    from twinstream.edge.publisher_metrics import MetricsServer

log = logging.getLogger(__name__)

SOURCE_HEADER = "source"
SEQ_HEADER = "seq"
PUBLISHER_HEADER = "publisher"
# A transaction closes after this many lines, or when the source has nothing more for now.
MAX_BATCH = 500
# How far back from a partition's end the resume point is first looked for (records),
# growing fourfold until a record with a sequence number is found or the log's start.
TAIL_WINDOW = 64


def transactional_id(topics: PipelineTopics) -> str:
    """Shared by a pipeline's publisher adapters (not its engines'); its ACL is the
    publisher user's (twinstream.platform.kafka_auth.acl_bindings)."""
    return f"{topics.transactional_id}-publisher"


@dataclass(frozen=True)
class ResumePoint:
    """The last line committed to the inbound topic by an adapter: its position and its
    sequence number (None, 0 when there is none: start at the source's start)."""

    position: Position | None = None
    seq: int = 0


def text_headers(headers: Any) -> dict[str, str]:
    """A record's headers that hold a value, as text (the adapters' `seq`, `source` and
    `publisher` among them)."""
    return {str(key): bytes(value).decode() for key, value in headers or () if value is not None}


def _header(headers: Any, name: str) -> str | None:
    for key, value in headers or ():
        if key == name and value is not None:
            return bytes(value).decode()
    return None


def last_published(
    kafka: KafkaConnection, topics: PipelineTopics, timeout_s: float = 10.0
) -> ResumePoint:
    """The committed inbound record with the highest `seq` over every partition."""
    consumer = Consumer(
        kafka.consumer(
            f"{PUBLISHER_GROUP_PREFIX}{uuid.uuid4()}",
            **{
                "enable.partition.eof": True,
                # A takeover waits for this read: a fetch is answered at once with what the
                # tail holds, not after the default 500 ms of waiting for more.
                "fetch.wait.max.ms": 10,
            },
        )
    )
    try:
        meta = consumer.list_topics(topics.inbound, timeout=timeout_s).topics[topics.inbound]
        if meta.error is not None:
            raise KafkaException(meta.error)
        return last_in_tails(consumer, topics.inbound, sorted(meta.partitions), timeout_s)
    finally:
        consumer.close()


def last_in_tails(
    consumer: Consumer, topic: str, partitions: Sequence[int], timeout_s: float
) -> ResumePoint:
    """The record with the highest `seq` in the tails of `partitions`, read together: the
    last TAIL_WINDOW records of each, and a window four times as long further back in a
    partition whose tail holds no adapter's record (transaction markers, aborted records,
    records of another producer), until its log's start. (Together, because a takeover
    waits for this read: partition by partition, a fetch's round trip each, it would take
    seconds.)"""
    bounds: dict[int, tuple[int, int]] = {}
    for partition in partitions:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout_s
        )
        if high > low:
            bounds[partition] = (low, high)
    best = ResumePoint()
    window = TAIL_WINDOW
    while bounds:
        starts = {p: max(low, end - window) for p, (low, end) in bounds.items()}
        ends = {p: end for p, (_, end) in bounds.items()}
        found = _read_windows(consumer, topic, starts, ends, timeout_s)
        for partition, point in found.items():
            if point is not None:
                best = max(best, point, key=lambda r: r.seq)
                del bounds[partition]
        bounds = {p: (low, starts[p]) for p, (low, _) in bounds.items() if starts[p] > low}
        window *= 4
    return best


def _read_windows(
    consumer: Consumer,
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    timeout_s: float,
) -> dict[int, ResumePoint | None]:
    """Each partition's last adapter record in [start, end), read in one assignment."""
    consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
    last: dict[int, ResumePoint | None] = dict.fromkeys(starts)
    open_ = set(starts)
    while open_:
        msg = consumer.poll(timeout_s)
        if msg is None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no answer reading {topic}"))
        partition = msg.partition()
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(error)
            open_.discard(partition)
            continue
        if partition not in open_:
            continue
        if (msg.offset() or 0) >= ends[partition]:
            open_.discard(partition)
            continue
        seq, source = _header(msg.headers(), SEQ_HEADER), _header(msg.headers(), SOURCE_HEADER)
        if seq is not None and source is not None:
            last[partition] = ResumePoint(Position.parse(source), int(seq))
    return last


def recent_sources(
    kafka: KafkaConnection,
    topics: PipelineTopics,
    per_partition: int = 20_000,
    timeout_s: float = 10.0,
) -> list[str]:
    """The source positions of the last `per_partition` committed records of each inbound
    partition: the HTTP source's keys an earlier active committed."""
    consumer = Consumer(
        kafka.consumer(f"{PUBLISHER_GROUP_PREFIX}{uuid.uuid4()}", **{"enable.partition.eof": True})
    )
    found: list[str] = []
    try:
        meta = consumer.list_topics(topics.inbound, timeout=timeout_s).topics[topics.inbound]
        if meta.error is not None:
            raise KafkaException(meta.error)
        for partition in sorted(meta.partitions):
            tp = TopicPartition(topics.inbound, partition)
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            if high <= low:
                continue
            consumer.assign(
                [TopicPartition(topics.inbound, partition, max(low, high - per_partition))]
            )
            while True:
                msg = consumer.poll(timeout_s)
                if msg is None:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, f"no answer reading {topics.inbound}")
                    )
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break
                    raise KafkaException(error)
                text = _header(msg.headers(), SOURCE_HEADER)
                if text is not None:
                    found.append(text)
    finally:
        consumer.close()
    return found


class Source(Protocol):
    """What the adapter follows: a FileSource, a StreamSource, an HttpSource."""

    def lines(
        self, after: Position | None, stop: threading.Event
    ) -> Iterator[Line | TooLong | Lost]: ...

    def lag(self, after: Position | None) -> int | None:
        """Bytes of the source beyond `after` (None: not knowable)."""
        ...


class Producing(Protocol):
    """The transactional producer the adapter uses (confluent_kafka.Producer)."""

    def init_transactions(self, timeout: float) -> None: ...
    def begin_transaction(self) -> None: ...
    def produce(
        self, topic: str, *, value: bytes, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None: ...
    def commit_transaction(self, timeout: float) -> None: ...
    def abort_transaction(self, timeout: float) -> None: ...
    def poll(self, timeout: float) -> int: ...


class Status(BaseModel):
    """How an adapter stands, as it writes it into its status node (StatusBoard) and as
    `twinstream status` and the page show it (twinstream.ops.overview.AdapterView, this
    with the adapter's id)."""

    role: str = "standby"
    epoch: int | None = None
    # Its source position right after the last line it published (FILE@INODE.HEAD:OFFSET).
    position: str | None = None
    seq: int = 0
    published: int = 0
    # Lines over the size limit (skipped), and lines published as they are though not
    # UTF-8 (the engines dead-letter them).
    too_long: int = 0
    not_utf8: int = 0
    lost: list[str] = Field(default_factory=list)
    last_error: str | None = None
    # Bytes of the source beyond `position`: the active's lag to the source's end (None: a
    # standby, or a source whose end cannot be known, HTTP).
    source_lag: int | None = None


def status_path(topics: PipelineTopics) -> str:
    """Where each adapter of the pipeline says how it stands (one ephemeral node each)."""
    return f"/twinstream/{topics.pipeline}/publishers/status"


class StatusBoard:
    """Each adapter's Status in an ephemeral znode of its own, gone with its session: what
    `twinstream status` and the page read (`read`). A write never blocks on a suspended
    session: it is asynchronous, and one that failed is made again at the next call."""

    def __init__(self, client: Any, topics: PipelineTopics, adapter_id: str) -> None:
        self._client = client
        self._path = f"{status_path(topics)}/{adapter_id}"
        self._session: Any = None

    def publish(self, status: Status) -> None:
        from kazoo.exceptions import KazooException, NodeExistsError

        data = json.dumps(status.model_dump()).encode()
        session = self._client.client_id
        try:
            if session is None or session != self._session:
                with contextlib.suppress(NodeExistsError):
                    self._client.create(self._path, data, ephemeral=True, makepath=True)
                self._client.set(self._path, data)
                self._session = session
            else:
                self._client.set_async(self._path, data)
        except KazooException as exc:
            self._session = None
            log.debug("publisher status not written (%r)", exc)

    @staticmethod
    def read(client: Any, topics: PipelineTopics) -> dict[str, Status]:
        """Every live adapter's status, by adapter id."""
        from kazoo.exceptions import NoNodeError

        path = status_path(topics)
        try:
            children = client.get_children(path)
        except NoNodeError:
            return {}
        found: dict[str, Status] = {}
        for child in sorted(children):
            with contextlib.suppress(NoNodeError, ValueError, TypeError):
                data, _stat = client.get(f"{path}/{child}")
                found[child] = Status.model_validate_json(data)
        return found


class Fenced(RuntimeError):
    """Another adapter (or a client with the shared transactional id) took over."""


class PublisherAdapter:
    """One adapter of a pipeline: it publishes while elected, from where the last active
    left off."""

    def __init__(
        self,
        adapter_id: str,
        topics: PipelineTopics,
        source: Callable[[Callable[[float], None]], Source],
        producer: Callable[[], Producing],
        resume: Callable[[], ResumePoint],
        key_field: str | None = None,
        csv_fields: Mapping[str, str] | None = None,
        optional: Collection[str] = (),
        max_batch: int = MAX_BATCH,
        sleep: Callable[[float], None] = time.sleep,
        resign: Callable[[], None] = lambda: None,
    ) -> None:
        self.adapter_id = adapter_id
        self.topics = topics
        self._source = source
        self._producer = producer
        self._resume = resume
        self.key_field = key_field
        self.csv_fields = csv_fields
        self.optional = optional
        self.max_batch = max_batch
        self._sleep = sleep
        # Leaves the lead and queues again (the election's resign): an active whose
        # publishing ended while it still leads resumes, or lets another, from Kafka.
        self.resign = resign
        self.status = Status()
        self._connected = threading.Event()
        self._connected.set()
        self._leading = threading.Event()
        self._thread: threading.Thread | None = None
        self._batch: list[tuple[Line, bytes]] = []
        self._producing: Producing | None = None
        self._on_commit: Callable[[list[Line]], None] | None = None
        # The source while leading, for its lag.
        self._following: Source | None = None
        # Set once the source ended and all it gave is committed: the adapter is done.
        self.finished = threading.Event()

    # -- the election's callbacks -------------------------------------------------------

    def on_elected(self, epoch: int) -> None:
        self._leading.set()
        self.status.role, self.status.epoch = "active", epoch
        self._thread = threading.Thread(
            target=self.publish, args=(epoch,), name=f"publisher-{self.adapter_id}", daemon=True
        )
        self._thread.start()

    def on_step_down(self, reason: str) -> None:
        log.warning(
            "publisher %s pipeline %s: stepping down: %s",
            self.adapter_id,
            self.topics.pipeline,
            reason,
        )
        self._leading.clear()
        self.status.role = "standby"
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def on_connection(self, connected: bool) -> None:
        if connected:
            self._connected.set()
        else:
            self._connected.clear()

    # -- publishing ---------------------------------------------------------------------

    def publish(self, epoch: int) -> None:
        """While elected: fence, find where the last active stopped, follow the source."""
        try:
            producer = self._producing = self._producer()
            producer.init_transactions(30.0)
            point = self._resume()
            self.status.seq = point.seq
            self.status.position = point.position.text() if point.position else None
            log.warning(
                "publisher %s pipeline %s: active at epoch %s, resuming after %s (seq %s)",
                self.adapter_id,
                self.topics.pipeline,
                epoch,
                point.position.text() if point.position else "the source's start",
                point.seq,
            )
            stop = _Unless(self._leading)
            source = self._following = self._source(self._idle)
            # A source that answers its clients once their lines are committed (HTTP), or
            # keeps them until then (standard input).
            self._on_commit = getattr(source, "committed", None)
            for event in source.lines(point.position, stop):
                if isinstance(event, Line):
                    if event.raw.strip():
                        if not _utf8(event.raw):
                            self._not_utf8(event)
                        self._batch.append((event, self._record(event)))
                    if len(self._batch) >= self.max_batch:
                        self._commit()
                elif isinstance(event, TooLong):
                    self.status.too_long += 1
                    log.error(
                        "publisher %s pipeline %s: a line of %s bytes at %s is over the limit "
                        "and not published",
                        self.adapter_id,
                        self.topics.pipeline,
                        event.length,
                        event.position.text(),
                    )
                elif isinstance(event, Lost):
                    self.status.lost.append(f"after {event.after.text()}: {event.why}")
                    log.error(
                        "publisher %s pipeline %s: lines lost after %s: %s",
                        self.adapter_id,
                        self.topics.pipeline,
                        event.after.text(),
                        event.why,
                    )
            self._commit()
            if getattr(source, "ended", False) and self._leading.is_set():
                log.warning(
                    "publisher %s pipeline %s: the source ended and every line of it is "
                    "committed (%s published, last at %s): done",
                    self.adapter_id,
                    self.topics.pipeline,
                    self.status.published,
                    self.status.position,
                )
                self.finished.set()
        except Fenced as exc:
            self.status.last_error = str(exc)
            log.warning("publisher %s pipeline %s: %s", self.adapter_id, self.topics.pipeline, exc)
        except Exception as exc:
            self.status.last_error = f"{type(exc).__name__}: {exc}"
            log.exception(
                "publisher %s pipeline %s: publishing failed", self.adapter_id, self.topics.pipeline
            )
        finally:
            self._batch.clear()
            self._following = None
            still_leading = self._leading.is_set()
            self._leading.clear()
            self.status.role = "standby"
            self.status.source_lag = None
            if still_leading and not self.finished.is_set():
                self.resign()

    def _not_utf8(self, line: Line) -> None:
        self.status.not_utf8 += 1
        count = self.status.not_utf8
        # Each of the first ones, then one in a thousand: a file in another encoding would
        # otherwise fill the log; every one is counted, and dead-lettered with its bytes.
        if count <= 10 or count % 1000 == 0:
            log.warning(
                "publisher %s pipeline %s: the line at %s is not UTF-8; published as it is "
                "for the engines to dead-letter (%s such lines so far)",
                self.adapter_id,
                self.topics.pipeline,
                line.position.text(),
                count,
            )

    def source_lag(self) -> int | None:
        """Bytes of the source beyond the last line published, while leading."""
        source = self._following
        if source is None or self.status.role != "active":
            return None
        try:
            after = Position.parse(self.status.position) if self.status.position else None
            return source.lag(after)
        except (OSError, ValueError):
            return None

    def _idle(self, seconds: float) -> None:
        """The source has nothing more for now: commit what is pending, then wait."""
        if self._leading.is_set():
            self._commit()
        self._sleep(seconds)

    def _record(self, line: Line) -> bytes:
        if line.header is None or self.csv_fields is None:
            return line.raw
        try:
            header = next(csv.reader([line.header.decode("utf-8")]))
            cells = next(csv.reader([line.raw.decode("utf-8")]))
        except UnicodeDecodeError:
            # Published as it is: the engines dead-letter it (not JSON) with its position.
            return line.raw
        return csv_record(dict(zip(header, cells, strict=False)), self.csv_fields, self.optional)

    def _commit(self) -> None:
        """The pending lines in one transaction, once ZooKeeper is connected."""
        if not self._batch:
            return
        producer = self._producing
        assert producer is not None
        while not self._connected.wait(0.1):
            if not self._leading.is_set():
                raise Fenced("stepped down while ZooKeeper was away; nothing committed")
        if not self._leading.is_set():
            raise Fenced("stepped down; the open lines are left to the next active")
        seq = self.status.seq
        try:
            producer.begin_transaction()
            for line, value in self._batch:
                seq += 1
                headers = [
                    (SOURCE_HEADER, line.position.text().encode()),
                    (SEQ_HEADER, str(seq).encode()),
                    (PUBLISHER_HEADER, self.adapter_id.encode()),
                ]
                key = record_key(value, self.key_field) if self.key_field else None
                while True:
                    try:
                        producer.produce(self.topics.inbound, value=value, key=key, headers=headers)
                        break
                    except BufferError:
                        producer.poll(0.1)
            producer.commit_transaction(30.0)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.txn_requires_abort():
                # Nothing of it is committed: the adapter resigns, and whoever leads next
                # resumes from what Kafka holds.
                producer.abort_transaction(30.0)
                raise
            raise Fenced(f"the transaction failed ({exc}): another adapter took over") from exc
        if self._on_commit is not None:
            self._on_commit([line for line, _value in self._batch])
        self.status.seq = seq
        self.status.published += len(self._batch)
        self.status.position = self._batch[-1][0].position.text()
        self._batch.clear()


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _Unless(threading.Event):
    """An event that reads as set once `leading` is clear: the source stops with the lead."""

    def __init__(self, leading: threading.Event) -> None:
        super().__init__()
        self._leading = leading

    def is_set(self) -> bool:
        return super().is_set() or not self._leading.is_set()


def election_paths(topics: PipelineTopics) -> tuple[str, str]:
    """The adapters' election and epoch nodes: beside the engines', their own."""
    home = f"/twinstream/{topics.pipeline}/publishers"
    return f"{home}/election", f"{home}/epoch"


# `--source -`: standard input.
STDIN_SOURCE = "-"


def run(
    settings: CommonSettings,
    adapter_id: str,
    source_path: Path | str,
    pattern: str,
    stop: threading.Event,
    echo: Callable[[str], None] = print,
    *,
    stdin_format: str = "jsonl",
    stdin: IO[bytes] | None = None,
    metrics_port: int = 0,
) -> Status:
    """One publisher adapter of the settings' pipeline until `stop` (or, for standard
    input, its end once all of it is committed): in the election, and publishing while it
    leads; its status in ZooKeeper each second and, with `metrics_port`, at GET /metrics.
    Returns its last status."""
    import sys

    from confluent_kafka import Producer

    from twinstream.contract import field_types
    from twinstream.core.election import Election, root_acl, zk_client
    from twinstream.platform import registry
    from twinstream.platform.kafka import connection

    pipeline = registry.load(settings)
    # As the pipeline's publisher, the one user that may write its inbound topic.
    kafka = connection(settings.model_copy(update={"kafka_role": "publisher"}))
    topics = settings.topics()
    zookeeper = settings.zookeeper()
    http = str(source_path).startswith("http://")
    from_stdin = str(source_path) == STDIN_SOURCE
    file_path = Path(source_path)
    if from_stdin:
        is_csv = stdin_format == "csv"
    else:
        is_csv = not http and (
            file_path.suffix == ".csv" or (file_path.is_dir() and pattern.endswith(".csv"))
        )
    # Standard input is read from the start, leading or not (StreamSource says why).
    reading: StreamSource | None = None
    if from_stdin:
        reading = StreamSource(stdin or sys.stdin.buffer, STDIN, header=is_csv)
    listening: HttpSource | None = None
    if http:
        from urllib.parse import urlsplit

        where = urlsplit(str(source_path))
        listening = HttpSource(
            where.hostname or "127.0.0.1",
            where.port or 8800,
            recent=lambda: recent_sources(kafka, topics),
        )

    def source(idle: Callable[[float], None]) -> Source:
        if listening is not None:
            listening.idle = idle
            return listening
        if reading is not None:
            reading.idle = idle
            return reading
        return FileSource(file_path, pattern, sleep=idle, header=is_csv)

    def producer() -> Producing:
        # confluent_kafka's Producer, as the narrow protocol the adapter uses.
        return cast(
            Producing,
            Producer(
                kafka.producer(
                    **{
                        "transactional.id": transactional_id(topics),
                        # A dead active's open transaction is aborted by the next one's init;
                        # the broker's own timeout only bounds one nobody replaces.
                        "transaction.timeout.ms": 10_000,
                        # Under the transaction timeout: in an outage a commit settles in it.
                        "message.timeout.ms": 9_000,
                        "client.id": f"twinstream-{topics.pipeline}-publisher-{adapter_id}",
                        # Lines arrive in bursts; a transaction closes every MAX_BATCH anyway.
                        "linger.ms": 20,
                    }
                )
            ),
        )

    adapter = PublisherAdapter(
        adapter_id,
        topics,
        source,
        producer,
        lambda: last_published(kafka, topics),
        key_field=pipeline.partition_by,
        csv_fields=field_types(pipeline.schema) if is_csv else None,
        optional=pipeline.optional,
    )
    zk = zk_client(zookeeper)
    path, epoch_path = election_paths(topics)
    election = Election(
        zk,
        path,
        epoch_path,
        adapter_id,
        on_elected=adapter.on_elected,
        on_step_down=adapter.on_step_down,
        on_connection=adapter.on_connection,
        root_acl=root_acl(zookeeper),
    )
    adapter.resign = election.resign
    if from_stdin:
        following = f"standard input ({stdin_format})"
    else:
        folder = f" ({pattern})" if not http and file_path.is_dir() else ""
        following = f"{source_path}{folder}"
    echo(
        f"publisher {adapter_id} of pipeline {topics.pipeline}: following {following} "
        f"into {topics.inbound} when elected"
    )
    served: MetricsServer | None = None
    if metrics_port:
        from twinstream.edge.publisher_metrics import MetricsServer, PublisherMetrics

        metrics = PublisherMetrics(adapter_id, topics.pipeline)
        served = MetricsServer(
            settings.bind_host,
            metrics_port,
            settings.secret("admin_token"),
            lambda: metrics.page(adapter.status),
        )
        served.start()
        echo(
            f"publisher {adapter_id}: Prometheus metrics at "
            f"http://{settings.bind_host}:{served.port}/metrics (the admin token's)"
        )
    if listening is not None:
        listening.start()
    if reading is not None:
        reading.start()
    board = StatusBoard(zk, topics, adapter_id)
    election.start()
    try:
        last: tuple[str | None, int] = (None, 0)
        while not stop.wait(1.0):
            adapter.status.source_lag = adapter.source_lag()
            board.publish(adapter.status)
            now = (adapter.status.role, adapter.status.published)
            if now != last:
                echo(
                    f"publisher {adapter_id}: {adapter.status.role}, "
                    f"{adapter.status.published} lines published, at "
                    f"{adapter.status.position or 'the start'}"
                )
                last = now
            if adapter.finished.is_set():
                break
    finally:
        election.stop()
        zk.stop()
        zk.close()
        if listening is not None:
            listening.close()
        if served is not None:
            served.close()
    return adapter.status
