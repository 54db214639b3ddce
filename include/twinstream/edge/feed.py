"""Feeding a pipeline once (`twinstream publish --file`, the tests' loads): file readers (CSV
typed by a pipeline's schema, JSONL as it is) and a rate-limited producer with a progress
line. No position is kept: a feed cut short cannot be resumed (the publisher adapter,
twinstream.edge.publisher, can)."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from twinstream.platform.kafka import producer_config
from twinstream.platform.settings import CommonSettings

FEEDER_LINGER_MS = 50


def from_file(
    path: Path, fields: Mapping[str, str] | None = None, optional: Collection[str] = ()
) -> Iterator[bytes]:
    """JSONL (one object per line, sent as is) or CSV with a header naming the fields,
    each value converted to its field's type in `fields` (name -> Spark type name, from
    the pipeline's schema: `twinstream.contract.field_types`); a value that does not convert
    is sent as text, so the pipeline dead-letters it with its reason rather than the tool
    dropping it. Columns not in `fields` are left out, and so is an empty cell of an
    `optional` member (the contract's: CSV has no null, and "" would be a wrong type)."""
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        with path.open("rb") as lines:
            for line in lines:
                if line.strip():
                    yield line.rstrip(b"\r\n")
        return
    if path.suffix.lower() != ".csv":
        raise ValueError(f"{path}: want .csv or .jsonl, got {path.suffix or 'no suffix'}")
    if not fields:
        raise ValueError(f"{path}: a CSV file needs the pipeline's fields (--pipeline)")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [f for f in fields if f not in (reader.fieldnames or []) and f not in optional]
        if missing:
            raise ValueError(f"{path}: CSV header lacks {', '.join(missing)}")
        for row in reader:
            yield csv_record(row, fields, optional)


def csv_record(
    row: Mapping[str | None, str | list[str] | None],
    fields: Mapping[str, str],
    optional: Collection[str] = (),
) -> bytes:
    """One CSV row (header -> cell) as the JSON record the pipeline reads: its `fields`
    typed, an empty optional member left out (see from_file)."""
    return json.dumps(
        {
            k: _typed(fields[k], v)
            for k, v in row.items()
            if isinstance(k, str)
            and k in fields
            and isinstance(v, str)
            and not (v == "" and k in optional)
        }
    ).encode()


def _typed(kind: str, text: str) -> object:
    try:
        if kind in ("tinyint", "smallint", "int", "bigint", "long", "integer", "short", "byte"):
            return int(text)
        if kind in ("float", "double", "real") or kind.startswith("decimal"):
            return float(text)
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
    except ValueError:
        return text
    return text


@dataclass
class Progress:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    started: float = 0.0

    def line(self, total: int | None, now: float) -> str:
        rate = self.acked / max(now - self.started, 1e-9)
        of = f"/{total}" if total is not None else ""
        return (
            f"published {self.acked}{of} acked ({self.sent} sent, {self.failed} failed), "
            f"{rate:,.0f}/s"
        )


def record_key(value: bytes | None, field: str) -> bytes | None:
    """The value of member `field` of a JSON object record, as the record's Kafka key."""
    try:
        found = json.loads(value) if value is not None else None
    except ValueError:
        return None
    member = found.get(field) if isinstance(found, dict) else None
    if member is None or isinstance(member, (dict, list)):
        return None
    return str(member).encode()


def publish(
    settings: CommonSettings,
    records: Iterable[bytes | None],
    rate: float = 0.0,
    total: int | None = None,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    key_field: str | None = None,
) -> Progress:
    """Produce `records` to the inbound topic with acks=all at `rate` per second (0: as
    fast as possible). Raises if any record is not acknowledged. `key_field`: each record
    is keyed by that member of its JSON object (the pipeline's `partition_by`), so that
    the default partitioner puts a key's records in one partition, in order; a record
    without it (or not JSON) goes unkeyed, to become a dead letter wherever it lands."""
    progress = Progress(started=clock())
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is None:
            progress.acked += 1
        else:
            progress.failed += 1
            errors.append(err)

    producer = Producer(
        producer_config(
            # As the pipeline's publisher, the one user that may write its inbound topic.
            settings.model_copy(update={"kafka_role": "publisher"}),
            # At the default 5 ms linger, paced sends make one acks=all request per record
            # or two: at 1,000 records/s librdkafka's broker thread takes about 0.65 of a
            # core, and the brokers a share more, on the cores the engines under test
            # need; 50 ms batches take about a sixth of that CPU. The wait is part of the
            # end-to-end latency, as with any batching upstream producer.
            **{"linger.ms": FEEDER_LINGER_MS},
        )
    )
    last_report = progress.started
    try:
        for value in records:
            while True:
                try:
                    producer.produce(
                        settings.inbound_topic,
                        key=record_key(value, key_field) if key_field else None,
                        value=value,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: wait for acks
            progress.sent += 1
            producer.poll(0)
            now = clock()
            if rate > 0:
                ahead = progress.started + progress.sent / rate - now
                if ahead > 0:
                    sleep(ahead)
            if on_progress is not None and now - last_report >= 1.0:
                last_report = now
                on_progress(progress.line(total, now))
    finally:
        remaining = producer.flush(60)
    if on_progress is not None:
        on_progress(progress.line(total, clock()))
    if remaining or errors:
        raise RuntimeError(
            f"{remaining} records unacknowledged, {len(errors)} failed"
            + (f" (first error: {errors[0]})" if errors else "")
        )
    return progress
