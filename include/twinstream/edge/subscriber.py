"""A subscriber adapter: a pipeline's outbound topic delivered into a file, every record
exactly once, for as long as it runs and across its restarts.

Guarantees:
- It reads only committed records (read_committed), of every partition, each from right
  after the position its file holds (twinstream.edge.file_sink): a restart, a kill -9
  included, neither skips nor repeats a record.
- What it wrote is put on disk with its position at least every `sync_every_s` while
  records arrive, and whenever the topic falls quiet or the adapter stops.
- Kafka going away is waited out, with the wait said once and a backoff up to 30 s; a read
  Kafka refuses (a login, an ACL) ends the adapter with the fix (ReadFailed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

from confluent_kafka import KafkaException

from twinstream.edge.file_sink import Position
from twinstream.edge.reader import Record, read_committed
from twinstream.platform.settings import AdapterSettings, CommonSettings

log = logging.getLogger(__name__)

# How long one read waits for a record before it ends (and the file is synced); the next
# read starts at once from the file's position.
IDLE_S = 5.0
MAX_BACKOFF_S = 30.0


class Sink(Protocol):
    """Where the adapter delivers: a FileSink, an HttpSink."""

    @property
    def position(self) -> Position: ...
    @property
    def path(self) -> Path: ...
    def write(self, record: Record) -> bool: ...
    def sync(self) -> None: ...


class Reader(Protocol):
    def __call__(
        self,
        settings: CommonSettings,
        topic: str,
        start_offset: int | Mapping[int, int] = 0,
        idle_timeout_s: float = 5.0,
        max_records: int | None = None,
        follow: bool = False,
        partition: int | None = 0,
    ) -> Iterator[Record]: ...


def deliver(
    settings: AdapterSettings,
    sink: Sink,
    stop: threading.Event,
    read: Reader = read_committed,
    sync_every_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    echo: Callable[[str], None] = print,
) -> int:
    """Append the pipeline's committed outbound records to `sink` until `stop` is set;
    returns how many it wrote."""
    # As the pipeline's reader, which may read its outputs and nothing else.
    reader = settings.model_copy(update={"kafka_role": "reader"})
    topic = settings.outbound_topic
    written = 0
    backoff = 1.0
    while not stop.is_set():
        starts = sink.position.next_offsets()
        try:
            last_sync = clock()
            for record in read(
                reader,
                topic,
                start_offset=starts,
                idle_timeout_s=IDLE_S,
                follow=True,
                partition=None,
            ):
                written += sink.write(record)
                if clock() - last_sync >= sync_every_s:
                    sink.sync()
                    last_sync = clock()
                if stop.is_set():
                    break
            backoff = 1.0
        except KafkaException as exc:
            echo(
                f"pipeline {settings.pipeline}: reading {topic} failed ({exc}); trying again "
                f"in {backoff:.0f} s from {sink.position.next_offsets() or 'the start'}"
            )
            sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            sink.sync()
    log.info(
        "pipeline %s: %s records of %s delivered to %s",
        settings.pipeline,
        written,
        topic,
        sink.path,
    )
    return written
